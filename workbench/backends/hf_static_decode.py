"""The transformers backend's decode on a GPU: a preallocated KV cache and one captured CUDA graph a batch size.

``workbench.backends.hf_decode`` decodes with transformers' growing cache, shedding finished rows: right on a
CPU, where a step is compute-bound, but on a GPU a 0.5B model's decode step is ~800 small kernels, each
launched from Python, so the GPU waits for the CPU (1.7k tokens/s at batch 64 on an H200). Here instead:

- the prompts are prefilled as before (``hf_decode.prefill``: distinct prompts once, a shared prefix once),
  then copied into a **static cache**: per layer ``[rows, kv heads, length, head dim]`` buffers allocated once
  for the largest batch and reused across batches, every row writing the same column each step;
- one decode step (mark the column visible, the forward over one token a row, sampling, the log-prob of the
  drawn token, advancing the column) reads and writes only those fixed buffers, so on CUDA it is captured
  once per **batch-size bucket** (1, 2, 4, ... ``max_batch``) as a CUDA graph and replayed: one launch a step;
- **sampling runs on the device** from a counter-based random number: each row's uniform draw is a hash of
  its seed and the drawn token's position (``uniform``), so a seeded row draws the same tokens whatever
  shares its batch and a graph needs no generator state; rows without a seed get one from torch's global
  generator. (The dynamic decode draws from a generator per row instead: a seed gives the same tokens on
  every run of one decode path, not across the two.)
- **the host does not wait for every step**: each step writes its tokens and their log-probs into a device
  buffer at the column it wrote, and the host reads the steps since its last read in one copy every
  ``check_every`` steps (default 8), or sooner when a live row reaches its ``max_tokens`` (known on the host),
  and nothing is read in between: the steps' launches queue up on the device. The host then checks ends
  (limits, end-of-sequence, stop strings: ``hf_decode.Done``, token by token, so a row ends exactly where it
  did when the host read every step); when few enough rows are left, the live ones move to the front and the
  next smaller bucket's graph runs.

Rows that finished keep being computed until the next read, and after it until their batch moves to a smaller
bucket (their tokens are dropped). Every row ends at the token it ended at when the host read every step, and
where rows end at their limits the batch shrinks at the same steps, so ids and log-probs are the same bit for
bit. A row that ends at end-of-sequence or a stop string may shrink the batch a few steps later than before;
the other rows' products, computed in the larger batch's shape meanwhile, may round differently in their last
bit (``tests/test_sync_audit.py`` compares reading every 1, 3 and 8 steps on such batches: identical there,
and it counts the reads). On a CPU the same code runs without capture (``capture=False``):
``tests/test_backends.py`` checks it against the dynamic decode there; ``tests/perf/gpu_check.sh`` measures
it on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.backends.base import GenerationRequest
from workbench.backends.hf_decode import Done, prefill, scores_for

#: Batch-size buckets are powers of two up to the backend's ``max_batch``; cache lengths round up to this.
LENGTH_STEP = 256
#: Decode steps between two reads of the drawn tokens by the host (``StaticDecoder(check_every=)``).
CHECK_EVERY = 8
_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit constant as torch's signed int64 holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniform(seeds: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One uniform draw in [0, 1) a row (float64), a function of the row's seed and ``counter`` only:
    SplitMix64 of ``seed * golden + counter``, its top 53 bits. Graph-safe (integer arithmetic, no state)."""
    z = seeds * _GOLDEN + counter + _GOLDEN
    z = (z ^ _shift(z, 30)) * _MIX1
    z = (z ^ _shift(z, 27)) * _MIX2
    z = z ^ _shift(z, 31)
    return _shift(z, 11).double() * (1.0 / (1 << 53))


def sample(logits: torch.Tensor, request: GenerationRequest, u: torch.Tensor) -> torch.Tensor:
    """One token a row from ``logits`` under ``request``'s sampling settings, inverting the cumulative
    distribution at the draws ``u`` (``[rows]``); greedy at temperature 0."""
    if request.temperature == 0.0:
        return logits.argmax(-1)
    cdf = scores_for(logits, request).softmax(-1).double().cumsum(-1)
    return (
        torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], side="right")
        .squeeze(-1)
        .clamp(max=cdf.shape[-1] - 1)
    )


class _StaticKV:
    """What a transformers decoder layer calls ``past_key_values``: ``update`` writes the new key and value
    at the current column of this bucket's views of the static cache and returns the whole buffers."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], column: torch.Tensor):
        self.keys, self.values, self.column = keys, values, column

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple:
        # in the buffers' dtype: under autocast a trained model's rotary keys come out fp32 and its values in
        # the compute dtype, and the prefill's cache (which made the buffers) need not match a step's
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.column, key.to(keys.dtype))
        values.index_copy_(2, self.column, value.to(values.dtype))
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.column)


@dataclass
class _Buffers:
    """The state one decode step reads and writes, for ``rows`` rows (the largest bucket) and ``length``
    cache columns; a bucket of b rows works on the first b of every buffer."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    visible: torch.Tensor  # [rows, 1, 1, length] bool: the cache columns each row attends to
    tokens: torch.Tensor  # [rows] the last token of each row (the step's input)
    positions: torch.Tensor  # [rows] its position id
    seeds: torch.Tensor  # [rows] int64
    column: torch.Tensor  # [1] int64: the cache column this step writes
    # [2, length, rows] float64: each step's tokens and their log-probs, at the column the step wrote (the
    # first token's at the prompt's last column): what the host reads, every few steps
    drawn: torch.Tensor
    graphs: dict[tuple, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def length(self) -> int:
        return int(self.visible.shape[-1])


def _bucket(n: int, largest: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return min(size, largest)


class StaticDecoder:
    """Decodes left-padded batches of one sampling setting with a static cache (see the module docstring).

    Keeps its buffers and captured graphs between batches; they are rebuilt when a batch needs more rows or
    cache columns than they hold. ``capture``: record each bucket's step as a CUDA graph (CUDA only; default:
    on CUDA). ``check_every``: decode steps between two reads of the drawn tokens by the host."""

    def __init__(
        self, model: Any, max_batch: int, capture: bool | None = None, check_every: int = CHECK_EVERY
    ):
        if check_every < 1:
            raise ValueError(f"check_every must be a positive number of decode steps, got {check_every!r}")
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation not in STATIC_ATTENTION:
            raise ValueError(
                f"the static decode reads a boolean mask, which attention {implementation!r} does not: use one of "
                f"{', '.join(STATIC_ATTENTION)}, or decode='dynamic'"
            )
        self.model, self.max_batch, self.check_every = model, max_batch, check_every
        self.device = model.get_input_embeddings().weight.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.buffers: _Buffers | None = None
        self.pool: Any = None

    # ------------------------------------------------------------------ public

    @torch.no_grad()
    def decode(
        self,
        tokenizer: Any,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        rows: list[GenerationRequest],
        eos_ids: list[int],
        seeds: list[int | None],
        adapter: Any = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Completion ids and raw log-probs per row of a left-padded batch (``hf_decode.decode``'s contract)."""
        first = rows[0]
        n = len(rows)
        cache, logits, mask = prefill(self.model, input_ids, attention)
        width = mask.shape[1]
        length = width + max(r.max_tokens for r in rows)
        buffers = self._buffers(_bucket(n, self.max_batch) if n <= self.max_batch else n, length, cache)
        missing = sum(s is None for s in seeds)  # drawn from torch's global generator, on the host
        unseeded = iter(torch.randint(0, 2**62, (missing,)).tolist() if missing else [])
        row_seeds = [next(unseeded) if s is None else int(s) for s in seeds]
        buffers.seeds[:n] = torch.tensor(row_seeds, dtype=torch.long, device=self.device)
        # the first token comes from the prefill's logits, its draw keyed to its position (the prompt's length)
        buffers.column.fill_(width)
        lengths = mask.sum(-1)
        token = sample(logits, first, uniform(buffers.seeds[:n], lengths))
        chosen = logits.float().log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        for layer, (k, v) in enumerate(_layers(cache)):
            buffers.keys[layer][:n, :, :width].copy_(k)
            buffers.values[layer][:n, :, :width].copy_(v)
        buffers.visible.zero_()
        buffers.visible[:n, 0, 0, :width] = mask.bool()
        buffers.tokens[:n] = token
        buffers.positions[:n] = lengths
        buffers.drawn[:, width - 1, :n] = torch.stack([token.double(), chosen.double()])
        ids: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        done = Done(tokenizer, rows, eos_ids)
        active = list(range(n))  # the original row of each buffer row still decoding
        live = list(range(n))  # buffer rows of `active`
        bucket = _bucket(n, buffers.rows)
        column, unread = width, 1  # the host's copy of the next step's column; tokens drawn and not yet read
        while True:
            # up to `check_every` tokens drawn between two reads, read as soon as a live row reaches its limit (so
            # the batch shrinks at the step it did when the host read every step, and nothing runs past a limit)
            least = min(rows[i].max_tokens - len(ids[i]) for i in active)
            for _ in range(min(self.check_every, least) - unread):
                self._step(buffers, bucket, first, adapter)
                column, unread = column + 1, unread + 1
            # the host's one read of these steps: rows that ended meanwhile were computed on, their tokens dropped
            drawn_ids, drawn_logprobs = buffers.drawn[:, column - unread : column, :bucket].tolist()
            unread = 0
            keep = []
            for j, i in zip(live, active, strict=True):
                for step_ids, step_logprobs in zip(drawn_ids, drawn_logprobs, strict=True):
                    ids[i].append(int(step_ids[j]))
                    logprobs[i].append(step_logprobs[j])
                    if done(i, ids[i]):
                        break
                else:
                    keep.append(j)
            if not keep:
                return ids, logprobs
            active = [active[live.index(j)] for j in keep]
            bucket = _bucket(len(keep), buffers.rows)
            if keep[-1] >= bucket:  # the live rows to the front, so a smaller graph holds them
                self._compact(buffers, keep)
                keep = list(range(len(keep)))
            live = keep

    # ------------------------------------------------------------------ internals

    def _buffers(self, rows: int, length: int, cache: Any) -> _Buffers:
        """The buffers, reused when they hold ``rows`` rows and ``length`` columns, else made anew."""
        have = self.buffers
        if have is not None and have.rows >= rows and have.length >= length:
            return have
        rows = max(rows, have.rows if have is not None else 0)
        length = -(-max(length, have.length if have is not None else 0) // LENGTH_STEP) * LENGTH_STEP
        self.buffers = None  # free the old ones (and their graphs) first
        layers = _layers(cache)
        keys = [
            torch.zeros(rows, k.shape[1], length, k.shape[3], dtype=k.dtype, device=self.device)
            for k, _ in layers
        ]
        values = [
            torch.zeros(rows, v.shape[1], length, v.shape[3], dtype=v.dtype, device=self.device)
            for _, v in layers
        ]
        long = {"dtype": torch.long, "device": self.device}
        self.buffers = _Buffers(
            keys=keys,
            values=values,
            visible=torch.zeros(rows, 1, 1, length, dtype=torch.bool, device=self.device),
            tokens=torch.zeros(rows, **long),
            positions=torch.zeros(rows, **long),
            seeds=torch.zeros(rows, **long),
            column=torch.zeros(1, **long),
            drawn=torch.zeros(2, length, rows, dtype=torch.float64, device=self.device),
        )
        return self.buffers

    def _compact(self, buffers: _Buffers, keep: list[int]) -> None:
        """Move the buffer rows ``keep`` to the front, in order."""
        index = torch.tensor(keep, device=self.device)
        n = len(keep)
        for tensor in (
            *buffers.keys,
            *buffers.values,
            buffers.visible,
            buffers.tokens,
            buffers.positions,
            buffers.seeds,
        ):
            tensor[:n] = tensor.index_select(0, index)

    def _step(self, buffers: _Buffers, bucket: int, request: GenerationRequest, adapter: Any) -> None:
        """One decode step for the first ``bucket`` rows: replayed from its graph when capturing."""
        if not self.capture:
            self._forward_step(buffers, bucket, request)
            return
        key = (
            bucket,
            request.temperature,
            request.top_p,
            request.top_k,
            adapter,
            torch.is_autocast_enabled("cuda"),
        )
        graph = buffers.graphs.get(key)
        if graph is None:
            graph = self._record(buffers, bucket, request)
            buffers.graphs[key] = graph
        graph.replay()

    def _record(self, buffers: _Buffers, bucket: int, request: GenerationRequest) -> Any:
        """Capture one step of ``bucket`` rows as a CUDA graph; the buffers' contents are saved and restored
        around the warm-up run that capture needs (the graph records addresses, not values)."""
        saved = [t.clone() for t in (buffers.visible, buffers.tokens, buffers.positions, buffers.column)]
        column = int(buffers.column)
        cache = [
            (k[:bucket, :, column].clone(), v[:bucket, :, column].clone())
            for k, v in zip(buffers.keys, buffers.values, strict=True)
        ]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), _uncached_autocast():
            self._forward_step(buffers, bucket, request)  # warm-up: allocations, kernel selection
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a trainer updating on another thread (pipeline, async) does not break the capture
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), _uncached_autocast():
            self._forward_step(buffers, bucket, request)
        for tensor, before in zip(
            (buffers.visible, buffers.tokens, buffers.positions, buffers.column), saved, strict=True
        ):
            tensor.copy_(before)
        for (k, v), (k0, v0) in zip(zip(buffers.keys, buffers.values, strict=True), cache, strict=True):
            k[:bucket, :, column] = k0
            v[:bucket, :, column] = v0
        return graph

    def _forward_step(self, buffers: _Buffers, bucket: int, request: GenerationRequest) -> None:
        """Mark the column visible, run one token a row through the model, draw the next, advance."""
        visible = buffers.visible[:bucket]
        visible.index_fill_(3, buffers.column, True)
        kv = _StaticKV(
            [k[:bucket] for k in buffers.keys], [v[:bucket] for v in buffers.values], buffers.column
        )
        positions = buffers.positions[:bucket]
        logits = self.model(
            input_ids=buffers.tokens[:bucket, None],
            attention_mask=visible,
            position_ids=positions[:, None],
            past_key_values=kv,
            use_cache=True,
        ).logits[:, -1]
        token = sample(logits, request, uniform(buffers.seeds[:bucket], positions + 1))
        chosen = logits.float().log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        step = torch.stack([token.double(), chosen.double()])[:, None]
        buffers.drawn[:, :, :bucket].index_copy_(1, buffers.column, step)
        buffers.tokens[:bucket].copy_(token)
        positions.add_(1)
        buffers.column.add_(1)


def _uncached_autocast() -> Any:
    """The autocast in force, without its cache of cast weights: a graph must cast the (trained, changing)
    fp32 weights on every replay, never keep a cast made before capture (freed when autocast exits)."""
    import contextlib

    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


#: Attention implementations that read the static cache's 4-D boolean mask (transformers' eager attention
#: adds its mask to the scores, so it needs a float one; flash-attention takes none).
STATIC_ATTENTION = ("sdpa", "gqa_sdpa", "packed")


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of a transformers ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]

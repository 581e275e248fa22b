"""Generation with a transformers model: the small CPU fallback backend.

Concurrent requests (many agents of many episodes at once) are collected by a micro-batcher
and decoded together in one left-padded batch per sampling setting (temperature, top-p/k, adapter);
each row keeps its own ``max_tokens``, stop strings, ``ignore_eos`` and seed, so different agents'
requests share a batch. A request's seed seeds a generator of its own (its ``k``-th sample's: seed + k),
so a seeded request draws the same tokens whatever else shares its batch (up to the float noise of a
different batch shape). A scheduler that must know which weights each of its rollout batches decodes with
(the async one) holds trained weights back (``hold_weights``) and applies them itself, in the order they
came, between two of its batches (``apply_held``). The decode loop (``workbench.backends.hf_decode``) drops rows
from the batch as they finish; log-probs are those of the raw model distribution for the sampled
tokens (as vLLM reports by default).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from workbench.backends.base import BackendError, Generation, GenerationRequest, cut_at_stop, fit_to_context
from workbench.backends.gqa_attention import use_gqa_attention
from workbench.backends.hf_decode import decode
from workbench.backends.hf_static_decode import STATIC_ATTENTION, StaticDecoder
from workbench.models.placement import Placement, placement_of

DECODE_MODES = ("auto", "dynamic", "static")


class HFBackend:
    """A transformers model behind the async backend interface."""

    name = "hf"

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        max_batch: int = 128,
        dtype: str = "auto",
        device: str = "auto",
        placement: Placement | None = None,
        decode: str = "auto",
    ):
        """``model``: a registry name or path, loaded on ``device`` in ``dtype`` (``auto``: a GPU in bf16 where
        one exists, else the CPU in fp32); or a model object, decoded where it is, under autocast to
        ``placement``'s dtype if given (a trainer's fp32 master weights with bf16 compute). ``decode``:
        ``dynamic`` (a growing cache that sheds finished rows: ``hf_decode``), ``static`` (a preallocated cache,
        one CUDA graph a batch size on a GPU: ``hf_static_decode``) or ``auto`` (static on CUDA, else dynamic)."""
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str | Path):
            from workbench.models import resolve

            path = resolve(str(model))
            placement = placement or Placement.resolve(device, dtype)
            self.model = placement.place_frozen(
                AutoModelForCausalLM.from_pretrained(path, dtype=placement.dtype)
            )
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        else:
            self.model, self.tokenizer = model, tokenizer
        self.placement = placement or placement_of(self.model)
        use_gqa_attention(self.model).eval()
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.max_batch = max_batch
        on_gpu = self.model.get_input_embeddings().weight.device.type == "cuda"
        static_ok = getattr(self.model.config, "_attn_implementation", None) in STATIC_ATTENTION
        self.decode_mode = ("static" if on_gpu and static_ok else "dynamic") if decode == "auto" else decode
        self._static: StaticDecoder | None = None
        if self.decode_mode == "static":
            self._static = StaticDecoder(self.model, max_batch)  # refuses an attention it cannot feed
        self.policy_version = 0
        self._weights_lock = threading.Lock()  # held while a batch decodes
        self._pending_lock = threading.Lock()
        self._pending: tuple[dict[str, Any], int] | None = None  # weights waiting for the next batch
        self._held: list[tuple[dict[str, Any], int]] | None = None  # held back for ``apply_held`` (in order)
        self._queue: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.closed = False

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if self.closed:
            raise BackendError("this hf backend is closed: create a new one")
        # past its context the model would read positions it was never trained on (or index out of range)
        request = fit_to_context(request, getattr(self.model.config, "max_position_embeddings", None))
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        future: asyncio.Future = loop.create_future()
        self._queue.append((request, future))
        self._wakeup.set()
        return await future

    async def _serve(self) -> None:
        while True:
            await self._wakeup.wait()
            quiet = 0  # let every ready coroutine enqueue before we batch: a request can be several
            for _ in range(64):  # awaits (wrappers, gathers) away from the queue
                queued = len(self._queue)
                await asyncio.sleep(0)
                quiet = quiet + 1 if len(self._queue) == queued else 0
                if quiet == 8:
                    break
            self._wakeup.clear()
            pending, self._queue = self._queue, []
            groups: dict[tuple, list] = defaultdict(list)
            for request, future in pending:
                groups[_batch_key(request)].append((request, future))
            for items in groups.values():
                for batch in _batches(items, self.max_batch):
                    try:
                        results = await _in_own_thread(self._generate_batch, [r for r, _ in batch])
                    except Exception as error:  # noqa: BLE001 - hand the failure to every waiter
                        for _, future in batch:
                            if not future.done():
                                future.set_exception(error)
                        continue
                    for (_, future), result in zip(batch, results, strict=True):
                        if not future.done():
                            future.set_result(result)

    def load_state(self, state: dict[str, Any], *, policy_version: int) -> None:
        """Hand trained weights to the served model: applied at once when no batch is decoding, else
        right before the next batch (never during one); the caller does not wait for a batch to end."""
        snapshot = {name: tensor.detach().clone() for name, tensor in state.items()}
        with self._pending_lock:
            if self._held is not None:  # the scheduler applies it (``apply_held``)
                self._held.append((snapshot, policy_version))
                return
            self._pending = (snapshot, policy_version)
        if self._weights_lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self._weights_lock.release()

    def hold_weights(self) -> None:
        """From now on keep the weights ``load_state`` is handed until ``apply_held`` asks for them."""
        with self._pending_lock:
            if self._held is None:
                self._held = []

    def apply_held(self, count: int = 1) -> None:
        """Apply the next ``count`` held weight updates (those there are), oldest first, between two decode
        batches (it waits for one that is decoding)."""
        with self._weights_lock, self._pending_lock:
            held = self._held or []
            for state, version in held[:count]:
                self.model.load_state_dict(state, strict=False)
                self.policy_version = version
            del held[:count]

    def _apply_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.model.load_state_dict(pending[0], strict=False)
            self.policy_version = pending[1]

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        with self._weights_lock:
            self._apply_pending()
            return self._generate_batch_unlocked(requests)

    def _generate_batch_unlocked(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        started = time.perf_counter()
        first = requests[0]
        with self._adapter(first.adapter):
            return self._generate_rows(requests, started)

    @property
    def adapters(self) -> dict[str, int]:
        """LoRA adapters of a peft model, by name (empty for a plain model)."""
        return {name: i for i, name in enumerate(getattr(self.model, "peft_config", {}))}

    def add_adapter(self, name: str, path: str | Path) -> int:
        """Load a peft LoRA adapter directory under ``name`` (a no-op for one the model already has:
        a trainer sharing this model object updates it in place)."""
        if name not in self.adapters:
            if not (Path(path) / "adapter_config.json").is_file():
                raise BackendError(f"adapter '{name}': {path} has no adapter_config.json (save it with peft)")
            if hasattr(self.model, "load_adapter") and hasattr(self.model, "peft_config"):
                self.model.load_adapter(str(path), adapter_name=name)
            else:
                from peft import PeftModel

                self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name).eval()
        return self.adapters[name]

    def _adapter(self, name: str | None) -> Any:
        """A context running the model with adapter ``name`` on (or, for a peft model, all off)."""
        import contextlib

        if name is None:
            disable = getattr(self.model, "disable_adapter", None)
            return disable() if disable is not None and self.adapters else contextlib.nullcontext()
        if name not in self.adapters:
            raise BackendError(f"unknown adapter '{name}' (loaded: {', '.join(self.adapters) or 'none'})")
        self.model.set_adapter(name)
        return contextlib.nullcontext()

    def _generate_rows(self, requests: list[GenerationRequest], started: float) -> list[list[Generation]]:
        import torch

        rows = [r for r in requests for _ in range(r.n)]
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        width = max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention[i, width - len(r.prompt_ids) :] = 1
        seeds = [None if r.seed is None else r.seed + k for r in requests for k in range(r.n)]
        device = self.model.get_input_embeddings().weight.device
        with self.placement.autocast():
            args = (self.tokenizer, input_ids.to(device), attention.to(device), rows, self.eos_ids, seeds)
            if self._static is not None:
                completions, chosen = self._static.decode(*args, adapter=requests[0].adapter)
            else:
                completions, chosen = decode(self.model, *args)
        elapsed = time.perf_counter() - started
        generations = []
        for i, r in enumerate(rows):
            ids = completions[i]
            n, finish = len(ids), "length"
            if not r.ignore_eos:
                end = next((k + 1 for k, t in enumerate(ids) if t in self.eos_ids), None)
                if end is not None:
                    n, finish = end, "stop"
            cut, stop_reason = cut_at_stop(self.tokenizer, ids[:n], r.stop)
            if stop_reason is not None:
                n, finish = cut, "stop"
            generations.append(
                Generation(
                    completion_ids=ids[:n],
                    logprobs=chosen[i][:n],
                    text=self.tokenizer.decode(ids[:n], skip_special_tokens=True),
                    finish_reason=finish,
                    stop_reason=stop_reason,
                    policy_version=self.policy_version,
                    timings={"generate_s": elapsed, "batch_size": float(len(rows))},
                )
            )
        out, i = [], 0
        for r in requests:
            out.append(generations[i : i + r.n])
            i += r.n
        return out

    def close(self) -> None:
        """Stop batching and let go of the model (its memory goes back unless a trainer still holds it); safe to
        call again. The backend cannot generate afterwards. Nothing runs outside this process, so nothing needs
        stopping at interpreter exit."""
        self.closed = True
        if self._worker is not None:
            self._worker.cancel()
        self.model = self._static = None

    def __enter__(self) -> HFBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _in_own_thread(function: Any, *args: Any) -> Any:
    """Run ``function`` on a thread of its own that ends with it.

    Not ``asyncio.to_thread``: an executor thread that ran torch ops and then waits idle in the pool
    slows every torch op of the other threads (measured: a trainer step 4x slower on 2 cores while
    a long-lived rollout loop kept its executor), which a thread that exits does not.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            future.set_exception(outcome) if failed else future.set_result(outcome)

    def run() -> None:
        try:
            outcome, failed = function(*args), False
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome, failed = error, True
        loop.call_soon_threadsafe(settle, outcome, failed)

    threading.Thread(target=run, name="hf-decode", daemon=True).start()
    return await future


def _batch_key(request: GenerationRequest) -> tuple:
    """Requests with the same key share one decode batch (``max_tokens``, stops, ``ignore_eos`` and the seed are
    per row).

    Not ``GenerationRequest.sampling_key``: that one also holds the per-row settings.
    """
    return (request.temperature, request.top_p, request.top_k, request.adapter)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the tokenizer's and the generation config's (as vLLM stops on both)."""
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        for token in value if isinstance(value, list | tuple) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids


def _batches(items: list, max_rows: int) -> list[list]:
    """Split requests into batches of at most ``max_rows`` sampled sequences (a request of n counts n)."""
    batches, current, rows = [], [], 0
    for item in items:
        if current and rows + item[0].n > max_rows:
            batches.append(current)
            current, rows = [], 0
        current.append(item)
        rows += item[0].n
    if current:
        batches.append(current)
    return batches

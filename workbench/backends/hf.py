"""Generation with transformers ``generate``: the small CPU fallback backend.

Concurrent requests (many agents of many episodes at once) are collected by a micro-batcher
and decoded together in one left-padded ``generate`` call per sampling setting. Log-probs are
those of the raw model distribution for the sampled tokens (as vLLM reports by default).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from transformers import StoppingCriteria

from workbench.backends.base import BackendError, Generation, GenerationRequest, cut_at_stop


class HFBackend:
    """A transformers model behind the async backend interface."""

    name = "hf"

    def __init__(
        self, model: str | Path | Any, tokenizer: Any = None, max_batch: int = 32, dtype: str = "float32"
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str | Path):
            from workbench.models import resolve

            path = resolve(str(model))
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        else:
            self.model, self.tokenizer = model, tokenizer
        self.model.eval()
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.max_batch = max_batch
        self.policy_version = 0
        self._queue: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def generate(self, request: GenerationRequest) -> list[Generation]:
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
            await asyncio.sleep(0)  # let every ready coroutine enqueue before we batch
            self._wakeup.clear()
            pending, self._queue = self._queue, []
            groups: dict[tuple, list] = defaultdict(list)
            for request, future in pending:
                groups[request.sampling_key()].append((request, future))
            for items in groups.values():
                for batch in _batches(items, self.max_batch):
                    try:
                        results = await asyncio.to_thread(self._generate_batch, [r for r, _ in batch])
                    except Exception as error:  # noqa: BLE001 - hand the failure to every waiter
                        for _, future in batch:
                            if not future.done():
                                future.set_exception(error)
                        continue
                    for (_, future), result in zip(batch, results, strict=True):
                        if not future.done():
                            future.set_result(result)

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[list[Generation]]:

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

        first = requests[0]
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
        greedy = first.temperature == 0.0
        if first.seed is not None:
            torch.manual_seed(first.seed)
        with torch.no_grad():
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=first.max_tokens,
                do_sample=not greedy,
                temperature=None if greedy else first.temperature,
                top_p=None if greedy else first.top_p,
                top_k=None if greedy else first.top_k,
                pad_token_id=pad_id,
                eos_token_id=self.eos_ids,
                stopping_criteria=[_StopStrings(self.tokenizer, first.stop, width)] if first.stop else None,
            )
            new_tokens = sequences[:, width:]
            chosen = self._logprobs(sequences, attention, width)
        elapsed = time.perf_counter() - started
        generations = []
        for i in range(len(rows)):
            ids = new_tokens[i].tolist()
            n = next((k + 1 for k, t in enumerate(ids) if t in self.eos_ids), len(ids))
            finish = "stop" if ids[:n] and ids[n - 1] in self.eos_ids else "length"
            cut, stop_reason = cut_at_stop(self.tokenizer, ids[:n], first.stop)
            if stop_reason is not None:
                n, finish = cut, "stop"
            generations.append(
                Generation(
                    completion_ids=ids[:n],
                    logprobs=chosen[i, :n].tolist(),
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

    def _logprobs(self, sequences: Any, prompt_mask: Any, width: int) -> Any:
        """Raw-model log-probs of the generated tokens, from one teacher-forced pass (cheaper than
        keeping every step's logits during generation)."""
        import torch

        mask = torch.cat([prompt_mask, torch.ones_like(sequences[:, width:])], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=sequences, attention_mask=mask, position_ids=positions).logits
        logprobs = logits[:, width - 1 : -1].float().log_softmax(-1)
        return logprobs.gather(-1, sequences[:, width:].unsqueeze(-1)).squeeze(-1)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()


class _StopStrings(StoppingCriteria):
    """Ends a row once its decoded completion contains a stop string (the rule of ``cut_at_stop``).

    transformers' own ``stop_strings`` matches token strings and can end a row early (it stopped
    after one newline token for the stop string of two newlines), so rows are checked on decoded
    text: at each step only the tail of each completion, long enough to hold any stop string.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], width: int):
        self.tokenizer, self.stop, self.width = tokenizer, [s for s in stop if s], width
        self.tail = 4 * max((len(s.encode()) for s in self.stop), default=1) + 4  # tokens: >= 1 byte each

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = [
            any(s in self.tokenizer.decode(row[-self.tail :], skip_special_tokens=False) for s in self.stop)
            for row in input_ids[:, self.width :].tolist()
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


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

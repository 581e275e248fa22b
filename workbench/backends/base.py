"""The one async interface every generation backend implements (vLLM, transformers, OpenAI-compatible).

The engine tokenises prompts itself (with the policy's chat template, or raw text for
completion-mode roles) and hands the backend exact token ids; the backend returns exact
completion token ids with their log-probabilities, so training never re-tokenises text.

Semantics every backend follows:
- ``n`` samples per request; ``generate`` returns a list of ``n`` generations.
- A stop string ends a completion and stays in it: ``completion_ids`` run up to and including the
  token that completed the stop string, ``text`` is their decoding, ``stop_reason`` names the string.
- ``finish_reason`` is ``"stop"`` (end-of-sequence or a stop string) or ``"length"`` (``max_tokens``).
- ``logprobs`` are the raw model's log-probabilities of the sampled tokens (before temperature).
- ``ignore_eos`` decodes on past end-of-sequence to ``max_tokens`` (vLLM's ``SamplingParams.ignore_eos``):
  benchmarks use it to fix completion lengths.
- ``adapter`` names a LoRA adapter of the base model, for roles bound to per-role adapters.
- ``retokenized`` is True only where a backend could not get the engine's token ids (an
  OpenAI-compatible server without token-id output) and re-tokenised the text: such samples
  carry approximate ids and log-probs, and training must refuse them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...] | list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    adapter: str | None = None
    ignore_eos: bool = False

    def sampling_key(self) -> tuple:
        """Requests with the same key can be decoded in one batch."""
        return (
            self.max_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            self.stop,
            self.seed,
            self.adapter,
            self.ignore_eos,
        )


@dataclass
class Generation:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None = None  # the stop string that ended it, if any
    policy_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    retokenized: bool = False  # ids re-tokenised from text, not the engine's: never train on these


@runtime_checkable
class Backend(Protocol):
    """A generator for one policy. ``tokenizer`` is a Hugging Face tokenizer with a chat template."""

    name: str
    tokenizer: object
    policy_version: int

    async def generate(self, request: GenerationRequest) -> list[Generation]: ...

    def close(self) -> None: ...


class BackendError(RuntimeError):
    """A backend that cannot start or cannot serve a request."""


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids of chat ``messages`` through the tokenizer's chat template, ready for a reply."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def fit_to_context(request: GenerationRequest, context: int | None) -> GenerationRequest:
    """``request`` with its completion cut to what a ``context``-token window leaves after the prompt; a
    ``BackendError`` naming the fix for a prompt that fills the window (the engine records it on the call's
    episode, and the rest of the batch goes on)."""
    if not isinstance(context, int) or context <= 0:
        return request
    n = len(request.prompt_ids)
    if n >= context:
        raise BackendError(
            f"the prompt has {n} tokens and the model's context window holds {context}: shorten the "
            "question, the conversation or the tool results it carries, or use a model with a longer context"
        )
    if n + request.max_tokens > context:
        return dataclasses.replace(request, max_tokens=context - n)
    return request


def cut_at_stop(tokenizer: object, ids: list[int], stop: tuple[str, ...]) -> tuple[int, str | None]:
    """Length of the shortest prefix of ``ids`` whose text contains a stop string, and that string.

    Returns ``(len(ids), None)`` when no stop string occurs.
    """
    if not stop:
        return len(ids), None
    text = tokenizer.decode(ids, skip_special_tokens=False)
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if not hits:
        return len(ids), None
    _, first = min(hits)
    lo, hi = 1, len(ids)
    while lo < hi:  # the smallest k with the stop string complete in decode(ids[:k])
        mid = (lo + hi) // 2
        if first in tokenizer.decode(ids[:mid], skip_special_tokens=False):
            hi = mid
        else:
            lo = mid + 1
    return lo, first

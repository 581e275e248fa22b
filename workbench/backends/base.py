"""The one async interface every generation backend implements (vLLM, transformers, OpenAI-compatible).

The engine tokenises prompts itself with the policy's chat template and hands the backend exact
token ids; the backend returns exact completion token ids with their log-probabilities, so
training never re-tokenises text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max_tokens)
    policy_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """A generator for one policy. ``tokenizer`` is a Hugging Face tokenizer with a chat template."""

    name: str
    tokenizer: object
    policy_version: int

    async def generate(self, request: GenerationRequest) -> Generation: ...

    def close(self) -> None: ...


class BackendError(RuntimeError):
    """A backend that cannot start or cannot serve a request."""

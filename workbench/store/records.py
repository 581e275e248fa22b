"""What a rollout produces: an episode is a tree of calls, each with exact tokens and log-probs.

Plain data at the bottom layer: the engine fills these records, rewards and the trainer read them, and
the store writes them (``StepWriter.add_record``). ``workbench.engine.records`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codec import TokenOwner


@dataclass
class CallRecord:
    role: str
    node: str
    position: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    prompt_text: str
    completion_text: str
    finish_reason: str
    policy: str
    policy_version: int
    trainable: bool
    parent: int | None = None  # position of the parent call within the episode (nested agents)
    source: int | None = None  # position of the call whose output this call consumed (provenance)
    parsed: Any = None
    format_error: str | None = None
    mask: list[int] | None = None  # TokenOwner code per completion token; None: all the role's own
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)  # reward, accuracy, format (workbench.rewards)
    advantage: float | None = None  # set when the call is trained on, stored with it

    def owners(self) -> list[int]:
        """The `TokenOwner` code of each completion token, as stored and as trained: the engine's mask
        (None: all the role's own), with the role's own tokens MASKED when its role is not trained."""
        owners = [int(TokenOwner.TRAINABLE)] * len(self.completion_ids) if self.mask is None else self.mask
        if self.trainable:
            return owners
        return [int(TokenOwner.MASKED) if o == TokenOwner.TRAINABLE else o for o in owners]


@dataclass
class EpisodeRecord:
    task_id: str
    group: str
    sample: int
    answer: str = ""
    status: str = "complete"  # complete | call_limit | error
    error: str | None = None
    reward: float | None = None  # the outcome reward (the final answer checked), set by the engine
    variables: dict[str, Any] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)

"""What a rollout produces: an episode is a tree of calls, each with exact tokens and log-probs.

Plain data at the bottom layer: the engine fills these records, rewards and the trainer read them, and
the store writes them (``StepWriter.add_record``). ``workbench.engine.records`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codec import TokenOwner


@dataclass(kw_only=True)
class CallFields:
    """What a call holds wherever it is, declared once: the engine's `CallRecord` and the store's row
    (`workbench.store.call_row.CallRow`) both extend it. Token arrays are lists in a record; the store also
    takes numpy arrays or CPU tensors. `mask` holds a TokenOwner code per completion token (None: all the
    role's own); empty collections are stored as NULL; `rewards` maps reward names to numbers (reward, accuracy, format: workbench.rewards); `advantage`
    is set when the call is trained on."""

    role: str
    policy: str | None = None
    policy_version: int | None = None
    position: int | None = None  # order within the episode
    prompt_ids: Any = None
    completion_ids: Any = None
    logprobs: Any = None
    mask: Any = None
    prompt_text: str | None = None
    completion_text: str | None = None
    format_error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None


@dataclass(kw_only=True)
class CallRecord(CallFields):
    """One call of an episode as the engine made it: every `CallFields` entry filled (lists, dicts), plus
    the topology node, the finish reason and the episode-relative links to other calls."""

    node: str
    finish_reason: str
    trainable: bool
    parent: int | None = None  # position of the parent call within the episode (nested agents)
    source: int | None = None  # position of the call whose output this call consumed (provenance)
    previous: int | None = None  # grouped rollouts: position of the call before it on its branch
    parsed: Any = None

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

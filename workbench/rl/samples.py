"""Training samples: the view of one call the trainer learns from.

A sample is a call's exact prompt and completion token ids (as the engine produced them), which
completion tokens train (the role's own generated tokens; tool results and other roles' text are
masked), the engine's log-probs of those tokens, and the call's reward, group and advantage. A sample
keeps its call, so the advantage it is trained with is written back to the call (and stored with it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.store.codec import TokenOwner

if TYPE_CHECKING:
    from workbench.store.records import CallRecord, EpisodeRecord


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]  # 1 where the completion token trains the policy, 0 elsewhere
    old_logprobs: list[float]  # the engine's log-probs of the completion tokens
    role: str = ""
    policy: str = "base"
    policy_version: int = 0
    reward: float = 0.0
    group: tuple[Any, ...] = ()
    advantage: float = 0.0
    episode: int = -1  # index of the episode in its step
    position: int = -1  # position of the call in its episode
    parent: int | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    call: CallRecord | None = field(default=None, repr=False, compare=False)  # the call it was made from

    def __getstate__(self) -> dict[str, Any]:
        """A sample travels (to trainer ranks) without its call: training needs only its tokens."""
        return {**self.__dict__, "call": None}

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


def from_call(call: CallRecord, episode_index: int) -> Sample:
    """A sample from a call: its tokens whose owner (`CallRecord.owners`) is TRAINABLE train."""
    return Sample(
        prompt_ids=list(call.prompt_ids),
        completion_ids=list(call.completion_ids),
        mask=[int(o == TokenOwner.TRAINABLE) for o in call.owners()],
        old_logprobs=list(call.logprobs),
        role=call.role,
        policy=call.policy,
        policy_version=call.policy_version,
        reward=float(call.rewards.get("reward", 0.0)) if call.rewards else 0.0,
        episode=episode_index,
        position=call.position,
        parent=call.parent,
        rewards=dict(call.rewards),
        call=call,
    )


def from_episodes(episodes: list[EpisodeRecord]) -> list[Sample]:
    """One sample per rewarded call of the episodes (calls with no reward, e.g. ``kind: none``, are left out)."""
    return [from_call(c, i) for i, e in enumerate(episodes) for c in e.calls if c.rewards]

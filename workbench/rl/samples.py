"""Training samples: the view of one call the trainer learns from.

A sample is a call's exact prompt and completion token ids (as the engine produced them), which
completion tokens train (the role's own generated tokens; tool results and other roles' text are
masked), the engine's log-probs of those tokens, and the call's reward, group and advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.engine.records import CallRecord, EpisodeRecord


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

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


def from_call(call: CallRecord, episode_index: int, trainable_owner: int = 1) -> Sample:
    """A sample from a call; tokens whose owner code is not ``trainable_owner`` are masked."""
    owners = call.mask if call.mask is not None else [trainable_owner] * len(call.completion_ids)
    mask = [int(o == trainable_owner) for o in owners] if call.trainable else [0] * len(owners)
    return Sample(
        prompt_ids=list(call.prompt_ids),
        completion_ids=list(call.completion_ids),
        mask=mask,
        old_logprobs=list(call.logprobs),
        role=call.role,
        policy=call.policy,
        policy_version=call.policy_version,
        reward=float(call.rewards.get("reward", 0.0)) if call.rewards else 0.0,
        episode=episode_index,
        position=call.position,
        parent=call.parent,
        rewards=dict(call.rewards),
    )


def from_episodes(episodes: list[EpisodeRecord]) -> list[Sample]:
    """One sample per rewarded call of the episodes (calls with no reward, e.g. ``kind: none``, are left out)."""
    return [from_call(c, i) for i, e in enumerate(episodes) for c in e.calls if c.rewards]

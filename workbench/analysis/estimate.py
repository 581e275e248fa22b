"""Monte-Carlo estimates of a call's value from replays: Q (keep the call), V (resample it), Q - V.

Q is the mean outcome of episodes that keep the call and resample what follows it; V the mean outcome of
episodes resampled from the call itself (its parent state). Their difference estimates the call's
advantage, with the standard error of a difference of two independent means (sample variances, ddof 1).
Both arms seed their continuations alike (common random numbers), which correlates them positively:
the error shown is then an upper bound. Outcomes are the episode's reward and the mean reward of each
role's calls from the replayed one on (the replayed call included, and the calls it runs inside).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.store.records import EpisodeRecord


@dataclass(frozen=True)
class Mean:
    """A sample mean with its standard error (NaN with fewer than two values)."""

    mean: float
    stderr: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Mean:
        n = len(values)
        if n == 0:
            return cls(math.nan, math.nan, 0)
        mean = sum(values) / n
        if n < 2:
            return cls(mean, math.nan, n)
        variance = sum((v - mean) ** 2 for v in values) / (n - 1)
        return cls(mean, math.sqrt(variance / n), n)

    def minus(self, other: Mean) -> Mean:
        """The difference of two independent means, with its standard error."""
        return Mean(self.mean - other.mean, math.hypot(self.stderr, other.stderr), min(self.n, other.n))


@dataclass
class CallEstimate:
    """A call's Monte-Carlo value (Q), its parent state's (V) and their difference, per outcome.

    ``outcomes`` names what was averaged: ``episode`` (the episode's reward) and ``role/<name>`` (the mean
    reward of that role's calls from the replayed one on). ``grpo_advantage`` is the advantage the call was
    trained with (None for a call of a rollout, or one not trained on).
    """

    call_id: int
    role: str
    q: dict[str, Mean]
    v: dict[str, Mean]
    grpo_advantage: float | None = None
    replaced: dict[str, Mean] = field(default_factory=dict)  # Q of the researcher's replacement text

    @property
    def advantage(self) -> Mean:
        """The episode-outcome advantage estimate Q - V."""
        return self.advantage_of("episode")

    def advantage_of(self, outcome: str) -> Mean:
        """Q - V of one outcome (``episode`` or ``role/<name>``); NaN where an arm never scored it."""
        return self.q.get(outcome, Mean.of([])).minus(self.v.get(outcome, Mean.of([])))

    @property
    def own_outcome(self) -> str:
        """The call's own role's outcome (what its GRPO advantage was computed from, with agent-specific
        rewards) where both arms scored it, else the episode's."""
        own = f"role/{self.role}"
        return own if own in self.q and own in self.v else "episode"

    def frame(self) -> Any:
        """One row per outcome: q, q_se, v, v_se, advantage, advantage_se, n (and the replacement's Q)."""
        import pandas as pd

        rows = []
        for name in sorted(set(self.q) | set(self.v), key=lambda k: (k != "episode", k)):
            q, v = self.q.get(name, Mean.of([])), self.v.get(name, Mean.of([]))
            diff = q.minus(v)
            row = {
                "outcome": name,
                "q": q.mean,
                "q_se": q.stderr,
                "v": v.mean,
                "v_se": v.stderr,
                "advantage": diff.mean,
                "advantage_se": diff.stderr,
                "n_q": q.n,
                "n_v": v.n,
                "grpo_advantage": self.grpo_advantage if name == "episode" else None,
            }
            if self.replaced:
                r = self.replaced.get(name, Mean.of([]))
                row.update(q_replaced=r.mean, q_replaced_se=r.stderr)
            rows.append(row)
        return pd.DataFrame(rows).set_index("outcome")

    def __repr__(self) -> str:
        a = self.advantage
        return (
            f"CallEstimate(call {self.call_id} ({self.role}): Q {self.q['episode'].mean:.3f}, "
            f"V {self.v['episode'].mean:.3f}, advantage {a.mean:+.3f} ± {a.stderr:.3f}, "
            f"GRPO advantage {self.grpo_advantage})"
        )

    def _repr_html_(self) -> str:
        return f"<p>{self!r}</p>" + self.frame().to_html(float_format=lambda x: f"{x:.3f}")


def outcomes(
    reward: float | None,
    calls: Iterable[tuple[str, int, dict | None]],
    point: int,
    ancestors: Collection[int] = (),
) -> dict[str, float]:
    """What a replayed episode scored: its ``reward``, and each role's mean call reward (``calls``: role,
    position, rewards) from position ``point`` on (the replayed call included: kept in Q, sampled again in V)
    and of the calls it runs inside (``ancestors``: their turns after it are sampled again)."""
    out = {"episode": float(reward or 0.0)}
    by_role: dict[str, list[float]] = {}
    for role, position, rewards in calls:
        value = (rewards or {}).get("reward")
        if (position >= point or position in ancestors) and value is not None:
            by_role.setdefault(role, []).append(float(value))
    out.update({f"role/{r}": sum(v) / len(v) for r, v in by_role.items()})
    return out


def means(episodes: Sequence[EpisodeRecord], point: int, ancestors: Collection[int] = ()) -> dict[str, Mean]:
    """Each outcome's mean over ``episodes`` (a role's over the episodes where it was rewarded)."""
    return mean_of(
        outcomes(e.reward, ((c.role, c.position, c.rewards) for c in e.calls), point, ancestors)
        for e in episodes
    )


def mean_of(scored: Iterable[dict[str, float]]) -> dict[str, Mean]:
    """Each outcome's mean over episodes' ``outcomes``."""
    values: dict[str, list[float]] = {}
    for episode in scored:
        for name, value in episode.items():
            values.setdefault(name, []).append(value)
    return {name: Mean.of(v) for name, v in values.items()}

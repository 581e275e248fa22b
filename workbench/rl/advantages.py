"""Group-relative advantages (GRPO) per role, MATPO's planner-to-worker broadcast and MARS's balancing.

Each sample falls into one group by its role's ``reward.group_by`` (``workbench.topology.spec.RewardRule``):

- ``task``: the role's samples for one task (MARS: per question and system);
- ``input``: the role's samples that consumed the same upstream output (MarsRL's grouped rollouts:
  per role and input instance).

A group's advantages are ``(r - mean) / (std + eps)`` (``scale=False``: ``r - mean``, Dr. GRPO). A group
whose rewards are all equal gets zeros; their share is reported, since such groups teach nothing.
Samples of a ``parent`` role take the advantage of the call that invoked them (MATPO). After the
advantages are known, a role with ``balance`` is resampled to exactly G samples per task (MARS 3.2:
down-sample at random, or up-sample by duplication), optionally weighting by ``|advantage|``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.rl.samples import Sample

if TYPE_CHECKING:
    from workbench.engine.records import EpisodeRecord
    from workbench.topology import Topology


@dataclass
class AdvantageStats:
    groups: int = 0
    zero_variance_groups: int = 0
    per_role_groups: dict[str, int] = field(default_factory=dict)
    per_role_zero_variance: dict[str, int] = field(default_factory=dict)
    balanced: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (before, after)

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.groups if self.groups else 0.0


def group_key(sample: Sample, episodes: Sequence[EpisodeRecord], topology: Topology) -> tuple[Any, ...]:
    """The advantage group of a sample: its role and task, plus its input for ``group_by: input``."""
    episode = episodes[sample.episode]
    rule = topology.roles[sample.role].reward if sample.role in topology.roles else None
    if rule is not None and rule.group_by == "input":
        call = next(c for c in episode.calls if c.position == sample.position)
        # forks of one branch share the episode and the source position
        return (sample.role, episode.group, sample.episode, call.source)
    return (sample.role, episode.group)


def compute_advantages(
    samples: list[Sample],
    episodes: Sequence[EpisodeRecord],
    topology: Topology,
    eps: float = 1e-4,
    scale: bool = True,
) -> AdvantageStats:
    """Set ``group`` and ``advantage`` on every sample (in place); returns group statistics."""
    stats = AdvantageStats()
    by_group: dict[tuple[Any, ...], list[Sample]] = defaultdict(list)
    inherit: list[Sample] = []
    for sample in samples:
        rule = topology.roles[sample.role].reward if sample.role in topology.roles else None
        if rule is not None and rule.kind == "parent" and sample.parent is not None:
            inherit.append(sample)
            continue
        sample.group = group_key(sample, episodes, topology)
        by_group[sample.group].append(sample)
    for key, members in by_group.items():
        rewards = np.array([s.reward for s in members], dtype=np.float64)
        centred = rewards - rewards.mean()
        std = rewards.std(ddof=1) if len(rewards) > 1 else 0.0  # TRL and the GRPO papers use the sample std
        zero = bool(np.allclose(rewards, rewards[0]))
        values = np.zeros_like(rewards) if zero else (centred / (std + eps) if scale else centred)
        for sample, value in zip(members, values, strict=True):
            sample.advantage = float(value)
        role = key[0]
        stats.groups += 1
        stats.per_role_groups[role] = stats.per_role_groups.get(role, 0) + 1
        if zero:
            stats.zero_variance_groups += 1
            stats.per_role_zero_variance[role] = stats.per_role_zero_variance.get(role, 0) + 1
    by_call = {(s.episode, s.position): s for s in samples}
    for sample in inherit:
        parent = by_call.get((sample.episode, sample.parent))
        sample.advantage = parent.advantage if parent is not None else 0.0
        sample.group = parent.group if parent is not None else (sample.role, sample.episode)
    return stats


def balance(
    samples: list[Sample],
    topology: Topology,
    group_size: int,
    rng: random.Random,
    stats: AdvantageStats | None = None,
) -> list[Sample]:
    """MARS's balancing: each role with ``reward.balance`` gets exactly ``group_size`` samples per task.

    Down-sampling draws without replacement; up-sampling adds duplicates drawn with replacement. The
    ``advantage_weighted`` mode draws proportionally to ``|advantage|`` (plus a small floor, so samples
    with zero advantage can still be drawn). A task with no sample of the role stays without one.
    ``verdicts`` (verifier roles) is another kind: see :func:`balance_verdicts`.
    """
    out: list[Sample] = []
    per_task: dict[tuple[str, Any], list[Sample]] = defaultdict(list)
    verdicts: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        mode = topology.roles[sample.role].reward.balance if sample.role in topology.roles else "none"
        if mode == "none":
            out.append(sample)
        elif mode == "verdicts":
            verdicts[sample.role].append(sample)
        else:
            per_task[(sample.role, sample.group[1] if len(sample.group) > 1 else None)].append(sample)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for role, members in verdicts.items():
        chosen = balance_verdicts(members, rng)
        counts[role] = [len(members), len(chosen)]
        out.extend(chosen)
    for (role, _), members in per_task.items():
        mode = topology.roles[role].reward.balance
        weights = [abs(s.advantage) + 1e-3 for s in members] if mode == "advantage_weighted" else None
        if len(members) > group_size:
            chosen = _draw_without_replacement(members, group_size, weights, rng)
        else:
            extra = rng.choices(members, weights=weights, k=group_size - len(members))
            chosen = members + extra
        counts[role][0] += len(members)
        counts[role][1] += len(chosen)
        out.extend(chosen)
    if stats is not None:
        stats.balanced.update({role: (before, after) for role, (before, after) in counts.items()})
    return out


def balance_verdicts(members: list[Sample], rng: random.Random) -> list[Sample]:
    """A verifier role's advantage groups, as many judging a correct solution as judging a wrong one.

    Only groups that carry a gradient (some advantage not 0) are dropped: whole groups of the more common
    kind, drawn at random. Without this, a step whose Solver was mostly right trains the Verifier mostly
    to say "Correct", whatever it reads: the prior, not the check. A group whose every verdict was right
    counts on its side without a gradient, so once the Verifier is sure of right solutions its groups on
    wrong ones still train; a side it gets all wrong (stuck on one verdict) counts nothing.
    """
    groups: dict[Any, list[Sample]] = defaultdict(list)
    for sample in members:
        groups[sample.group].append(sample)
    kept: list[Sample] = []
    learning: dict[bool, list[list[Sample]]] = {True: [], False: []}
    settled = {True: 0, False: 0}
    for group in groups.values():
        if "judged_correct" not in group[0].rewards:
            kept += group
            continue
        side = group[0].rewards["judged_correct"] >= 1.0
        if all(s.advantage == 0 for s in group):
            kept += group
            settled[side] += all(s.reward >= 1.0 for s in group)
        else:
            learning[side].append(group)
    for side, other in ((True, False), (False, True)):
        n = min(len(learning[side]), len(learning[other]) + settled[other])
        for group in rng.sample(learning[side], n):
            kept += group
    return kept


def _draw_without_replacement(
    members: list[Sample], k: int, weights: list[float] | None, rng: random.Random
) -> list[Sample]:
    if weights is None:
        return rng.sample(members, k)
    # Efraimidis-Spirakis: key u^(1/w) per item, keep the k largest
    keys = [rng.random() ** (1.0 / w) for w in weights]
    order = sorted(range(len(members)), key=keys.__getitem__, reverse=True)
    return [members[i] for i in order[:k]]

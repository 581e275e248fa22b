"""Which upstream outputs a grouped rollout carries forward (MarsRL's agentic sampling strategies).

Each strategy picks ``k`` of the items that reached a node, given each item's upstream reward:

- ``random``: uniformly at random.
- ``balanced``: as many items with reward 1 as with reward 0 (1 + 1 for k = 2), filled from the
  others when one side runs short.
- ``adaptive``: items whose reward equals ``prefer`` first (a Verifier prefers wrong solutions, a
  Corrector prefers correctly flagged ones), then the others.

The paper leaves the short-supply case open; here the pick is always filled from the remaining
items, so fewer than ``k`` come back only when fewer than ``k`` arrived.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

Selector = Callable[[Sequence[T], Sequence[float | None], int, int, random.Random], list[T]]


def select_random(
    items: Sequence[T], rewards: Sequence[float | None], k: int, prefer: int, rng: random.Random
) -> list[T]:
    return rng.sample(list(items), min(k, len(items)))


def select_balanced(
    items: Sequence[T], rewards: Sequence[float | None], k: int, prefer: int, rng: random.Random
) -> list[T]:
    positives = [x for x, r in zip(items, rewards, strict=True) if _positive(r)]
    negatives = [x for x, r in zip(items, rewards, strict=True) if not _positive(r)]
    rng.shuffle(positives)
    rng.shuffle(negatives)
    chosen = positives[: (k + 1) // 2] + negatives[: k // 2]
    rest = [x for x in positives + negatives if not any(x is c for c in chosen)]
    return chosen + rest[: k - len(chosen)]


def select_adaptive(
    items: Sequence[T], rewards: Sequence[float | None], k: int, prefer: int, rng: random.Random
) -> list[T]:
    preferred = [x for x, r in zip(items, rewards, strict=True) if _positive(r) == bool(prefer)]
    others = [x for x, r in zip(items, rewards, strict=True) if _positive(r) != bool(prefer)]
    rng.shuffle(preferred)
    rng.shuffle(others)
    return (preferred + others)[:k]


SELECTORS: dict[str, Selector] = {
    "random": select_random,
    "balanced": select_balanced,
    "adaptive": select_adaptive,
}


def _positive(reward: float | None) -> bool:
    return reward is not None and reward >= 0.5

"""What one episode carries while a rollout runs it: its record and next call position, a grouped rollout's
branches, and the signal that the rollout was cancelled. Shared by the runner and its agent and tool parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.engine.records import EpisodeRecord


class Cancelled(Exception):
    """Raised inside an episode once the rollout is cancelled."""


@dataclass
class EpisodeState:
    """Mutable state of one episode while it runs: its record and the next call position."""

    record: EpisodeRecord
    seed: int | None = None  # the seed its requests' seeds derive from (None: unseeded)
    next_position: int = 0
    calls_made: dict[int, int] = field(default_factory=dict)  # per flow walk: calls so far

    def reserve(self) -> int:
        self.next_position += 1
        return self.next_position - 1


@dataclass
class Branch:
    """One line of a grouped rollout: its variables, its episode, and the output it carries forward."""

    variables: dict[str, Any]
    state: EpisodeState
    source: int | None = None  # position of the call whose output this branch carries
    reward: float | None = None  # that call's reward, which selectors read
    calls: int = 0
    last: int | None = None  # position of the branch's latest call

    def fork(self) -> Branch:
        return Branch(dict(self.variables), self.state, self.source, self.reward, self.calls, self.last)

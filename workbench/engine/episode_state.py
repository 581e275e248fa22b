"""What one episode carries while a rollout runs it: its record, its calls' positions and places, a grouped
rollout's branches, and the signal that the rollout was cancelled. Shared by the runner and its agent and tool
parts.

A call's *place* is where it sits in the episode's structure, whatever the timing: the line it runs on (the
episode's own, or a branch: a map item, an agent of an emitted graph, a distilled bin, an agent call's tool
call) and its index on that line. Places read ``slot(.branch.slot)*``: ``"3"`` is the fourth call of the
episode's own line, ``"2.1.0"`` the first call of the second branch that the fork at slot 2 opened, ``"3.0.0"``
the first call of the subflow that the agent call at ``"3"`` ran as its first tool call. A call's request seeds
derive from its place (``workbench.engine.forcing.request_seed``), so what parallel branches draw does not
depend on which starts first; on a line without branches a call's place is its position, as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.engine.records import EpisodeRecord


class Cancelled(Exception):
    """Raised inside an episode once the rollout is cancelled."""


@dataclass
class EpisodeState:
    """Mutable state of one line of an episode while it runs: the record and the positions (shared by all the
    episode's lines) and this line's place; ``fork`` and ``under`` open branch lines."""

    record: EpisodeRecord
    seed: int | None = None  # the seed its requests' seeds derive from (None: unseeded)
    positions: Iterator[int] = field(default_factory=itertools.count)  # next call positions, by start
    places: dict[int, str] = field(default_factory=dict)  # each call's place, by its position
    line: str = ""  # this line's place prefix: "" the episode's own line
    slots: int = 0  # slots taken on this line

    def take(self) -> str:
        """The place of the next call or fork on this line."""
        self.slots += 1
        return f"{self.line}{self.slots - 1}"

    def fork(self, branches: int) -> list[EpisodeState]:
        """The lines of ``branches`` parallel branches, opened at this line's next slot."""
        slot = self.take()
        return [replace(self, line=f"{slot}.{i}.", slots=0) for i in range(branches)]

    def under(self, position: int, index: int) -> EpisodeState:
        """The line of the ``index``-th tool call of the agent call at ``position`` (an agent tool's subflow)."""
        return replace(self, line=f"{self.places[position]}.{index}.", slots=0)


def place_key(place: str) -> tuple[int, ...]:
    """A place as a sort key: calls in the order of the episode's structure (a parent before its subflow)."""
    return tuple(int(part) for part in place.split("."))


def renumber(record: EpisodeRecord, places: dict[int, str], reorder: bool = True) -> None:
    """Record each call's place (``timings["place"]``) and, with ``reorder``, number the episode's calls in the
    order of their places instead of the order they started in: the same episode is stored the same, however
    it ran."""
    order = sorted(record.calls, key=lambda c: place_key(places[c.position]) if reorder else c.position)
    new = {c.position: i if reorder else c.position for i, c in enumerate(order)}
    for call in order:
        call.timings["place"] = places[call.position]
        call.position = new[call.position]
        call.parent, call.source, call.previous = (
            None if p is None else new[p] for p in (call.parent, call.source, call.previous)
        )
    record.calls = order


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

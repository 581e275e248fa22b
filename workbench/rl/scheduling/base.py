"""What every scheduler hands the training loop each step, and the helpers they share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from workbench.engine.records import CallRecord, EpisodeRecord
    from workbench.tasks import Task

BatchFor = Callable[[int], "list[Task]"]  # the tasks of a step (the run's seeded data order)


@dataclass
class StepRollout:
    """One step's share of the rollout.

    ``train`` holds what trains now: whole episodes, or (agent-level pipeline) views of episodes that
    carry only the calls scored since the last step. ``episodes`` are the episodes that finished and
    are stored at this step (for the synchronous and async schedulers the same list).
    """

    episodes: list[EpisodeRecord]
    train: list[EpisodeRecord]
    trainer_wait_s: float = 0.0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # the scheduler's own (cluster/*)


class Scheduler(Protocol):
    """How rollout and training take turns; see ``workbench.rl.scheduling``."""

    def rollout(self, step: int) -> StepRollout:
        """The episodes that train at ``step`` (blocks until they are ready)."""
        ...

    def published(self, step: int) -> None:
        """The weights updated at ``step`` have reached the rollout backends."""
        ...

    def run(self, factory: Callable[[], Coroutine]) -> Any:
        """Run a coroutine where the rollout backends live (held-out evaluation)."""
        ...

    def close(self) -> None: ...


def view(record: EpisodeRecord, calls: list[CallRecord]) -> EpisodeRecord:
    """The episode with only ``calls`` (the same call objects): what one pipeline step trains of it."""
    return dataclasses.replace(record, calls=list(calls))


def input_lag_metrics(episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
    """How much older the policy was that wrote a call's input (its source call) than the call's own."""
    lags = []
    for episode in episodes:
        by_position = {c.position: c for c in episode.calls}
        for call in episode.calls:
            source = by_position.get(call.source) if call.source is not None else None
            if source is not None:
                lags.append(call.policy_version - source.policy_version)
    return {
        "pipeline/input_lag_max": float(max(lags, default=0)),
        "pipeline/input_lag_mean": sum(lags) / len(lags) if lags else 0.0,
    }

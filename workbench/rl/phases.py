"""The phases of a training step and the one timer they run under.

A step runs its phases in this order: rollout, score, advantages, evaluation (when due), update, sync,
record and checkpoint (when due). Each runs under ``StepTimer.phase``, and ``StepTimer.metrics`` gives
the step's ``time/*`` metrics: one per phase finished so far, named in ``METRICS``, and ``time/step_s``,
the wall time since the step began. The trainer splits the update further (its own
``time/old_logprobs_s`` and ``time/update_s``). Record and checkpoint end after the step's metrics are
stored, so they have no metric of their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("rollout", "score", "advantages", "evaluation", "update", "sync", "record", "checkpoint")

METRICS = {
    "rollout": "time/rollout_s",
    "score": "time/score_s",
    "advantages": "time/advantages_s",
    "evaluation": "time/evaluation_s",
    "update": "time/train_s",
    "sync": "time/weight_sync_s",
}


class StepTimer:
    """Seconds of each phase of one step, from the moment the timer is made."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as the phase ``name`` (one of ``PHASES``)."""
        if name not in PHASES:
            raise ValueError(f"a step's phase is one of {', '.join(PHASES)}, got {name!r}")
        began = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - began

    def metrics(self) -> dict[str, float]:
        """The ``time/*`` metrics of the phases done so far, and ``time/step_s``."""
        out = {METRICS[name]: s for name, s in self.seconds.items() if name in METRICS}
        out["time/step_s"] = time.perf_counter() - self.started
        return out

"""How rollout and training take turns: the scheduler a run names with ``scheduler`` in its config.

- ``sync`` (MARS): roll out the step's batch, score it, train, sync the weights, repeat.
- ``async``: the rollout runs ahead of training in a background thread by at most ``max_staleness``
  policy versions (``workbench.rl.scheduling.asynchronous``).
- ``pipeline`` (MarsRL, grouped flows): each step's rollout batch is new problems' first agents plus
  the next agent of earlier problems, decoded together; every call scored in it trains at once
  (``workbench.rl.scheduling.pipeline``).

``segment_len`` (any scheduler) decodes at most that many tokens of a request before it queues again
(``workbench.backends.segmented``); every segment's policy version is kept. The pipeline then decodes at most
one segment of a call a step and carries the rest over to the next steps. Each step records the
rollout's and the trainer's idle time (``workbench.rl.scheduling.bubbles``) and how stale its samples
were (``policy_lag/*``, from ``workbench.rl.metrics``).
"""

from __future__ import annotations

from typing import Any

from workbench.rl.scheduling.asynchronous import AsyncScheduler
from workbench.rl.scheduling.base import (
    BatchFor,
    Scheduler,
    StepRollout,
    input_lag_metrics,
)
from workbench.rl.scheduling.bubbles import BusyMeter, bubble_metrics, busiest
from workbench.rl.scheduling.pipeline import PipelineScheduler
from workbench.rl.scheduling.synchronous import SynchronousScheduler

SCHEDULERS = ("sync", "async", "pipeline")

__all__ = [
    "SCHEDULERS",
    "AsyncScheduler",
    "BatchFor",
    "BusyMeter",
    "PipelineScheduler",
    "Scheduler",
    "StepRollout",
    "SynchronousScheduler",
    "bubble_metrics",
    "busiest",
    "input_lag_metrics",
    "make_scheduler",
    "rollout_backends",
]


def make_scheduler(
    kind: str,
    engine: Any,
    batch_for: BatchFor,
    group_size: int,
    first_step: int,
    last_step: int,
    max_staleness: int = 1,
    drain_every: int | None = None,
    carry: bool = False,
) -> Scheduler:
    """The scheduler named ``kind`` (one of ``SCHEDULERS``) over ``engine``'s rollouts.

    ``drain_every``: the pipeline finishes every group in flight at each multiple of it (the checkpoints).
    ``carry``: the pipeline carries calls still decoding over to the next step (the backends are segmented).
    """
    if kind == "sync":
        return SynchronousScheduler(engine, batch_for, group_size)
    if kind == "async":
        return AsyncScheduler(engine, batch_for, group_size, first_step, last_step, max_staleness)
    if kind == "pipeline":
        return PipelineScheduler(engine, batch_for, group_size, last_step, max_staleness, drain_every, carry)
    raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {kind!r}")


def rollout_backends(backends: dict[str, Any], segment_len: int | None) -> dict[str, Any]:
    """The backends wrapped for scheduling: metered, and segmented when ``segment_len`` is set (around
    the meter, so a call waiting between two segments does not count as rollout work)."""
    from workbench.backends.segmented import SegmentedBackend

    wrapped: dict[int, Any] = {}
    for backend in backends.values():
        if id(backend) not in wrapped:
            metered = BusyMeter(backend)
            wrapped[id(backend)] = SegmentedBackend(metered, segment_len) if segment_len else metered
    return {name: wrapped[id(b)] for name, b in backends.items()}

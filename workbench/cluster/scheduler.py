"""The cluster scheduler: the synchronous schedule with the rollout on a pool of Ray workers.

Each step's batch is rolled out by the pool; after the update, ``published`` pushes the new weights to
every worker (the policy version moves on by one, as in the loop). Held-out evaluation runs on the
driver's own backends, which share the trained weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from workbench.backends.loop_thread import run_sync
from workbench.cluster.pool import RolloutPool
from workbench.rl.scheduling.base import BatchFor, StepRollout


class ClusterScheduler:
    def __init__(
        self,
        pool: RolloutPool,
        batch_for: BatchFor,
        group_size: int,
        weights: Callable[[], dict[str, Any]],
        version: int,
    ):
        self.pool, self.batch_for, self.group_size, self.weights = pool, batch_for, group_size, weights
        self.version = version
        pool.set_weights(weights(), version)

    def rollout(self, step: int) -> StepRollout:
        started = time.perf_counter()
        episodes, metrics = self.pool.rollout(self.batch_for(step), self.group_size)
        return StepRollout(episodes, episodes, time.perf_counter() - started, metrics)

    def published(self, step: int) -> None:
        self.version += 1
        self.pool.set_weights(self.weights(), self.version)

    def run(self, factory: Callable[[], Coroutine]) -> Any:
        return run_sync(factory)

    def close(self) -> None:
        self.pool.close()

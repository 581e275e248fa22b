"""The synchronous scheduler (MARS style): roll out a step's batch, then train on it, then the next.

The rollout runs in the calling thread (its own event loop per step, or a helper thread under a
notebook's running loop); the trainer idles during the rollout and the rollout during training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from workbench.backends.loop_thread import run_sync
from workbench.engine.runner import Rollout
from workbench.rl.scheduling.base import BatchFor, StepRollout


class SynchronousScheduler:
    def __init__(self, engine: Rollout, batch_for: BatchFor, group_size: int):
        self.engine, self.batch_for, self.group_size = engine, batch_for, group_size

    def rollout(self, step: int) -> StepRollout:
        started = time.perf_counter()
        batch = self.batch_for(step)
        episodes = run_sync(lambda: self.engine.run(batch, group_size=self.group_size, step=step))
        return StepRollout(episodes, episodes, trainer_wait_s=time.perf_counter() - started)

    def published(self, step: int) -> None:
        pass

    def run(self, factory: Callable[[], Coroutine]) -> Any:
        return run_sync(factory)

    def close(self) -> None:
        pass

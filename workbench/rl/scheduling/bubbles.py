"""The bubble gauge: how long the rollout backends and the trainer each sat idle in a step.

``BusyMeter`` wraps a rollout backend and adds up the wall time during which at least one request
was in flight (queued or decoding); the rest of a step is rollout idle time. The trainer's idle time
is what it spent waiting for the rollout to hand over a batch. Both go into the step's metrics
(``time/rollout_idle_s``, ``time/trainer_idle_s`` and their shares of the step, ``bubble/*``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from workbench.backends.base import Generation, GenerationRequest
from workbench.backends.wrapper import BackendWrapper


class BusyMeter(BackendWrapper):
    """Counts the seconds during which this backend had work."""

    def __init__(self, inner: Any):
        super().__init__(inner)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self._busy = 0.0

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1
        try:
            return await self.inner.generate(request)
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._busy += time.perf_counter() - self._since

    def busy_s(self) -> float:
        """Busy seconds so far, the current busy stretch included."""
        with self._lock:
            running = time.perf_counter() - self._since if self._in_flight else 0.0
            return self._busy + running


def busiest(backends: dict[str, Any]) -> float:
    """Busy seconds of the busiest metered backend (the rollout is idle only when all of them are);
    a meter is found under any wrappers around it."""
    meters = {id(m): m for m in map(_meter, backends.values()) if m is not None}
    return max((m.busy_s() for m in meters.values()), default=0.0)


def _meter(backend: Any) -> BusyMeter | None:
    while isinstance(backend, BackendWrapper):
        if isinstance(backend, BusyMeter):
            return backend
        backend = backend.inner
    return None


def bubble_metrics(step_s: float, rollout_busy_s: float, trainer_wait_s: float) -> dict[str, float]:
    """The step's idle times and their shares of the step's wall time."""
    rollout_idle = max(step_s - rollout_busy_s, 0.0)
    return {
        "time/rollout_idle_s": rollout_idle,
        "time/trainer_idle_s": trainer_wait_s,
        "bubble/rollout": rollout_idle / step_s if step_s > 0 else 0.0,
        "bubble/trainer": trainer_wait_s / step_s if step_s > 0 else 0.0,
    }

"""Live widgets: start and stop a Panel periodic callback that re-reads a run while it is shown.

``periodic(callback, period_ms)`` is ``pn.state.add_periodic_callback`` as a background task: Panel does
not raise its busy indicator around each tick (the bookkeeping cost a served dashboard more than the poll
itself, once per tick of every session). Served, the callback belongs to the session it was started in
(Bokeh removes it when the session ends).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from panel.io.callbacks import PeriodicCallback


def periodic(callback: Callable[[], Any], period_ms: int) -> PeriodicCallback:
    """Call ``callback`` every ``period_ms`` ms (served, or in a notebook with a live kernel), started now."""
    found = PeriodicCallback(callback=callback, period=period_ms, background=True)
    found.start()
    return found


class PeriodicRefresh:
    """Mixin for a widget with ``interval_ms`` and a ``_tick()`` that reads what a run wrote since the last one."""

    interval_ms: int
    _callback: Any = None

    def _tick(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        """Call ``_tick`` every ``interval_ms`` (served, or in a notebook with a live kernel)."""
        if self._callback is None:
            self._callback = periodic(self._tick, self.interval_ms)

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None


__all__ = ["PeriodicRefresh", "periodic"]

"""Live widgets: start and stop a Panel periodic callback that re-reads a run while it is shown."""

from __future__ import annotations

from typing import Any

import panel as pn


class PeriodicRefresh:
    """Mixin for a widget with ``interval_ms`` and a ``_tick()`` that reads what a run wrote since the last one."""

    interval_ms: int
    _callback: Any = None

    def _tick(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        """Call ``_tick`` every ``interval_ms`` (served, or in a notebook with a live kernel)."""
        if self._callback is None:
            self._callback = pn.state.add_periodic_callback(self._tick, period=self.interval_ms)

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None

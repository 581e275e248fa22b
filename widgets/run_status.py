"""A run's status as the live views show it: whether it may still be stopped, and a failed run's error.

``status_html(status, error)`` is the status line of the dashboard's run view and of RewardMonitor's
header; ``run_error(reader)`` is the error a failed run stored (its last ``error`` event, as
``BackgroundRun.error()`` reads it). CSS classes a browser test can find: ``wb-run-status`` (with a
``data-status`` attribute) and ``wb-run-error`` (the failed run's error).
"""

from __future__ import annotations

import html

from workbench.store import RunReader

#: Statuses of a run that is still going (or about to): only these can be stopped.
ACTIVE_STATUSES = ("created", "running")


def is_active(status: str | None) -> bool:
    """Whether a run with ``status`` is still going, so that a Stop means something."""
    return status in ACTIVE_STATUSES


def run_error(reader: RunReader) -> str | None:
    """The error the run stored last (its last ``error`` event), None if it stored none."""
    events = reader.events(kind="error")
    if events.empty:
        return None
    payload = events.iloc[-1]["payload"]
    return str(payload.get("error")) if isinstance(payload, dict) else str(payload)


def status_html(status: str, error: str | None = None) -> str:
    """The status as HTML: ``(status)``, followed by the error of a failed run."""
    line = f'<span class="wb-status wb-run-status" data-status="{html.escape(status)}">({html.escape(status)})</span>'
    if error:
        line += f' <pre class="wb-run-error">{html.escape(error)}</pre>'
    return line

"""Recording why a run ended early: the error and the run's status, as far as its store can still be written.

The training loop, a rollout (``workbench.runs``) and a run's background process (``workbench.training``)
record an early end alike.
"""

from __future__ import annotations

import traceback

from workbench.engine.runner import describe_error
from workbench.store import RunStore, StoreError


def record_end(store: RunStore, error: BaseException, status: str) -> None:
    """Store why a run ended early (an ``error`` event unless stopped) and its status, as far as the store
    can still be written: a full or read-only disk must not replace ``error`` with its own."""
    try:
        if status == "failed":
            store.log_event("error", {"error": describe_error(error), "traceback": traceback.format_exc()})
        store.set_status(status)
    except StoreError as unrecorded:
        error.add_note(f"the run store could not record this either: {unrecorded}")

"""Live tail: follow new rows of a run's table while the writer adds them.

Rows are yielded in increasing id order (steps: increasing step index, and only once complete),
in DataFrames of at most `batch_size` rows. Ids only grow (they are never reused, even after a
discarded step), so a tail never skips a committed row. A tail of `calls` shows calls of the step
being written as soon as the writer flushes them; if that step is later discarded, those calls
disappear from the store (an event `step_aborted` or `partial_step_discarded` says so).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .codec import ArrayFormat
from .errors import InvalidRecordError

if TYPE_CHECKING:
    import pandas as pd

#: Tables that can be tailed and the increasing key each is followed by.
TAILABLE = {"calls": "id", "metrics": "id", "events": "id", "steps": "step"}


def tail(
    reader: Any,
    table: str = "calls",
    since_id: int | None = None,
    poll_interval: float = 0.2,
    timeout: float | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int = 1000,
    arrays: ArrayFormat = "numpy",
) -> Iterator[pd.DataFrame]:
    """Yield DataFrames of rows of `table` of `reader` (a RunReader, which imports this module) whose key is
    greater than `since_id` (None: from the start).

    Polls every `poll_interval` seconds; stops once `timeout` seconds pass without a new row
    (None: never - break out of the loop to stop; 0: yield what is there now, then stop). Pass `reader.last_id(table)` as `since_id` to
    follow only rows written from now on.
    """
    key = TAILABLE.get(table)
    if key is None:
        raise InvalidRecordError(f"table {table!r} cannot be tailed; choose from {', '.join(TAILABLE)}")
    if not (isinstance(batch_size, int) and batch_size > 0):
        raise InvalidRecordError(f"batch_size must be a positive int, got {batch_size!r}")
    if poll_interval < 0 or (timeout is not None and timeout < 0):
        raise InvalidRecordError("poll_interval and timeout must be non-negative seconds")
    select = reader._select(table, columns, key=key)
    complete = " AND status = 'complete'" if table == "steps" else ""
    sql = f"SELECT {select} FROM {table} WHERE {key} > ?{complete} ORDER BY {key} LIMIT ?"
    cursor = -1 if since_id is None else since_id
    last_new = time.monotonic()
    while True:
        names, rows = reader._query(sql, (cursor, batch_size))
        if rows:
            cursor = rows[-1][0]
            last_new = time.monotonic()
            yield reader._frame(names, rows, arrays)
            if len(rows) == batch_size:
                continue
        if timeout is not None and time.monotonic() - last_new >= timeout:
            return
        time.sleep(poll_interval)

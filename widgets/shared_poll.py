"""Shared polling: one read of a run (and of a runs directory) per change, for every session that shows it.

A served dashboard has one session per browser tab; each tab's periodic callbacks used to run their own
queries, so 20 tabs on one run cost 20 times the queries of one, on the server's one event loop. Here
each run has one process-wide ``SharedRun`` (``shared_run(run_dir)``) that holds the run's complete
metric rows, its last complete step, status and (when failed) error. Sessions ask it to ``refresh``;
it reads the store only when the store changed since its last read (SQLite's ``PRAGMA data_version``
on its own read-only connection, which moves whenever another connection commits) and at most once
every ``min_interval`` seconds whatever the number of sessions asking; it then reads only the metric
rows past the last id it holds. ``version`` counts the changes a session can see, so a session with
nothing new does nothing. An active run's status is re-read at least every ``STATUS_MAX_AGE`` seconds
even without a commit (a killed writer makes it ``interrupted`` without writing anything).

The points of each plot are shared too: ``SharedRun.curves(names)`` is one ``Curves`` per plot and run,
each curve's steps and values as lists that the refresh appends to, so a session sends the tail past
what it sent (``Curves.tail``) without any computing of its own; its ``resets`` count moves when a row
arrives out of step order (a session then sends that plot's curves whole).

``runs_table(runs_dir)`` is the runs list the dashboards show, shared the same way: a run's row is read
again only when its database files changed (their size and modification time) or, while it is active,
every ``STATUS_MAX_AGE`` seconds; ``runs_version(runs_dir)`` moves when the table does.

All of it is guarded by locks; Panel's server calls sessions' callbacks on one thread, a notebook on
its kernel's.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from widgets.run_status import ACTIVE_STATUSES
from workbench.store import RunReader
from workbench.store.layout import DB_NAME
from workbench.store.queries import complete_totals, data_version, metrics_since

#: Seconds after which an active run's status is read again though nothing was committed.
STATUS_MAX_AGE = 5.0
#: Run-wide rows are stored with no role; their curve is labelled this.
RUN_WIDE = "run"
METRIC_COLUMNS = ["id", "step", "role", "name", "value"]
RUN_COLUMNS = ["id", "name", "status", "topology", "last_step", "calls", "created_at"]


class Curves:
    """The curves of one plot of one run: for each label (the role, with the metric where the plot draws
    several), its steps and values in step order. Shared by every session showing the plot; only
    ``SharedRun.refresh`` changes it (appending, under the run's lock)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        #: label -> (steps, values), labels in the order they first appeared
        self.points: dict[str, tuple[list[int], list[float]]] = {}
        #: moves when a row arrived out of step order: what a session sent of a curve may have changed
        self.resets = 0

    def add(self, rows: list[tuple[int, str, str, float]]) -> bool:
        """Take the rows (step, role, name, value; role never None) of this plot's metrics; whether any were."""
        names, several, taken = set(self.names), len(self.names) > 1, False
        for step, role, name, value in rows:
            if name not in names:
                continue
            taken = True
            steps, values = self.points.setdefault(f"{role} · {name}" if several else role, ([], []))
            if not steps or step > steps[-1]:
                steps.append(step)
                values.append(value)
                continue
            at = bisect.bisect_left(
                steps, step
            )  # out of order, or a metric logged twice in a step: last wins
            if at < len(steps) and steps[at] == step:
                values[at] = value
            else:
                steps.insert(at, step)
                values.insert(at, value)
            self.resets += 1
        return taken

    def tail(self, label: str, sent: int) -> dict[str, list]:
        """The points of ``label`` past the first ``sent``, as a ColumnDataSource's columns."""
        steps, values = self.points[label]
        return {"step": steps[sent:], "value": values[sent:]}

    def frame(self) -> pd.DataFrame:
        """Every point: step, label, value (by label, then step)."""
        parts = [
            pd.DataFrame({"step": steps, "label": label, "value": values})
            for label, (steps, values) in sorted(self.points.items())
        ]
        if not parts:
            return pd.DataFrame({"step": pd.Series(dtype=int), "label": pd.Series(dtype=object), "value": []})
        return pd.concat(parts, ignore_index=True)


def _rows(frame: pd.DataFrame) -> list[tuple[int, str, str, float]]:
    """Metric rows as plain (step, role, name, value) tuples, converted once for all the plots."""
    return list(
        zip(
            frame["step"].astype(int).tolist(),
            frame["role"].tolist(),
            frame["name"].tolist(),
            frame["value"].astype(float).tolist(),
            strict=True,
        )
    )


class SharedRun:
    """What the live views of one run show, read once per change for all of them."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.reader = RunReader(run_dir)
        self.version = 0
        self.last_id = 0
        self.rows = 0  # metric rows read so far
        self.last_step: int | None = None
        self.status = "created"
        self.error: str | None = None
        self.queries = 0  # store reads past the change check: what the sharing saves
        self._lock = threading.RLock()
        self._marker: Any = None
        self._checked_at = float("-inf")
        self._status_at = float("-inf")
        self._chunks: list[pd.DataFrame] = []  # the metric rows read, one frame per read
        self._curves: dict[tuple[str, ...], Curves] = {}
        self._series: dict[tuple[tuple[str, ...], int], pd.DataFrame] = {}
        self.refresh()

    @property
    def frame(self) -> pd.DataFrame:
        """Every metric row read so far (id, step, role, name, value), in id order."""
        with self._lock:
            if len(self._chunks) > 1:
                self._chunks = [pd.concat(self._chunks, ignore_index=True)]
            return self._chunks[0] if self._chunks else pd.DataFrame(columns=METRIC_COLUMNS)

    def refresh(self, min_interval: float = 0.0) -> int:
        """Read what changed since the last read (unless one ran under ``min_interval`` s ago); the version."""
        from widgets.run_status import run_error

        with self._lock:
            now = time.monotonic()
            if now - self._checked_at < min_interval:
                return self.version
            self._checked_at = now
            marker = data_version(self.reader)
            stale = self.status in ACTIVE_STATUSES and now - self._status_at >= STATUS_MAX_AGE
            if marker == self._marker and not stale:
                return self.version
            self._marker = marker
            self.queries += 1
            changed = False
            new = metrics_since(self.reader, self.last_id)
            if not new.empty:
                self.last_id = int(new["id"].max())
                self.rows += len(new)
                new["role"] = new["role"].fillna(RUN_WIDE)
                self._chunks.append(new)
                rows = _rows(new)
                for curves in self._curves.values():
                    curves.add(rows)
                changed = True
            step = self.reader.last_complete_step()
            status = self.reader.info()["status"]
            self._status_at = now
            if status == "failed" and self.error is None:  # read once: a failed run stays so
                self.error = run_error(self.reader) or ""
            if step != self.last_step or status != self.status:
                self.last_step, self.status = step, status
                changed = True
            if changed:
                self.version += 1
            return self.version

    def curves(self, names: tuple[str, ...]) -> Curves:
        """The shared curves of the plot of metrics ``names`` (made from the rows so far on first use)."""
        with self._lock:
            found = self._curves.get(names)
            if found is None:
                found = self._curves[names] = Curves(names)
                found.add(_rows(self.frame))
            return found

    def series(self, names: tuple[str, ...]) -> pd.DataFrame:
        """Every point of the plot of metrics ``names``: step, label, value; computed once per read for all
        sessions."""
        with self._lock:
            key = (names, self.last_id)
            if key not in self._series:
                self._series = {k: v for k, v in self._series.items() if k[1] == self.last_id}
                self._series[key] = self.curves(names).frame()
            return self._series[key]


_RUNS: dict[Path, SharedRun] = {}
_RUNS_LOCK = threading.Lock()


def _process_wide(registry: dict[Path, Any], lock: threading.Lock, path: str | Path, make: Any) -> Any:
    """The one object of ``registry`` for ``path`` (made by ``make(path)`` on first use, kept while the process
    lives)."""
    key = Path(path).resolve()
    with lock:
        found = registry.get(key)
        if found is None:
            found = registry[key] = make(key)
        return found


def shared_run(run_dir: str | Path) -> SharedRun:
    """The process-wide ``SharedRun`` of ``run_dir`` (made on first use, kept while the process lives)."""
    return _process_wide(_RUNS, _RUNS_LOCK, run_dir, SharedRun)


def forget_runs() -> None:
    """Drop every shared run (closing their readers): tests, or a process that removes run directories."""
    with _RUNS_LOCK:
        for run in _RUNS.values():
            run.reader.close()
        _RUNS.clear()
        _LISTS.clear()


# ---------------------------------------------------------------------------------------------- runs list
def _db_marker(run_dir: Path) -> tuple:
    stats = []
    for name in (DB_NAME, f"{DB_NAME}-wal"):
        try:
            st = (run_dir / name).stat()
            stats.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stats.append(None)
    return tuple(stats)


def _run_row(run_dir: Path) -> dict[str, Any]:
    from workbench.store.errors import StoreError

    try:
        with RunReader(run_dir) as reader:
            info = reader.info()
            last_step, calls = complete_totals(reader)
        return {
            "id": info["id"],
            "name": info["name"],
            "status": info["status"],
            "topology": info["topology"],
            "last_step": last_step,
            "calls": calls,
            "created_at": info["created_at"],
        }
    except StoreError:
        return {"id": run_dir.name, "name": None, "status": "unreadable", "topology": None,
                "last_step": None, "calls": None, "created_at": None}  # fmt: skip


@dataclass
class _RunsList:
    runs_dir: Path
    version: int = 0
    #: moves when a run appears, goes or changes status (not with its progress)
    structure: int = 0
    frame: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RUN_COLUMNS))
    rows: dict[str, tuple[tuple, float, dict[str, Any]]] = field(default_factory=dict)
    checked_at: float = float("-inf")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, min_interval: float) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.checked_at < min_interval:
                return
            self.checked_at = now
            dirs = (
                sorted(p for p in self.runs_dir.iterdir() if (p / DB_NAME).is_file())
                if self.runs_dir.is_dir()
                else []
            )
            rows: dict[str, tuple[tuple, float, dict[str, Any]]] = {}
            changed = set(self.rows) != {p.name for p in dirs}
            for run_dir in dirs:
                marker = _db_marker(run_dir)
                old = self.rows.get(run_dir.name)
                if (
                    old is not None
                    and old[0] == marker
                    and not (old[2]["status"] in ACTIVE_STATUSES and now - old[1] >= STATUS_MAX_AGE)
                ):
                    rows[run_dir.name] = old
                    continue
                row = _run_row(run_dir)
                rows[run_dir.name] = (marker, now, row)
                changed = changed or old is None or old[2] != row
            shape = [(name, row[2]["status"]) for name, row in self.rows.items()]
            self.rows = rows
            if changed:
                self.frame = _table([rows[p.name][2] for p in dirs])
                self.version += 1
                if [(name, row[2]["status"]) for name, row in rows.items()] != shape:
                    self.structure += 1


def _table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Newest first, with the columns (and types) the dashboard shows."""
    if not records:
        return pd.DataFrame(columns=RUN_COLUMNS)
    frame = pd.DataFrame(records[::-1], columns=RUN_COLUMNS)
    for column in ("last_step", "calls"):
        frame[column] = frame[column].astype("Int64")
    frame["created_at"] = pd.to_datetime(frame["created_at"], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
    return frame.reset_index(drop=True)


_LISTS: dict[Path, _RunsList] = {}
_LISTS_LOCK = threading.Lock()


def _runs_list(runs_dir: str | Path) -> _RunsList:
    return _process_wide(_LISTS, _LISTS_LOCK, runs_dir, _RunsList)


def runs_table(runs_dir: str | Path, min_interval: float = 0.0) -> pd.DataFrame:
    """The runs under ``runs_dir``, newest first (a frame shared by all sessions: do not change it)."""
    runs = _runs_list(runs_dir)
    runs.refresh(min_interval)
    return runs.frame


#: Recent ``table_changes`` answers, by the ids of the two frames (each entry holds both, so no id is reused).
_CHANGES: dict[tuple[int, int], tuple[pd.DataFrame, pd.DataFrame, dict | None]] = {}
_CHANGES_LOCK = threading.Lock()


def table_changes(old: pd.DataFrame, new: pd.DataFrame) -> dict[str, list[tuple[int, Any]]] | None:
    """The cells that differ from ``old`` to ``new`` (two runs lists ``runs_table`` returned), as
    ``Tabulator.patch`` takes them: column -> [(row, value)]; None where they cannot be patched (other
    runs or columns, or a cell that emptied). Computed once per pair of lists for all sessions."""
    key = (id(old), id(new))
    with _CHANGES_LOCK:
        found = _CHANGES.get(key)
        if found is not None:
            return found[2]
    changes: dict[str, list[tuple[int, Any]]] | None = {}
    if list(old.columns) != list(new.columns) or list(old["id"]) != list(new["id"]):
        changes = None
    else:
        for column in new.columns:
            a, b = new[column], old[column]
            same = (a.isna() & b.isna()) | (a == b).fillna(False).astype(bool)
            rows = [i for i, equal in enumerate(same.tolist()) if not equal]
            if not rows:
                continue
            values = a.iloc[rows]
            if values.isna().any():
                changes = None
                break
            changes[column] = list(zip(rows, values.tolist(), strict=True))
    with _CHANGES_LOCK:
        if len(_CHANGES) >= 64:
            _CHANGES.pop(next(iter(_CHANGES)))
        _CHANGES[key] = (old, new, changes)
    return changes


def runs_version(runs_dir: str | Path, min_interval: float = 0.0) -> int:
    """A number that moves whenever ``runs_table(runs_dir)`` changes."""
    return runs_versions(runs_dir, min_interval)[0]


def runs_versions(runs_dir: str | Path, min_interval: float = 0.0) -> tuple[int, int]:
    """(``runs_version``, a number that moves only when a run appears, goes or changes status)."""
    runs = _runs_list(runs_dir)
    runs.refresh(min_interval)
    return runs.version, runs.structure


__all__ = [
    "Curves",
    "SharedRun",
    "forget_runs",
    "runs_table",
    "runs_version",
    "runs_versions",
    "shared_run",
    "table_changes",
]

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

``runs_table(runs_dir)`` is the runs list the dashboards show, shared the same way: a run's row is read
again only when its database files changed (their size and modification time) or, while it is active,
every ``STATUS_MAX_AGE`` seconds; ``runs_version(runs_dir)`` moves when the table does.

All of it is guarded by locks; Panel's server calls sessions' callbacks on one thread, a notebook on
its kernel's.
"""

from __future__ import annotations

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


class SharedRun:
    """What the live views of one run show, read once per change for all of them."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.reader = RunReader(run_dir)
        self.version = 0
        self.last_id = 0
        self.frame = pd.DataFrame(columns=METRIC_COLUMNS)
        self.last_step: int | None = None
        self.status = "created"
        self.error: str | None = None
        self.queries = 0  # store reads past the change check: what the sharing saves
        self._lock = threading.RLock()
        self._marker: Any = None
        self._checked_at = float("-inf")
        self._status_at = float("-inf")
        self._series: dict[tuple[str, int], pd.DataFrame] = {}
        self.refresh()

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
                new["role"] = new["role"].fillna(RUN_WIDE)
                # a new frame each time (never changed in place): a session may still hold the old one
                self.frame = new if self.frame.empty else pd.concat([self.frame, new], ignore_index=True)
                self._series = {k: v for k, v in self._series.items() if k[1] == self.last_id}
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

    def series(self, names: tuple[str, ...], frame: pd.DataFrame, last_id: int) -> pd.DataFrame:
        """Rows of metrics ``names`` in ``frame`` (read up to ``last_id``): step, label, value; computed once
        per (names, last_id) for all sessions. The label is the role, with the metric where there are several."""
        key = ("\0".join(names), last_id)
        with self._lock:
            cached = self._series.get(key)
        if cached is not None:
            return cached
        rows = frame[frame["name"].isin(names)]
        if rows.empty:
            out = pd.DataFrame(columns=["step", "label", "value"])
        else:
            label = rows["role"] + (" · " + rows["name"] if len(names) > 1 else "")
            out = pd.DataFrame({"step": rows["step"].astype(int), "label": label, "value": rows["value"]})
            out = out.sort_values(["label", "step"]).drop_duplicates(["label", "step"], keep="last")
        if last_id == self.last_id:
            with self._lock:
                self._series[key] = out
        return out


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
            self.rows = rows
            if changed:
                self.frame = _table([rows[p.name][2] for p in dirs])
                self.version += 1


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


def runs_version(runs_dir: str | Path, min_interval: float = 0.0) -> int:
    """A number that moves whenever ``runs_table(runs_dir)`` changes."""
    runs = _runs_list(runs_dir)
    runs.refresh(min_interval)
    return runs.version


__all__ = ["SharedRun", "forget_runs", "runs_table", "runs_version", "shared_run"]

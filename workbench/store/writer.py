"""The single writer of a run: `RunStore.create` makes a run directory, `RunStore.open` resumes one.

Only one `RunStore` may hold a run at a time (an exclusive lock on `writer.lock`, held while open);
any number of `RunReader`s may read alongside it. Rows are written inside steps (`store.step(i)`,
see `step.py`); a step that did not complete - an exception in its block, or a writer killed
mid-step - is discarded, so readers and a resumed writer only ever see whole steps.

`log_event` and `set_status` commit at once (which also commits rows pending in an open step; the
step itself stays `running` until its block ends).

Events the store logs itself: `run_created`, `writer_opened` (both with the writer's host, pid and start
time, see `liveness.py`), `status`, `step_aborted` (a step's block raised) and `partial_step_discarded`
(found running when the writer reopened the run).
Durability: `synchronous="NORMAL"` (default) keeps every committed step through a killed process;
`"FULL"` also through power loss, at the cost of an fsync per commit.
"""

from __future__ import annotations

import copy
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from filelock import FileLock, Timeout

from . import schema
from .codec import dumps, loads, plain
from .errors import (
    InvalidRecordError,
    RunExistsError,
    RunsDirError,
    StorageError,
    StoreError,
    WriterLockedError,
)
from .layout import RunPaths, cause, check_run_id, connect, existing_run, new_run_id, sqlite_errors
from .liveness import identity
from .step import StepWriter

if TYPE_CHECKING:
    from .reader import RunReader

#: Statuses a run moves through; `set_status` accepts these.
RUN_STATUSES = ("created", "running", "finished", "failed", "stopped")

Synchronous = Literal["NORMAL", "FULL"]

#: Events that record what happened to a step; they outlive the step's rows (any other event logged
#: with a step index belongs to that step and is discarded with it).
HISTORY_EVENTS = ("step_aborted", "partial_step_discarded")


def _lock(paths: RunPaths) -> FileLock:
    lock = FileLock(str(paths.lock))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise WriterLockedError(
            f"run {paths.run_dir} is already open for writing ({paths.lock} is held); "
            "close the other RunStore first, or read the run with RunReader"
        ) from None
    except OSError as exc:
        raise RunsDirError(
            f"cannot lock {paths.lock} ({cause(exc, paths.lock)}); the run directory must be writable to write "
            "to it (what is stored stays readable with RunReader)"
        ) from None
    return lock


def _configure(conn: sqlite3.Connection, synchronous: Synchronous, path: Path) -> None:
    if synchronous not in ("NORMAL", "FULL"):
        raise StoreError(f"synchronous={synchronous!r} is not supported; use 'NORMAL' or 'FULL'")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(
            f"{path} could not switch to WAL mode (got {mode!r}); keep runs on a local disk, not a network share"
        )
    # NORMAL in WAL mode: a committed transaction survives the process being killed; FULL also
    # survives power loss, at the cost of an fsync per commit.
    conn.execute(f"PRAGMA synchronous = {synchronous}")


class RunStore:
    """The one writer of a run directory. Make one with `create` or `open`, never directly."""

    def __init__(self, paths: RunPaths, conn: sqlite3.Connection, lock: FileLock) -> None:
        self._paths = paths
        self._conn = conn
        self._file_lock = lock
        self._mutex = threading.RLock()
        self._open_step: StepWriter | None = None
        self._closed = False
        with sqlite_errors(paths.db, writer=True):
            row = conn.execute("SELECT id, config FROM runs").fetchone()
            if row is None:
                raise StoreError(f"{paths.db} has no run row; it was not made by RunStore.create")
            self._run_id: str = row[0]
            self._config: dict = loads(row[1])
            self._last_ids = {
                table: self._max_id(table) for table in ("episodes", "calls", "metrics", "events")
            }

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        runs_dir: str | Path,
        config: Mapping[str, Any],
        run_id: str | None = None,
        name: str | None = None,
        topology: str | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
    ) -> RunStore:
        """Make `<runs_dir>/<run_id>/` with its database, `config.yaml` and `checkpoints/`, and open it.

        `run_id` defaults to a fresh sortable id; `topology` defaults to the config's `topology`
        (a name, or a mapping with a `name`). On any failure the new directory is removed again.
        """
        if not isinstance(config, Mapping):
            raise InvalidRecordError(
                f"config must be a dict, got {type(config).__name__}; pass the run's settings"
            )
        config = plain(config, "config")
        if topology is None:
            topo = config.get("topology")
            topology = topo if isinstance(topo, str) else topo.get("name") if isinstance(topo, dict) else None
        runs_dir = Path(runs_dir).expanduser()
        if runs_dir.exists() and not runs_dir.is_dir():
            raise RunsDirError(f"runs directory {runs_dir} is a file; pass a directory to hold runs")
        try:
            runs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunsDirError(
                f"cannot create runs directory {runs_dir} ({cause(exc, runs_dir)}); choose a writable runs_dir"
            ) from None
        run_dir = cls._claim_dir(runs_dir.resolve(), run_id)
        paths = RunPaths(run_dir)
        conn = lock = None
        try:
            import yaml

            paths.config.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
            paths.checkpoints.mkdir()
            lock = _lock(paths)
            conn = connect(paths.db, readonly=False, create=True)
            with sqlite_errors(paths.db, writer=True):
                _configure(conn, synchronous, paths.db)
                schema.migrate(conn, paths.db, fresh=True)
                now = time.time()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT INTO runs (id, name, created_at, status, config, topology) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_dir.name, name, now, "created", dumps(config, "config"), topology),
                )
                conn.execute(
                    "INSERT INTO events (ts, step, kind, payload) VALUES (?, NULL, 'run_created', ?)",
                    (now, dumps({"schema_version": schema.latest_version(), **identity()}, "payload")),
                )
                conn.execute("COMMIT")
            return cls(paths, conn, lock)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if lock is not None:
                lock.release()
            shutil.rmtree(run_dir, ignore_errors=True)
            if isinstance(exc, OSError | StorageError):
                reason = exc.reason if isinstance(exc, StorageError) else cause(exc, run_dir)
                raise RunsDirError(
                    f"cannot create run {run_dir} ({reason}); nothing was created: free space or fix "
                    "permissions, or choose another runs_dir"
                ) from exc
            raise

    @staticmethod
    def _claim_dir(runs_dir: Path, run_id: str | None) -> Path:
        if not os.access(runs_dir, os.W_OK | os.X_OK):
            read_only = bool(os.statvfs(runs_dir).f_flag & os.ST_RDONLY)
            reason = "it is on a read-only file system" if read_only else "permission denied"
            raise RunsDirError(
                f"runs directory {runs_dir} is not writable ({reason}); choose another runs_dir"
                + ("" if read_only else " or fix its permissions")
            )
        candidates = [check_run_id(run_id)] if run_id is not None else [new_run_id() for _ in range(20)]
        for candidate in candidates:
            run_dir = runs_dir / candidate
            try:
                run_dir.mkdir()
                return run_dir
            except FileExistsError:
                if run_id is not None:
                    raise RunExistsError(
                        f"run {run_id} already exists in {runs_dir}; resume it with RunStore.open('{run_dir}') "
                        "or pass another run_id"
                    ) from None
            except OSError as exc:
                raise RunsDirError(
                    f"cannot create {run_dir} ({cause(exc, runs_dir)}); choose a writable runs_dir, free space "
                    "or fix its permissions"
                ) from None
        raise RunExistsError(f"could not find a free run id in {runs_dir}; pass run_id explicitly")

    @classmethod
    def open(cls, run_dir: str | Path, *, synchronous: Synchronous = "NORMAL") -> RunStore:
        """Resume writing an existing run: migrate its schema if older, and discard any partial step."""
        paths = existing_run(run_dir)
        lock = _lock(paths)
        conn = None
        try:
            conn = connect(paths.db, readonly=False)
            with sqlite_errors(paths.db, writer=True):
                schema.check_not_newer(schema.read_version(conn, paths.db), paths.db)
                _configure(conn, synchronous, paths.db)
                schema.migrate(conn, paths.db)
            store = cls(paths, conn, lock)
            store._recover()
            return store
        except BaseException:
            if conn is not None:
                conn.close()
            lock.release()
            raise

    @classmethod
    def upgrade(cls, run_dir: str | Path) -> tuple[int, int]:
        """Migrate an older run's schema to this code's version and close it again; returns (from, to).

        Unlike ``open`` it keeps a partial step (a resume discards it), so it suits any run that no writer
        holds: ``workbench migrate runs/`` runs it on every run of a directory (readers refuse older runs)."""
        paths = existing_run(run_dir)
        lock = _lock(paths)  # a running writer holds it: its run is left alone (WriterLockedError)
        try:
            conn = connect(paths.db, readonly=False)
            try:
                with sqlite_errors(paths.db, writer=True):
                    version = schema.read_version(conn, paths.db)
                    schema.check_not_newer(version, paths.db)
                    if version < schema.latest_version():
                        _configure(conn, "NORMAL", paths.db)
                        schema.migrate(conn, paths.db)
            finally:
                conn.close()
        finally:
            lock.release()
        return version, max(version, schema.latest_version())

    def _recover(self) -> list[int]:
        """Delete the rows of steps a previous writer left running; returns the discarded step indices."""
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            partial = [r[0] for r in self._conn.execute("SELECT step FROM steps WHERE status != 'complete'")]
            for index in partial:
                self._conn.execute("BEGIN IMMEDIATE")
                counts = self._delete_step(index)
                self._insert_event(
                    "partial_step_discarded", {"reason": "writer stopped mid-step", **counts}, index
                )
                self._conn.execute("COMMIT")
            self._insert_event("writer_opened", {"discarded_steps": partial, **identity()}, None, commit=True)
        return partial

    # ------------------------------------------------------------------ properties
    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def run_dir(self) -> Path:
        return self._paths.run_dir

    @property
    def db_path(self) -> Path:
        return self._paths.db

    @property
    def config(self) -> dict:
        """The run's config (a copy)."""
        return copy.deepcopy(self._config)

    @property
    def status(self) -> str:
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            return self._conn.execute("SELECT status FROM runs").fetchone()[0]

    # ------------------------------------------------------------------ writing
    def step(self, index: int, policy_version: int | None = None) -> StepWriter:
        """A step to write inside `with store.step(index, policy_version=v) as step:`.

        Steps are written one at a time, in increasing index order; resume with
        `store.last_complete_step() + 1` (or 0).
        """
        self._check_open()
        return StepWriter(self, index, policy_version)

    def log_event(self, kind: str, payload: Any = None, step: int | None = None) -> int:
        """Record an event (committed at once); returns its id."""
        if not isinstance(kind, str) or not kind:
            raise InvalidRecordError(f"event kind must be a non-empty string, got {kind!r}")
        self._check_open()
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            return self._insert_event(kind, payload, step, commit=True)

    def set_status(self, status: str) -> None:
        """Set the run's status (one of RUN_STATUSES) and log it as an event."""
        if status not in RUN_STATUSES:
            raise InvalidRecordError(
                f"run status {status!r} is unknown; use one of {', '.join(RUN_STATUSES)}"
            )
        self._check_open()
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            self._begin()
            self._conn.execute("UPDATE runs SET status = ?", (status,))
            self._insert_event("status", {"status": status}, None, commit=True)

    def last_complete_step(self) -> int | None:
        """Index of the last complete step, or None before the first."""
        self._check_open()
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            return self._conn.execute("SELECT max(step) FROM steps WHERE status = 'complete'").fetchone()[0]

    def discard_steps_after(self, step: int | None) -> list[int]:
        """Delete every step after ``step`` (all steps if None): what a resumed run redoes from its checkpoint.

        Logged as a ``steps_discarded`` event; returns the discarded indices.
        """
        self._check_open()
        with self._mutex, sqlite_errors(self._paths.db, writer=True):
            floor = -1 if step is None else int(step)
            rows = self._conn.execute(
                "SELECT step FROM steps WHERE step > ? ORDER BY step", (floor,)
            ).fetchall()
            indices = [r[0] for r in rows]
            if indices:
                self._begin()
                for index in indices:
                    self._delete_step(index)
                self._insert_event("steps_discarded", {"after": step, "steps": indices}, None, commit=True)
            return indices

    def checkpoint_dir(self, step: int) -> Path:
        """`checkpoints/step-000123/` of this run, created if missing."""
        if not isinstance(step, int) or step < 0:
            raise InvalidRecordError(f"checkpoint step must be a non-negative int, got {step!r}")
        path = self._paths.checkpoint(step)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def reader(self) -> RunReader:
        """A read-only reader of this run (open alongside the writer)."""
        from .reader import RunReader

        return RunReader(self._paths.run_dir)

    def close(self) -> None:
        """Release the run. A step still open is discarded (as if its block had raised)."""
        with self._mutex:
            if self._closed:
                return
            try:
                if self._open_step is not None:
                    self._open_step._abort("store closed while the step was open")
            finally:
                self._closed = True
                self._conn.close()
                self._file_lock.release()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is not None and not self._closed and self.status in ("created", "running"):
                self.set_status("failed")
        finally:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"RunStore({self._run_id!r}, run_dir='{self._paths.run_dir}', {state})"

    # ------------------------------------------------------------------ internals (used by StepWriter)
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the RunStore of {self._paths.run_dir} is closed; reopen it with RunStore.open")

    def _begin(self) -> None:
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT")

    def _max_id(self, table: str) -> int:
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
        return int(row[0]) if row else 0

    def _next_id(self, table: str) -> int:
        self._last_ids[table] += 1
        return self._last_ids[table]

    def _insert_event(self, kind: str, payload: Any, step: int | None, *, commit: bool = False) -> int:
        self._begin()
        event_id = self._next_id("events")
        self._conn.execute(
            "INSERT INTO events (id, ts, step, kind, payload) VALUES (?, ?, ?, ?, ?)",
            (event_id, time.time(), step, kind, dumps(payload, "event payload")),
        )
        if commit:
            self._commit()
        return event_id

    def _delete_step(self, index: int) -> dict[str, int]:
        counts = {"step": index}
        for table in ("calls", "metrics", "episodes"):
            counts[table] = self._conn.execute(f"DELETE FROM {table} WHERE step = ?", (index,)).rowcount
        counts["events"] = self._conn.execute(
            f"DELETE FROM events WHERE step = ? AND kind NOT IN ({', '.join('?' * len(HISTORY_EVENTS))})",
            (index, *HISTORY_EVENTS),
        ).rowcount
        self._conn.execute("DELETE FROM steps WHERE step = ?", (index,))
        return counts

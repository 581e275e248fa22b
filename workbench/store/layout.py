"""Where a run lives on disk and how its database is opened.

A run is one directory, `<runs_dir>/<run_id>/`, holding `run.db` (SQLite, WAL mode), `config.yaml`
(the run's config as given), `checkpoints/` and `writer.lock` (held by the one writer). Run ids sort
by creation time: `20261122-045012-ab12cd` is UTC date, time and six random hex digits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import (
    CorruptStoreError,
    NotARunStoreError,
    ReadOnlyStoreError,
    RunNotFoundError,
    StorageError,
    StoreError,
)

DB_NAME = "run.db"
CONFIG_NAME = "config.yaml"
CHECKPOINTS_NAME = "checkpoints"
LOCK_NAME = "writer.lock"

#: How long a statement waits on a lock held by another connection before failing (milliseconds).
BUSY_TIMEOUT_MS = 10_000

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_run_id(now: float | None = None) -> str:
    """A fresh sortable, human-readable run id: `YYYYMMDD-HHMMSS-xxxxxx` (UTC)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise StoreError(
            f"run id {run_id!r} is not usable as a directory name; use letters, digits, '.', '_' "
            "and '-' (at most 128, not starting with '.' or '-'), or pass run_id=None for a fresh one"
        )
    return run_id


@dataclass(frozen=True)
class RunPaths:
    """The files of one run directory."""

    run_dir: Path

    @property
    def db(self) -> Path:
        return self.run_dir / DB_NAME

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_NAME

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / CHECKPOINTS_NAME

    @property
    def lock(self) -> Path:
        return self.run_dir / LOCK_NAME

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}"


def existing_run(run_dir: str | Path) -> RunPaths:
    """Check that `run_dir` is a directory holding a run database; return its paths."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise RunNotFoundError(
            f"no run at {path}: the directory does not exist; check the path or see list_runs(runs_dir)"
        )
    if not path.is_dir():
        raise RunNotFoundError(
            f"{path} is a file, not a run directory; pass the directory that holds {DB_NAME}"
        )
    paths = RunPaths(path.resolve())
    if not paths.db.is_file():
        raise RunNotFoundError(
            f"{path} is not a run directory (no {DB_NAME} inside); pass a directory made by RunStore.create"
        )
    return paths


#: What to do after the file system refused a write; nothing already committed is lost.
KEPT = "the steps stored before are kept; resume the run once that is fixed"


def free_space(path: Path) -> str:
    """`path`'s file system and its free space, for error messages ("" if it cannot be read)."""
    for candidate in (path, *path.parents):
        if not candidate.is_dir():
            continue
        try:
            usage = os.statvfs(candidate)
        except OSError:
            continue
        return f"{usage.f_bavail * usage.f_frsize:,} bytes free on the file system of {candidate}"
    return ""


def cause(exc: OSError, path: Path) -> str:
    """Why the OS refused to write `path`, in words: the error's text, plus the free space when full."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        space = free_space(path)
        return f"{text}; {space}" if space else text
    return text


def storage_error(exc: OSError, path: Path, what: str = "write") -> StorageError:
    """A clear StorageError for an OSError met while writing `path` (names the path and the cause)."""
    reason = cause(exc, path)
    return StorageError(f"cannot {what} {path} ({reason}); {KEPT}", reason)


def translate(exc: sqlite3.Error, path: Path, *, writer: bool = False) -> Exception:
    """Turn a SQLite error about the file at `path` into a StoreError saying what to do.

    `writer`: the error came through the run's writer, so a read-only database means the file system
    or the file's permissions, not a RunReader.
    """
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    reason = None
    if name.startswith("SQLITE_FULL") or "database or disk is full" in text:
        space = free_space(path)
        reason = f"the disk is full ({text}{'; ' + space if space else ''})"
    elif name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
        reason = (
            f"the file system reported an I/O error ({text}; it may be full, read-only or failing; "
            f"{free_space(path) or 'free space unknown'})"
        )
    elif writer and (name.startswith("SQLITE_READONLY") or "readonly database" in text):
        reason = (
            f"the database is read-only ({text}): it or its directory is on a read-only file system "
            "or not writable by this user"
        )
    if reason is not None:
        return StorageError(f"cannot {'write' if writer else 'read'} {path}: {reason}; {KEPT}", reason)
    if name.startswith("SQLITE_NOTADB") or "file is not a database" in text:
        return NotARunStoreError(
            f"{path} is not a SQLite database; point at a run directory made by RunStore.create"
        )
    if name.startswith("SQLITE_CORRUPT") or "malformed" in text:
        return CorruptStoreError(
            f"{path} is damaged ({text}); restore it from a copy, or salvage it with `sqlite3 {path} .recover`"
        )
    if name.startswith("SQLITE_READONLY") or "readonly database" in text:
        return ReadOnlyStoreError(
            f"{path} is open read-only ({text}); write through the run's RunStore, not a RunReader"
        )
    if name.startswith("SQLITE_CANTOPEN"):
        return RunNotFoundError(f"cannot open {path} ({text}); check that it exists and is readable")
    if name.startswith("SQLITE_BUSY") or "database is locked" in text:
        return StoreError(
            f"{path} stayed locked for {BUSY_TIMEOUT_MS} ms ({text}); retry, or close the other writer"
        )
    return exc


@contextlib.contextmanager
def sqlite_errors(path: Path, *, writer: bool = False) -> Iterator[None]:
    """Re-raise SQLite errors about `path` as StoreErrors (unknown ones pass through unchanged)."""
    try:
        yield
    except sqlite3.Error as exc:
        new = translate(exc, path, writer=writer)
        if new is exc:
            raise
        raise new from exc


def connect(db: Path, *, readonly: bool, create: bool = False) -> sqlite3.Connection:
    """Open `db` in autocommit mode (transactions are explicit); never creates it unless `create`.

    A reader of a run on a read-only file system (an archive, a read-only mount for the dashboard) opens it
    as immutable: SQLite cannot make the shared-memory file a WAL database needs, and no writer can exist.
    """
    mode = "ro" if readonly else ("rwc" if create else "rw")
    uri = f"{db.resolve().as_uri()}?mode={mode}"
    with sqlite_errors(db, writer=not readonly):
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if readonly and _on_read_only_file_system(db):
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError:
                conn.close()
                conn = sqlite3.connect(
                    uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False
                )
    return conn


def _on_read_only_file_system(path: Path) -> bool:
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False

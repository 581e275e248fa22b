"""Schema of a run database, its version number, and the ordered migrations that reach it.

`MIGRATIONS[n]` takes a database from version n to n + 1; the writer applies the missing ones on open,
each in its own transaction together with the version bump, so a failed migration leaves the database
at the last good version. Version 0 is an empty file; version 1 is the baseline below. Readers never
migrate: they refuse a database that is older or newer than this code.

One database holds one run: `runs` has exactly one row, and every other table belongs to it.
Timestamps are Unix seconds (REAL). Columns holding JSON are TEXT; token arrays are BLOBs (see codec).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from .errors import NotARunStoreError, SchemaVersionError

Migration = Callable[[sqlite3.Connection], None]

_BASELINE = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        name TEXT,
        created_at REAL NOT NULL,
        status TEXT NOT NULL,
        config TEXT NOT NULL,
        topology TEXT
    )""",
    """CREATE TABLE steps (
        step INTEGER PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('running', 'complete')),
        started_at REAL NOT NULL,
        finished_at REAL,
        policy_version INTEGER
    )""",
    """CREATE TABLE episodes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL REFERENCES steps(step),
        task_id TEXT,
        group_key TEXT,
        status TEXT NOT NULL,
        reward REAL,
        error TEXT,
        task_meta TEXT
    )""",
    "CREATE INDEX episodes_by_step ON episodes(step)",
    # Small columns first, large text and BLOBs last: SQLite then reads the small ones without
    # walking overflow pages.
    """CREATE TABLE calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL REFERENCES steps(step),
        episode_id INTEGER NOT NULL REFERENCES episodes(id),
        parent_id INTEGER REFERENCES calls(id),
        role TEXT NOT NULL,
        policy TEXT,
        position INTEGER NOT NULL,
        policy_version INTEGER,
        n_prompt INTEGER,
        n_completion INTEGER,
        advantage REAL,
        rewards TEXT,
        timings TEXT,
        format_error TEXT,
        action TEXT,
        tool_calls TEXT,
        tool_results TEXT,
        prompt_text TEXT,
        completion_text TEXT,
        prompt_ids BLOB,
        completion_ids BLOB,
        logprobs BLOB,
        mask BLOB,
        token_advantages BLOB
    )""",
    "CREATE INDEX calls_by_step ON calls(step, role)",
    "CREATE INDEX calls_by_role ON calls(role)",
    "CREATE INDEX calls_by_episode ON calls(episode_id, position)",
    """CREATE TABLE metrics (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL REFERENCES steps(step),
        role TEXT,
        name TEXT NOT NULL,
        value REAL,
        ts REAL NOT NULL
    )""",
    "CREATE INDEX metrics_by_step ON metrics(step)",
    "CREATE INDEX metrics_by_role ON metrics(role, name, step)",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        step INTEGER,
        kind TEXT NOT NULL,
        payload TEXT
    )""",
    "CREATE INDEX events_by_kind ON events(kind)",
]


def _v1_baseline(conn: sqlite3.Connection) -> None:
    for statement in _BASELINE:
        conn.execute(statement)


def _v2_call_source(conn: sqlite3.Connection) -> None:
    """Provenance: the call whose output a call consumed (a Verifier's judged solution)."""
    conn.execute("ALTER TABLE calls ADD COLUMN source_id INTEGER REFERENCES calls(id)")


def _v3_call_previous(conn: sqlite3.Connection) -> None:
    """Grouped rollouts: the call before a call on its branch (the path a replay of one branch follows)."""
    conn.execute("ALTER TABLE calls ADD COLUMN previous_id INTEGER REFERENCES calls(id)")


#: Ordered migrations: MIGRATIONS[n] upgrades version n to n + 1.
MIGRATIONS: list[Migration] = [_v1_baseline, _v2_call_source, _v3_call_previous]

#: The version this code writes (the length of MIGRATIONS at import time).
SCHEMA_VERSION = len(MIGRATIONS)


def latest_version() -> int:
    """The schema version this code reads and writes."""
    return len(MIGRATIONS)


def has_meta(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    return row is not None


def read_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version recorded in the database at `path`."""
    if not has_meta(conn):
        raise NotARunStoreError(
            f"{path} is a SQLite database but not a workbench run store (no meta table); "
            "point at a run directory made by RunStore.create"
        )
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or not str(row[0]).isdigit():
        raise NotARunStoreError(
            f"{path} has no valid schema_version in its meta table; it is not a run store"
        )
    return int(row[0])


def check_not_newer(version: int, path: Path) -> None:
    latest = latest_version()
    if version > latest:
        raise SchemaVersionError(
            f"{path} has schema v{version}, newer than this workbench knows (v{latest}); "
            "upgrade the workbench package to open it"
        )


def check_readable(version: int, path: Path) -> None:
    """Readers accept exactly the current version."""
    check_not_newer(version, path)
    if version < latest_version():
        raise SchemaVersionError(
            f"{path} has schema v{version}, older than v{latest_version()}; migrate it with `workbench migrate "
            f"{path.parent}` (or open it once with RunStore.open), then read it"
        )


def migrate(conn: sqlite3.Connection, path: Path, *, fresh: bool = False) -> list[int]:
    """Apply the missing migrations (writer only); returns the versions reached, in order.

    `fresh` marks a newly created, empty database (version 0); otherwise the database must already
    carry a meta table.
    """
    version = 0 if fresh and not has_meta(conn) else read_version(conn, path)
    check_not_newer(version, path)
    reached = []
    for target in range(version + 1, latest_version() + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[target - 1](conn)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(target),),
            )
            conn.execute("COMMIT")
        except Exception as exc:
            conn.execute("ROLLBACK")
            raise SchemaVersionError(
                f"migration of {path} from v{target - 1} to v{target} failed ({exc}); "
                f"the database is left at v{target - 1}; fix the migration and reopen"
            ) from exc
        reached.append(target)
    return reached

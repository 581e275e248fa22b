"""Read a run as pandas DataFrames, read-only, while its writer may still be writing.

`RunReader(run_dir)` opens the database with `mode=ro` (and `query_only`), so it can never change
it; any number of readers, in any processes, may read while the one writer writes (SQLite WAL).
Every query sees the latest committed rows. Token arrays come back as numpy arrays (or lists),
JSON columns as Python objects, timestamps as Unix seconds. By default only rows of complete steps
are returned (`complete_only=True`); pass False to include the step being written.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .codec import FLOAT_DTYPE, IDS_DTYPE, MASK_DTYPE, ArrayFormat, decode_array, loads
from .errors import InvalidRecordError, NotARunStoreError, RunsDirError, StoreError
from .layout import DB_NAME, connect, existing_run, sqlite_errors
from .liveness import writer_gone
from .schema import check_readable, read_version

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("runs", "steps", "episodes", "calls", "metrics", "events")
BLOB_DTYPES = {
    "prompt_ids": IDS_DTYPE,
    "completion_ids": IDS_DTYPE,
    "logprobs": FLOAT_DTYPE,
    "mask": MASK_DTYPE,
    "token_advantages": FLOAT_DTYPE,
}
JSON_COLUMNS = frozenset(
    {"config", "task_meta", "action", "tool_calls", "tool_results", "rewards", "timings", "payload"}
)
NULLABLE_INT_COLUMNS = frozenset(
    {"parent_id", "source_id", "previous_id", "policy_version", "n_prompt", "n_completion"}
)
COUNTABLE = ("step", "role", "policy", "episode_id", "policy_version")
_COMPLETE = "step IN (SELECT step FROM steps WHERE status = 'complete')"
_CHECKPOINT = re.compile(r"step-(\d+)")


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def _where(clauses: list[str], params: list[Any], column: str, value: Any, kind: type) -> None:
    """Add `column = value` (or `IN (...)` for a list of values) unless value is None."""
    if value is None:
        return
    values = [value] if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) else list(value)
    values = [_scalar(v) for v in values]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, kind):
            raise InvalidRecordError(
                f"filter {column}={v!r} must be {'an int' if kind is int else 'a string'} (or a list of them)"
            )
    if len(values) == 1:
        clauses.append(f"{column} = ?")
    else:
        clauses.append(f"{column} IN ({', '.join('?' * len(values))})" if values else "0")
    params.extend(values)


def _sql(select: str, table: str, clauses: list[str], order: str) -> str:
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return f"SELECT {select} FROM {table}{where} ORDER BY {order}"


class RunReader:
    """Read-only access to one run directory; use as a context manager or call `close()`."""

    def __init__(self, run_dir: str | Path) -> None:
        self._paths = existing_run(run_dir)
        self._conn = connect(self._paths.db, readonly=True)
        self._mutex = threading.RLock()
        try:
            with sqlite_errors(self._paths.db):
                self._conn.execute("PRAGMA query_only = ON")
                check_readable(read_version(self._conn, self._paths.db), self._paths.db)
                self._columns = {
                    t: [r[1] for r in self._conn.execute(f"PRAGMA table_info({t})")] for t in TABLES
                }
                row = self._conn.execute("SELECT id FROM runs").fetchone()
            if row is None:
                raise NotARunStoreError(
                    f"{self._paths.db} holds no run row; it was not made by RunStore.create"
                )
            self._run_id: str = row[0]
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ plumbing
    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def run_dir(self) -> Path:
        return self._paths.run_dir

    @property
    def db_path(self) -> Path:
        return self._paths.db

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunReader({self._run_id!r}, run_dir='{self._paths.run_dir}')"

    def _query(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple]]:
        with self._mutex, sqlite_errors(self._paths.db):
            try:
                cursor = self._conn.execute(sql, tuple(params))
            except Exception as exc:
                if "closed database" in str(exc):
                    raise StoreError(
                        f"this RunReader of {self._paths.run_dir} is closed; open a new one"
                    ) from None
                raise
            columns = [d[0] for d in cursor.description] if cursor.description else []
            return columns, cursor.fetchall()

    def _frame(self, columns: list[str], rows: list[tuple], arrays: ArrayFormat = "numpy") -> pd.DataFrame:
        import pandas as pd

        if arrays not in ("numpy", "list", "bytes"):
            raise InvalidRecordError(f"arrays={arrays!r} is unknown; use 'numpy', 'list' or 'bytes'")
        data: dict[str, Any] = {}
        for i, name in enumerate(columns):
            values = [row[i] for row in rows]
            if name in BLOB_DTYPES:
                dtype = BLOB_DTYPES[name]
                values = [decode_array(v, dtype, arrays) for v in values]
                data[name] = pd.Series(values, dtype=object)
            elif name in JSON_COLUMNS:
                data[name] = pd.Series([loads(v) for v in values], dtype=object)
            elif name in NULLABLE_INT_COLUMNS:
                data[name] = pd.array(values, dtype="Int64")
            else:
                data[name] = values
        return pd.DataFrame(data, columns=columns)

    def _select(self, table: str, columns: Sequence[str] | None, key: str = "id") -> str:
        known = self._columns[table]
        if columns is None:
            return ", ".join(known)
        if isinstance(columns, str):
            columns = [columns]
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise InvalidRecordError(f"unknown {table} column(s) {unknown}; choose from {', '.join(known)}")
        chosen = [key] + [c for c in columns if c != key]
        return ", ".join(chosen)

    # ------------------------------------------------------------------ the run
    def info(self) -> dict[str, Any]:
        """The run's row (id, name, created_at, status, config, topology) plus where it lives.

        A run still ``created`` or ``running`` whose writer is known to have ended (killed, so it could
        not record its end; see ``liveness.py``) has the status ``interrupted``: resume it or leave it.
        """
        columns, rows = self._query("SELECT id, name, created_at, status, config, topology FROM runs")
        info = dict(zip(columns, rows[0], strict=True))
        info["config"] = loads(info["config"])
        if info["status"] in ("created", "running") and writer_gone(self.writer()):
            info["status"] = "interrupted"
        _, version = self._query("SELECT value FROM meta WHERE key = 'schema_version'")
        info.update(
            schema_version=int(version[0][0]), run_dir=str(self._paths.run_dir), db_path=str(self._paths.db)
        )
        return info

    def writer(self) -> dict[str, Any] | None:
        """The identity (host, pid, start time) of the last process that opened the run for writing."""
        _, rows = self._query(
            "SELECT payload FROM events WHERE kind IN ('run_created', 'writer_opened') ORDER BY id DESC LIMIT 1"
        )
        return loads(rows[0][0]) if rows else None

    @property
    def config(self) -> dict[str, Any]:
        return self.info()["config"]

    def runs(self) -> pd.DataFrame:
        """The run's row as a one-row DataFrame (config decoded)."""
        return self._frame(*self._query("SELECT id, name, created_at, status, topology, config FROM runs"))

    def steps(self, complete_only: bool = False) -> pd.DataFrame:
        """One row per step: status, start/finish times, policy version, episode and call counts."""
        where = " WHERE s.status = 'complete'" if complete_only else ""
        return self._frame(
            *self._query(
                "SELECT s.step, s.status, s.started_at, s.finished_at, s.policy_version, "
                "(SELECT count(*) FROM episodes e WHERE e.step = s.step) AS episodes, "
                "(SELECT count(*) FROM calls c WHERE c.step = s.step) AS calls "
                f"FROM steps s{where} ORDER BY s.step"
            )
        )

    def last_complete_step(self) -> int | None:
        return self._query("SELECT max(step) FROM steps WHERE status = 'complete'")[1][0][0]

    def checkpoints(self) -> pd.DataFrame:
        """Checkpoint directories of the run (`checkpoints/step-NNNNNN`), by step."""
        import pandas as pd

        found = []
        if self._paths.checkpoints.is_dir():
            for path in self._paths.checkpoints.iterdir():
                match = _CHECKPOINT.fullmatch(path.name)
                if match and path.is_dir():
                    found.append((int(match.group(1)), str(path)))
        return pd.DataFrame(sorted(found), columns=["step", "path"])

    # ------------------------------------------------------------------ rows
    def episodes(self, step: int | Sequence[int] | None = None, complete_only: bool = True) -> pd.DataFrame:
        """Episodes (id, step, task_id, group_key, status, reward, error, task_meta)."""
        clauses: list[str] = []
        params: list[Any] = []
        _where(clauses, params, "step", step, int)
        if complete_only:
            clauses.append(_COMPLETE)
        return self._frame(
            *self._query(_sql(self._select("episodes", None), "episodes", clauses, "id"), params)
        )

    def calls(
        self,
        step: int | Sequence[int] | None = None,
        role: str | Sequence[str] | None = None,
        episode: int | Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
        complete_only: bool = True,
        arrays: ArrayFormat = "numpy",
    ) -> pd.DataFrame:
        """Calls, ordered by id, filtered by step, role and episode (each a value or a list).

        `columns` picks columns (`id` always comes first); `limit`/`offset` paginate; token arrays
        are decoded to numpy arrays (`arrays="list"` for lists, `"bytes"` to skip decoding).
        """
        clauses: list[str] = []
        params: list[Any] = []
        _where(clauses, params, "step", step, int)
        _where(clauses, params, "role", role, str)
        _where(clauses, params, "episode_id", episode, int)
        if complete_only:
            clauses.append(_COMPLETE)
        sql = _sql(self._select("calls", columns), "calls", clauses, "id")
        if limit is not None or offset:
            for name, value in (("limit", limit), ("offset", offset)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise InvalidRecordError(f"{name} must be a non-negative int, got {value!r}")
            sql += " LIMIT ? OFFSET ?"
            params += [-1 if limit is None else limit, offset]
        return self._frame(*self._query(sql, params), arrays=arrays)

    def transcript(self, call_id: int) -> list[dict[str, str]]:
        """The whole completion of call ``call_id`` as text by owner (``trainable``, ``tool``, ``other_role``,
        ``masked``): an agent call's interleaved turns and tool results as the engine recorded them, a plain
        call's completion as one trainable segment. Each tool result's text is also in ``tool_results``."""
        import json

        rows = self._query("SELECT action, completion_text FROM calls WHERE id = ?", (int(call_id),))[1]
        if not rows:
            raise KeyError(f"no call {call_id} in {self.run_dir}")
        stored, text = rows[0]
        action = json.loads(stored) if isinstance(stored, str) and stored else None
        if isinstance(action, dict) and isinstance(action.get("transcript"), list):
            return list(action["transcript"])
        return [{"owner": "trainable", "text": text}]

    def call_counts(
        self,
        by: str | Sequence[str] = "role",
        step: int | Sequence[int] | None = None,
        complete_only: bool = True,
    ) -> pd.DataFrame:
        """Number of calls grouped by `by` (any of step, role, policy, episode_id, policy_version)."""
        keys = [by] if isinstance(by, str) else list(by)
        bad = [k for k in keys if k not in COUNTABLE]
        if bad or not keys:
            raise InvalidRecordError(
                f"cannot count calls by {bad or keys}; group by any of {', '.join(COUNTABLE)}"
            )
        clauses: list[str] = []
        params: list[Any] = []
        _where(clauses, params, "step", step, int)
        if complete_only:
            clauses.append(_COMPLETE)
        group = ", ".join(keys)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._frame(
            *self._query(
                f"SELECT {group}, count(*) AS calls FROM calls{where} GROUP BY {group} ORDER BY {group}",
                params,
            )
        )

    def rewards(
        self,
        step: int | Sequence[int] | None = None,
        role: str | Sequence[str] | None = None,
        complete_only: bool = True,
    ) -> pd.DataFrame:
        """Named call rewards in long form: call_id, step, episode_id, role, name, value."""
        clauses = ["c.rewards IS NOT NULL"]
        params: list[Any] = []
        _where(clauses, params, "c.step", step, int)
        _where(clauses, params, "c.role", role, str)
        if complete_only:
            clauses.append("c." + _COMPLETE)
        return self._frame(
            *self._query(
                _sql(
                    "c.id AS call_id, c.step, c.episode_id, c.role, r.key AS name, r.value AS value",
                    "calls c, json_each(c.rewards) r",
                    clauses,
                    "c.id, r.key",
                ),
                params,
            )
        )

    def metrics(
        self,
        role: str | Sequence[str] | None = None,
        name: str | Sequence[str] | None = None,
        step: int | Sequence[int] | None = None,
        complete_only: bool = True,
    ) -> pd.DataFrame:
        """Metrics in long form (id, step, role, name, value, ts); role is None for run-wide metrics."""
        clauses: list[str] = []
        params: list[Any] = []
        _where(clauses, params, "role", role, str)
        _where(clauses, params, "name", name, str)
        _where(clauses, params, "step", step, int)
        if complete_only:
            clauses.append(_COMPLETE)
        return self._frame(
            *self._query(_sql(self._select("metrics", None), "metrics", clauses, "step, id"), params)
        )

    def metrics_wide(
        self,
        role: str | Sequence[str] | None = None,
        name: str | Sequence[str] | None = None,
        complete_only: bool = True,
    ) -> pd.DataFrame:
        """Metrics pivoted to one row per step and one column per `role/name` (`name` for run-wide ones)."""
        return to_wide(self.metrics(role=role, name=name, complete_only=complete_only))

    def events(
        self, kind: str | Sequence[str] | None = None, step: int | Sequence[int] | None = None
    ) -> pd.DataFrame:
        """Events (id, ts, step, kind, payload), oldest first."""
        clauses: list[str] = []
        params: list[Any] = []
        _where(clauses, params, "kind", kind, str)
        _where(clauses, params, "step", step, int)
        frame = self._frame(*self._query(_sql(self._select("events", None), "events", clauses, "id"), params))
        frame["step"] = frame["step"].astype("Int64")
        return frame

    def last_id(self, table: str) -> int:
        """Largest id in `table` (for steps: the last complete step), 0 (-1 for steps) when empty.

        Pass it as `since_id` to `tail` to follow only rows written from now on.
        """
        from .tail import TAILABLE

        key = TAILABLE.get(table)
        if key is None:
            raise InvalidRecordError(f"table {table!r} cannot be tailed; choose from {', '.join(TAILABLE)}")
        where = " WHERE status = 'complete'" if table == "steps" else ""
        value = self._query(f"SELECT max({key}) FROM {table}{where}")[1][0][0]
        return (-1 if table == "steps" else 0) if value is None else value

    def tail(
        self,
        table: str = "calls",
        since_id: int | None = None,
        poll_interval: float = 0.2,
        timeout: float | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1000,
        arrays: ArrayFormat = "numpy",
    ) -> Iterator[pd.DataFrame]:
        """Yield new rows of `table` as DataFrames as they land; see `workbench.store.tail.tail`."""
        from .tail import tail

        return tail(self, table, since_id, poll_interval, timeout, columns, batch_size, arrays)

    # ------------------------------------------------------------------ escape hatches
    def sql(self, query: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run a read-only SQL query; known array and JSON columns are decoded by name."""
        return self._frame(*self._query(query, params))

    def integrity_check(self) -> str:
        """SQLite's `PRAGMA integrity_check`: 'ok', or the problems found, one per line."""
        return "\n".join(str(row[0]) for row in self._query("PRAGMA integrity_check")[1])


def to_wide(metrics: pd.DataFrame) -> pd.DataFrame:
    """Long metrics (step, role, name, value) -> one row per step, one column per `role/name`."""
    import pandas as pd

    if metrics.empty:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    labels = [
        name if role is None or role != role else f"{role}/{name}"
        for role, name in zip(metrics["role"], metrics["name"], strict=True)
    ]
    frame = metrics.assign(column=labels)
    wide = frame.pivot_table(index="step", columns="column", values="value", aggfunc="last")
    wide.columns.name = None
    return wide


def list_runs(runs_dir: str | Path) -> pd.DataFrame:
    """One row per run under `runs_dir`, oldest first; unreadable runs are listed with their error."""
    import pandas as pd

    path = Path(runs_dir).expanduser()
    if not path.is_dir():
        raise RunsDirError(
            f"no runs directory at {path}; check the path, or make a run there with RunStore.create('{path}', config)"
        )
    columns = [
        "id",
        "name",
        "created_at",
        "status",
        "topology",
        "steps",
        "last_step",
        "calls",
        "run_dir",
        "error",
    ]
    records = []
    for run_dir in sorted(p for p in path.iterdir() if (p / DB_NAME).is_file()):
        try:
            with RunReader(run_dir) as reader:
                info = reader.info()
                _, rows = reader._query(
                    "SELECT count(*), max(step), (SELECT count(*) FROM calls WHERE "
                    f"{_COMPLETE}) FROM steps WHERE status = 'complete'"
                )
            n_steps, last_step, n_calls = rows[0]
            records.append(
                [
                    info["id"],
                    info["name"],
                    info["created_at"],
                    info["status"],
                    info["topology"],
                    n_steps,
                    last_step,
                    n_calls,
                    str(run_dir),
                    None,
                ]
            )
        except StoreError as exc:
            records.append(
                [run_dir.name, None, None, "unreadable", None, None, None, None, str(run_dir), str(exc)]
            )
    frame = pd.DataFrame(records, columns=columns)
    for column in ("steps", "last_step", "calls"):
        frame[column] = frame[column].astype("Int64")
    return frame

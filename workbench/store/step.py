"""Writing one step of a run: `with store.step(index, policy_version=v) as step: ...`.

Inside the block, `add_episode`, `add_call`/`add_calls` (or `add_record`, an engine's call record) and
`log_metrics` queue rows in a transaction; `flush()` commits what was queued so far (live readers then
see it); a clean exit marks the step `complete` in the same transaction as its last rows. An exception
in the block rolls back what was not flushed, deletes what was, logs a `step_aborted` event and
re-raises: no partial step remains.

Call ids and episode ids are returned at once (the writer allocates them), so a call can name its
parent before the parent is written: reserve the parent's id with `new_call_id()` and pass it later
as `call_id=`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .call_row import CALL_FIELDS, CallRow
from .codec import (
    FLOAT_DTYPE,
    IDS_DTYPE,
    MASK_DTYPE,
    as_number,
    dumps,
    encode_floats,
    encode_ids,
    encode_mask,
    rewards_json,
)
from .errors import InvalidRecordError, StepError
from .layout import sqlite_errors

if TYPE_CHECKING:
    from .records import CallRecord

_UNSET: Any = object()

#: Keys accepted by update_call / update_calls (besides `id`).
UPDATABLE_CALL_FIELDS = frozenset(
    (
        "rewards",
        "advantage",
        "token_advantages",
        "format_error",
        "action",
        "tool_calls",
        "tool_results",
        "timings",
    )
)


def _opt_int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidRecordError(f"{field} must be an int or None, got {type(value).__name__} {value!r:.40}")
    return value.__index__()


def _opt_str(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidRecordError(f"{field} must be a string or None, got {type(value).__name__}")


def _display_text(value: Any, field: str) -> str | None:
    """Prompt and completion text as stored: a NUL becomes U+FFFD, since SQLite's text functions (LIKE,
    length, substr) stop at a NUL and a search would miss what follows; the token ids stay exact."""
    text = _opt_str(value, field)
    return text.replace("\x00", "\ufffd") if text else text


def _check_len(blob: bytes | None, itemsize: int, field: str, n_completion: int | None) -> None:
    if blob is None:
        return
    if n_completion is None:
        raise InvalidRecordError(
            f"{field} was given without completion_ids; pass the completion's token ids too"
        )
    if len(blob) // itemsize != n_completion:
        raise InvalidRecordError(
            f"{field} has {len(blob) // itemsize} entries but the completion has {n_completion} tokens; "
            "give exactly one per completion token"
        )


class StepWriter:
    """The rows of one step. Obtain it from `RunStore.step` and use it as a context manager."""

    def __init__(self, store: Any, index: int, policy_version: int | None) -> None:
        # store: the RunStore of the step (not imported here: writer.py imports this module)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise StepError(f"step index must be a non-negative int, got {index!r}")
        self._store = store
        self.index = index
        self.policy_version = _opt_int(policy_version, "policy_version")
        self._state = "new"
        self._episodes: dict[int, int] = {}  # episode id -> next call position
        self._reserved: set[int] = set()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> StepWriter:
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            store._check_open()
            if self._state != "new":
                raise StepError(f"step {self.index} was already used; open a new one with store.step(...)")
            if store._open_step is not None:
                raise StepError(
                    f"step {store._open_step.index} is still open; finish its block before starting step {self.index}"
                )
            last = store._conn.execute("SELECT max(step) FROM steps").fetchone()[0]
            if last is not None and self.index <= last:
                raise StepError(
                    f"step {self.index} is not after the last written step {last} of run {store.run_id}; "
                    f"steps are written in increasing order, continue with store.step({last + 1})"
                )
            store._begin()
            store._conn.execute(
                "INSERT INTO steps (step, status, started_at, policy_version) VALUES (?, 'running', ?, ?)",
                (self.index, time.time(), self.policy_version),
            )
            store._commit()
            self._state = "open"
            store._open_step = self
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._state != "open":
            return False
        if exc_type is None:
            try:
                self._complete()
            except BaseException as err:
                self._abort(f"completing the step failed: {err!r}", err)
                raise
        else:
            self._abort(f"{exc_type.__name__}: {exc}", exc)
        return False

    def _complete(self) -> None:
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            store._begin()
            store._conn.execute(
                "UPDATE episodes SET status = 'complete' WHERE step = ? AND status = 'running'", (self.index,)
            )
            store._conn.execute(
                "UPDATE steps SET status = 'complete', finished_at = ? WHERE step = ?",
                (time.time(), self.index),
            )
            store._commit()
            self._state = "complete"
            store._open_step = None

    def _abort(self, reason: str, exc: BaseException | None = None) -> None:
        """Roll back what is pending, delete what was flushed, log why."""
        store = self._store
        conn = store._conn
        with store._mutex:
            try:
                with sqlite_errors(store.db_path, writer=True):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    store._begin()
                    counts = store._delete_step(self.index)
                    store._insert_event("step_aborted", {"reason": reason[:2000], **counts}, self.index)
                    store._commit()
            except Exception as cleanup:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                note = (
                    f"run store: step {self.index} could not be discarded now ({cleanup}); "
                    "it will be discarded when the run is reopened with RunStore.open"
                )
                if exc is None:
                    raise
                exc.add_note(note)
            finally:
                self._state = "aborted"
                store._open_step = None

    def _writable(self) -> None:
        if self._state == "open":
            self._store._check_open()
            return
        if self._state == "new":
            raise StepError(
                f"step {self.index} is not open; write inside `with store.step({self.index}) as step:`"
            )
        raise StepError(f"step {self.index} is {self._state} and closed; write further rows in a new step")

    def flush(self) -> None:
        """Commit the rows queued so far, so readers see them; the step stays `running`."""
        with self._store._mutex, sqlite_errors(self._store.db_path, writer=True):
            self._writable()
            self._store._commit()

    # ------------------------------------------------------------------ episodes
    def add_episode(
        self,
        task_id: str | int | None = None,
        group_key: str | None = None,
        task_meta: Any = None,
        reward: float | None = None,
        status: str = "running",
        error: str | None = None,
    ) -> int:
        """Add an episode (a tree of calls on one task); returns its id.

        Episodes still `running` when the step completes are marked `complete`.
        """
        row = (
            None if task_id is None else str(task_id),
            None if group_key is None else str(group_key),
            dumps(task_meta, "task_meta"),
            None if reward is None else as_number(reward, "episode reward"),
            _opt_str(status, "episode status") or "running",
            _opt_str(error, "episode error"),
        )
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            episode_id = store._next_id("episodes")
            store._begin()
            store._conn.execute(
                "INSERT INTO episodes (id, step, task_id, group_key, task_meta, reward, status, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (episode_id, self.index, *row),
            )
            self._episodes[episode_id] = 0
        return episode_id

    def update_episode(
        self,
        episode_id: int,
        *,
        reward: Any = _UNSET,
        status: Any = _UNSET,
        error: Any = _UNSET,
        task_meta: Any = _UNSET,
    ) -> None:
        """Set an episode's reward, status, error or task metadata (only the fields given)."""
        if episode_id not in self._episodes:
            raise StepError(
                f"episode {episode_id!r} is not part of step {self.index}; update it in its own step"
            )
        fields: dict[str, Any] = {}
        if reward is not _UNSET:
            fields["reward"] = None if reward is None else as_number(reward, "episode reward")
        if status is not _UNSET:
            fields["status"] = _opt_str(status, "episode status") or "running"
        if error is not _UNSET:
            fields["error"] = _opt_str(error, "episode error")
        if task_meta is not _UNSET:
            fields["task_meta"] = dumps(task_meta, "task_meta")
        if not fields:
            return
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            store._begin()
            store._conn.execute(
                f"UPDATE episodes SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                (*fields.values(), int(episode_id)),
            )

    # ------------------------------------------------------------------ calls
    def new_call_id(self) -> int:
        """Reserve a call id now (e.g. for a parent whose record is written after its children)."""
        with self._store._mutex:
            self._writable()
            call_id = self._store._next_id("calls")
            self._reserved.add(call_id)
            return call_id

    def add_call(self, episode_id: int, role: str, **fields: Any) -> int:
        """Add one call (one model generation) to an episode of this step; returns its id.

        The fields are those of `CallRow`: token arrays, texts, action, tool calls, rewards, ids.
        """
        return self._add_row(CallRow(episode_id, role=role, **fields))

    def add_record(self, episode_id: int, call: CallRecord, ids: Mapping[int, int] | None = None) -> int:
        """Add the engine's record of a call; `ids` maps its episode's positions to the ids of the calls
        stored before it (its parent, source and previous calls). Returns its id."""
        return self._add_row(CallRow.of(call, episode_id, ids or {}))

    def _add_row(self, row: CallRow) -> int:
        with self._store._mutex, sqlite_errors(self._store.db_path, writer=True):
            self._writable()
            values = self._call_row(row)
            self._store._begin()
            self._store._conn.execute(_insert_sql(values), values)
        return values["id"]

    def add_calls(self, calls: Iterable[Mapping[str, Any]]) -> list[int]:
        """Add many calls at once (each a dict of `add_call` arguments); all or none are added."""
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            saved = (dict(self._episodes), set(self._reserved), store._last_ids["calls"])
            rows = []
            try:
                for i, call in enumerate(calls):
                    if not isinstance(call, Mapping):
                        raise InvalidRecordError(
                            f"calls[{i}] is a {type(call).__name__}; pass dicts of add_call arguments"
                        )
                    unknown = call.keys() - CALL_FIELDS
                    if unknown or "episode_id" not in call or "role" not in call:
                        what = f"unknown field(s) {sorted(unknown)}" if unknown else "no episode_id or role"
                        raise InvalidRecordError(
                            f"calls[{i}] has {what}; see StepWriter.add_call for the fields"
                        )
                    try:
                        rows.append(self._call_row(CallRow(**call)))
                    except InvalidRecordError as exc:
                        raise InvalidRecordError(f"calls[{i}]: {exc}") from None
                    except StepError as exc:
                        raise StepError(f"calls[{i}]: {exc}") from None
                store._begin()
                store._conn.execute("SAVEPOINT add_calls")
                try:
                    if rows:
                        store._conn.executemany(_insert_sql(rows[0]), rows)
                except BaseException:
                    store._conn.execute("ROLLBACK TO add_calls")
                    raise
                finally:
                    store._conn.execute("RELEASE add_calls")
            except BaseException:
                self._episodes, self._reserved, store._last_ids["calls"] = saved
                raise
        return [row["id"] for row in rows]

    def _call_row(self, row: CallRow) -> dict[str, Any]:
        """The calls table's columns for `row`, validated; only then are a position and an id taken."""
        episode_id = row.episode_id
        next_position = self._episodes.get(episode_id)
        if next_position is None:
            raise StepError(
                f"episode {episode_id!r} is not part of step {self.index}; add it with step.add_episode() first"
            )
        if not isinstance(row.role, str) or not row.role:
            raise InvalidRecordError(
                f"call role must be a non-empty string (a role of the topology), got {row.role!r}"
            )
        prompt = encode_ids(row.prompt_ids, "prompt_ids")
        completion = encode_ids(row.completion_ids, "completion_ids")
        n_completion = None if completion is None else len(completion) // IDS_DTYPE.itemsize
        columns = {
            "logprobs": encode_floats(row.logprobs, "logprobs"),
            "mask": encode_mask(row.mask, "mask"),
            "token_advantages": encode_floats(row.token_advantages, "token_advantages"),
        }
        _check_len(columns["logprobs"], FLOAT_DTYPE.itemsize, "logprobs", n_completion)
        _check_len(columns["mask"], MASK_DTYPE.itemsize, "mask", n_completion)
        _check_len(columns["token_advantages"], FLOAT_DTYPE.itemsize, "token_advantages", n_completion)
        policy_version = self.policy_version if row.policy_version is None else row.policy_version
        columns.update(
            parent_id=_opt_int(row.parent_id, "parent_id"),
            role=row.role,
            policy=_opt_str(row.policy, "policy"),
            policy_version=_opt_int(policy_version, "policy_version"),
            n_prompt=None if prompt is None else len(prompt) // IDS_DTYPE.itemsize,
            n_completion=n_completion,
            advantage=None if row.advantage is None else as_number(row.advantage, "advantage"),
            rewards=rewards_json(_null_if_empty(row.rewards)),
            timings=dumps(_null_if_empty(row.timings), "timings"),
            format_error=_opt_str(row.format_error, "format_error"),
            action=dumps(row.action, "action"),
            tool_calls=dumps(_null_if_empty(row.tool_calls), "tool_calls"),
            tool_results=dumps(_null_if_empty(row.tool_results), "tool_results"),
            prompt_text=_display_text(row.prompt_text, "prompt_text"),
            completion_text=_display_text(row.completion_text, "completion_text"),
            prompt_ids=prompt,
            completion_ids=completion,
            source_id=_opt_int(row.source_id, "source_id"),
            previous_id=_opt_int(row.previous_id, "previous_id"),
        )
        # Everything is valid: only now take a position and an id.
        position = next_position if row.position is None else _opt_int(row.position, "position")
        if row.call_id is None:
            call_id = self._store._next_id("calls")
        else:
            call_id = _opt_int(row.call_id, "call_id")
            if call_id not in self._reserved:
                raise InvalidRecordError(
                    f"call_id {call_id} was not reserved in this step (or was already used); "
                    "get one from step.new_call_id()"
                )
            self._reserved.discard(call_id)
        self._episodes[episode_id] = max(next_position, position + 1)
        return {
            "id": call_id,
            "step": self.index,
            "episode_id": int(episode_id),
            "position": position,
            **columns,
        }

    def update_call(self, call_id: int, **fields: Any) -> None:
        """Set fields of a call written in this step (e.g. rewards and advantages once known).

        Accepted: rewards, advantage, token_advantages, format_error, action, tool_calls, tool_results,
        timings.
        """
        self.update_calls([{"id": call_id, **fields}])

    def update_calls(self, updates: Iterable[Mapping[str, Any]]) -> None:
        """Update many calls at once (each a dict with `id` and the fields to set); all or none apply."""
        store = self._store
        conn = store._conn
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            store._begin()
            conn.execute("SAVEPOINT update_calls")
            try:
                for i, update in enumerate(updates):
                    self._update_one(i, update)
            except BaseException:
                conn.execute("ROLLBACK TO update_calls")
                raise
            finally:
                conn.execute("RELEASE update_calls")

    def _update_one(self, i: int, update: Mapping[str, Any]) -> None:
        conn = self._store._conn
        if not isinstance(update, Mapping) or "id" not in update:
            raise InvalidRecordError(
                f"updates[{i}] must be a dict with the call's 'id' and the fields to set"
            )
        fields = {k: v for k, v in update.items() if k != "id"}
        unknown = fields.keys() - UPDATABLE_CALL_FIELDS
        if unknown:
            raise InvalidRecordError(
                f"updates[{i}] sets {sorted(unknown)}, which cannot change; updatable: {sorted(UPDATABLE_CALL_FIELDS)}"
            )
        call_id = _opt_int(update["id"], "call id")
        row = conn.execute(
            "SELECT n_completion FROM calls WHERE id = ? AND step = ?", (call_id, self.index)
        ).fetchone()
        if row is None:
            raise StepError(
                f"call {call_id} is not in step {self.index}; only this step's calls can be updated here"
            )
        values: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "rewards":
                values[key] = rewards_json(value)
            elif key == "advantage":
                values[key] = None if value is None else as_number(value, "advantage")
            elif key == "token_advantages":
                values[key] = encode_floats(value, "token_advantages")
                _check_len(values[key], FLOAT_DTYPE.itemsize, "token_advantages", row[0])
            elif key == "format_error":
                values[key] = _opt_str(value, "format_error")
            else:
                values[key] = dumps(value, key)
        if values:
            conn.execute(
                f"UPDATE calls SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?",
                (*values.values(), call_id),
            )

    # ------------------------------------------------------------------ metrics
    def log_metrics(self, metrics: Mapping[str, Any], role: str | None = None) -> None:
        """Record numbers for this step, for one role or (role=None) for the whole run."""
        if not isinstance(metrics, Mapping):
            raise InvalidRecordError(
                f"metrics must be a dict of name -> number, got {type(metrics).__name__}"
            )
        role = _opt_str(role, "metrics role")
        now = time.time()
        values = []
        for name, value in metrics.items():
            if not isinstance(name, str) or not name:
                raise InvalidRecordError(f"metric name {name!r} must be a non-empty string")
            values.append((name, as_number(value, f"metric {name!r}")))
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            rows = [(store._next_id("metrics"), self.index, role, name, v, now) for name, v in values]
            store._begin()
            store._conn.executemany(
                "INSERT INTO metrics (id, step, role, name, value, ts) VALUES (?, ?, ?, ?, ?, ?)", rows
            )

    def log_event(self, kind: str, payload: Any = None) -> None:
        """Record an event that belongs to this step: committed with it, discarded with it."""
        if not isinstance(kind, str) or not kind:
            raise InvalidRecordError(f"event kind must be a non-empty string, got {kind!r}")
        store = self._store
        with store._mutex, sqlite_errors(store.db_path, writer=True):
            self._writable()
            store._insert_event(kind, payload, self.index)

    def __repr__(self) -> str:
        return f"StepWriter(step={self.index}, {self._state}, episodes={len(self._episodes)})"


def _insert_sql(columns: Mapping[str, Any]) -> str:
    """The INSERT of a call whose column values are `columns` (named parameters)."""
    return f"INSERT INTO calls ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"


def _null_if_empty(value: Any) -> Any:
    """An empty list or dict is stored as NULL, as an absent one is (a record's collections default empty)."""
    return None if isinstance(value, list | dict) and not value else value

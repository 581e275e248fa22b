"""The tool interface: a tool is an async callable with a name, a description and a JSON Schema.

``run_tool(tool, arguments, timeout)`` is how the engine calls any tool: it checks the arguments
against the tool's schema, enforces a wall-clock timeout and turns every failure (bad arguments, an
exception inside the tool, a timeout) into a ``ToolResult`` with ``ok=False`` and a one-line error,
so a failing tool is recorded as a tool error and the episode goes on. It never raises, except that
cancelling the caller (stopping a rollout) still cancels the tool.

Faults it absorbs, besides exceptions: a tool that calls ``sys.exit`` (argparse does on bad input) or
cancels itself; a timed-out tool whose clean-up after cancellation hangs (the call returns after
``CANCEL_GRACE_S``, the clean-up finishes in the background); a result of the wrong shape (``None``, a
``ToolResult`` with fields of the wrong types, records that are not dicts, bytes), which is coerced to
a well-formed ``ToolResult``; and a huge result, cut to ``MAX_RESULT_CHARS`` characters (and
``MAX_RECORDS`` records) whatever the topology's own truncation. A tool that blocks the event loop
(``time.sleep`` in an ``async def``) cannot be timed out from inside the loop: write tools async, or
hand blocking work to ``asyncio.to_thread``; one that ignores cancellation for ever lets its episode
finish, but its event loop cannot close.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import jsonschema

TRUNCATION_MARKER = "\n[truncated]"
#: Ceiling on a result's size, whatever the tool or topology says: no context window holds more.
MAX_RESULT_CHARS = 1_000_000
MAX_RECORDS = 10_000
#: Longest error message kept (a tool's error text is recorded with every call).
MAX_ERROR_CHARS = 1_000
#: Seconds a timed-out tool gets to finish cancelling before the call returns without it.
CANCEL_GRACE_S = 1.0
#: ``ToolResult.metadata`` entries the engine records with a call when they are set (not 0, False or None).
RECORDED_METADATA = ("timed_out", "exit_code", "killed")


class ToolError(Exception):
    """Base class of the tools' errors (bad options, unknown kinds, missing keys)."""


class ToolOptionError(ToolError, ValueError):
    """A tool was configured with an option it does not accept or a bad value."""


class UnknownToolKindError(ToolError, KeyError):
    """``make_tool`` was asked for a kind nobody registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class ToolResult:
    """What one tool call produced.

    ``content`` is text, or a list of records (search results: ``{"title", "url", "snippet", ...}``).
    ``error`` is a one-line reason when ``ok`` is false. ``truncated`` says output was cut to a limit.
    ``metadata`` holds tool-specific facts (exit codes, cache keys, ...), never secrets.
    """

    ok: bool
    content: str | list[dict[str, Any]] = ""
    error: str | None = None
    truncated: bool = False
    seconds: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failure(cls, error: str, **metadata: Any) -> ToolResult:
        return cls(ok=False, content="", error=error, metadata=dict(metadata))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """What a run records about the call (JSON data): ``ok``, ``error``, ``seconds``, ``truncated``, the
        number of ``results`` (records, or 1 for non-empty text) and the set ``RECORDED_METADATA`` entries."""
        content = self.content
        out: dict[str, Any] = {
            "ok": self.ok,
            "error": self.error,
            "seconds": self.seconds,
            "truncated": self.truncated,
            "results": len(content) if isinstance(content, list) else int(bool(content)),
        }
        for key in RECORDED_METADATA:
            value = self.metadata.get(key)
            if value not in (None, False, 0) and isinstance(value, str | int | float | bool):
                out[key] = value
        return out


@runtime_checkable
class ToolLike(Protocol):
    """What the engine needs of a tool (structural; subclassing :class:`Tool` is optional)."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def __call__(self, **arguments: Any) -> ToolResult: ...


class Tool:
    """Base class for tools: set ``name``, ``description`` and ``parameters``; implement ``__call__``."""

    name: str = "tool"
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    async def __call__(self, **arguments: Any) -> ToolResult:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """The function-calling description of this tool: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def close(self) -> None:
        """Release resources (clients, indexes). Tools without any need not override it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_validators: dict[int, tuple[Any, jsonschema.protocols.Validator]] = {}


def _validator(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    cached = _validators.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    validator = cls(schema)
    _validators[id(schema)] = (schema, validator)  # keeps ``schema`` alive, so its id stays unique
    return validator


def validate_arguments(tool: ToolLike, arguments: Any) -> str | None:
    """None if ``arguments`` fit the tool's schema, else a one-line description of the first problem."""
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    schema = getattr(tool, "parameters", None) or {"type": "object"}
    error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(dict(arguments)))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{'argument ' + where + ': ' if where else ''}{error.message}"


async def run_tool(
    tool: ToolLike,
    arguments: Mapping[str, Any] | Any,
    timeout: float | None = 30.0,
    max_chars: int | None = None,
) -> ToolResult:
    """Call ``tool(**arguments)`` safely: validated, time-limited, never raising (see module doc).

    ``max_chars`` optionally truncates the content (:func:`truncate_content`). ``seconds`` is the
    wall time of the whole call, including validation.
    """
    started = time.perf_counter()
    name = getattr(tool, "name", None)
    name = name if isinstance(name, str) and name else type(tool).__name__
    try:
        problem = validate_arguments(tool, arguments)
        if problem is not None:
            result = ToolResult.failure(f"{name}: invalid arguments: {problem}")
        else:
            result = well_formed(name, await _call(tool, dict(arguments), timeout))
    except _TimedOut:
        result = ToolResult.failure(f"{name}: timed out after {timeout:g} s", timed_out=True)
    except Exception as error:  # noqa: BLE001 - a tool failure is recorded, never raised into the episode
        detail = _first_line(error)
        result = ToolResult.failure(f"{name}: {type(error).__name__}{': ' + detail if detail else ''}")
    if max_chars is not None and result.ok:
        result.content, cut = truncate_content(result.content, max_chars)
        result.truncated = result.truncated or cut
    result.content, cut = _cap_content(result.content, MAX_RESULT_CHARS)
    result.truncated = result.truncated or cut
    result.seconds = time.perf_counter() - started
    return result


class _TimedOut(Exception):
    """The tool ran past ``run_tool``'s timeout (a ``TimeoutError`` the tool raises is its own failure)."""


class ToolExitError(RuntimeError):
    """A tool called ``sys.exit`` (which would otherwise end the whole process)."""


class ToolCancelledError(RuntimeError):
    """A tool's coroutine was cancelled from inside (nobody cancelled the caller)."""


async def _guarded(tool: ToolLike, arguments: dict[str, Any]) -> Any:
    try:
        value = tool(**arguments)
        return await value if inspect.isawaitable(value) else value
    except SystemExit as exit_:  # inside the task, before asyncio re-raises it out of the event loop
        raise ToolExitError(f"the tool called sys.exit({exit_.code!r})") from None


async def _call(tool: ToolLike, arguments: dict[str, Any], timeout: float | None) -> Any:
    """The tool's return value; ``_TimedOut`` after ``timeout`` seconds (see the module doc)."""
    task = asyncio.ensure_future(_guarded(tool, arguments))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:  # the caller was cancelled (a rollout stopping): so is the tool
        task.cancel()
        raise
    if not done:
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        finally:
            if not task.done():  # its clean-up goes on in the background; its outcome is dropped
                task.add_done_callback(_drop_outcome)
        raise _TimedOut
    if task.cancelled():
        raise ToolCancelledError("the tool was cancelled from inside")
    return task.result()


def _drop_outcome(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: no "exception was never retrieved" warning


def _first_line(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - an exception whose message itself fails
        return "(its message could not be read)"
    return _one_line(text)


def _one_line(text: str) -> str:
    """The first non-blank line of ``text``, at most ``MAX_ERROR_CHARS`` characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + " ..."


def _text(value: Any) -> str:
    """Any value as text: strings as they are, bytes decoded, the rest as JSON where possible, else str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except Exception:  # noqa: BLE001 - circular or hostile objects
        try:
            return str(value)
        except Exception:  # noqa: BLE001
            return f"<unprintable {type(value).__name__}>"


def _content(value: Any) -> str | list[dict[str, Any]]:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return [
            {str(k): v for k, v in item.items()} if isinstance(item, Mapping) else {"text": _text(item)}
            for item in value
        ]
    return _text(value)


def well_formed(name: str, value: Any) -> ToolResult:
    """A tool's return value as a well-formed ``ToolResult`` (see the module doc); ``None`` is a failure."""
    if value is None:
        return ToolResult.failure(f"{name}: returned nothing (None) instead of a result")
    if not isinstance(value, ToolResult):
        return ToolResult(ok=True, content=_content(value))
    ok = _as_bool(value.ok)
    if ok is None:
        return ToolResult.failure(
            f"{name}: returned a malformed result (its ok is a {type(value.ok).__name__}, not a bool)"
        )
    if value.error is None:
        error = None
    else:
        try:
            error = _one_line(value.error if isinstance(value.error, str) else str(value.error)) or None
        except Exception:  # noqa: BLE001 - an error object whose str() fails
            error = f"{name}: failed with an unreadable error"
    if not ok and not error:
        error = f"{name}: failed without giving a reason"
    metadata = value.metadata if isinstance(value.metadata, dict) else {"metadata": _text(value.metadata)}
    return ToolResult(
        ok=ok,
        content=_content(value.content),
        error=error,
        truncated=value.truncated is True,
        metadata=metadata,
    )


def _as_bool(value: Any) -> bool | None:
    """``value`` as a bool when it is one (Python, numpy, or the integers 0 and 1), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if type(value).__name__ in ("bool", "bool_") and hasattr(value, "item"):  # numpy's
        return bool(value.item())
    return None


def _cap_content(content: str | list[dict[str, Any]], limit: int) -> tuple[str | list[dict[str, Any]], bool]:
    """``content`` within ``limit`` characters of text (and ``MAX_RECORDS`` records), and whether it was cut."""
    if isinstance(content, str):
        return truncate_text(content, limit)
    if len(content) <= MAX_RECORDS and sum(_size(r) for r in content) <= limit:
        return content, False
    out: list[dict[str, Any]] = []
    left = limit
    for record in content[:MAX_RECORDS]:
        size = _size(record)
        if size <= left:
            out.append(record)
            left -= size
            continue
        if left > 0:  # the record that crosses the budget keeps what fits of each text field
            share = max(1, left // max(1, sum(isinstance(v, str) for v in record.values())))
            out.append(
                {k: truncate_text(v, share)[0] if isinstance(v, str) else v for k, v in record.items()}
            )
        return out, True
    return out, len(content) > MAX_RECORDS


def truncate_text(
    text: str, limit: int, tokenizer: Any | None = None, marker: str = TRUNCATION_MARKER
) -> tuple[str, bool]:
    """Cut ``text`` to ``limit`` characters, or to ``limit`` tokens when a tokenizer is given.

    The tokenizer needs ``encode(text, add_special_tokens=False)`` and ``decode(ids)`` (any Hugging
    Face tokenizer). Returns the text (with ``marker`` appended when cut) and whether it was cut.
    """
    if limit < 0:
        raise ToolOptionError(f"truncation limit must be >= 0, got {limit}")
    if tokenizer is None:
        return (text, False) if len(text) <= limit else (text[:limit] + marker, True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= limit:
        return text, False
    return tokenizer.decode(ids[:limit]) + marker, True


def truncate_content(
    content: str | list[dict[str, Any]], limit: int, tokenizer: Any | None = None
) -> tuple[str | list[dict[str, Any]], bool]:
    """Truncate text content, or a list of records by a budget shared over their ``text``/``snippet``.

    Records are kept in order while the budget lasts; the record that crosses it is cut, later ones
    are dropped.
    """
    if isinstance(content, str):
        return truncate_text(content, limit, tokenizer)
    out: list[dict[str, Any]] = []
    left, cut = limit, False
    for record in content:
        key = "text" if isinstance(record.get("text"), str) else "snippet"
        body = record.get(key)
        if not isinstance(body, str):
            out.append(record)
            continue
        if left <= 0:
            cut = True
            break
        text, was_cut = truncate_text(body, left, tokenizer)
        used = len(tokenizer.encode(body, add_special_tokens=False)) if tokenizer is not None else len(body)
        left -= used
        out.append({**record, key: text} if was_cut else record)
        if was_cut:
            cut = True
            break
    return out, cut


def _size(record: Mapping[str, Any]) -> int:
    return sum(len(v) for v in record.values() if isinstance(v, str))

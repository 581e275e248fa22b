"""The tool interface: a tool is an async callable with a name, a description and a JSON Schema.

``run_tool(tool, arguments, timeout)`` is how the engine calls any tool: it checks the arguments
against the tool's schema, enforces a wall-clock timeout and turns every failure (bad arguments, an
exception inside the tool, a timeout) into a ``ToolResult`` with ``ok=False`` and a one-line error,
so a failing tool is recorded as a tool error and the episode goes on. It never raises, except that
cancelling the caller (stopping a rollout) still cancels the tool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import jsonschema

TRUNCATION_MARKER = "\n[truncated]"


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
    name = getattr(tool, "name", type(tool).__name__)
    try:
        problem = validate_arguments(tool, arguments)
        if problem is not None:
            result = ToolResult.failure(f"{name}: invalid arguments: {problem}")
        else:
            result = await asyncio.wait_for(tool(**dict(arguments)), timeout)
            if not isinstance(result, ToolResult):
                result = ToolResult(
                    ok=True, content=result if isinstance(result, str | list) else str(result)
                )
    except TimeoutError:
        result = ToolResult.failure(f"{name}: timed out after {timeout:g} s", timed_out=True)
    except Exception as error:  # noqa: BLE001 - a tool failure is recorded, never raised into the episode
        detail = str(error).splitlines()[0] if str(error) else ""
        result = ToolResult.failure(f"{name}: {type(error).__name__}{': ' + detail if detail else ''}")
    if max_chars is not None and result.ok:
        result.content, cut = truncate_content(result.content, max_chars)
        result.truncated = result.truncated or cut
    result.seconds = time.perf_counter() - started
    return result


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

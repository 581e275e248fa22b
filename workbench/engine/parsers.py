"""Output parsers and post-processors that a topology names.

A parser turns a role's text into structured data (or raises ``FormatError``, which the
engine records as a format failure instead of stopping the run). A post-processor rewrites
the text before other roles see it. Both are looked up by name; register new ones with
``register_parser`` / ``register_postprocess``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from workbench.answers import last_boxed, last_number


class FormatError(ValueError):
    """A model output that does not follow the protocol its role was asked to use."""


class UnreadableJson(ValueError):
    """JSON that a model wrote whole but that a stored call cannot hold: a number that is not finite (NaN,
    Infinity, 1e999), an integer longer than Python converts, or nesting deeper than ``MAX_JSON_DEPTH``.
    Its message completes a sentence ("tool call holds NaN, which is not a finite number"); ``end`` is the
    index just after the value, None where the nesting was too deep to find it."""

    def __init__(self, message: str, end: int | None = None):
        super().__init__(message)
        self.end = end


#: How deeply JSON read from a model's output may nest (deeper is a model repeating brackets, and would
#: overflow the stack of the JSON readers and writers it passes through on its way to the run store).
MAX_JSON_DEPTH = 100


class _Refused:
    """Stands in, while decoding, for a number a run cannot store; the walk after decoding reports it."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"holds {text}, which is not a finite number")


def _constant(name: str) -> _Refused:
    return _Refused(f"holds {name}, which is not a finite number")


def _integer(text: str) -> int | _Refused:
    try:
        return int(text)
    except ValueError:  # more digits than sys.get_int_max_str_digits() allows
        return _Refused(f"holds an integer of {len(text.lstrip('-'))} digits, too long to read")


_DECODER = json.JSONDecoder(parse_float=_float, parse_int=_integer, parse_constant=_constant)


def read_json(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value that begins at ``text[start]`` and the index just after it, for text a model wrote.

    ``json.JSONDecodeError`` where it is not JSON; ``UnreadableJson`` where it is JSON that a run store
    and the dashboard could not hold (see that class). Never another exception, however deep the nesting.
    """
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:  # the C decoder recurses once per level: thousands of brackets overflow it
        raise UnreadableJson(f"is nested deeper than {MAX_JSON_DEPTH} levels") from None
    todo = [(value, 0)]  # walked without recursion
    while todo:
        item, depth = todo.pop()
        if isinstance(item, _Refused):
            raise UnreadableJson(item.reason, end)
        if isinstance(item, dict | list) and depth >= MAX_JSON_DEPTH:
            raise UnreadableJson(f"is nested deeper than {MAX_JSON_DEPTH} levels", end)
        if isinstance(item, dict):
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            todo += [(v, depth + 1) for v in item]
    return value, end


def loads_json(text: str) -> Any:
    """The whole of ``text`` (blank space around it allowed) as JSON; errors as ``read_json``'s."""
    start = len(text) - len(text.lstrip())
    value, end = read_json(text, start)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


Parser = Callable[[str], Any]
PostProcess = Callable[[str], str]

PARSERS: dict[str, Parser] = {}
POSTPROCESS: dict[str, PostProcess] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    def add(fn: Parser) -> Parser:
        PARSERS[name] = fn
        return fn

    return add


def register_postprocess(name: str) -> Callable[[PostProcess], PostProcess]:
    def add(fn: PostProcess) -> PostProcess:
        POSTPROCESS[name] = fn
        return fn

    return add


@register_parser("boxed")
def parse_boxed(text: str) -> dict[str, str]:
    """The answer inside the last ``\\boxed{}``."""
    answer = last_boxed(text)
    if answer is None:
        raise FormatError("no complete \\boxed{...} in the output")
    return {"answer": answer}


@register_parser("last_number")
def parse_last_number(text: str) -> dict[str, str]:
    """The last number in the text (what small models answer when asked for 'just the number')."""
    answer = last_number(text)
    if answer is None:
        raise FormatError("no number in the output")
    return {"answer": answer}


_VERDICT = re.compile(r"\b(correct|wrong|incorrect)\b")


@register_parser("verdict")
def parse_verdict(text: str) -> dict[str, str]:
    """MarsRL's verifier verdict: the whole word after the last 'correctness', plus the bug report.

    Whole words only, so 'incorrect' reads as wrong (the reference code's substring test does not).
    """
    lowered = text.lower()
    anchor = lowered.rfind("correctness")
    tail = lowered[anchor + len("correctness") :] if anchor >= 0 else lowered
    words = _VERDICT.findall(tail)
    if not words:
        raise FormatError("no verdict: expected 'Correctness: Correct' or 'Correctness: Wrong'")
    verdict = "correct" if words[0] == "correct" else "wrong"
    report = text[:anchor].rstrip(" *#:\n") if anchor >= 0 else text
    return {"verdict": verdict, "report": report}


_YES_NO = re.compile(r"\b(yes|no)\b")


@register_parser("yes_no")
def parse_yes_no(text: str) -> dict[str, str]:
    """A verdict given as the answer to "is the solution right?": the last whole word Yes or No (Yes reads
    as correct), plus the text before it as the report. A neutral pair: "Correct"/"Wrong" carry a prior
    toward "Correct" in a small model that Yes/No do not."""
    found = list(_YES_NO.finditer(text.lower()))
    if not found:
        raise FormatError("no verdict: expected a final Yes or No")
    last = found[-1]
    verdict = "correct" if last.group(1) == "yes" else "wrong"
    return {"verdict": verdict, "report": text[: last.start()].rstrip()}


VERDICT_PARSERS = frozenset({"verdict", "yes_no"})
"""Parsers whose output carries a ``verdict`` ('correct' / 'wrong') that a verdict reward reads."""


_OBJECT_START = re.compile(r'\{[ \t\n\r]*["}]')


@register_parser("json")
def parse_json(text: str) -> dict[str, Any]:
    """The first JSON object in the text, in a code fence or not (router and distiller roles). An object that
    a run cannot store (NaN, 1e999, nesting deeper than ``MAX_JSON_DEPTH``) is passed over whole, never
    read in part: what it holds is not the answer."""
    unreadable, after = None, 0
    for start in _OBJECT_START.finditer(text):  # only where an object can begin: "{{{{..." is not tried
        if start.start() < after:
            continue  # inside an object passed over
        try:
            value, _ = read_json(text, start.start())
        except json.JSONDecodeError:
            continue
        except UnreadableJson as error:
            if error.end is None:  # too deep to tell where it ends: nothing after it can be trusted
                raise FormatError(f"the JSON object in the output {error}") from None
            unreadable, after = unreadable or error, error.end
            continue
        if isinstance(value, dict):
            return value
    if unreadable is not None:
        raise FormatError(f"no readable JSON object in the output (one {unreadable})")
    raise FormatError("no JSON object in the output")


@register_postprocess("strip_think")
def strip_think(text: str) -> str:
    """Keep only what follows the last ``</think>``: reasoning never enters another role's context."""
    return text.split("</think>")[-1].strip()


@register_postprocess("strip_tool_calls")
def strip_tool_calls(text: str) -> str:
    """Remove tool-call blocks (MCP XML and JSON tool calls), e.g. from a worker's final message."""
    text = re.sub(r"<use_mcp_tool>.*?(</use_mcp_tool>|$)", "", text, flags=re.S)
    return re.sub(r"<tool_call>.*?(</tool_call>|$)", "", text, flags=re.S).strip()


@register_postprocess("strip")
def strip_whitespace(text: str) -> str:
    return text.strip()

"""Output parsers and post-processors that a topology names.

A parser turns a role's text into structured data (or raises ``FormatError``, which the
engine records as a format failure instead of stopping the run). A post-processor rewrites
the text before other roles see it. Both are looked up by name; register new ones with
``register_parser`` / ``register_postprocess``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from workbench.answers import last_boxed, numbers


class FormatError(ValueError):
    """A model output that does not follow the protocol its role was asked to use."""


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
    found = numbers(text)
    if not found:
        raise FormatError("no number in the output")
    return {"answer": found[-1]}


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


@register_parser("json")
def parse_json(text: str) -> dict[str, Any]:
    """The first JSON object in the text, code fences allowed (router and distiller roles)."""
    text = re.sub(r"```(?:json)?", "", text)
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
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

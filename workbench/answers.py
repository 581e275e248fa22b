"""Pulling final answers out of model text: ``\\boxed{}`` contents and numbers.

Shared by the engine's parsers, the verifiers and the task loaders, so all three read an
answer the same way.
"""

from __future__ import annotations

import re

_OPENERS = ("\\boxed{", "\\fbox{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _boxed_from(text: str, start: int) -> tuple[str, int] | None:
    """The braced content that opens at ``start`` and the index after it, or None if unclosed."""
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip(), j + 1
    return None


def all_boxed(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` (or ``\\fbox{...}``), in order, nesting balanced."""
    found, i = [], 0
    while True:
        starts = [s for s in (text.find(o, i) for o in _OPENERS) if s >= 0]
        if not starts:
            return found
        box = _boxed_from(text, min(starts))
        if box is None:
            return found
        found.append(box[0])
        i = box[1]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` when it is complete, else None (a final box cut off is no answer)."""
    start = max(text.rfind(o) for o in _OPENERS)
    if start < 0:
        return None
    box = _boxed_from(text, start)
    return box[0] if box else None


def numbers(text: str) -> list[str]:
    """Every number in the text, thousands separators removed."""
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def last_number(text: str) -> str | None:
    """The last number in the text, or None."""
    found = numbers(text)
    return found[-1] if found else None

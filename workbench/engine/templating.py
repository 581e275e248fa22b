"""The Jinja2 environments for prompt templates (strict) and for conditions and bindings (lenient).

Both are sandboxed and share the workbench's filters: ``majority`` (self-consistency voting),
``boxed`` (the content of the last ``\\boxed{}``) and ``last_number`` (the last number in a text).
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2
import jinja2.sandbox

from workbench.answers import last_boxed
from workbench.answers import last_number as _last_number


def majority(values: list[Any]) -> Any:
    """The most common value (the first seen wins ties)."""
    values = [v for v in values if v is not None]
    return max(values, key=values.count) if values else None


def boxed(text: Any) -> str | None:
    return last_boxed(text) if isinstance(text, str) else None


def last_number(text: Any) -> str | None:
    return _last_number(text) if isinstance(text, str) else None


class _Unset(jinja2.StrictUndefined):
    """A variable no node has set yet: false in ``{% if %}`` and empty in loops, an error when printed."""

    def __bool__(self) -> bool:
        return False

    def __iter__(self):  # noqa: ANN204
        return iter(())

    def __len__(self) -> int:
        return 0


templates = jinja2.sandbox.ImmutableSandboxedEnvironment(undefined=_Unset, keep_trailing_newline=True)
expressions = jinja2.sandbox.ImmutableSandboxedEnvironment()
for _environment in (templates, expressions):
    _environment.filters.update({"majority": majority, "boxed": boxed, "last_number": last_number})


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> Any:
    return expressions.compile_expression(expression, undefined_to_none=True)


@functools.lru_cache(maxsize=1024)
def template(source: str) -> jinja2.Template:
    """A compiled prompt template (cached: the same text compiles once)."""
    return templates.from_string(source)


def evaluate(expression: str, variables: dict[str, Any]) -> Any:
    """Value of a Jinja2 expression; undefined names read as None."""
    return _compiled(expression)(**variables)

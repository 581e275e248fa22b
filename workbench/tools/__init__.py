"""Tools agents call: local BM25 search, a Python sandbox, web search behind a record/replay cache.

A topology names tools by kind with options (``kind: bm25, options: {top_k: 10}``);
``make_tool(kind, **options)`` builds one and ``run_tool(tool, arguments, timeout)`` calls it
safely (validated, time-limited, failures returned as ``ToolResult(ok=False, error=...)``).

>>> from workbench.tools import make_tool, run_tool
>>> search = make_tool("bm25", top_k=5)
>>> result = await run_tool(search, {"queries": ["Who founded Vexaro Works?"]}, timeout=10)  # a notebook cell

(In a script, with no event loop running: ``asyncio.run(run_tool(...))``; a notebook already runs one, where
``asyncio.run`` fails.) Your own kinds: subclass :class:`~workbench.tools.base.Tool` and
:func:`register_tool_kind`; ``wb.train`` carries what a notebook registers into its runs
(``workbench.engine.plugins``).

Kinds: ``bm25`` (:class:`~workbench.tools.search.SearchTool`), ``python``
(:class:`~workbench.tools.sandbox.PythonTool`), ``web_search``
(:class:`~workbench.tools.web.WebSearchTool`); add more with :func:`register_tool_kind`. The
modules behind each kind load on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from workbench.tools.base import (
    TRUNCATION_MARKER,
    Tool,
    ToolError,
    ToolLike,
    ToolOptionError,
    ToolResult,
    UnknownToolKindError,
    run_tool,
    truncate_content,
    truncate_text,
    validate_arguments,
)


def _lazy(path: str) -> Callable[..., ToolLike]:
    module, _, attr = path.partition(":")

    def factory(**options: Any) -> ToolLike:
        return getattr(importlib.import_module(module), attr)(**options)

    factory.__qualname__ = factory.__name__ = attr
    factory.__doc__ = f"Build a {attr} ({path})."
    return factory


TOOL_KINDS: dict[str, Callable[..., ToolLike]] = {
    "bm25": _lazy("workbench.tools.search:SearchTool"),
    "python": _lazy("workbench.tools.sandbox:PythonTool"),
    "web_search": _lazy("workbench.tools.web:WebSearchTool"),
}


def register_tool_kind(kind: str, factory: Callable[..., ToolLike], replace: bool = False) -> None:
    """Make ``kind`` available to topologies; ``factory(**options)`` returns the tool."""
    if kind == "agent":
        raise ToolOptionError("'agent' is the engine's kind for subflows exposed as tools; pick another name")
    if kind in TOOL_KINDS and not replace:
        raise ToolOptionError(f"tool kind {kind!r} is already registered; pass replace=True to override it")
    TOOL_KINDS[kind] = factory


def make_tool(kind: str, **options: Any) -> ToolLike:
    """Build a tool of a registered kind with the topology's options."""
    try:
        factory = TOOL_KINDS[kind]
    except KeyError:
        raise UnknownToolKindError(
            f"unknown tool kind {kind!r}; known: {', '.join(sorted(TOOL_KINDS))} "
            "(register more with workbench.tools.register_tool_kind)"
        ) from None
    try:
        return factory(**options)
    except TypeError as error:
        raise ToolOptionError(
            f"tool kind {kind!r}: {error}; see the {factory.__name__} docstring for options"
        ) from None


__all__ = [
    "TOOL_KINDS",
    "TRUNCATION_MARKER",
    "Tool",
    "ToolError",
    "ToolLike",
    "ToolOptionError",
    "ToolResult",
    "UnknownToolKindError",
    "make_tool",
    "register_tool_kind",
    "run_tool",
    "truncate_content",
    "truncate_text",
    "validate_arguments",
]

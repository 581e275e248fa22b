"""A rollout's tool calls: an agent's call run (or refused as a duplicate, or forced by a replay), a routed
tool's output distilled by its System 1 role in bins, tool instances made once per key before the episodes
start; and how a tool's result becomes the text an agent reads. ``ToolCalls`` is a part of ``Rollout``
(``workbench.engine.runner``), which supplies the topology, the backends and the calls it makes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from workbench.engine.episode_state import EpisodeState
from workbench.engine.protocols import ToolCall
from workbench.engine.templating import evaluate as _evaluate
from workbench.topology.spec import AgentNode

if TYPE_CHECKING:
    from workbench.tasks import Task


class ToolCalls:
    """The tool half of ``Rollout``: its methods read ``self.topology``, ``self.backends``, ``self.forcing``,
    ``self._tools`` and ``self._tool_lock``, and call back ``self._walk`` (agent tools) and ``self._call``."""

    async def _tool_or_duplicate(
        self,
        call: ToolCall,
        node: AgentNode,
        variables: dict,
        state: EpisodeState,
        parent: int,
        done: list[dict],
        index: int = 0,
    ) -> tuple[str, dict[str, Any]]:
        """The ``index``-th tool call of the agent call at ``parent``: refused as a duplicate, taken from
        the forced episode (a replay's prefix), or run; its calls (an agent tool's, a routed tool's) run on a
        line of their own."""
        state = state.under(parent, index)
        if self.forcing is not None:
            forced = self.forcing.tool_result(parent, index, call.name)
            if forced is not None:
                return forced
            documents, info = self.forcing.routed_documents(parent, index)
            if (
                documents is not None
            ):  # the stored output, distilled again (its System 1 calls forced in turn)
                return await self._route(self.topology.tools[call.name], documents, call, variables, state,
                                         parent, info)  # fmt: skip
        if node.refuse_duplicates and {"name": call.name, "arguments": call.arguments} in done:
            return node.refuse_duplicates, {
                "name": call.name,
                "ok": False,
                "error": "duplicate call",
                "seconds": 0.0,
            }
        return await self._run_tool(call, node, variables, state, parent)

    async def _run_tool(
        self, call: ToolCall, node: AgentNode, variables: dict, state: EpisodeState, parent: int
    ) -> tuple[str, dict[str, Any]]:
        """Run one tool call; returns the text the agent sees and what to record about the call."""
        started = time.perf_counter()
        spec = self.topology.tools.get(call.name)
        if spec is None or call.name not in node.tools:
            return f"Error: unknown tool '{call.name}'; available: {', '.join(node.tools)}", {
                "name": call.name,
                "ok": False,
                "error": "unknown tool",
                "seconds": 0.0,
            }
        if spec.kind == "agent":
            sub = self.topology.subflows[spec.subflow]
            scope = {
                **self.topology.params,
                "arguments": call.arguments,
                "question": variables.get("question"),
                "task": variables.get("task"),
            }
            # inputs read the caller's variables (e.g. HiRA's memory so far); the subflow sees only them
            inputs = {var: _evaluate(expr, {**variables, **scope}) for var, expr in spec.inputs.items()}
            sub_variables = {**scope, **inputs}
            answer, status = await self._walk(sub, sub_variables, state, parent=parent)
            for var, expr in spec.outputs.items():
                variables[var] = _evaluate(expr, sub_variables)
            info = {
                "name": call.name,
                "ok": status == "complete",
                "error": None if status == "complete" else status,
                "seconds": time.perf_counter() - started,
                "agent": spec.subflow,
                "via": spec.subflow,
            }
            return _truncate(answer, spec.truncate), info
        from workbench.tools import run_tool

        key, options = self._tool_key(call.name, variables.get("task"))
        tool = self._tools.get(key)  # made before the rollout (``_make_tools``): no thread hop, see there
        if tool is None:  # an episode started on its own (``episode``, ``grouped``)
            tool = await asyncio.to_thread(self._tool, key, options)
        result = await run_tool(tool, call.arguments, timeout=spec.timeout)
        info = {"name": call.name, **result.summary()}  # with timed_out, exit_code, killed when set
        if not result.ok:
            return f"Error: {result.error}", info
        if spec.route is not None:
            return await self._route(spec, _documents(result.content), call, variables, state, parent, info)
        return _truncate(_as_text(result.content), spec.truncate), info

    async def _route(
        self,
        spec: Any,
        documents: list[str],
        call: ToolCall,
        variables: dict,
        state: EpisodeState,
        parent: int,
        info: dict[str, Any],
    ) -> tuple[str, dict[str, Any]]:
        """A routed tool's output distilled by its ``via`` role; the raw documents are kept in the record
        (``documents``), so that a replay distils the same ones without running the tool."""
        distilled = await self._distil(spec, documents, call, variables, state, parent)
        info = {**info, "via": spec.route.via, "bins": len(distilled), "documents": documents}
        return _truncate("\n\n".join(distilled), spec.truncate), info

    def _tool_key(self, name: str, task: dict[str, Any] | None) -> tuple[tuple, dict[str, Any]]:
        """The cache key of ``name``'s tool instance for ``task``, and the options that make it; a corpus-less
        search tool searches the task's own corpus."""
        spec = self.topology.tools[name]
        options = dict(spec.options)
        meta = (task or {}).get("metadata", {})
        uses_task_corpus = spec.kind == "bm25" and not {"corpus", "kb_seed", "n_entities"} & set(options)
        if uses_task_corpus and "kb_seed" in meta:
            options.update(kb_seed=meta["kb_seed"], n_entities=meta.get("n_entities", 60))
        return (name, options.get("kb_seed"), options.get("n_entities")), options

    async def _make_tools(self, tasks: list[Task]) -> None:
        """Make every tool the episodes of ``tasks`` may call before the first episode starts, on a thread (a
        corpus index can take seconds).

        Made on first use instead, a tool's thread hop let the hf backend's micro-batcher close a batch before
        some episodes' next requests arrived, a different batch in each run: the same seed then drew other
        tokens and a training run with tools did not repeat itself. A tool that cannot be made is left to the
        episode that calls it, which records the error as before."""
        missing: dict[tuple, dict[str, Any]] = {}
        for task in tasks:
            as_dict = task.to_dict()
            for name, spec in self.topology.tools.items():
                key, options = self._tool_key(name, as_dict)
                if spec.kind != "agent" and key not in self._tools:
                    missing.setdefault(key, options)
        if missing:
            await asyncio.to_thread(self._make_each, missing)

    def _make_each(self, missing: dict[tuple, dict[str, Any]]) -> None:
        for key, options in missing.items():
            try:
                self._tool(key, options)
            except Exception:  # noqa: BLE001, S112 - raised again, and recorded, where an episode calls it
                continue

    def _tool(self, key: tuple, options: dict[str, Any]) -> Any:
        """The tool instance under ``key`` (``_tool_key``), made from ``options`` on first use (building a
        corpus index can take seconds: the caller runs this on a thread)."""
        name = key[0]
        with self._tool_lock:
            if key not in self._tools:
                from workbench.tools import make_tool

                kind = self.topology.tools[name].kind
                self._tools[key] = self._tools.get(name) or make_tool(kind, **options)
            return self._tools[key]

    async def _distil(
        self,
        spec: Any,
        documents: list[str],
        call: ToolCall,
        variables: dict,
        state: EpisodeState,
        parent: int,
    ) -> list[str]:
        """MARS's System 1: pack documents into bins (FFD) and distil each bin in one stateless call."""
        from workbench.engine.binpack import pack_texts

        role = self.topology.roles[spec.route.via]
        tokenizer = self.backends[role.policy].tokenizer
        bins = pack_texts(
            documents, spec.route.capacity, lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])
        )
        calls = await asyncio.gather(
            *(
                self._call(
                    f"{call.name}:{spec.route.via}",
                    spec.route.via,
                    {**variables, "arguments": call.arguments, spec.route.variable: text},
                    line,
                    parent,
                )
                for text, line in zip(bins, state.fork(len(bins)), strict=True)
            )
        )
        return [c.completion_text for c in calls]


#: Characters of a tool result's text kept in its record (the agent read all of it; the tokens hold it too).
TOOL_TEXT_CHARS = 4000


def capped(content: Any) -> str:
    text = content if isinstance(content, str) else str(content)
    return (
        text
        if len(text) <= TOOL_TEXT_CHARS
        else text[:TOOL_TEXT_CHARS] + f" [... {len(text) - TOOL_TEXT_CHARS} more]"
    )


def _truncate(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[:limit] + "\n[truncated]"


def _documents(content: Any) -> list[str]:
    """A tool result as a list of documents (search results become titled texts)."""
    if isinstance(content, list):
        return [_as_text(item) for item in content]
    return [_as_text(content)]


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        title, url = content.get("title"), content.get("url")
        body = content.get("text") or content.get("snippet") or content.get("content")
        if body is not None:
            head = "\n".join(
                x for x in (f"Title: {title}" if title else "", f"URL: {url}" if url else "") if x
            )
            return f"{head}\n{body}".strip()
    if isinstance(content, list):
        return "\n\n".join(_as_text(item) for item in content)
    return json.dumps(content, ensure_ascii=False, default=str)

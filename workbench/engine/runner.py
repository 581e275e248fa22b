"""Runs a topology over tasks: each episode walks the flow, calling roles, agents and tools.

Episodes run concurrently as coroutines, so a batching backend sees every agent that is ready
at once. A malformed output is recorded as a format failure and the episode goes on; a tool
that fails or times out is recorded as a tool error and the agent sees that error; an exception
inside one episode is recorded on that episode and never stops the others.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.backends.base import Backend, Generation, GenerationRequest
from workbench.engine.conversation import Conversation
from workbench.engine.mas_graph import substitute
from workbench.engine.parsers import PARSERS, POSTPROCESS, FormatError
from workbench.engine.protocols import Actions, ToolCall, make_protocol
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.engine.templating import evaluate as _evaluate
from workbench.engine.templating import template
from workbench.store.codec import TokenOwner
from workbench.topology.spec import END, AgentNode, CallNode, DagNode, Flow, MapNode, Role, Topology

if TYPE_CHECKING:
    from workbench.tasks import Task


class _Cancelled(Exception):
    """Raised inside an episode once the rollout is cancelled."""


@dataclass
class _Episode:
    """Mutable state of one episode while it runs: its record and the next call position."""

    record: EpisodeRecord
    next_position: int = 0
    calls_made: dict[int, int] = field(default_factory=dict)  # per flow walk: calls so far

    def reserve(self) -> int:
        self.next_position += 1
        return self.next_position - 1


class Rollout:
    """A topology bound to backends (one per policy) and tools, ready to run episodes."""

    def __init__(
        self,
        topology: Topology,
        backends: dict[str, Backend] | Backend,
        max_tokens: int | None = None,
        tools: dict[str, Any] | None = None,
    ):
        self.topology = topology
        if not isinstance(backends, dict):
            backends = {name: backends for name in topology.policies}
        missing = set(topology.policies) - set(backends)
        if missing:
            raise ValueError(
                f"no backend for policies {sorted(missing)}; pass one per policy in the topology"
            )
        self.backends = backends
        for name, policy in topology.policies.items():
            if policy.adapter is not None:
                add = getattr(backends[name], "add_adapter", None)
                if add is None:
                    raise ValueError(
                        f"policy '{name}' is a LoRA adapter; serve it with a backend that has add_adapter "
                        "(vllm with enable_lora=True)"
                    )
                add(name, policy.adapter)
        self.max_tokens = max_tokens
        self._templates = {
            (name, i): template(m.content)
            for name, role in topology.roles.items()
            for i, m in enumerate(role.messages)
        }
        self._answers = {
            id(flow): template(flow.answer) if flow.answer else None
            for flow in [topology.flow, *topology.subflows.values()]
        }
        self._tools = dict(tools or {})
        self._tool_lock = threading.Lock()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop starting new generations and tool calls; running episodes end as ``cancelled``."""
        self._cancelled.set()

    # ------------------------------------------------------------------ episodes

    async def episode(self, task: Task, sample: int = 0) -> EpisodeRecord:
        record = EpisodeRecord(task_id=task.id, group=task.id, sample=sample)
        state = _Episode(record)
        variables: dict[str, Any] = {
            **self.topology.params,
            "question": task.question,
            "task": task.to_dict(),
        }
        try:
            record.answer, record.status = await self._walk(self.topology.flow, variables, state, parent=None)
        except _Cancelled:
            record.status = "cancelled"
        except Exception as error:  # noqa: BLE001 - one broken episode must not stop the rollout
            record.status = "error"
            record.error = f"{type(error).__name__}: {error}"
        record.variables = {k: v for k, v in variables.items() if k != "task"}
        record.calls.sort(key=lambda c: c.position)
        return record

    async def run(
        self,
        tasks: Iterable[Task],
        group_size: int = 1,
        progress: Callable[[EpisodeRecord], None] | None = None,
    ) -> list[EpisodeRecord]:
        """``group_size`` episodes per task, all concurrently; results in task-major order.

        ``progress`` is called with each episode as it finishes (a progress bar's update).
        """

        async def one(task: Task, sample: int) -> EpisodeRecord:
            record = await self.episode(task, sample)
            if progress is not None:
                progress(record)
            return record

        return list(await asyncio.gather(*(one(t, s) for t in tasks for s in range(group_size))))

    async def _walk(
        self, flow: Flow, variables: dict[str, Any], state: _Episode, parent: int | None
    ) -> tuple[str, str]:
        """Walk ``flow`` from its start; returns its rendered answer and how it ended."""
        node_name, calls, status = flow.start, 0, "complete"
        while node_name != END:
            if calls >= flow.max_calls:
                status = "call_limit"
                break
            node = flow.nodes[node_name]
            calls += 1
            if isinstance(node, AgentNode):
                output = await self._agent(node_name, node, variables, state, parent)
            elif isinstance(node, MapNode):
                output = await self._map(node_name, node, variables, state, parent)
            elif isinstance(node, DagNode):
                output = await self._dag(node, variables, state, parent)
            else:
                output = await self._single(node_name, node, variables, state, parent)
            for var, expr in getattr(node, "bind", {}).items():
                variables[var] = _evaluate(expr, {**variables, **output})
            node_name = next(
                (b.goto for b in node.next if b.when is None or _evaluate(b.when, variables)), END
            )
        template = self._answers[id(flow)]
        return (template.render(variables).strip() if template is not None else ""), status

    # ------------------------------------------------------------------ node kinds

    async def _single(
        self, node_name: str, node: CallNode, variables: dict, state: _Episode, parent: int | None
    ) -> dict[str, Any]:
        call = await self._call(node_name, node.call, variables, state, parent)
        return _output(call)

    async def _map(
        self, node_name: str, node: MapNode, variables: dict, state: _Episode, parent: int | None
    ) -> dict:
        items = _evaluate(node.over, variables)
        if isinstance(items, int):
            items = list(range(items))
        calls = await asyncio.gather(
            *(
                self._call(node_name, node.map, {**variables, node.item: item}, state, parent)
                for item in items or []
            )
        )
        variables[node.into] = [c.completion_text for c in calls]
        return {"text": variables[node.into], "parsed": [c.parsed for c in calls]}

    async def _dag(self, node: DagNode, variables: dict, state: _Episode, parent: int | None) -> dict:
        """Run an emitted agent graph level by level; each agent is a subflow with a fresh context."""
        graph = _evaluate(node.dag, variables) or {}
        agents = {a["id"]: a for a in graph.get("agents", [])}
        results: dict[str, str] = {}
        question = variables.get("question", "")

        async def run_agent(agent_id: str) -> tuple[str, str]:
            agent = agents[agent_id]
            subflow = node.agents.get(agent["name"])
            if subflow is None:
                return agent_id, f"Error: no subflow runs agents named {agent['name']}"
            sub_input = substitute(agent["input"], results)
            task_info = (
                f"Original task: {question}; Current Sub-task: {sub_input}." if sub_input else question
            )
            scope = {
                **self.topology.params,
                "question": question,
                "task": variables.get("task"),
                "task_info": task_info,
                "roles": agent["roles"],
                "agent": agent,
            }
            answer, _ = await self._walk(self.topology.subflows[subflow], scope, state, parent)
            return agent_id, answer

        for level in graph.get("order", []):
            results.update(await asyncio.gather(*(run_agent(a) for a in level)))
        sink = graph.get("sink")
        fallback = graph.get("answer") or ""
        variables[node.into] = results.get(sink, fallback) if sink else fallback
        return {"text": variables[node.into], "parsed": {"results": results, "sink": sink}}

    async def _call(
        self, node: str, role_name: str, variables: dict, state: _Episode, parent: int | None
    ) -> CallRecord:
        """One generation of a role from its templated prompt."""
        role = self.topology.roles[role_name]
        position = state.reserve()
        backend = self.backends[role.policy]
        conversation = Conversation(backend.tokenizer, self._messages(role_name, variables), mode="chat")
        queued = time.time()
        generation = await self._generate(role, backend, conversation.ids, ())
        text = _postprocess(role, generation.text)
        parsed, format_error = _parse(role, text)
        call = CallRecord(
            role=role_name,
            node=node,
            position=position,
            prompt_ids=conversation.prompt_ids,
            completion_ids=generation.completion_ids,
            logprobs=generation.logprobs,
            prompt_text=backend.tokenizer.decode(conversation.prompt_ids),
            completion_text=text,
            finish_reason=generation.finish_reason,
            policy=role.policy,
            policy_version=generation.policy_version,
            trainable=role.trainable,
            parent=parent,
            parsed=parsed,
            format_error=format_error,
            timings={"queued": queued, "finished": time.time(), **generation.timings},
        )
        state.record.calls.append(call)
        return call

    async def _agent(
        self, node_name: str, node: AgentNode, variables: dict, state: _Episode, parent: int | None
    ) -> dict:
        """The multi-turn loop: generate, run the tool calls, insert results, until an answer or the turn limit."""
        role = self.topology.roles[node.agent]
        position = state.reserve()
        backend = self.backends[role.policy]
        protocol = make_protocol(node.protocol, **node.protocol_options)
        conversation = Conversation(backend.tokenizer, self._messages(node.agent, variables), mode=role.mode)
        queued = time.time()
        actions, generation, text = Actions(), None, ""
        tool_calls: list[dict] = []
        tool_results: list[dict] = []
        format_errors: list[str] = []
        finish = "stop"
        for _turn in range(node.max_turns):
            generation = await self._generate(role, backend, conversation.ids, protocol.stop)
            text = _postprocess(role, generation.text)
            conversation.add_generation(generation, text)
            actions = protocol.parse(generation.text)
            format_errors += actions.invalid
            finish = generation.finish_reason
            if finish == "length":
                break
            if not actions.tool_calls and not actions.invalid:
                break
            calls_to_run = actions.tool_calls
            if node.max_tool_calls is not None:
                calls_to_run = calls_to_run[: max(0, node.max_tool_calls - len(tool_calls))]
            results = await asyncio.gather(
                *(
                    self._tool_or_duplicate(c, node, variables, state, position, tool_calls)
                    for c in calls_to_run
                )
            )
            for call, (content, info) in zip(calls_to_run, results, strict=True):
                tool_calls.append({"name": call.name, "arguments": call.arguments})
                tool_results.append(info)
                owner = TokenOwner.OTHER_ROLE if info.get("via") else TokenOwner.TOOL
                conversation.insert(protocol.format_result(call, content), owner, role=node.result_role)
            if node.max_tool_calls is not None and len(tool_calls) >= node.max_tool_calls:
                finish = "turn_limit"
                break
            for problem in actions.invalid:
                conversation.insert(
                    protocol.format_result(ToolCall("", {}), f"Error: {problem}"),
                    TokenOwner.TOOL,
                    role=node.result_role,
                )
        else:
            finish = "turn_limit" if actions.tool_calls else finish
        if node.final_prompt and (node.final_when == "always" or finish in {"turn_limit", "length"}):
            limited = finish in {"turn_limit", "length"}
            prompt = template(node.final_prompt).render({**variables, "limit_reached": limited})
            conversation.insert(prompt, TokenOwner.OTHER_ROLE, role="user")
            generation = await self._generate(role, backend, conversation.ids, ())
            text = _postprocess(role, generation.text)
            conversation.add_generation(generation, text)
            actions = protocol.parse(generation.text)
            finish = generation.finish_reason
        parsed = {
            "answer": actions.answer,
            "turns": len(conversation.turn_texts),
            "tool_calls": len(tool_calls),
        }
        record = CallRecord(
            role=node.agent,
            node=node_name,
            position=position,
            prompt_ids=conversation.prompt_ids,
            completion_ids=conversation.completion_ids,
            logprobs=conversation.logprobs,
            prompt_text=backend.tokenizer.decode(conversation.prompt_ids),
            completion_text=text,
            finish_reason=finish,
            policy=role.policy,
            policy_version=generation.policy_version if generation else 0,
            trainable=role.trainable,
            parent=parent,
            parsed=parsed,
            format_error="; ".join(format_errors) or None,
            mask=conversation.mask,
            tool_calls=tool_calls,
            tool_results=tool_results,
            timings={"queued": queued, "finished": time.time()},
        )
        state.record.calls.append(record)
        return {
            "text": text,
            "parsed": parsed,
            "raw": conversation.decoded(),
            "finish_reason": finish,
            "format_error": record.format_error,
            "answer": actions.answer,
        }

    # ------------------------------------------------------------------ tools

    async def _tool_or_duplicate(
        self, call: ToolCall, node: AgentNode, variables: dict, state: _Episode, parent: int, done: list[dict]
    ) -> tuple[str, dict[str, Any]]:
        if node.refuse_duplicates and {"name": call.name, "arguments": call.arguments} in done:
            return node.refuse_duplicates, {
                "name": call.name,
                "ok": False,
                "error": "duplicate call",
                "seconds": 0.0,
            }
        return await self._run_tool(call, node, variables, state, parent)

    async def _run_tool(
        self, call: ToolCall, node: AgentNode, variables: dict, state: _Episode, parent: int
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
            inputs = {var: _evaluate(expr, scope) for var, expr in spec.inputs.items()}
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

        tool = await asyncio.to_thread(self._tool, call.name, variables.get("task"))
        result = await run_tool(tool, call.arguments, timeout=spec.timeout)
        info = {
            "name": call.name,
            "ok": result.ok,
            "error": result.error,
            "seconds": result.seconds,
            "truncated": result.truncated,
        }
        if not result.ok:
            return f"Error: {result.error}", info
        if spec.route is not None:
            documents = _documents(result.content)
            distilled = await self._distil(spec, documents, call, variables, state, parent)
            info["via"] = spec.route.via
            info["bins"] = len(distilled)
            return _truncate("\n\n".join(distilled), spec.truncate), info
        return _truncate(_as_text(result.content), spec.truncate), info

    def _tool(self, name: str, task: dict[str, Any] | None) -> Any:
        """The tool instance for ``name``; a corpus-less search tool searches the task's own corpus."""
        spec = self.topology.tools[name]
        options = dict(spec.options)
        meta = (task or {}).get("metadata", {})
        uses_task_corpus = spec.kind == "bm25" and not {"corpus", "kb_seed", "n_entities"} & set(options)
        if uses_task_corpus and "kb_seed" in meta:
            options.update(kb_seed=meta["kb_seed"], n_entities=meta.get("n_entities", 60))
        key = (name, options.get("kb_seed"), options.get("n_entities"))
        with self._tool_lock:
            if key not in self._tools:
                from workbench.tools import make_tool

                self._tools[key] = self._tools.get(name) or make_tool(spec.kind, **options)
            return self._tools[key]

    async def _distil(
        self, spec: Any, documents: list[str], call: ToolCall, variables: dict, state: _Episode, parent: int
    ) -> list[str]:
        """MARS's System 1: pack documents into bins (FFD) and distil each bin in one stateless call."""
        from workbench.rl.binpack import pack_texts

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
                    state,
                    parent,
                )
                for text in bins
            )
        )
        return [c.completion_text for c in calls]

    # ------------------------------------------------------------------ helpers

    def _messages(self, role_name: str, variables: dict) -> list[dict[str, str]]:
        role = self.topology.roles[role_name]
        return [
            {"role": m.role, "content": self._templates[(role_name, i)].render(variables)}
            for i, m in enumerate(role.messages)
        ]

    async def _generate(
        self, role: Role, backend: Backend, prompt_ids: list[int], stop: tuple[str, ...]
    ) -> Generation:
        if self._cancelled.is_set():
            raise _Cancelled
        max_tokens = role.sampling.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        (generation,) = await backend.generate(
            GenerationRequest(
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                temperature=role.sampling.temperature,
                top_p=role.sampling.top_p,
                stop=tuple(dict.fromkeys((*stop, *role.stop))),
                adapter=role.policy if self.topology.policies[role.policy].adapter else None,
            )
        )
        return generation


def _output(call: CallRecord) -> dict[str, Any]:
    return {
        "text": call.completion_text,
        "parsed": call.parsed,
        "raw": call.completion_text,
        "finish_reason": call.finish_reason,
        "format_error": call.format_error,
    }


def _postprocess(role: Role, text: str) -> str:
    for step in role.postprocess:
        text = POSTPROCESS[step](text)
    return text


def _parse(role: Role, text: str) -> tuple[Any, str | None]:
    if role.parser is None:
        return None, None
    try:
        return PARSERS[role.parser](text), None
    except FormatError as error:
        return None, str(error)


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


def run_sync(coroutine_factory: Callable[[], Any], on_interrupt: Callable[[], None] | None = None) -> Any:
    """Run a coroutine from plain or notebook code (a running loop gets its own thread).

    An interrupt (Ctrl-C, or the notebook's stop button) calls ``on_interrupt`` and waits for the
    coroutine to wind down, so what finished is kept.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if on_interrupt is None:
            return asyncio.run(coroutine_factory())
    return _run_in_thread(coroutine_factory, on_interrupt)


def _run_in_thread(coroutine_factory: Callable[[], Any], on_interrupt: Callable[[], None] | None) -> Any:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coroutine_factory())
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        if on_interrupt is None:
            raise
        on_interrupt()
        thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]

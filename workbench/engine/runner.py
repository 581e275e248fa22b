"""Runs a topology over tasks: each episode walks the flow, calling roles, agents and tools.

Episodes run concurrently as coroutines, so a batching backend sees every agent that is ready at once. A
seeded rollout gives each generation request a seed of its own (``request_seed``: the seed, or in training the
step's seed, the task, the sample, the call's place in the episode's structure and turn,
``workbench.engine.episode_state``), so what a call draws does not depend on which requests share its decode
batch, how fast a tool answered, which process ran it, or which of parallel branches started first; an
episode's calls are numbered in the order of their places. A malformed output is recorded as a format failure
and the episode goes on; a tool that fails or times out is recorded as a tool error and the agent sees that
error; an exception inside one episode is recorded on that episode and never stops the others. ``Rollout``
walks the flow and makes the calls; its agent steps are ``workbench.engine.agent_loop``, its tool calls
``workbench.engine.tool_calls``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from workbench.backends.base import Backend, Generation, GenerationRequest
from workbench.engine.agent_loop import AgentLoop, postprocess
from workbench.engine.conversation import Conversation
from workbench.engine.episode_state import Branch, Cancelled, EpisodeState, renumber
from workbench.engine.forcing import Forcing, request_seed, step_seed
from workbench.engine.mas_graph import substitute
from workbench.engine.parsers import PARSERS, FormatError
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.engine.selectors import SELECTORS
from workbench.engine.templating import evaluate as _evaluate
from workbench.engine.templating import template
from workbench.engine.tool_calls import ToolCalls
from workbench.rewards.assign import answer_text, assign, call_reward, judge_calls, judged_reward
from workbench.topology.spec import END, AgentNode, DagNode, Flow, MapNode, Role, Topology

if TYPE_CHECKING:
    from workbench.tasks import Task


class Rollout(AgentLoop, ToolCalls):
    """A topology bound to backends (one per policy) and tools, ready to run episodes."""

    def __init__(
        self,
        topology: Topology,
        backends: dict[str, Backend] | Backend,
        max_tokens: int | None = None,
        tools: dict[str, Any] | None = None,
        judge: Backend | None = None,
        seed: int | None = None,
        forcing: Forcing | None = None,
    ):
        """``seed``: give every generation request a seed of its own, derived from ``seed``, the task, the
        episode's sample and the call's place and turn (``request_seed``), so that an episode's draws do not
        depend on what else was decoded beside it, nor on the timing of its parallel branches; None (the
        default) leaves requests unseeded.
        A training step passes its ``step`` to ``run``/``episode``/``grouped``: its requests' seeds then
        derive from ``step_seed(seed, step)``, so a task drawn again at a later step draws other tokens.
        ``forcing``: answer some generations and tool calls from a stored episode instead (a replay's
        prefix, ``workbench.engine.forcing``)."""
        self.topology = topology
        self.seed = seed
        self.forcing = forcing
        judged = sorted(name for name, role in topology.roles.items() if role.reward.judge)
        if judged and judge is None:
            raise ValueError(
                f"the reward rules of {', '.join(judged)} name an LLM judge; give the rollout a judge backend "
                "(judge=..., or judge_model in the training config)"
            )
        self.judge = judge
        self._judges: dict[str, Any] = {}
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
        self._prefills = {
            name: template(role.prefill) for name, role in topology.roles.items() if role.prefill
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

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # ------------------------------------------------------------------ episodes

    def _seed(self, step: int | None) -> int | None:
        """The seed of the episodes of training step ``step`` (None: a rollout outside training)."""
        if self.seed is None or step is None:
            return self.seed
        return step_seed(self.seed, step)

    def _state(self, record: EpisodeRecord, step: int | None) -> EpisodeState:
        """A new episode's state; a replay numbers calls its stored episode lacks after the stored ones."""
        first = 0 if self.forcing is None else self.forcing.first_new
        return EpisodeState(record, self._seed(step), positions=itertools.count(first))

    def _reserve(self, state: EpisodeState) -> int:
        """The position of a new call on ``state``'s line (a replay's: the stored call's at its place)."""
        place = state.take()
        position = None if self.forcing is None else self.forcing.position(place)
        if position is None:
            position = next(state.positions)
        state.places[position] = place
        return position

    async def episode(self, task: Task, sample: int = 0, step: int | None = None) -> EpisodeRecord:
        """One episode of ``task`` (its ``sample``-th); ``step``: the training step it belongs to (its seeds)."""
        record = EpisodeRecord(task_id=task.id, group=task.id, sample=sample)
        state = self._state(record, step)
        variables: dict[str, Any] = {
            **self.topology.params,
            "question": task.question,
            "task": task.to_dict(),
        }
        try:
            record.answer, record.status = await self._walk(self.topology.flow, variables, state, parent=None)
        except Cancelled:
            record.status = "cancelled"
        except Exception as error:  # noqa: BLE001 - one broken episode must not stop the rollout
            record.status = "error"
            record.error = describe_error(error)
        record.variables = {k: v for k, v in variables.items() if k != "task"}
        renumber(record, state.places, reorder=self.forcing is None)  # a replay keeps the stored positions
        await judge_calls(self.topology, record, task, self._judge)
        record.reward = assign(self.topology, record, task)
        return record

    async def grouped(
        self,
        task: Task,
        group_size: int,
        on_level: Callable[[Task, list[EpisodeRecord]], None] | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        step: int | None = None,
    ) -> list[EpisodeRecord]:
        """MarsRL's grouped agentic rollout of one task: ``group_size`` episodes that fan out as they go.

        The start node is sampled ``group_size`` times (one episode each). Where a node has ``select``,
        the outputs of all branches arriving there are pooled, ``k`` are chosen by the strategy from
        their rewards (scored as soon as each call finishes), and each is sampled again ``samples``
        times; so every group shares one input. Calls descending from an episode's first call stay in
        that episode, each with its ``source``. An episode's answer is the flow's answer over its
        first call's variables (the Solver's solution).

        ``on_level`` is called after each level (one node on every live branch) with the group's
        episodes as they stand, and ``gate`` is awaited before every level but the first: an
        agent-level pipeline runs one level of every group per step and trains its scored calls. ``step``:
        the training step the group started at (its requests' seeds, see ``Rollout``).
        """
        base = {**self.topology.params, "question": task.question, "task": task.to_dict()}
        states = [
            self._state(EpisodeRecord(task_id=task.id, group=task.id, sample=i), step)
            for i in range(group_size)
        ]
        rng = random.Random(f"{task.id}")
        flow = self.topology.flow
        frontier = {flow.start: [Branch(dict(base), s) for s in states]}
        first = True
        while frontier:
            if gate is not None and not first:
                await gate()
            jobs: list[tuple[str, Branch]] = []
            for node_name, branches in frontier.items():
                select = getattr(flow.nodes[node_name], "select", None)
                if select is not None and not first:
                    chosen = SELECTORS[select.strategy](
                        branches, [b.reward for b in branches], select.k, select.prefer, rng
                    )
                    n = select.samples or group_size
                    branches = [b.fork() for b in chosen for _ in range(n)]
                jobs += [(node_name, b) for b in branches]
            results = await asyncio.gather(*(self._advance(flow, name, b, task) for name, b in jobs))
            if on_level is not None:
                on_level(task, [s.record for s in states])
            frontier = {}
            for (_, branch), goto in zip(jobs, results, strict=True):
                if first:
                    template = self._answers[id(flow)]
                    record = branch.state.record
                    ended = record.status != "complete"  # cancelled or failed before its first output
                    record.answer = (
                        "" if ended or template is None else template.render(branch.variables).strip()
                    )
                    record.variables = {k: v for k, v in branch.variables.items() if k != "task"}
                if goto is not None and goto != END:
                    frontier.setdefault(goto, []).append(branch)
            first = False
        records = []
        for state in states:  # numbered as they started: one level at a time, in its branches' order
            renumber(state.record, state.places, reorder=False)
            await judge_calls(self.topology, state.record, task, self._judge)
            state.record.reward = assign(self.topology, state.record, task)
            records.append(state.record)
        return records

    async def _advance(self, flow: Flow, node_name: str, branch: Branch, task: Task) -> str | None:
        """Run one node on one branch; returns the node to go to next, or None when the branch ends."""
        record = branch.state.record
        if branch.calls >= flow.max_calls:
            record.status = "call_limit"
            return None
        node = flow.nodes[node_name]
        branch.calls += 1
        try:
            output = await self._run_node(
                node_name, node, branch.variables, branch.state, None, branch.source
            )
        except Cancelled:
            record.status = "cancelled"
            return None
        except Exception as error:  # noqa: BLE001 - one broken branch must not stop the others
            record.status, record.error = "error", describe_error(error)
            return None
        if output.get("position") is not None:  # the branch's path through the group (what a replay follows)
            made = next(c for c in record.calls if c.position == output["position"])
            made.previous, branch.last = branch.last, made.position
        call = self._passed_on(output, record)
        if call is not None:
            source = next((c for c in record.calls if c.position == branch.source), None)
            rule = self.topology.roles[call.role].reward
            if rule.judge is not None and rule.kind == "answer":
                judgement = await self._judge(rule.judge).judge(task.question, answer_text(call), task.answer)
                call.rewards = judged_reward(rule, call, judgement)
            else:
                call.rewards = call_reward(rule, call, source, task) or {}
            branch.reward = call.rewards.get("reward")
            branch.source = call.position
        self._bind(node, output, branch.variables)
        return self._next(node, branch.variables)

    async def run(
        self,
        tasks: Iterable[Task],
        group_size: int = 1,
        progress: Callable[[EpisodeRecord], None] | None = None,
        on_level: Callable[[Task, list[EpisodeRecord]], None] | None = None,
        step: int | None = None,
    ) -> list[EpisodeRecord]:
        """``group_size`` episodes per task, all concurrently; results in task-major order.

        ``progress`` is called with each episode as it finishes (a progress bar's update);
        ``on_level`` after each level of a grouped rollout (see ``grouped``); ``step``: the training step
        these episodes belong to (their requests' seeds, see ``Rollout``).
        """

        tasks = list(tasks)
        await self._make_tools(tasks)

        async def one(task: Task, sample: int) -> EpisodeRecord:
            record = await self.episode(task, sample, step)
            if progress is not None:
                progress(record)
            return record

        if self.grouped_mode:

            async def group(task: Task) -> list[EpisodeRecord]:
                records = await self.grouped(task, group_size, on_level, step=step)
                for record in records:
                    if progress is not None:
                        progress(record)
                return records

            groups = await asyncio.gather(*(group(t) for t in tasks))
            return [record for records in groups for record in records]
        return list(await asyncio.gather(*(one(t, s) for t in tasks for s in range(group_size))))

    @property
    def grouped_mode(self) -> bool:
        """Whether the main flow fans out with ``select`` (MarsRL grouped agentic rollouts)."""
        return any(getattr(n, "select", None) is not None for n in self.topology.flow.nodes.values())

    async def _walk(
        self, flow: Flow, variables: dict[str, Any], state: EpisodeState, parent: int | None
    ) -> tuple[str, str]:
        """Walk ``flow`` from its start; returns its rendered answer and how it ended."""
        node_name, calls, status, source = flow.start, 0, "complete", None
        while node_name != END:
            if calls >= flow.max_calls:
                status = "call_limit"
                break
            node = flow.nodes[node_name]
            calls += 1
            output = await self._run_node(node_name, node, variables, state, parent, source)
            passed_on = self._passed_on(output, state.record)
            if passed_on is not None:
                source = passed_on.position
            self._bind(node, output, variables)
            node_name = self._next(node, variables)
        template = self._answers[id(flow)]
        return (template.render(variables).strip() if template is not None else ""), status

    def _passed_on(self, output: dict[str, Any], record: EpisodeRecord) -> CallRecord | None:
        """The node's call if it becomes what the next call judges (its ``source``, and the upstream reward
        a ``select`` reads). A call of a role rewarded ``none`` does not: it is a step inside the judgement
        of the output before it (a check that a Verifier's verdict call reads), which stays the source."""
        position = output.get("position")
        if position is None:
            return None
        call = next(c for c in record.calls if c.position == position)
        role = self.topology.roles.get(call.role)
        return None if role is not None and role.reward.kind == "none" else call

    async def _run_node(
        self,
        node_name: str,
        node: Any,
        variables: dict,
        state: EpisodeState,
        parent: int | None,
        source: int | None,
    ) -> dict[str, Any]:
        if isinstance(node, AgentNode):
            return await self._agent(node_name, node, variables, state, parent, source)
        if isinstance(node, MapNode):
            return await self._map(node_name, node, variables, state, parent)
        if isinstance(node, DagNode):
            return await self._dag(node, variables, state, parent)
        call = await self._call(node_name, node.call, variables, state, parent, source)
        return _output(call)

    @staticmethod
    def _bind(node: Any, output: dict[str, Any], variables: dict[str, Any]) -> None:
        for var, expr in getattr(node, "bind", {}).items():
            variables[var] = _evaluate(expr, {**variables, **output})

    @staticmethod
    def _next(node: Any, variables: dict[str, Any]) -> str:
        return next((b.goto for b in node.next if b.when is None or _evaluate(b.when, variables)), END)

    # ------------------------------------------------------------------ node kinds

    async def _map(
        self, node_name: str, node: MapNode, variables: dict, state: EpisodeState, parent: int | None
    ) -> dict:
        items = _evaluate(node.over, variables)
        if isinstance(items, int):
            items = list(range(items))
        items = list(items or [])
        calls = await asyncio.gather(
            *(
                self._call(node_name, node.map, {**variables, node.item: item}, line, parent)
                for item, line in zip(items, state.fork(len(items)), strict=True)
            )
        )
        variables[node.into] = [c.completion_text for c in calls]
        return {"text": variables[node.into], "parsed": [c.parsed for c in calls]}

    async def _dag(self, node: DagNode, variables: dict, state: EpisodeState, parent: int | None) -> dict:
        """Run an emitted agent graph level by level; each agent is a subflow with a fresh context."""
        graph = _evaluate(node.dag, variables) or {}
        agents = {a["id"]: a for a in graph.get("agents", [])}
        results: dict[str, str] = {}
        question = variables.get("question", "")

        async def run_agent(agent_id: str, line: EpisodeState) -> tuple[str, str]:
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
                "sub_task": sub_input,  # the sub-task alone ("" for the whole task): the repo's exclude-task variant
                "roles": agent["roles"],
                "agent": agent,
            }
            answer, _ = await self._walk(self.topology.subflows[subflow], scope, line, parent)
            return agent_id, answer

        for level in graph.get("order", []):
            lines = state.fork(len(level))
            results.update(
                await asyncio.gather(*(run_agent(a, line) for a, line in zip(level, lines, strict=True)))
            )
        sink = graph.get("sink")
        fallback = graph.get("answer") or ""
        variables[node.into] = results.get(sink, fallback) if sink else fallback
        return {"text": variables[node.into], "parsed": {"results": results, "sink": sink}}

    async def _call(
        self,
        node: str,
        role_name: str,
        variables: dict,
        state: EpisodeState,
        parent: int | None,
        source: int | None = None,
    ) -> CallRecord:
        """One generation of a role from its templated prompt."""
        role = self.topology.roles[role_name]
        position = self._reserve(state)
        backend = self.backends[role.policy]
        conversation = self._conversation(role_name, backend, variables)
        queued = time.time()
        generation = await self._generate(role, backend, conversation.ids, (), state, position, 0)
        text = postprocess(role, generation.text)
        parsed, format_error = _parse(role, text)
        conversation.add_generation(generation, text)
        return self._record(
            state,
            role_name,
            node,
            position,
            conversation,
            text,
            generation,
            parent=parent,
            source=source,
            parsed=parsed,
            format_error=format_error,
            mask=None,
            timings={"queued": queued, "finished": time.time(), **generation.timings},
        )

    def _record(
        self,
        state: EpisodeState,
        role_name: str,
        node: str,
        position: int,
        conversation: Conversation,
        text: str,
        generation: Generation | None,
        **fields: Any,
    ) -> CallRecord:
        """Build a call's record from its conversation and add it to the episode."""
        role = self.topology.roles[role_name]
        call = CallRecord(
            role=role_name,
            node=node,
            position=position,
            prompt_ids=conversation.prompt_ids,
            completion_ids=conversation.completion_ids,
            logprobs=conversation.logprobs,
            prompt_text=self.backends[role.policy].tokenizer.decode(conversation.prompt_ids),
            completion_text=text,
            finish_reason=fields.pop("finish_reason", generation.finish_reason if generation else "stop"),
            policy=role.policy,
            policy_version=generation.policy_version if generation else 0,
            trainable=role.trainable,
            **fields,
        )
        state.record.calls.append(call)
        return call

    # ------------------------------------------------------------------ helpers

    def _messages(self, role_name: str, variables: dict) -> list[dict[str, str]]:
        role = self.topology.roles[role_name]
        return [
            {"role": m.role, "content": self._templates[(role_name, i)].render(variables)}
            for i, m in enumerate(role.messages)
        ]

    def _judge(self, prompt: str) -> Any:
        from workbench.rewards.judge import LLMJudge

        if prompt not in self._judges:
            self._judges[prompt] = LLMJudge(self.judge, prompt)
        return self._judges[prompt]

    def _conversation(self, role_name: str, backend: Backend, variables: dict) -> Conversation:
        """A role's fresh context: its rendered messages, then its prefill in raw mode."""
        prefill = self._prefills.get(role_name)
        return Conversation(
            backend.tokenizer,
            self._messages(role_name, variables),
            mode=self.topology.roles[role_name].mode,
            raw_prefix=prefill.render(variables) if prefill else "",
        )

    async def _generate(
        self,
        role: Role,
        backend: Backend,
        prompt_ids: list[int],
        stop: tuple[str, ...],
        state: EpisodeState,
        position: int,
        turn: int,
    ) -> Generation:
        """The ``turn``-th generation of the call at ``position``: forced (a replay's prefix) or sampled."""
        if self._cancelled.is_set():
            raise Cancelled
        if self.forcing is not None:
            forced = self.forcing.generation(position, turn, prompt_ids, backend.tokenizer)
            if forced is not None:
                return forced
        max_tokens = role.sampling.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        place = state.places[position]
        seeded = place if self.forcing is None else self.forcing.seed_key(position, place)
        (generation,) = await backend.generate(
            GenerationRequest(
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                temperature=role.sampling.temperature,
                top_p=role.sampling.top_p,
                top_k=role.sampling.top_k,
                stop=tuple(dict.fromkeys((*stop, *role.stop))),
                # a policy the backend serves as a LoRA adapter (declared in the spec, or a trainer's)
                adapter=role.policy if role.policy in getattr(backend, "adapters", {}) else None,
                seed=None
                if state.seed is None
                else request_seed(state.seed, state.record.task_id, state.record.sample, seeded, turn),
            )
        )
        return generation


def describe_error(error: BaseException) -> str:
    """``Type: message`` of an episode's error, even for an exception whose message itself fails."""
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:  # noqa: BLE001 - a hostile __str__ must not end the rollout
        return f"{type(error).__name__}: (its message could not be read)"


def _output(call: CallRecord) -> dict[str, Any]:
    return {
        "position": call.position,
        "text": call.completion_text,
        "parsed": call.parsed,
        "raw": call.completion_text,
        "finish_reason": call.finish_reason,
        "format_error": call.format_error,
    }


def _parse(role: Role, text: str) -> tuple[Any, str | None]:
    if role.parser is None:
        return None, None
    try:
        return PARSERS[role.parser](text), None
    except FormatError as error:
        return None, str(error)

"""Runs a topology over tasks: each episode walks the flow, calling roles on a backend.

Episodes run concurrently as coroutines, so a batching backend sees every agent that is ready
at once. A malformed output is recorded as a format failure and the episode goes on; an
exception inside one episode is recorded on that episode and never stops the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.sandbox

from workbench.backends.base import Backend, GenerationRequest
from workbench.engine.parsers import PARSERS, POSTPROCESS, FormatError
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.topology.spec import END, Role, Topology

if TYPE_CHECKING:
    from workbench.tasks import Task

_env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)
_lenient = jinja2.sandbox.ImmutableSandboxedEnvironment()


class Rollout:
    """A topology bound to backends (one per policy), ready to run episodes."""

    def __init__(
        self,
        topology: Topology,
        backends: dict[str, Backend] | Backend,
        max_tokens: int | None = None,
        seed: int = 0,
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
        self.max_tokens = max_tokens
        self.seed = seed
        self._templates = {
            (name, i): _env.from_string(m.content)
            for name, role in topology.roles.items()
            for i, m in enumerate(role.messages)
        }
        self._answer = _env.from_string(topology.flow.answer) if topology.flow.answer else None

    async def episode(self, task: Task, sample: int = 0) -> EpisodeRecord:
        record = EpisodeRecord(task_id=task.id, group=task.id, sample=sample)
        variables: dict[str, Any] = {"question": task.question, "task": task.to_dict()}
        flow = self.topology.flow
        node_name = flow.start
        try:
            while node_name != END:
                if len(record.calls) >= flow.max_calls:
                    record.status = "call_limit"
                    break
                node = flow.nodes[node_name]
                call = await self._call(node_name, node.call, variables, len(record.calls), sample)
                record.calls.append(call)
                output = {
                    "text": call.completion_text,
                    "parsed": call.parsed,
                    "raw": call.completion_text,
                    "finish_reason": call.finish_reason,
                    "format_error": call.format_error,
                }
                for var, expr in node.bind.items():
                    variables[var] = _evaluate(expr, {**variables, **output})
                node_name = next(
                    (b.goto for b in node.next if b.when is None or _evaluate(b.when, variables)), END
                )
            if self._answer is not None:
                record.answer = self._answer.render(variables).strip()
        except Exception as error:  # noqa: BLE001 - one broken episode must not stop the rollout
            record.status = "error"
            record.error = f"{type(error).__name__}: {error}"
        record.variables = {k: v for k, v in variables.items() if k != "task"}
        return record

    async def _call(
        self, node: str, role_name: str, variables: dict, position: int, sample: int
    ) -> CallRecord:
        role: Role = self.topology.roles[role_name]
        backend = self.backends[role.policy]
        messages = [
            {"role": m.role, "content": self._templates[(role_name, i)].render(variables)}
            for i, m in enumerate(role.messages)
        ]
        prompt_ids = _chat_ids(backend.tokenizer, messages)
        max_tokens = role.sampling.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        queued = time.time()
        (generation,) = await backend.generate(
            GenerationRequest(
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                temperature=role.sampling.temperature,
                top_p=role.sampling.top_p,
            )
        )
        text = generation.text
        for step in role.postprocess:
            text = POSTPROCESS[step](text)
        parsed, format_error = None, None
        if role.parser is not None:
            try:
                parsed = PARSERS[role.parser](text)
            except FormatError as error:
                format_error = str(error)
        return CallRecord(
            role=role_name,
            node=node,
            position=position,
            prompt_ids=prompt_ids,
            completion_ids=generation.completion_ids,
            logprobs=generation.logprobs,
            prompt_text=backend.tokenizer.decode(prompt_ids),
            completion_text=text,
            finish_reason=generation.finish_reason,
            policy=role.policy,
            policy_version=generation.policy_version,
            trainable=role.trainable,
            parsed=parsed,
            format_error=format_error,
            timings={"queued": queued, "finished": time.time(), **generation.timings},
        )

    async def run(self, tasks: Iterable[Task], samples: int = 1) -> list[EpisodeRecord]:
        """One episode per task and sample, all concurrently; results in task-major order."""
        jobs = [self.episode(task, s) for task in tasks for s in range(samples)]
        return list(await asyncio.gather(*jobs))


def _evaluate(expression: str, variables: dict[str, Any]) -> Any:
    value = _lenient.compile_expression(expression, undefined_to_none=True)(**variables)
    return value


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def run_sync(coroutine_factory: Callable[[], Any]) -> Any:
    """Run a coroutine from plain or notebook code (a running loop gets its own thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine_factory())
    result: dict[str, Any] = {}

    def target() -> None:
        result["value"] = asyncio.run(coroutine_factory())

    import threading

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return result["value"]

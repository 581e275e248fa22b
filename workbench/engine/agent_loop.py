"""An agent step of a rollout: the role generates, its protocol reads tool calls out of the text, the tools run
(concurrently), their results go back into the conversation, until the role answers or a limit ends it.
``AgentLoop`` is a part of ``Rollout`` (``workbench.engine.runner``), which supplies the conversation, the
generation, the record and the tool calls (``workbench.engine.tool_calls``)."""

from __future__ import annotations

import asyncio
import time

from workbench.engine.episode_state import EpisodeState
from workbench.engine.parsers import POSTPROCESS
from workbench.engine.protocols import Actions, ToolCall, make_protocol
from workbench.engine.templating import template
from workbench.engine.tool_calls import capped
from workbench.store.codec import TokenOwner
from workbench.topology.spec import AgentNode, Role


class AgentLoop:
    """The agent half of ``Rollout``."""

    async def _agent(
        self,
        node_name: str,
        node: AgentNode,
        variables: dict,
        state: EpisodeState,
        parent: int | None,
        source: int | None = None,
    ) -> dict:
        """The multi-turn loop: generate, run the tool calls, insert results, until an answer or the turn limit."""
        role = self.topology.roles[node.agent]
        position = self._reserve(state)
        backend = self.backends[role.policy]
        protocol = make_protocol(node.protocol, **node.protocol_options)
        conversation = self._conversation(node.agent, backend, variables)
        queued = time.time()
        actions, generation, text = Actions(), None, ""
        tool_calls: list[dict] = []
        tool_results: list[dict] = []
        format_errors: list[str] = []
        finish = "stop"
        for turn in range(node.max_turns):
            generation = await self._generate(
                role, backend, conversation.ids, protocol.stop, state, position, turn
            )
            text = postprocess(role, generation.text)
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
                    self._tool_or_duplicate(
                        c, node, variables, state, position, tool_calls, len(tool_calls) + i
                    )
                    for i, c in enumerate(calls_to_run)
                )
            )
            for call, (content, info) in zip(calls_to_run, results, strict=True):
                tool_calls.append({"name": call.name, "arguments": call.arguments})
                tool_results.append(
                    {**info, "text": capped(content)}
                )  # what the agent read, beside the summary
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
            turns = len(conversation.turn_texts)
            generation = await self._generate(role, backend, conversation.ids, (), state, position, turns)
            text = postprocess(role, generation.text)
            conversation.add_generation(generation, text)
            actions = protocol.parse(generation.text)
            finish = generation.finish_reason
        parsed = {
            "answer": actions.answer,
            "turns": len(conversation.turn_texts),
            "tool_calls": len(tool_calls),
            # the whole interleaved completion by owner: completion_text holds only the last turn
            "transcript": conversation.segments(),
        }
        record = self._record(
            state,
            node.agent,
            node_name,
            position,
            conversation,
            text,
            generation,
            finish_reason=finish,
            parent=parent,
            source=source,
            parsed=parsed,
            format_error="; ".join(format_errors) or None,
            mask=conversation.mask,
            tool_calls=tool_calls,
            tool_results=tool_results,
            timings={"queued": queued, "finished": time.time()},
        )
        return {
            "position": position,
            "text": text,
            "parsed": parsed,
            "raw": conversation.decoded(),
            "finish_reason": finish,
            "format_error": record.format_error,
            "answer": actions.answer,
        }


def postprocess(role: Role, text: str) -> str:
    """A role's output after its ``postprocess`` steps (strip think, truncate, ...): what other roles see."""
    for step in role.postprocess:
        text = POSTPROCESS[step](text)
    return text

"""Text protocols by which a role asks for tools and gives its answer, named by the topology.

A protocol reads one turn of model output into ``Actions`` (tool calls, a final answer, and
what was malformed) and writes tool results back in the form the model was prompted with. They
are parsers, not code paths: a malformed call becomes an ``invalid`` entry that the engine
records as a format failure, and the episode goes on.

- ``json_tool_call``: Qwen/Hermes style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  results in ``<tool_response>...</tool_response>``, answer in ``<answer>...</answer>`` (MARS).
- ``mcp_xml``: ``<use_mcp_tool><server_name>..</server_name><tool_name>..</tool_name><arguments>{json}
  </arguments></use_mcp_tool>`` at the end of a turn; answer in ``\\boxed{}`` (MATPO).
- ``tags``: plain-text tags such as HiRA's ``<|begin_call_subtask|>...<|end_call_subtask|>``
  calling one tool with the enclosed text; results in ``<|begin_subtask_result|>...`` (HiRA).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.answers import last_boxed
from workbench.engine.parsers import UnreadableJson, loads_json


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Actions:
    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    invalid: list[str] = field(default_factory=list)  # why a call could not be read

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "answer": self.answer,
            "invalid": self.invalid,
        }


class Protocol:
    """How tool calls and answers are written in text. Subclasses fill in ``parse`` and ``format_result``."""

    name = "protocol"
    stop: tuple[str, ...] = ()  # stop strings that end a turn at a complete call

    def parse(self, text: str) -> Actions:
        raise NotImplementedError

    def format_result(self, call: ToolCall, content: str) -> str:
        raise NotImplementedError


def _json(text: str) -> Any:
    """``text`` as JSON; ``UnreadableJson`` for NaN, Infinity or a number too large for a float (which the
    run store would keep but JSON readers such as the dashboard's browser refuse), an integer too long to
    convert, or nesting deeper than ``MAX_JSON_DEPTH``."""
    return loads_json(text)


def _answer_tag(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    return found[-1].strip() if found else None


def _answer_reader(kind: str) -> Callable[[str], str | None]:
    readers = {"answer_tag": _answer_tag, "boxed": last_boxed}
    if kind not in readers:
        raise ValueError(f"unknown answer form '{kind}'; known: {', '.join(readers)}")
    return readers[kind]


class JsonToolCall(Protocol):
    name = "json_tool_call"
    stop = ("</tool_call>",)
    _call = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def __init__(self, answer: str = "answer_tag"):
        self.answer = _answer_reader(answer)

    def parse(self, text: str) -> Actions:
        actions = Actions(answer=self.answer(text))
        for body in self._call.findall(text):
            try:
                data = _json(body.strip())
            except json.JSONDecodeError as error:
                actions.invalid.append(f"tool call is not valid JSON ({error.msg} at char {error.pos})")
                continue
            except UnreadableJson as error:
                actions.invalid.append(f"tool call {error}")
                continue
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                actions.invalid.append('tool call needs {"name": <tool>, "arguments": {...}}')
                continue
            arguments = data.get("arguments", data.get("parameters", {}))
            if isinstance(arguments, str):
                try:
                    arguments = _json(arguments)
                except (json.JSONDecodeError, UnreadableJson):
                    actions.invalid.append("tool call arguments are a string that is not JSON")
                    continue
            if not isinstance(arguments, dict):
                actions.invalid.append("tool call arguments must be a JSON object")
                continue
            actions.tool_calls.append(ToolCall(data["name"], arguments))
        return actions

    def format_result(self, call: ToolCall, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"


class McpXml(Protocol):
    name = "mcp_xml"
    stop = ("</use_mcp_tool>",)
    _block = re.compile(r"<use_mcp_tool>(.*?)</use_mcp_tool>", re.S)

    def parse(self, text: str) -> Actions:
        actions = Actions()
        blocks = self._block.findall(text)
        if not blocks:
            actions.answer = last_boxed(text)
            if "<use_mcp_tool>" in text:
                actions.invalid.append("<use_mcp_tool> is never closed")
            return actions
        for block in blocks:
            fields = {
                tag: re.search(rf"<{tag}>(.*?)</{tag}>", block, flags=re.S)
                for tag in ("server_name", "tool_name", "arguments")
            }
            missing = [tag for tag, m in fields.items() if m is None]
            if missing:
                actions.invalid.append(f"<use_mcp_tool> lacks {', '.join('<' + m + '>' for m in missing)}")
                continue
            try:
                arguments = _json(fields["arguments"].group(1).strip() or "{}")
            except json.JSONDecodeError as error:
                actions.invalid.append(f"<arguments> is not valid JSON ({error.msg})")
                continue
            except UnreadableJson as error:
                actions.invalid.append(f"<arguments> {error}")
                continue
            if not isinstance(arguments, dict):
                actions.invalid.append("<arguments> must be a JSON object")
                continue
            actions.tool_calls.append(ToolCall(fields["tool_name"].group(1).strip(), arguments))
        tail = text[text.rfind("</use_mcp_tool>") + len("</use_mcp_tool>") :].strip()
        if tail:
            actions.invalid.append("a tool call must come at the end of the response")
        return actions

    def format_result(self, call: ToolCall, content: str) -> str:
        return content


class Tags(Protocol):
    """One tool per tag pair; the text between the tags is that tool's single argument."""

    name = "tags"

    def __init__(
        self,
        begin: str,
        end: str,
        tool: str,
        argument: str,
        result_begin: str,
        result_end: str,
        answer: str = "boxed",
        separator: str = "\n\n",
    ):
        self.begin, self.end, self.tool, self.argument = begin, end, tool, argument
        self.result_begin, self.result_end = result_begin, result_end
        self.answer = _answer_reader(answer)
        self.separator = separator
        self.stop = (end,)

    def parse(self, text: str) -> Actions:
        start = text.rfind(self.begin)
        if start < 0:
            return Actions(answer=self.answer(text))
        close = text.find(self.end, start)
        if close < 0:
            return Actions(invalid=[f"{self.begin} is never closed by {self.end}"])
        body = text[start + len(self.begin) : close].strip()
        if not body:
            return Actions(invalid=[f"empty {self.begin} call"])
        return Actions(tool_calls=[ToolCall(self.tool, {self.argument: body})])

    def format_result(self, call: ToolCall, content: str) -> str:
        return f"{self.separator}{self.result_begin}{content}{self.result_end}{self.separator}"


def make_protocol(name: str, **options: Any) -> Protocol:
    """A protocol by name: ``json_tool_call``, ``mcp_xml`` or ``tags`` (which needs its tag options)."""
    kinds = {"json_tool_call": JsonToolCall, "mcp_xml": McpXml, "tags": Tags}
    try:
        return kinds[name](**options)
    except KeyError:
        raise ValueError(f"unknown protocol '{name}'; known: {', '.join(kinds)}") from None

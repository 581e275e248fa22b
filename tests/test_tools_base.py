"""The tool interface: argument validation, timeouts, failures as results, truncation, the kind registry."""

from __future__ import annotations

import asyncio

import pytest

from workbench.tools import (
    TOOL_KINDS,
    Tool,
    ToolOptionError,
    ToolResult,
    UnknownToolKindError,
    make_tool,
    register_tool_kind,
    run_tool,
    truncate_content,
    truncate_text,
)


class Echo(Tool):
    name = "echo"
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "delay": {"type": "number", "minimum": 0}},
        "required": ["text"],
        "additionalProperties": False,
    }

    async def __call__(self, text: str, delay: float = 0.0) -> ToolResult:
        await asyncio.sleep(delay)
        return ToolResult(ok=True, content=text)


class Broken(Tool):
    name = "broken"

    async def __call__(self, **arguments) -> ToolResult:
        raise RuntimeError("disk on fire\nsecond line")


class Blocking(Tool):
    """Returns a plain string (not a ToolResult) after a delay."""

    name = "plain"

    async def __call__(self, **arguments):
        return "just text"


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_valid_call_returns_the_tools_result_with_its_wall_time():
    result = run(run_tool(Echo(), {"text": "hello"}, timeout=5))
    assert result.ok and result.content == "hello" and result.error is None
    assert 0 < result.seconds < 5


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "'text' is a required property"),
        ({"text": 3}, "argument text: 3 is not of type 'string'"),
        ({"text": "x", "colour": "red"}, "Additional properties are not allowed"),
        ({"text": "x", "delay": -1}, "argument delay: -1 is less than the minimum of 0"),
        (["text"], "arguments must be a JSON object, got list"),
    ],
)
def test_invalid_arguments_become_a_tool_error_naming_the_problem(arguments, expected):
    result = run(run_tool(Echo(), arguments, timeout=5))
    assert not result.ok and result.content == ""
    assert result.error.startswith("echo: invalid arguments: ") and expected in result.error


def test_a_timeout_becomes_a_tool_error_and_the_caller_goes_on():
    result = run(run_tool(Echo(), {"text": "late", "delay": 10}, timeout=0.2))
    assert not result.ok and result.error == "echo: timed out after 0.2 s"
    assert result.metadata == {"timed_out": True} and result.seconds < 2


def test_an_exception_inside_a_tool_becomes_a_one_line_tool_error():
    result = run(run_tool(Broken(), {}, timeout=5))
    assert not result.ok and result.error == "broken: RuntimeError: disk on fire"


def test_a_tool_returning_plain_text_is_wrapped():
    result = run(run_tool(Blocking(), {}, timeout=5))
    assert result.ok and result.content == "just text"


def test_cancelling_the_caller_still_cancels_the_tool():
    async def main():
        task = asyncio.create_task(run_tool(Echo(), {"text": "x", "delay": 10}, timeout=30))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_run_tool_can_truncate_the_content_and_says_so():
    result = run(run_tool(Echo(), {"text": "abcdefghij"}, timeout=5, max_chars=4))
    assert result.content == "abcd\n[truncated]" and result.truncated


class WordTokenizer:
    """A real (if simple) tokenizer: one id per whitespace-separated word."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text, add_special_tokens=False):
        ids = []
        for word in text.split():
            if word not in self.vocab:
                self.vocab[word] = len(self.words)
                self.words.append(word)
            ids.append(self.vocab[word])
        return ids

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_truncate_text_by_characters_and_by_tokens():
    assert truncate_text("short", 10) == ("short", False)
    assert truncate_text("0123456789", 3, marker="…") == ("012…", True)
    text, cut = truncate_text("one two three four five", 2, tokenizer=WordTokenizer())
    assert cut and text == "one two\n[truncated]"
    assert truncate_text("one two", 2, tokenizer=WordTokenizer()) == ("one two", False)
    with pytest.raises(ToolOptionError, match="must be >= 0"):
        truncate_text("x", -1)


def test_truncate_content_shares_the_budget_over_records_in_order():
    records = [
        {"title": "a", "text": "x" * 6},
        {"title": "b", "text": "y" * 6},
        {"title": "c", "text": "z" * 6},
    ]
    out, cut = truncate_content(records, 10)
    assert cut and [r["title"] for r in out] == ["a", "b"]
    assert out[0]["text"] == "x" * 6 and out[1]["text"] == "yyyy\n[truncated]"
    assert records[1]["text"] == "y" * 6  # the input is not modified
    assert truncate_content(records, 100) == (records, False)


def test_make_tool_builds_registered_kinds_and_rejects_unknown_ones():
    assert {"bm25", "python", "web_search"} <= set(TOOL_KINDS)
    tool = make_tool("bm25", top_k=3)
    assert tool.name == "search" and tool.top_k == 3
    with pytest.raises(UnknownToolKindError, match="unknown tool kind 'teleport'; known: bm25, python"):
        make_tool("teleport")
    with pytest.raises(ToolOptionError, match="tool kind 'bm25': .*unexpected keyword argument 'colour'"):
        make_tool("bm25", colour="red")


def test_register_tool_kind_adds_a_kind_and_refuses_silent_replacement():
    register_tool_kind("echo_test", lambda **options: Echo())
    try:
        assert isinstance(make_tool("echo_test"), Echo)
        with pytest.raises(ToolOptionError, match="already registered"):
            register_tool_kind("echo_test", lambda **options: Echo())
        with pytest.raises(ToolOptionError, match="engine's kind"):
            register_tool_kind("agent", lambda **options: Echo())
    finally:
        TOOL_KINDS.pop("echo_test", None)


def test_topology_validation_knows_the_tool_kinds():
    from workbench.engine.spec_checks import _tool_kinds

    assert set(_tool_kinds()) == set(TOOL_KINDS)

"""Tool-call protocols: well-formed calls parse, malformed ones become `invalid`, nothing ever raises."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engine.protocols import Actions, make_protocol

HIRA = {
    "begin": "<|begin_call_subtask|>",
    "end": "<|end_call_subtask|>",
    "tool": "subtask",
    "argument": "task",
    "result_begin": "<|begin_subtask_result|>",
    "result_end": "<|end_subtask_result|>",
}


def test_json_tool_call_reads_calls_and_answer():
    p = make_protocol("json_tool_call")
    text = '<think>need facts</think><tool_call>{"name": "search", "arguments": {"queries": ["a", "b"], "purpose": "x"}}</tool_call>'
    actions = p.parse(text)
    assert [(c.name, c.arguments["queries"]) for c in actions.tool_calls] == [("search", ["a", "b"])]
    assert actions.answer is None and not actions.invalid
    assert p.parse("<think>done</think><answer>Olvik</answer>").answer == "Olvik"
    bad = p.parse('<tool_call>{"name": "search", "arguments": </tool_call>')
    assert not bad.tool_calls and "not valid JSON" in bad.invalid[0]
    assert "tool_response" in p.format_result(actions.tool_calls[0], "r")


def test_mcp_xml_requires_every_field_and_the_call_at_the_end():
    p = make_protocol("mcp_xml")
    call = (
        "<use_mcp_tool>\n<server_name>browsing_agent</server_name>\n<tool_name>search_and_browse</tool_name>\n"
        '<arguments>\n{"subtask": "who founded Olvik?"}\n</arguments>\n</use_mcp_tool>'
    )
    actions = p.parse("I will delegate.\n" + call)
    assert actions.tool_calls[0].name == "search_and_browse" and actions.tool_calls[0].arguments["subtask"]
    assert "at the end" in p.parse(call + "\nmore text").invalid[0]
    assert "<tool_name>" in p.parse(call.replace("<tool_name>search_and_browse</tool_name>", "")).invalid[0]
    assert p.parse("The answer is \\boxed{42}.").answer == "42"


def test_tags_protocol_calls_one_tool_with_the_enclosed_text():
    p = make_protocol("tags", **HIRA)
    actions = p.parse("plan... <|begin_call_subtask|> find the mayor of Olvik <|end_call_subtask|>")
    assert actions.tool_calls[0].arguments == {"task": "find the mayor of Olvik"}
    assert p.parse("so \\boxed{Ana}").answer == "Ana"
    assert p.parse("<|begin_call_subtask|> unfinished").invalid
    assert p.stop == ("<|end_call_subtask|>",)


def test_tags_protocol_options_answer_form_and_separator():
    p = make_protocol(
        "tags",
        begin="<search>",
        end="</search>",
        tool="search",
        argument="query",
        result_begin="<information>",
        result_end="</information>",
        answer="answer_tag",
        separator="\n",
    )
    assert p.parse("<search>Olvik</search>").tool_calls[0].arguments == {"query": "Olvik"}
    assert p.parse("<answer>Ana Reyes</answer>").answer == "Ana Reyes"
    assert p.parse("\\boxed{Ana}").answer is None  # answers come in tags here, not boxed
    call = p.parse("<search>Olvik</search>").tool_calls[0]
    assert p.format_result(call, "Olvik is a city.") == "\n<information>Olvik is a city.</information>\n"
    with pytest.raises(ValueError, match="unknown answer form 'quoted'; known: answer_tag, boxed"):
        make_protocol("tags", **{**HIRA, "answer": "quoted"})


def test_unknown_protocol_names_the_known_ones():
    with pytest.raises(ValueError, match="json_tool_call"):
        make_protocol("smoke_signals")


_fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<answer>",
        "</answer>",
        "<use_mcp_tool>",
        "</use_mcp_tool>",
        "<server_name>s</server_name>",
        "<tool_name>t</tool_name>",
        "<arguments>",
        "</arguments>",
        "\\boxed{",
        "}",
        "{",
        '"name"',
        '"arguments"',
        ":",
        ",",
        "[",
        "]",
        "null",
        "1",
        HIRA["begin"],
        HIRA["end"],
        "<think>",
        "</think>",
    ]
)
_outputs = st.lists(st.one_of(_fragments, st.text(max_size=20)), max_size=30).map("".join)


@pytest.mark.parametrize("name", ["json_tool_call", "mcp_xml", "tags"])
@settings(max_examples=1000, deadline=None)
@given(text=_outputs)
def test_every_protocol_survives_arbitrary_output(name, text):
    protocol = make_protocol(name, **(HIRA if name == "tags" else {}))
    actions = protocol.parse(text)
    assert isinstance(actions, Actions)
    for call in actions.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        json.dumps(call.arguments)

"""Structured fuzzing of every parser a model's output goes through (hypothesis).

For each output format the tests generate *valid* outputs from the format's own grammar (a tool call with
any name and JSON arguments, a ``\\boxed{}`` answer with nested braces, a verdict, a JSON object inside
prose, an orchestrator's agent graph, a judge's reply) and check they read back exactly what was
generated; then they damage those outputs (cut at any point, a closing tag dropped or doubled, control
characters and unicode spliced in, the text nested in itself, brackets repeated thousands deep) and check
the damage surfaces only as the format's own failure: ``FormatError`` from output parsers, ``invalid``
entries from tool-call protocols, ``UnreadableJudgement`` from judge parsers, and that everything read is
strict JSON (no NaN or Infinity: it is stored, and the dashboard's browser reads it). JSON a model writes
is read up to ``MAX_JSON_DEPTH`` levels deep and refused beyond, as are numbers that are not finite and
integers too long to convert. Each property runs 250 generated examples (``FUZZ``).
Plain random text is fuzzed by the unit tests (``tests/test_parsers.py``, ``tests/test_protocols.py``).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from workbench.answers import last_boxed
from workbench.engine.mas_graph import AGENT_NAMES, parse_mas
from workbench.engine.parsers import (
    MAX_JSON_DEPTH,
    PARSERS,
    FormatError,
    parse_boxed,
    parse_json,
    parse_verdict,
)
from workbench.engine.protocols import Actions, make_protocol
from workbench.rewards.judge import (
    UnreadableJudgement,
    parse_hira,
    parse_hle,
    parse_mas_orchestra,
    parse_simpleqa,
)
from workbench.topology import load as load_topology

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HIRA = load_topology("hira").flow.nodes["plan"].protocol_options  # the tags HiRA's planner writes
BRACKETS = ["[", "{", '{"a": ', '[{"b": ', "\\boxed{", "<agent>", "<tool_call>"]
NASTY = ["\x00", "\x1b[31m", "\u202e", "\ufeff", "\ud7ff", "😀", "\r\n", "\t", "{", "}", "<", ">", "\\", '"']

# ---------------------------------------------------------------- strategies

# any text, except a closing tag: the protocols end a call's JSON at its closing tag, which no text in it can hold
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda w: "</" not in w
)
plain = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<>{}\\"), max_size=40
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | words,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(words, inner, max_size=4),
    max_leaves=12,
)
arguments = st.dictionaries(words, json_values, max_size=5)
tool_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)


@st.composite
def braced(draw, depth: int = 0) -> str:
    """Text whose braces balance (what a ``\\boxed{}`` holds)."""
    parts = draw(st.lists(plain | st.just("x^2") | st.just("\\frac{1}{2}"), max_size=4))
    if depth < 3 and draw(st.booleans()):
        parts.append("{" + draw(braced(depth + 1)) + "}")
    return "".join(parts)


@st.composite
def damaged(draw, text: str) -> str:
    """``text`` cut, with a tag or brace dropped or doubled, or with nasty characters spliced in."""
    kind = draw(st.sampled_from(["cut", "drop", "double", "splice", "nest", "deep"]))
    if kind == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "splice":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from(NASTY)) * draw(st.integers(1, 3)) + text[at:]
    if kind == "nest":
        at = draw(st.integers(0, len(text)))
        return text[:at] + text + text[at:]
    if kind == "deep":  # a model repeating an opening bracket, past any reader's recursion limit
        at = draw(st.integers(0, len(text)))
        return (
            text[:at] + draw(st.sampled_from(BRACKETS)) * draw(st.sampled_from([50, 200, 5000])) + text[at:]
        )
    marks = [i for i, c in enumerate(text) if c in "<>{}/"]
    if not marks:
        return text
    at = draw(st.sampled_from(marks))
    return text[:at] + text[at + 1 :] if kind == "drop" else text[:at] + text[at] + text[at:]


def stored(value) -> None:
    """What a parser returns is stored with the call: it must serialise as strict JSON."""
    json.dumps(value, allow_nan=False)


def same_json(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ---------------------------------------------------------------- output parsers


@FUZZ
@given(prefix=plain, answer=braced(), suffix=plain)
def test_a_boxed_answer_with_nested_braces_reads_back_exactly(prefix, answer, suffix):
    assume(answer.strip() == answer and answer)
    text = f"{prefix}\\boxed{{{answer}}}{suffix}"
    assert parse_boxed(text) == {"answer": answer}
    assert last_boxed(f"\\boxed{{wrong}} then {text}") == answer, "the last box counts"


@FUZZ
@given(prefix=plain, answer=braced(), data=st.data())
def test_a_damaged_boxed_answer_is_a_format_error_or_a_box_that_was_written(prefix, answer, data):
    text = data.draw(damaged(f"{prefix}\\boxed{{{answer}}}"))
    try:
        out = parse_boxed(text)
    except FormatError:
        return
    assert out["answer"] in text, "what is read was written in the output"
    stored(out)


@FUZZ
@given(report=plain, verdict=st.sampled_from(["Correct", "Wrong", "Incorrect", "correct", "WRONG"]))
def test_a_verdict_after_the_report_reads_back_with_its_report(report, verdict):
    assume("correct" not in report.lower())
    out = parse_verdict(f"{report}\n**Correctness**: {verdict}")
    assert out["verdict"] == ("correct" if verdict.lower() == "correct" else "wrong")
    assert out["report"] == report.rstrip(" *#:\n")


@FUZZ
@given(value=st.dictionaries(words, json_values, min_size=1, max_size=5), prose=plain, fence=st.booleans())
def test_a_json_object_in_prose_or_a_fence_reads_back_equal(value, prose, fence):
    body = json.dumps(value, ensure_ascii=False)
    text = f"{prose}\n```json\n{body}\n```" if fence else f"{prose} {body}"
    assume("{" not in prose)
    assert same_json(parse_json(text), value)


@FUZZ
@given(value=st.dictionaries(words, json_values, min_size=1, max_size=5), data=st.data())
def test_damaged_json_is_a_format_error_or_an_object(value, data):
    text = data.draw(damaged(json.dumps(value)))
    try:
        out = parse_json(text)
    except FormatError:
        return
    assert isinstance(out, dict)
    stored(out)


def nest(depth: int, leaf) -> dict:
    """``leaf`` inside ``depth`` levels of objects and lists, the outermost an object."""
    value = leaf
    for level in range(depth - 1):
        value = [value] if level % 2 else {"k": value}
    return {"k": value}


def levels(value) -> int:
    """How many levels of objects and lists ``value`` has."""
    if isinstance(value, dict | list):
        return 1 + max(map(levels, value.values() if isinstance(value, dict) else value), default=0)
    return 0


def read_by_each_reader(arguments: dict) -> dict[str, tuple[object, int]]:
    """``arguments`` written as a router's JSON and as a call in both JSON-carrying protocols, then read:
    per reader, what it read (a ``FormatError`` or the list of invalid reasons where it read nothing) and
    how many levels deep the JSON it had to read was."""
    text = json.dumps(arguments)
    out: dict[str, tuple[object, int]] = {}
    try:
        out["json"] = (parse_json(f"The route: {text}."), levels(arguments))
    except FormatError as error:
        out["json"] = (error, levels(arguments))
    for name, body in (
        ("json_tool_call", f'<tool_call>{{"name": "s", "arguments": {text}}}</tool_call>'),
        (
            "mcp_xml",
            f"<use_mcp_tool><server_name>s</server_name><tool_name>t</tool_name>"
            f"<arguments>{text}</arguments></use_mcp_tool>",
        ),
    ):
        actions = protocol(name).parse(body)
        stored(actions.to_dict())
        read = actions.tool_calls[0].arguments if actions.tool_calls else actions.invalid
        out[name] = (read, levels(arguments) + (name == "json_tool_call"))  # the call wraps its arguments
    return out


@FUZZ
@given(depth=st.integers(1, MAX_JSON_DEPTH + 20), leaf=json_values)
def test_nested_json_reads_back_up_to_the_depth_limit_and_is_refused_beyond_it(depth, leaf):
    arguments = nest(depth, leaf)
    for reader, (read, deep) in read_by_each_reader(arguments).items():
        if deep <= MAX_JSON_DEPTH:
            assert same_json(read, arguments), reader
        elif reader == "json":
            assert isinstance(read, FormatError) and f"nested deeper than {MAX_JSON_DEPTH} levels" in str(
                read
            )
        else:
            assert read == [
                f"{'tool call' if reader == 'json_tool_call' else '<arguments>'} is nested "
                f"deeper than {MAX_JSON_DEPTH} levels"
            ], reader


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("[" * 100_000, f"is nested deeper than {MAX_JSON_DEPTH} levels"),
        ("[" * 5000 + "]" * 5000, f"is nested deeper than {MAX_JSON_DEPTH} levels"),
        ('{"a": ' * 5000 + "1" + "}" * 5000, f"is nested deeper than {MAX_JSON_DEPTH} levels"),
        ("7" * 5000, "holds an integer of 5000 digits, too long to read"),
        ("-" + "7" * 5000, "holds an integer of 5000 digits, too long to read"),
        ("NaN", "holds NaN, which is not a finite number"),
        ("-Infinity", "holds -Infinity, which is not a finite number"),
        ("1e999", "holds 1e999, which is not a finite number"),
    ],
    ids=["unclosed-deep", "deep-list", "deep-object", "long-integer", "long-negative", "nan", "inf", "1e999"],
)
def test_json_a_run_cannot_store_is_a_format_error_or_an_invalid_call_naming_why(value, reason):
    body = f'{{"a": {value}}}'
    with pytest.raises(FormatError, match=reason):
        parse_json(f"The route is {body} and that is all.")
    actions = protocol("json_tool_call").parse(f'<tool_call>{{"name": "s", "arguments": {body}}}</tool_call>')
    assert not actions.tool_calls and actions.invalid == [f"tool call {reason}"]
    mcp = protocol("mcp_xml").parse(
        f"<use_mcp_tool><server_name>s</server_name><tool_name>t</tool_name><arguments>{body}</arguments>"
        "</use_mcp_tool>"
    )
    assert not mcp.tool_calls and mcp.invalid == [f"<arguments> {reason}"]
    stored(actions.to_dict())
    stored(mcp.to_dict())


def test_code_fences_inside_a_json_string_are_kept():
    # parse_json used to delete every ``` before reading, inside JSON strings too
    assert parse_json('```json\n{"summary": "run ```pip install x```", "k": 1}\n```') == {
        "summary": "run ```pip install x```",
        "k": 1,
    }


@pytest.mark.parametrize("value", ["NaN", "1e999", "7" * 5000, "[" * 150 + "]" * 150])
def test_an_unreadable_json_object_is_passed_over_whole_never_read_in_part(value):
    text = f'Not this: {{"route": "a", "x": {value}, "meta": {{"k": 1}}}}. This: {{"route": "b"}}'
    assert parse_json(text) == {"route": "b"}


def test_json_nested_past_the_decoders_stack_ends_the_search_with_a_format_error():
    text = '{"a": ' + "[" * 5000 + "]" * 5000 + '} {"route": "b"}'  # where the first object ends is unknown
    with pytest.raises(FormatError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        parse_json(text)


@FUZZ
@given(
    text=st.lists(
        st.sampled_from(
            ["\\boxed{", "}", "{", "Correctness:", "correct", "wrong", "```json", '{"a": 1}', "12"]
        )
        | plain,
        max_size=20,
    ).map("".join)
)
def test_every_registered_parser_raises_only_format_errors_on_format_fragments(text):
    for name, parser in PARSERS.items():
        try:
            out = parser(text)
        except FormatError:
            continue
        assert isinstance(out, dict), name
        stored(out)


# ---------------------------------------------------------------- the orchestrator's agent graph


@st.composite
def agent_graphs(draw):
    """A valid MAS-Orchestra graph: a chain-free DAG with one sink, every agent leading to it."""
    n = draw(st.integers(1, 5))
    ids = [f"A{i + 1}" for i in range(n)]
    agents = []
    for agent_id in ids:
        name = draw(st.sampled_from(AGENT_NAMES))
        roles = draw(st.lists(st.sampled_from(["Skeptic", "Expert", "Critic"]), min_size=2, max_size=3))
        agents.append((agent_id, name, draw(plain), roles if name == "DebateAgent" else []))
    # each agent but the last feeds a later one, so the last is the only sink
    edges = [(ids[i], ids[draw(st.integers(i + 1, n - 1))]) for i in range(n - 1)]
    return agents, edges


def render_graph(agents, edges) -> str:
    out = []
    for agent_id, name, task, roles in agents:
        block = f"<agent><agent_id>{agent_id}</agent_id><agent_name>{name}</agent_name>"
        block += f"<agent_input>{task}</agent_input>"
        if roles:
            block += f"<debate_roles>{json.dumps(roles)}</debate_roles>"
        out.append(block + "</agent>")
    if edges:
        out.append("<edge>" + "".join(f"<from>{a}</from><to>{b}</to>" for a, b in edges) + "</edge>")
    return "\n".join(out)


@FUZZ
@given(graph=agent_graphs())
def test_a_valid_agent_graph_reads_back_with_its_order_and_sink(graph):
    agents, edges = graph
    out = parse_mas(render_graph(agents, edges))
    assert [(a["id"], a["name"], a["input"], a["roles"]) for a in out["agents"]] == [
        (i, n, t.strip(), r) for i, n, t, r in agents
    ]
    assert out["edges"] == [list(e) for e in edges]
    assert out["sink"] == agents[-1][0]
    levels = out["order"]  # topological levels: every agent once, each after the agents feeding it
    assert sorted(a for level in levels for a in level) == sorted(a[0] for a in agents)
    level_of = {a: k for k, level in enumerate(levels) for a in level}
    assert all(level_of[a] < level_of[b] for a, b in edges)
    stored(out)


@FUZZ
@given(graph=agent_graphs(), data=st.data())
def test_a_damaged_agent_graph_is_a_format_error_or_a_graph(graph, data):
    text = data.draw(damaged(render_graph(*graph)))
    if data.draw(st.booleans()):  # garbage where a field's value goes
        text = text.replace("</debate_roles>", "").replace(
            '"]', data.draw(st.sampled_from(["5", '{"a": 1}', "null", "[1, 2]", ""])) + "</debate_roles>"
        )
    try:
        out = parse_mas(text)
    except FormatError:
        return
    assert isinstance(out["agents"], list)
    stored(out)


@pytest.mark.parametrize(
    "roles", ["5", "null", '{"Skeptic": 1, "Expert": 2}', "[1, 2]", "true", "3.5", "[" * 100_000]
)
def test_debate_roles_of_the_wrong_json_type_are_a_format_error(roles):
    text = render_graph([("A1", "DebateAgent", "argue", [])], []).replace(
        "</agent_input>", f"</agent_input><debate_roles>{roles}</debate_roles>"
    )
    with pytest.raises(FormatError, match="debate_roles"):
        parse_mas(text)


# ---------------------------------------------------------------- tool-call protocols


@st.composite
def calls(draw):
    return [(draw(tool_names), draw(arguments)) for _ in range(draw(st.integers(1, 3)))]


def render(name: str, call_list, answer: str | None = None) -> str:
    if name == "json_tool_call":
        text = "".join(
            f"<tool_call>{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}</tool_call>"
            for n, a in call_list
        )
        return text + (f"<answer>{answer}</answer>" if answer is not None else "")
    if name == "mcp_xml":
        return "\n".join(
            f"<use_mcp_tool><server_name>s</server_name><tool_name>{n}</tool_name>"
            f"<arguments>{json.dumps(a, ensure_ascii=False)}</arguments></use_mcp_tool>"
            for n, a in call_list
        )
    (_, a) = call_list[-1]
    return f"{HIRA['begin']}{a}{HIRA['end']}"


def protocol(name: str):
    return make_protocol(name, **(HIRA if name == "tags" else {}))


@pytest.mark.parametrize("name", ["json_tool_call", "mcp_xml"])
@FUZZ
@given(call_list=calls(), thinking=plain)
def test_generated_tool_calls_read_back_exactly(name, call_list, thinking):
    actions = protocol(name).parse(thinking + render(name, call_list))
    assert not actions.invalid
    got = [(c.name, c.arguments) for c in actions.tool_calls]
    expected = [(n.strip() if name == "mcp_xml" else n, a) for n, a in call_list]
    assert same_json(got, expected)


@FUZZ
@given(task=plain, thinking=plain)
def test_a_tags_call_reads_back_its_text(task, thinking):
    assume(task.strip() and HIRA["begin"] not in thinking)
    actions = protocol("tags").parse(f"{thinking}{HIRA['begin']}{task}{HIRA['end']}")
    assert [(c.name, c.arguments) for c in actions.tool_calls] == [("subtask", {"task": task.strip()})]


@FUZZ
@given(answer=plain)
def test_a_json_tool_call_answer_reads_back(answer):
    assume("<" not in answer)
    assert protocol("json_tool_call").parse(f"<answer>{answer}</answer>").answer == answer.strip()


@pytest.mark.parametrize("name", ["json_tool_call", "mcp_xml", "tags"])
@FUZZ
@given(call_list=calls(), data=st.data())
def test_damaged_tool_calls_become_invalid_entries_never_exceptions(name, call_list, data):
    text = data.draw(damaged(render(name, call_list)))
    actions = protocol(name).parse(text)
    assert isinstance(actions, Actions)
    assert all(isinstance(reason, str) and reason for reason in actions.invalid)
    for call in actions.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
    stored(actions.to_dict())


@pytest.mark.parametrize(
    "body",
    [
        '{"name": 5}',
        '{"name": "s", "arguments": [1]}',
        '{"name": "s", "arguments": "{bad"}',
        "[]",
        "null",
        "1e999",
    ],
)
def test_json_tool_calls_of_the_wrong_shape_are_invalid_with_a_reason(body):
    actions = protocol("json_tool_call").parse(f"<tool_call>{body}</tool_call>")
    assert not actions.tool_calls and len(actions.invalid) == 1


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("name", ["json_tool_call", "mcp_xml"])
def test_a_number_json_readers_refuse_makes_the_call_invalid(name, number):
    body = f'{{"x": {number}}}'
    text = render(name, [("s", {})]).replace("{}", body)
    actions = protocol(name).parse(text)
    assert not actions.tool_calls and "not a finite number" in actions.invalid[0]
    json.dumps(actions.to_dict(), allow_nan=False)


# ---------------------------------------------------------------- judge replies


JUDGES = {
    "hle": (
        parse_hle,
        lambda v: f"extracted_final_answer: x\nreasoning: r\n**correct**: {v}\nconfidence: 90",
    ),
    "mas_orchestra": (parse_mas_orchestra, lambda v: f"<reason>r</reason><correct>{v}</correct>"),
}


@pytest.mark.parametrize("judge", sorted(JUDGES))
@FUZZ
@given(verdict=st.sampled_from(["yes", "no", "Yes", "NO"]), preamble=plain, data=st.data())
def test_a_judge_reply_reads_back_and_damage_is_unreadable_never_an_exception(judge, verdict, preamble, data):
    parse, render_reply = JUDGES[judge]
    reply = preamble.replace("correct", "") + "\n" + render_reply(verdict)
    score, label = parse(reply)
    assert (score, label) == (float(verdict.lower() == "yes"), verdict.lower())
    try:
        score, label = parse(data.draw(damaged(reply)))
    except UnreadableJudgement:
        return
    assert score in (0.0, 1.0) and label in ("yes", "no")


@FUZZ
@given(letter=st.sampled_from("ABC"), tail=plain, data=st.data())
def test_simpleqa_and_hira_grades_read_back_and_damage_is_unreadable(letter, tail, data):
    assert (
        parse_simpleqa(f"{letter}: {tail}")[1]
        == {"A": "CORRECT", "B": "INCORRECT", "C": "NOT_ATTEMPTED"}[letter]
    )
    for parse, reply in (
        (parse_simpleqa, f"{letter}. {tail}"),
        (parse_hira, f"The answer is Correct. {tail}"),
    ):
        try:
            score, label = parse(data.draw(damaged(reply)))
        except UnreadableJudgement:
            continue
        assert score in (0.0, 1.0) and isinstance(label, str)

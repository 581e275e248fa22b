"""Topology specs fuzzed by random mutation of the shipped ones (hypothesis).

Every built-in topology is turned into its dict form and damaged one to three times at random places: a
key deleted, a value replaced by one of another type (None, booleans, huge or negative numbers, NaN and
infinities, unicode and control characters, lists, dicts, garbage nested thousands deep, objects YAML
cannot hold), a role, tool, policy, node or subflow renamed so that references dangle, a reference
pointed at a name that does not exist, an unknown key added, a list or dict emptied, a template or
expression broken or nested too deeply, garbage appended to a list. Loading the result must give either
a valid topology, which then survives ``to_dict``/``from_dict`` and ``to_yaml``/``from_yaml`` unchanged,
or a ``TopologyError`` listing each problem with a field path and a reason, at least one of which points
at what was damaged: never another exception, which a user would meet as a traceback from deep inside
the workbench. The YAML text of each topology is also damaged character by character (spans cut,
doubled, re-indented, bytes spliced in), and must load or raise ``TopologyError`` just the same.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.engine.spec_checks import from_dict, from_yaml, load  # every check, as a run loads a spec
from workbench.topology import TopologyError, library, to_dict, to_yaml
from workbench.topology.validate import at

NAMES = library()
SPECS = {name: to_dict(load(name)) for name in NAMES}
EXAMPLES = 300  # per shipped topology: 2,400 mutated specs in all
YAML_EXAMPLES = 60  # per shipped topology: 480 damaged YAML texts


def nested(depth: int, leaf: Any = 0) -> Any:
    """A list or dict nested ``depth`` deep (deeper than any recursive walker's stack)."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


NUMBERS = st.sampled_from(
    [0, -1, -(10**30), 10**30, 10**400, 2**63, -0.5, 1e308, math.nan, math.inf, -math.inf]
)
STRINGS = st.text(max_size=30) | st.sampled_from(
    [
        "",
        " ",
        "end",
        "END",
        "nobody",
        "\x00",
        "\u202e\u2028\ufeff",
        "a\x85b",
        "ä" * 200,
        "🙂" * 50,
        "1e999",
        "x" * 5000,
    ]
)
TEMPLATES = st.sampled_from(
    [
        "{{",
        "}}",
        "{% if %}",
        "{% for x in %}",
        "{{ undefined_variable }}",
        "{{ ((( }}",
        "{{ " + "(" * 3000 + "x" + ")" * 3000 + " }}",
        "{{ " + "[" * 3000,
        "{% if x %}" * 800 + "{% endif %}" * 800,
        "{{ " + "-" * 3000 + "1 }}",
        "text | majority | boxed",
        "question.__class__.__mro__",
    ]
)
DEEP = st.sampled_from([40, 2000, 20000]).map(nested)
OBJECTS = st.sampled_from(
    [{1, 2}, object(), b"\xff\xfe", (1, 2), frozenset(), complex(1, 2), range(3), print]
)
garbage = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.floats() | STRINGS | TEMPLATES | DEEP | OBJECTS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(-3, 3) | st.none(), inner, max_size=3)
    ),
    max_leaves=8,
)
KINDS = [
    "delete",
    "retype",
    "number",
    "rename",
    "dangle",
    "unknown",
    "empty",
    "template",
    "append",
    "unicode",
]
# the named entities: a problem under one of these is about what was damaged inside it
ENTITIES = {"roles": 2, "tools": 2, "policies": 2, "subflows": 4, "flow": 3}


def paths(value: Any, limit: int = 12) -> list[tuple]:
    """Every path into ``value`` (dict keys and list indices) at most ``limit`` deep, the root included
    (walked without recursion: an earlier damage may have left garbage nested 20,000 deep)."""
    out, todo = [], [((), value)]
    while todo:
        path, item = todo.pop()
        out.append(path)
        if len(path) < limit and isinstance(item, dict):
            todo += [((*path, key), v) for key, v in item.items()]
        elif len(path) < limit and isinstance(item, list):
            todo += [((*path, i), v) for i, v in enumerate(item)]
    return out[::-1]


def get(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def dotted(path: tuple) -> str:
    """A path written the way ``TopologyError`` writes one: ``flow.nodes.solve.next[0].goto``, ``roles[' ']``."""
    return functools.reduce(at, path, "")


def names_in(spec: dict) -> list[str]:
    out = []
    for key in ("roles", "tools", "policies", "subflows"):
        if isinstance(spec.get(key), dict):
            out += [k for k in spec[key] if isinstance(k, str)]
    return out


def words(value: Any) -> set[str]:
    """The keys and strings in ``value`` (the names a problem caused by removing it would quote)."""
    out: set[str] = set()
    for path in paths(value):
        out |= {str(p) for p in path if isinstance(p, str)}
        item = get(value, path)
        if isinstance(item, str) and 0 < len(item) <= 60:
            out.add(item)
    return out


class Damaged:
    """A damaged spec and what was done to it: (kind, path, names it touched) per damage. Its repr, which
    hypothesis prints for a failing example, lists the damage (the spec may be nested too deep to print)."""

    def __init__(self, spec: dict, done: list[tuple[str, tuple, set[str]]]):
        self.spec, self.done = spec, done
        self.steps = [f"{kind} {dotted(path)}" for kind, path, _ in done]

    def __repr__(self) -> str:
        return f"Damaged({self.steps})"


def fitting(kind: str, path: tuple, target: Any) -> bool:
    """Whether a damage of ``kind`` applies at ``path``."""
    if kind in ("rename", "unknown"):
        return isinstance(target, dict) and (kind == "unknown" or bool(target))
    if kind == "append":
        return isinstance(target, list)
    if kind in ("dangle", "template", "unicode"):
        return bool(path) and isinstance(target, str)
    if kind == "empty":
        return bool(path) and isinstance(target, dict | list | str)
    return bool(path)


@st.composite
def mutated(draw, name: str) -> Damaged:
    """A damaged copy of a shipped spec."""
    spec = copy.deepcopy(SPECS[name])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(KINDS))
        fits = [p for p in paths(spec) if fitting(kind, p, get(spec, p))]
        if not fits:
            continue
        path = draw(st.sampled_from(fits))
        target = get(spec, path)
        parent = get(spec, path[:-1]) if path else None
        touched = words(target) | ({str(path[-1])} if path else set())
        if kind == "delete":
            del parent[path[-1]]
        elif kind == "retype":
            parent[path[-1]] = draw(garbage)
        elif kind == "number":
            parent[path[-1]] = draw(NUMBERS)
        elif kind == "template":
            parent[path[-1]] = draw(TEMPLATES)
        elif kind == "unicode":  # any text at all where text was: most of it is valid
            parent[path[-1]] = new = draw(st.text(st.characters(codec="utf-8"), max_size=40))
            touched.add(new)
        elif kind == "rename":
            old = draw(st.sampled_from(sorted(target, key=str)))
            new = draw(STRINGS | st.sampled_from(["end", *names_in(spec)]))
            target[new] = target.pop(old)
            touched = {str(old), new}
            path = (*path, new)
        elif kind == "dangle":
            parent[path[-1]] = new = draw(st.sampled_from(["nobody", "", "end", "base", *names_in(spec)]))
            touched.add(new)
        elif kind == "unknown":
            key = draw(st.text(min_size=1, max_size=10))
            target[key] = draw(garbage)
            path, touched = (*path, key), {key}
        elif kind == "empty":
            parent[path[-1]] = type(target)()
        else:
            target.append(draw(garbage))
        done.append((kind, path, touched))
    return Damaged(spec, done)


def about(problem_path: str, message: str, path: tuple, touched: set[str]) -> bool:
    """Whether a problem points at a damage: its path and the damaged one lie on one line, or share the
    named entity they are in (a role, tool, node...), or it quotes a name the damage removed or added."""
    where = dotted(path)
    if problem_path.startswith(where) or where.startswith(problem_path):
        return True
    depth = ENTITIES.get(path[0], 1) if path else 0
    if len(path) >= depth and problem_path.startswith(dotted(path[:depth])):
        return True
    text = f"{problem_path} {message}"
    return any(word and word in text for word in touched)


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_topology_loads_and_round_trips(name):
    assert to_dict(from_dict(SPECS[name], name)) == SPECS[name]
    assert to_yaml(from_yaml(to_yaml(load(name)))) == to_yaml(load(name))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_topology_loads_or_names_each_problem_and_never_raises_anything_else(name, data):
    damaged = data.draw(mutated(name))
    spec, done, steps = damaged.spec, damaged.done, damaged.steps
    try:
        topology = from_dict(spec, name)
    except TopologyError as error:
        assert isinstance(error, ValueError)
        assert error.problems, steps
        for problem in error.problems:
            assert problem.path.strip() and problem.message.strip(), (steps, str(problem))
            assert str(problem) in str(error)
        assert any(
            about(p.path, p.message, path, touched) for p in error.problems for _, path, touched in done
        ), f"no problem points at {steps}:\n{error}"
        return
    except Exception as error:  # noqa: BLE001 - the assertion below is the test
        pytest.fail(f"{type(error).__name__} after {steps}: {error!r}"[:2000])
    again, text = to_dict(topology), to_yaml(topology)
    assert to_dict(from_dict(again, name)) == again, steps
    assert to_yaml(from_yaml(text)) == text, steps  # the same text: keys keep their order too


@st.composite
def damaged_yaml(draw, name: str) -> str:
    text = to_yaml(load(name))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 80)))
        how = draw(st.sampled_from(["cut", "double", "splice", "indent", "dedent"]))
        if how == "cut":
            text = text[:i] + text[j:]
        elif how == "double":
            text = text[:j] + text[i:j] + text[j:]
        elif how == "splice":
            junk = draw(
                st.text(max_size=12)
                | st.sampled_from(
                    [":", "- ", "{", "[", "&a", "*a", "!!python/object:os.system", "\t", "'", '"']
                )
            )
            text = text[:i] + junk + text[i:]
        else:
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            lines[k] = ("   " + lines[k]) if how == "indent" else lines[k].lstrip()
            text = "\n".join(lines)
    return text


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=YAML_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_yaml_text_loads_or_raises_a_topology_error(name, data):
    text = data.draw(damaged_yaml(name))
    try:
        topology = from_yaml(text)
    except TopologyError as error:
        assert error.problems and all(p.path and p.message for p in error.problems)
        return
    except Exception as error:  # noqa: BLE001 - the assertion below is the test
        pytest.fail(f"{type(error).__name__}: {error!r}"[:2000])
    assert to_dict(from_dict(to_dict(topology))) == to_dict(topology)


# ---------------------------------------------------------------- what the fuzzing found, pinned


def damage(name: str, path: tuple, value: Any) -> dict:
    spec = copy.deepcopy(SPECS[name])
    get(spec, path[:-1])[path[-1]] = value
    return spec


def problems(spec: dict) -> list[str]:
    with pytest.raises(TopologyError) as error:
        from_dict(spec, "fuzzed")
    return [str(p) for p in error.value.problems]


@pytest.mark.parametrize(
    ("where", "value", "path"),
    [
        (("roles",), None, "roles"),
        (("flow",), [], "flow"),
        (("policies",), 5, "policies"),
        (("params",), math.nan, "params"),
        (("tools",), "search", "tools"),
    ],
)
def test_a_wrong_type_at_the_top_names_the_field(where, value, path):
    spec = damage("marsrl", where, value)
    assert any(p.startswith(path) for p in problems(spec))


def test_a_renamed_role_names_every_dangling_reference():
    spec = copy.deepcopy(SPECS["marsrl"])
    spec["roles"]["the_solver"] = spec["roles"].pop("solver")
    found = problems(spec)
    assert any("unknown role 'solver'" in p for p in found), found
    assert all(p.startswith(("flow", "subflows", "roles", "tools")) for p in found)


@pytest.mark.parametrize(
    "expression",
    [
        "{{ " + "(" * 3000 + "x" + ")" * 3000 + " }}",
        "{{ " + "[" * 3000,
        "{% if x %}" * 800 + "{% endif %}" * 800,
    ],
    ids=["parentheses", "brackets", "blocks"],
)
def test_a_template_nested_too_deeply_for_jinja_is_a_problem_not_a_recursion_error(expression):
    spec = damage("marsrl", ("roles", "solver", "messages", 0, "content"), expression)
    assert problems(spec) == [
        "roles.solver.messages[0].content: nested too deeply for Jinja2 to parse; simplify the template or "
        "expression"
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (nested(20000), "nested deeper than 32 levels"),
        ({"a": math.nan}, "nan is not a finite number"),
        ({1, 2}, "a value of type set is not plain data"),
        (object(), "a value of type object is not plain data"),
        (b"\xff", "a value of type bytes is not plain data"),
        ({3: "x"}, "the key 3 is not a string"),
    ],
    ids=["deep", "nan", "set", "object", "bytes", "int-key"],
)
def test_params_and_tool_options_must_be_plain_data_that_a_run_can_store(value, reason):
    found = problems(damage("marsrl", ("params", "x"), value))
    assert len(found) == 1 and found[0].startswith("params.x") and reason in found[0], found
    found = problems(damage("mars", ("tools", "search", "options", "x"), value))
    assert found[0].startswith("tools.search.options.x") and reason in found[0], found


def test_a_yaml_alias_bomb_in_params_is_refused_without_expanding_it():
    bomb = "\n".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10))
    text = to_yaml(load("debate")).replace("params: {}", "params:\n  l0: &l0 [x]\n" + bomb)
    with pytest.raises(TopologyError, match="more than 100000 values in one field"):
        from_yaml(text)


def test_infinite_sampling_temperature_and_tool_timeout_are_refused():
    assert problems(damage("marsrl", ("roles", "solver", "sampling", "temperature"), math.inf)) == [
        "roles.solver.sampling.temperature: Input should be a finite number"
    ]
    assert problems(damage("mars", ("tools", "search", "timeout"), math.inf)) == [
        "tools.search.timeout: Input should be a finite number"
    ]


def test_protocol_options_are_checked_against_the_protocol():
    node = ("flow", "nodes", "plan", "protocol_options")
    options = SPECS["hira"]["flow"]["nodes"]["plan"]["protocol_options"]
    cases = [
        (
            {k: v for k, v in options.items() if k != "begin"},
            "missing 1 required positional argument: 'begin'",
        ),
        ({**options, "bogus": 1}, "got an unexpected keyword argument 'bogus'"),
        ({**options, "begin": 5}, "protocol_options.begin: must be a string, not int"),
        ({**options, "end": ""}, "protocol_options.end: must not be empty"),
        ({**options, "answer": "tag"}, "unknown answer form 'tag'"),
    ]
    for value, reason in cases:
        found = problems(damage("hira", node, value))
        assert len(found) == 1 and found[0].startswith(dotted(node)) and reason in found[0], found


def test_a_broken_final_prompt_and_agent_tool_output_are_found_before_a_run():
    found = problems(damage("hira", ("flow", "nodes", "plan", "final_prompt"), "{% if %}"))
    assert found[0].startswith("flow.nodes.plan.final_prompt: Jinja2 syntax error"), found
    found = problems(damage("hira", ("tools", "subtask", "outputs"), {"memory": "(("}))
    assert found[0].startswith("tools.subtask.outputs.memory: Jinja2 syntax error"), found


def test_text_with_a_next_line_character_survives_yaml():
    # PyYAML writes U+0085 raw and reads it back as a line break folded into a space: "a\x85b" became "a b"
    spec = damage("marsrl", ("params", "a\x85b"), "c\x85\x85d")
    spec["roles"]["solver"]["messages"][0]["content"] += "\x85"
    text = to_yaml(from_dict(spec))
    assert to_dict(from_yaml(text)) == to_dict(from_dict(spec)) and to_yaml(from_yaml(text)) == text


def test_a_mapping_key_that_is_not_a_string_names_its_mapping():
    spec = copy.deepcopy(SPECS["marsrl"])
    spec["roles"][7] = spec["roles"]["solver"]
    assert problems(spec) == ["roles: the name 7 is not valid: Input should be a valid string"]


@pytest.mark.parametrize(
    "text",
    ["a: [\n", "!!python/object:os.system {}", "[" * 100000, "{a: " * 100000, "name: x\n\troles: {}"],
    ids=["unclosed", "python-tag", "deep-list", "deep-map", "tab"],
)
def test_text_that_is_not_yaml_is_a_topology_error(text):
    with pytest.raises(TopologyError, match=r"\(file\): not valid YAML"):
        from_yaml(text)


def test_a_file_that_is_not_utf8_or_not_a_file_is_a_topology_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(TopologyError, match="not UTF-8 text"):
        load(path)
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(TopologyError, match="a directory"):
        load(tmp_path / "folder.yaml")


def test_a_blank_or_odd_name_is_written_so_that_it_can_be_read():
    spec = copy.deepcopy(SPECS["marsrl_inference"])
    spec[" "] = spec.pop("description")
    assert problems(spec) == ["[' ']: Extra inputs are not permitted"]
    spec = copy.deepcopy(SPECS["marsrl_inference"])
    spec["roles"][""] = spec["roles"].pop("solver")
    spec["flow"]["nodes"]["solve"]["call"] = ""
    assert problems(spec) == ["roles['']: a name must not be empty or blank; rename it"]
    found = problems(damage("marsrl", ("params", "a b"), {"c.d": [math.nan]}))
    assert found == ["params['a b']['c.d'][0]: nan is not a finite number (JSON cannot hold it)"]

"""The topology spec: round trips, JSON Schema, and validation errors that name the path.

A spec loaded for running gets the spec's own checks and the registries' (parsers, protocols, templates,
verifiers, tool kinds): ``workbench.engine.spec_checks``, which the error tests load through.
"""

import copy

import jsonschema
import pytest

import workbench.topology as topo
from workbench.engine import spec_checks


def test_builtin_marsrl_loads_and_round_trips_through_yaml_and_json():
    spec = topo.load("marsrl")
    assert list(spec.roles) == ["solver", "verifier1", "corrector1", "verifier2", "corrector2"]
    assert topo.from_yaml(topo.to_yaml(spec)) == spec
    assert topo.from_dict(topo.to_dict(spec)) == spec
    jsonschema.validate(topo.to_dict(spec), topo.json_schema())


def test_builder_api_gives_the_same_spec_as_yaml():
    spec = topo.Topology(
        name="single",
        roles={
            "solver": topo.Role(
                messages=[topo.Message(role="user", content="{{ question }}")], parser="boxed"
            )
        },
        flow=topo.Flow(
            start="solve", nodes={"solve": topo.CallNode(call="solver", bind={"solution": "text"})}
        ),
    )
    assert topo.validate(spec) is spec
    assert topo.from_yaml(topo.to_yaml(spec)) == spec


def _marsrl() -> dict:
    return copy.deepcopy(topo.to_dict(topo.load("marsrl")))


def _spec(name: str) -> dict:
    return copy.deepcopy(topo.to_dict(topo.load(name)))


def _set(path: list, value):
    def mutate(d):
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("name", "mutate", "path", "message"),
    [
        (
            "mars",
            _set(["flow", "nodes", "research", "tools"], ["search", "teleport"]),
            "flow.nodes.research.tools[1]",
            "unknown tool 'teleport'",
        ),
        (
            "mars",
            _set(["flow", "nodes", "research", "protocol"], "smoke"),
            "flow.nodes.research.protocol",
            "unknown protocol 'smoke'",
        ),
        (
            "mars",
            _set(["flow", "nodes", "research", "agent"], "system3"),
            "flow.nodes.research.agent",
            "unknown role 'system3'",
        ),
        (
            "mars",
            _set(["flow", "nodes", "research", "max_turns"], 0),
            "flow.nodes.research.max_turns",
            "greater than or equal to 1",
        ),
        (
            "mars",
            _set(["tools", "search", "kind"], "telepathy"),
            "tools.search.kind",
            "unknown tool kind 'telepathy'",
        ),
        (
            "mars",
            _set(["tools", "search", "route", "via"], "system9"),
            "tools.search.route.via",
            "unknown role 'system9'",
        ),
        (
            "mars",
            _set(["tools", "search", "route", "capacity"], 0),
            "tools.search.route.capacity",
            "greater than or equal to 1",
        ),
        ("mars", _set(["roles", "system2", "mode"], "telegraph"), "roles.system2.mode", "'chat' or 'raw'"),
        ("mars_cpu", _set(["roles", "system2", "mode"], "chat"), "roles.system2.prefill", "needs mode: raw"),
        (
            "mars_cpu",
            _set(["roles", "system1", "prefill"], "Text: {{ pages }}"),
            "roles.system1.prefill",
            "template variable 'pages' is provided by nothing",
        ),
        (
            "mars",
            _set(["roles", "system1", "postprocess"], ["shred"]),
            "roles.system1.postprocess[0]",
            "unknown post-processor 'shred'",
        ),
        (
            "matpo",
            _set(["tools", "search_and_browse", "subflow"], "nowhere"),
            "tools.search_and_browse.subflow",
            "unknown subflow 'nowhere'",
        ),
        (
            "matpo",
            _set(["subflows", "browse", "start"], "nap"),
            "subflows.browse.start",
            "unknown node 'nap'",
        ),
        (
            "matpo",
            _set(["subflows", "browse", "nodes", "work", "tools"], ["google_search", "fax"]),
            "subflows.browse.nodes.work.tools[1]",
            "unknown tool 'fax'",
        ),
        (
            "mas_orchestra",
            _set(["flow", "nodes", "execute", "agents", "CoTAgent"], "ghost"),
            "flow.nodes.execute.agents.CoTAgent",
            "unknown subflow 'ghost'",
        ),
        (
            "mas_orchestra",
            _set(["flow", "nodes", "execute", "dag"], "graph ||| x"),
            "flow.nodes.execute.dag",
            "Jinja2 syntax error",
        ),
        (
            "mas_orchestra",
            _set(["subflows", "sc", "nodes", "sample", "map"], "nobody"),
            "subflows.sc.nodes.sample.map",
            "unknown role 'nobody'",
        ),
        (
            "mas_orchestra",
            _set(["subflows", "sc", "answer"], "{{ samples | teleport }}"),
            "subflows.sc.answer",
            "No filter named 'teleport'",
        ),
        (
            "hira",
            _set(["subflows", "delegate", "nodes", "select", "next", 0, "when"], "memory and ("),
            "subflows.delegate.nodes.select.next[0].when",
            "Jinja2 syntax error",
        ),
        ("hira", _set(["roles", "router", "parser"], "yaml"), "roles.router.parser", "unknown parser 'yaml'"),
        ("debate", _set(["flow", "nodes", "rebut", "into"], None), "flow.nodes.rebut.into", "valid string"),
        (
            "debate",
            _set(["flow", "nodes", "judge", "bind"], {"verdict": "parsed.answer if"}),
            "flow.nodes.judge.bind.verdict",
            "Jinja2 syntax error",
        ),
        ("debate", _set(["flow", "nodes", "end"], {"call": "judge"}), "flow.nodes.end", "reserved"),
        ("debate", _set(["flow", "max_calls"], 0), "flow.max_calls", "greater than or equal to 1"),
        ("debate", _set(["policies"], {"other": {}}), "roles.judge.policy", "unknown policy 'base'"),
        ("debate", _set(["roles", "judge", "messages"], []), "roles.judge.messages", "at least one message"),
        (
            "debate",
            _set(["roles", "judge", "messages", 0, "role"], "narrator"),
            "roles.judge.messages[0].role",
            "'system', 'user' or 'assistant'",
        ),
        (
            "debate",
            _set(["flow", "nodes", "open_a", "next"], []),
            "flow.nodes.open_a.next",
            "at least one branch",
        ),
    ],
)
def test_invalid_specs_of_every_node_kind_name_path_and_fix(name, mutate, path, message):
    data = _spec(name)
    mutate(data)
    with pytest.raises(topo.TopologyError) as info:
        spec_checks.from_dict(data)
    matching = [p for p in info.value.problems if p.path == path]
    assert matching, str(info.value)
    assert any(message in p.message for p in matching), str(info.value)


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["flow"]["nodes"]["solve"].update(call="nobody"), "flow.nodes.solve.call"),
        (
            lambda d: d["flow"]["nodes"]["verify1"]["next"][0].update(goto="nowhere"),
            "flow.nodes.verify1.next[0].goto",
        ),
        (lambda d: d["roles"]["solver"].update(parser="nonsense"), "roles.solver.parser"),
        (lambda d: d["roles"]["solver"].update(policy="other"), "roles.solver.policy"),
        (
            lambda d: d["roles"]["verifier1"]["messages"][1].update(content="{{ undefined_thing }}"),
            "roles.verifier1.messages[1].content",
        ),
        (
            lambda d: d["flow"]["nodes"]["verify1"]["next"][0].update(when="verdict ==="),
            "flow.nodes.verify1.next[0].when",
        ),
        (lambda d: d["flow"].update(start="missing"), "flow.start"),
        (lambda d: d["roles"]["solver"]["sampling"].update(max_tokens=0), "roles.solver.sampling.max_tokens"),
        (lambda d: d["roles"]["solver"]["sampling"].update(top_k=0), "roles.solver.sampling.top_k"),
        (lambda d: d["roles"]["solver"].update(colour="red"), "roles.solver.colour"),
    ],
)
def test_each_error_names_its_path(mutate, path):
    data = _marsrl()
    mutate(data)
    with pytest.raises(topo.TopologyError) as info:
        spec_checks.from_dict(data)
    assert any(p.path == path for p in info.value.problems), str(info.value)
    assert path in str(info.value)


def test_unreachable_node_is_reported():
    data = _marsrl()
    data["flow"]["nodes"]["solve"]["next"] = [{"goto": "end"}]
    with pytest.raises(topo.TopologyError) as info:
        topo.from_dict(data)
    paths = {p.path for p in info.value.problems}
    assert {"flow.nodes.verify1", "flow.nodes.correct1"} <= paths


def test_unknown_builtin_names_the_choices():
    with pytest.raises(FileNotFoundError, match="marsrl"):
        topo.load("no-such-topology")


def test_a_branch_after_an_unconditional_one_is_never_taken_and_is_reported():
    data = _marsrl()
    data["flow"]["nodes"]["solve"]["next"] = [{"goto": "verify1"}, {"goto": "end", "when": "answer"}]
    with pytest.raises(topo.TopologyError) as info:
        topo.from_dict(data)
    (problem,) = [p for p in info.value.problems if p.path == "flow.nodes.solve.next[1]"]
    assert "never taken" in problem.message and "unconditional branch last" in problem.message


# --- one report with every problem, and the names it may have meant (issue 26) ---


def _broken_marsrl() -> dict:
    from workbench.topology import load, to_dict

    data = to_dict(load("marsrl_cpu"))
    data["roles"]["solver"]["sampling"]["temperature"] = "hot"  # a type error
    data["roles"]["solver"]["sampling"]["max_tokenz"] = 5  # a misspelt field
    data["flow"]["nodes"]["solve"]["bnid"] = {}  # a misspelt field of a flow node
    data["flow"]["start"] = "solv"  # cross-field: a dangling start
    data["flow"]["nodes"]["check1"]["call"] = "checkr"  # cross-field: an unknown role
    return data


def test_type_errors_and_cross_field_problems_are_reported_together_with_suggestions():
    from workbench.topology import TopologyError, from_dict

    with pytest.raises(TopologyError) as caught:
        from_dict(_broken_marsrl())
    found = {p.path: p.message for p in caught.value.problems}
    assert set(found) == {
        "roles.solver.sampling.temperature",
        "roles.solver.sampling.max_tokenz",
        "flow.nodes.solve.bnid",
        "flow.start",
        "flow.nodes.check1.call",
    }
    assert found["roles.solver.sampling.max_tokenz"].endswith("(did you mean 'max_tokens'?)")
    assert found["flow.nodes.solve.bnid"].endswith("(did you mean 'bind'?)")
    assert "unknown node 'solv' (did you mean 'solve'?)" in found["flow.start"]
    assert "unknown role 'checkr' (did you mean 'checker'?)" in found["flow.nodes.check1.call"]


def test_a_missing_required_field_still_reports_alone():
    from workbench.topology import TopologyError, from_dict, load, to_dict

    data = to_dict(load("marsrl_cpu"))
    del data["flow"]["start"]
    data["flow"]["nodes"]["check1"]["call"] = "checkr"
    with pytest.raises(TopologyError) as caught:
        from_dict(data)
    assert [p.path for p in caught.value.problems] == ["flow.start"]


def test_a_tag_protocol_must_call_a_tool_its_node_lists():
    from workbench.engine.spec_checks import from_dict
    from workbench.topology import TopologyError, load, to_dict

    data = to_dict(load("mars_cpu"))
    data["flow"]["nodes"]["research"]["protocol_options"]["tool"] = "serch"
    with pytest.raises(
        TopologyError, match=r"protocol_options.tool: unknown tool 'serch' \(did you mean 'search'\?\)"
    ):
        from_dict(data)


def test_the_spec_alone_knows_no_registry_and_the_full_check_reports_both_at_once():
    """``workbench.topology`` checks what the spec shows; the registries' names are checked by the engine,
    in the same report as the type errors and the spec's own problems."""
    from workbench.topology import TopologyError, from_dict, load, to_dict

    data = to_dict(load("marsrl_cpu"))
    data["roles"]["solver"]["parser"] = "boxd"  # a registry name
    assert from_dict(data).roles["solver"].parser == "boxd"
    data["roles"]["solver"]["sampling"]["temperature"] = "hot"  # a type error
    data["flow"]["start"] = "solv"  # the spec's own problem
    with pytest.raises(TopologyError) as caught:
        spec_checks.from_dict(data)
    found = {p.path: p.message for p in caught.value.problems}
    assert set(found) == {"roles.solver.sampling.temperature", "flow.start", "roles.solver.parser"}
    assert "unknown parser 'boxd' (did you mean 'boxed'?)" in found["roles.solver.parser"]
    assert spec_checks.validate(load("marsrl_cpu")) == load("marsrl_cpu")

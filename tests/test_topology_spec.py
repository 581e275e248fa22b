"""The topology spec: round trips, JSON Schema, and validation errors that name the path."""

import copy

import jsonschema
import pytest

import workbench.topology as topo


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
        (lambda d: d["roles"]["solver"].update(colour="red"), "roles.solver.colour"),
    ],
)
def test_each_error_names_its_path(mutate, path):
    data = _marsrl()
    mutate(data)
    with pytest.raises(topo.TopologyError) as info:
        topo.from_dict(data)
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

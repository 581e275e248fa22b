"""TopologyEditor: every built-in topology survives the canvas; edits change the spec; errors land on nodes."""

from __future__ import annotations

import panel as pn
import pytest

from widgets import topology_canvas as canvas
from widgets.topology_editor import TopologyEditor
from workbench.topology import from_yaml, load, to_dict
from workbench.topology.io import library


@pytest.mark.parametrize("name", library())
def test_every_builtin_topology_round_trips_through_the_canvas(name):
    spec = to_dict(load(name))
    nodes, edges = canvas.to_graph(spec)
    assert canvas.apply_graph(spec, nodes, edges) == spec
    ids = {n["id"] for n in nodes}
    assert {f"role:{r}" for r in spec["roles"]} <= ids and f"step:{spec['flow']['start']}" in ids
    assert all(e["source"] in ids and e["target"] in ids for e in edges)


def test_canvas_edits_change_the_spec_and_errors_land_on_their_node():
    editor = TopologyEditor("marsrl")
    assert editor.topology.name == "marsrl" and editor.problems == []
    before = editor.topology
    editor.remove("role:verifier2")  # the step that calls it now names a missing role
    assert "verifier2" not in editor.spec["roles"]
    assert any(canvas.node_of(path) == "step:verify2" for path, _ in editor.problems), editor.problems
    flagged = {n["id"]: n for n in editor.flow.nodes}["step:verify2"]
    assert flagged["label"].startswith("⚠") and flagged["style"] == {
        "border": "2px solid #c62828",
        "background": "#ffebee",
    }
    assert editor.topology is before, "the last valid topology is kept"
    assert "wb-problems" in editor._banner.object
    editor.load("marsrl")
    editor.remove("step:correct2")  # its incoming branch goes too: verify2 now always ends
    editor.connect("step:verify2", "step:end")
    assert editor.problems == [] and "correct2" not in editor.topology.flow.nodes
    editor.add("role", "critic")
    editor.add("step", "critique")
    editor.connect("step:critique", "role:critic")
    editor.connect("step:correct1", "step:critique")
    assert editor.spec["flow"]["nodes"]["critique"]["call"] == "critic"
    assert {b["goto"] for b in editor.spec["flow"]["nodes"]["correct1"]["next"]} == {"verify2", "critique"}
    editor.connect("step:critique", "step:end")
    editor.connect("step:critique", "step:verify2", when="'error' in answer")  # drawn after the 'always' edge
    assert editor.spec["flow"]["nodes"]["critique"]["next"] == [
        {"goto": "verify2", "when": "'error' in answer"},  # tried first, or it would never be taken
        {"goto": "end", "when": None},
    ]
    with pytest.raises(ValueError, match="already a role called 'critic'"):
        editor.add("role", "critic")
    with pytest.raises(ValueError, match="means nothing"):
        editor.connect("role:critic", "step:critique")


def test_the_form_edits_and_renames_and_the_yaml_loads_back_equal():
    editor = TopologyEditor("mars_cpu")
    editor.update_entry("role:system1", {"description": "copies the answering sentence"}, name="distiller")
    assert editor.problems == [], editor.problems
    assert "distiller" in editor.topology.roles and "system1" not in editor.topology.roles
    assert editor.topology.tools["search"].route.via == "distiller", "references follow a rename"
    again = from_yaml(editor.to_yaml())
    assert again == editor.topology
    assert again.roles["distiller"].description == "copies the answering sentence"
    editor.show_form("role:distiller")
    names = [getattr(w, "css_classes", []) for w in editor._form.objects]
    assert ["wb-field-description"] in names and ["wb-apply"] in names
    description = next(w for w in editor._form.objects if w.css_classes == ["wb-field-description"])
    description.value = "edited in the form"
    next(w for w in editor._form.objects if w.css_classes == ["wb-apply"]).clicks += 1
    assert editor.topology.roles["distiller"].description == "edited in the form"


def test_the_spec_follows_the_canvas_and_the_canvas_follows_the_spec():
    editor = TopologyEditor("marsrl")
    editor.topology = load("debate")
    assert {n["id"] for n in editor.flow.nodes} >= {f"role:{r}" for r in load("debate").roles}
    nodes = [n for n in editor.flow.nodes if n["id"] != "role:" + next(iter(load("debate").roles))]
    editor.flow.nodes = nodes  # what a delete on the canvas sends back
    assert len(editor.spec["roles"]) == len(load("debate").roles) - 1
    assert pn.panel(editor).get_root() is not None


def test_the_builtin_select_shows_the_loaded_topology_whatever_loaded_it():
    editor = TopologyEditor("marsrl")
    assert editor._load.value == "marsrl"
    editor.topology = load("mars_cpu")
    assert editor._load.value == "mars_cpu"
    editor.load("debate")
    assert editor._load.value == "debate"
    editor._load.value = "hira"  # picked in the select
    assert editor.topology == load("hira") and editor._load.value == "hira"
    role = next(iter(editor.spec["roles"]))
    editor.update_entry(f"role:{role}", {}, name=role + "_renamed")
    assert editor._load.value == "", "an edited built-in is no longer that built-in"
    editor._load.value = "hira"  # picking it again reloads it
    assert editor.topology == load("hira") and editor._load.value == "hira"
    custom = to_dict(load("mars_cpu")) | {"name": "mine"}
    assert TopologyEditor(custom)._load.value == ""
    assert TopologyEditor(load("matpo"))._load.value == "matpo"
    assert "(custom)" in TopologyEditor(custom)._load.options

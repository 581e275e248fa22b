"""TopologyEditor: every built-in topology survives the canvas; edits change the spec; errors land on nodes; a
run's signals colour the canvas without touching the spec."""

from __future__ import annotations

import panel as pn
import pytest

from widgets import topology_canvas as canvas
from widgets.topology_editor import ERROR_STYLE, TopologyEditor
from workbench.store import RunStore
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


def _marsrl_run(tmp_path):
    """Two MarsRL steps (the Solver's reward 0.2, then 0.9); in each, the Corrector follows three Verifier
    calls of four and turns one wrong Solver answer of three into a right one."""
    store = RunStore.create(tmp_path, config={"kind": "rollout", "topology": "marsrl"})
    for index, solver_reward in enumerate((0.2, 0.9)):
        with store.step(index) as step:
            for corrector_reward in (1.0, None, 0.0, 0.0):
                episode = step.add_episode()
                solver = step.add_call(episode, role="solver", completion_ids=[1], rewards={"reward": 0.0})
                verifier = step.add_call(
                    episode, role="verifier1", completion_ids=[2], source_id=solver, previous_id=solver
                )
                if corrector_reward is not None:
                    links = {"source_id": solver, "previous_id": verifier}
                    rewards = {"reward": corrector_reward}
                    step.add_call(episode, role="corrector1", completion_ids=[3], rewards=rewards, **links)
            step.log_metrics({"reward/mean": solver_reward, "accuracy": 0.5}, role="solver")
            step.log_metrics({"reward/mean": 0.25}, role="verifier1")
    store.close()
    return store.run_dir


def _canvas(editor):
    return {n["id"]: n for n in editor.flow.nodes}, {e["id"]: e for e in editor.flow.edges}


def test_a_runs_signals_colour_the_canvas_and_follow_the_step_and_measure(tmp_path):
    editor = TopologyEditor(run_dir=_marsrl_run(tmp_path))  # the run's topology, at its last step
    assert editor.topology == load("marsrl") and editor.spec == to_dict(load("marsrl"))
    nodes, edges = _canvas(editor)
    solver, solve = nodes["role:solver"], nodes["step:solve"]
    assert solver["style"] == {"background": editor.signals.fill("solver")} == solve["style"]
    assert solver["label"] == "role · solver · 0.90" and solve["label"] == "solve · 0.90"
    tip = solver["domAttributes"]["title"]
    assert "step 1" in tip and "reward/mean: 0.9" in tip and "accuracy: 0.5" in tip
    assert nodes["role:verifier1"]["style"]["background"] != solver["style"]["background"]
    assert "style" not in nodes["role:corrector1"] and "domAttributes" not in nodes["role:corrector1"]
    branch = edges["next:step:verify1->step:correct1:verdict != 'correct'"]
    assert branch["label"] == "verdict != 'correct' · taken 75% · fixed 33% · broke 0%"
    assert edges["next:step:verify1->step:end:"]["label"] == "taken 25%"
    assert "calls: 3" in branch["domAttributes"]["title"]
    assert editor._signals_bar.visible and editor._signal_step.options == [0, 1]
    editor._signal_step.value = 0  # the slider: the Solver's reward was 0.2 then
    nodes, _ = _canvas(editor)
    assert nodes["role:solver"]["label"] == "role · solver · 0.20"
    assert (
        nodes["role:solver"]["style"]["background"]
        == editor.signals.fill("solver")
        != solver["style"]["background"]
    )
    editor._colour_by.value = "accuracy"
    nodes, _ = _canvas(editor)
    assert nodes["role:solver"]["label"] == "role · solver · 0.50"
    verifier = nodes["role:verifier1"]  # no accuracy: its own colours and label, its numbers still on hover
    assert "style" not in verifier and verifier["label"] == "role · verifier1"
    assert "reward/mean: 0.25" in verifier["domAttributes"]["title"]
    assert editor.spec == to_dict(load("marsrl")) and from_yaml(editor.to_yaml()) == load("marsrl")
    with pytest.raises(ValueError, match="no complete step 7"):
        editor.show_signals(editor._run[0], step=7)
    with pytest.raises(ValueError, match="colour_by 'loss': choose one of reward/mean"):
        editor.show_signals(editor._run[0], colour_by="loss")
    assert editor.signals.colour_by == "accuracy", "a refused request leaves the signals shown"
    assert pn.panel(editor).get_root() is not None


def test_edits_keep_working_under_signals_which_never_reach_the_spec_and_clear_away(tmp_path):
    run_dir = _marsrl_run(tmp_path)
    editor = TopologyEditor("marsrl")
    plain_nodes, plain_edges = editor.flow.nodes, editor.flow.edges
    editor.show_signals(run_dir, step=1)
    nodes, edges = list(editor.flow.nodes), list(editor.flow.edges)
    assert canvas.apply_graph(editor.spec, nodes, edges) == editor.spec == to_dict(load("marsrl"))
    editor.flow.nodes = [n for n in nodes if n["id"] != "role:verifier2"]  # a delete on the canvas
    assert "verifier2" not in editor.spec["roles"] and editor.problems
    after, _ = _canvas(editor)
    assert after["step:verify2"]["style"] == ERROR_STYLE and after["role:solver"]["label"].endswith("0.90")
    editor.load("marsrl")
    editor.update_entry("role:solver", {}, name="answerer")  # a renamed role has no numbers of its own
    after, _ = _canvas(editor)
    assert "style" not in after["role:answerer"] and after["role:verifier1"]["label"].endswith("0.25")
    editor.load("marsrl")
    editor.clear_signals()
    assert editor.signals is None and not editor._signals_bar.visible
    assert editor.flow.nodes == plain_nodes and editor.flow.edges == plain_edges

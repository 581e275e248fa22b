"""TopologyEditor: every built-in topology survives the canvas and is laid out without overlaps; edits, forms, the
edge inspector, the palette and files change the spec as they should; errors land on nodes; a run's signals
colour the canvas without touching the spec. (The browser tests, tests/browser/test_editor.py, build each
paper's system through the UI in Chromium and measure the drawn canvas.)"""

from __future__ import annotations

import panel as pn
import pytest

from widgets import topology_canvas as canvas
from widgets import topology_forms as forms
from widgets import topology_layout as layout
from widgets import topology_spec_edits as edits
from widgets.topology_editor import ERROR_STYLE, TopologyEditor
from workbench.store import RunStore
from workbench.topology import from_yaml, load, to_dict
from workbench.topology.io import library


def _boxes(nodes: list[dict]) -> dict[str, tuple]:
    """Each node's absolute box (a subflow's steps are placed relative to their group)."""
    by_id = {n["id"]: n for n in nodes}
    sizes = canvas.sizes_of(nodes)
    out = {}
    for node in nodes:
        x, y = node["position"]["x"], node["position"]["y"]
        if node.get("parentId"):
            x += by_id[node["parentId"]]["position"]["x"]
            y += by_id[node["parentId"]]["position"]["y"]
        w, h = sizes.get(node["id"]) or (node["style"]["width"], node["style"]["height"])
        out[node["id"]] = (x, y, w, h)
    return out


@pytest.mark.parametrize("name", library())
def test_every_builtin_topology_round_trips_through_the_canvas_and_is_laid_out_without_overlaps(name):
    spec = to_dict(load(name))
    nodes, edges = canvas.to_graph(spec)
    assert edits.apply_graph(spec, nodes, edges) == spec
    ids = {n["id"] for n in nodes}
    assert {f"role:{r}" for r in spec["roles"]} <= ids and f"step:{spec['flow']['start']}" in ids
    assert {f"flow:{f}" for f in spec["subflows"]} <= ids and "policy:base" in ids
    assert all(e["source"] in ids and e["target"] in ids for e in edges)
    assert all(e["markerEnd"]["type"] == "arrowclosed" for e in edges), "every edge has an arrowhead"
    into = {}
    for edge in edges:
        into.setdefault(edge["target"], set()).add(edge["data"]["kind"])
    for role in spec["roles"]:
        assert into.get(f"role:{role}", set()) & {"calls", "route"}, f"role {role} is connected to nothing"
    for tool in spec["tools"]:
        assert "uses" in into.get(f"tool:{tool}", set()), f"tool {tool} is connected to nothing"
    for subflow in spec["subflows"]:
        assert "runs" in into.get(f"flow:{subflow}", set()), f"subflow {subflow} is run by nothing"
    boxes = _boxes(nodes)
    parents = {n["id"]: n.get("parentId") for n in nodes}
    names = sorted(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if (
                b in (parents[a], parents.get(b))
                and a in (parents[b], b)
                or parents[a] == b
                or parents[b] == a
            ):
                continue
            assert not layout._overlaps(boxes[a], boxes[b], 0), f"{a} and {b} overlap"


def test_branch_labels_are_placed_clear_of_nodes_and_of_each_other():
    spec = to_dict(load("hira"))
    nodes, edges = canvas.to_graph(spec)
    boxes = _boxes(nodes)
    solid = [b for n, b in boxes.items() if not n.startswith("flow:")]
    placed = []
    for edge in edges:
        if not edge.get("label"):
            continue
        anchor, _ = canvas._route(dict(edge), boxes)
        dx, dy = (float(v.rstrip("px")) for v in edge["labelStyle"]["transform"][10:-1].split(", "))
        width, height = layout.label_size(edge["label"])
        box = (anchor[0] + dx - width / 2, anchor[1] + dy - height / 2, width, height)
        assert not any(layout._overlaps(box, other, 0) for other in solid + placed), edge["id"]
        placed.append(box)
    assert len(placed) == 5, "hira's router and filter label their five branches with order and condition"
    select = {
        e["target"]: e["label"]
        for e in edges
        if e["source"] == "sub:delegate:select" and e["data"]["kind"] == "next"
    }
    assert select["sub:delegate:search"] == "3: else" and select["sub:delegate:filter"].startswith(
        "1: memory"
    )


def test_node_kinds_each_have_their_own_look_and_the_legend_names_them():
    from widgets.topology_style import PALETTE, canvas_css, palette_html

    spec = to_dict(load("mas_orchestra"))
    nodes, _ = canvas.to_graph(spec)
    kinds = {n["data"]["kind"] for n in nodes}
    assert kinds >= {"router", "dag", "call", "map", "agent", "end", "role", "tool", "policy", "subflow"}
    looks = {kind: canvas.KINDS[kind][:2] for kind in kinds}
    assert len(set(looks.values())) == len(looks), "no two kinds share a fill and border colour"
    css = canvas_css()
    assert all(f".wb-kind-{kind}" in css for kind in canvas.KINDS)
    legend = palette_html()
    assert all(f"wb-palette-{kind}" in legend for kind, _ in PALETTE)
    assert all(f"wb-legend-{kind}" in legend for kind in canvas.KINDS)
    assert all(f"wb-legend-edge-{kind}" in legend for kind in canvas.EDGE_KINDS)
    assert {k for k, _ in PALETTE} >= {
        "call",
        "agent",
        "map",
        "dag",
        "router",
        "end",
        "role",
        "tool",
        "policy",
        "subflow",
    }


def test_canvas_edits_change_the_spec_and_errors_land_on_their_node():
    editor = TopologyEditor("marsrl")
    assert editor.topology.name == "marsrl" and editor.problems == []
    before = editor.topology
    editor.remove("role:verifier2")  # the step that calls it now names a missing role
    assert "verifier2" not in editor.spec["roles"]
    assert any(canvas.node_of(path) == "step:verify2" for path, _ in editor.problems), editor.problems
    flagged = {n["id"]: n for n in editor.flow.nodes}["step:verify2"]
    assert flagged["label"].startswith("⚠") and "wb-error" in flagged["className"]
    assert flagged["style"] == ERROR_STYLE
    assert editor.topology is before, "the last valid topology is kept"
    assert "wb-problems" in editor._banner.object
    editor.load("marsrl")
    assert editor.problems == [] and editor._banner.object == "", "the banner follows the problems"
    editor.problems = [("flow.start", "set from code")]
    assert "set from code" in editor._banner.object
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
    with pytest.raises(ValueError, match="stays inside one flow"):
        TopologyEditor("hira").connect("step:plan", "sub:delegate:select")


def test_edges_of_every_kind_set_the_fields_they_stand_for():
    editor = TopologyEditor("matpo")
    editor.add("tool", "calc")
    editor.connect("sub:browse:work", "tool:calc")  # uses: the worker's tools
    assert editor.spec["subflows"]["browse"]["nodes"]["work"]["tools"] == ["google_search", "calc"]
    editor.add("call", "summarise", flow="browse")
    editor.connect("sub:browse:summarise", "tool:calc")  # a call step given a tool becomes an agent step
    step = editor.spec["subflows"]["browse"]["nodes"]["summarise"]
    assert step["agent"] == "planner" and step["tools"] == ["calc"] and "call" not in step
    editor.connect("tool:calc", "role:worker")  # route: the tool's output distilled by the worker
    assert editor.spec["tools"]["calc"]["route"]["via"] == "worker"
    editor.add("subflow", "check")
    editor.connect("tool:calc", "flow:check")  # runs: an agent tool
    assert (
        editor.spec["tools"]["calc"]["kind"] == "agent" and editor.spec["tools"]["calc"]["subflow"] == "check"
    )
    editor.add("policy", "judge")
    editor.connect("role:worker", "policy:judge")  # plays
    assert editor.spec["roles"]["worker"]["policy"] == "judge"
    nodes, edges = canvas.to_graph(editor.spec)
    plays = next(e for e in edges if e["data"]["kind"] == "plays" and e["source"] == "role:worker")
    editor.flow.edges = [e for e in editor.flow.edges if e["id"] != plays["id"]]  # deleted on the canvas
    assert editor.spec["roles"]["worker"]["policy"] == "base"
    mas = TopologyEditor("mas_orchestra")
    runs = next(e for e in mas.flow.edges if e["data"].get("agent") == "SCAgent")
    mas.inspect_edge(runs["id"])
    mas._inspector_view._rename_agent("step:execute", "SCAgent", "VoteAgent", "flow:sc")
    assert mas.spec["flow"]["nodes"]["execute"]["agents"]["VoteAgent"] == "sc"
    assert mas.inspected == ("edge", ("runs", "step:execute", "flow:sc", "VoteAgent"))
    mas.remove("flow:debate")  # a group goes with its steps; the dag still names it: flagged
    assert "debate" not in mas.spec["subflows"] and not any(
        n["id"].startswith("sub:debate:") for n in mas.flow.nodes
    )
    assert any(path.startswith("flow.nodes.execute.agents") for path, _ in mas.problems)


def test_a_new_topology_is_empty_and_its_settings_are_edited_in_the_form():
    editor = TopologyEditor("marsrl")
    editor.new()
    assert (
        editor.spec["roles"] == {}
        and editor.spec["flow"]["nodes"] == {}
        and editor.spec["name"] == "untitled"
    )
    assert {n["id"] for n in editor.flow.nodes} == {"step:end", "policy:base"}
    assert editor.inspected == ("settings", "")
    planner = editor.drop("role", (300, 300))
    editor.update_entry(planner, {"description": "plans"}, name="planner")
    worker_role = editor.drop("role", (500, 300))
    editor.update_entry(worker_role, {}, name="worker")
    editor.update_entry("role:worker", {}, name="worker2")  # a second rename: the form follows the first
    assert editor.inspected == ("node", "role:worker2")
    plan = editor.drop("call", (100, 100))
    assert editor.spec["flow"]["start"] == "call1", "the first step is the start"
    editor.update_entry(plan, {"bind": {"plan": "text"}}, name="plan")
    work = editor.drop("agent", (350, 100))
    editor.update_entry(work, {}, name="work")
    editor.drop("tool", (350, 450))
    editor.update_entry("tool:tool1", {"kind": "python"}, name="python")
    editor.connect("step:work", "role:worker2")
    editor.connect("step:work", "tool:python")
    editor.connect("step:plan", "step:work")
    review = editor.drop("router", (600, 100))
    assert {n["id"]: n for n in editor.flow.nodes}[review]["data"]["kind"] == "router", "drawn as a router"
    editor.update_entry(review, {}, name="review")
    editor.connect("step:work", "step:review")
    editor.connect("step:review", "step:work", when="'redo' in plan")
    editor.show_settings()
    form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
    form["wb-field-name"].value_input = "plan_work_review"
    form["wb-field-max_calls"].value = 6
    form["wb-field-answer"].value_input = "{{ plan }}"
    form["wb-field-params"].value_input = "depth: 2"
    button = next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[0]
    button.clicks += 1
    assert editor.problems == [], editor.problems
    topology = editor.topology
    assert (
        topology.name == "plan_work_review"
        and topology.flow.max_calls == 6
        and topology.params == {"depth": 2}
    )
    assert topology.flow.start == "plan" and topology.flow.nodes["work"].tools == ["python"]
    assert [b.goto for b in topology.flow.nodes["review"].next] == ["work", "end"]
    assert editor._save.filename == "plan_work_review.yaml"


def test_the_form_edits_renames_and_follows_renames_deletes_and_loads():
    editor = TopologyEditor("mars_cpu")
    editor.update_entry("role:system1", {"description": "copies the answering sentence"}, name="distiller")
    assert editor.problems == [], editor.problems
    assert "distiller" in editor.topology.roles and "system1" not in editor.topology.roles
    assert editor.topology.tools["search"].route.via == "distiller", "references follow a rename"
    again = from_yaml(editor.to_yaml())
    assert again == editor.topology
    assert again.roles["distiller"].description == "copies the answering sentence"
    editor.show_form("role:distiller")
    form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
    assert {
        "wb-field-description",
        "wb-field-sampling-max_tokens",
        "wb-field-reward-kind",
        "wb-field-parser",
    } <= set(form)
    form["wb-field-name"].value_input = "extractor"
    form["wb-field-description"].value_input = "edited in the form"
    apply = next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[0]
    apply.clicks += 1
    assert editor.topology.roles["extractor"].description == "edited in the form"
    assert editor.inspected == ("node", "role:extractor"), "the form follows the rename"
    form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
    assert form["wb-field-name"].value == "extractor"
    form["wb-field-sampling-max_tokens"].value = 99
    next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[0].clicks += 1  # a second Apply
    assert (
        editor.topology.roles["extractor"].sampling.max_tokens == 99
        and "internal" not in editor._message.object
    )
    editor.remove("role:extractor")
    assert editor.inspected == ("settings", ""), "a deleted node's form gives way to the settings"
    editor.show_form("step:answer")
    editor.load("marsrl")
    assert editor.inspected == ("settings", "") and editor.spec["name"] == "marsrl"


def test_the_edge_inspector_sets_conditions_checked_as_typed_and_the_branch_order():
    editor = TopologyEditor("hira")
    select = "sub:delegate:select"
    branch = next(
        e for e in editor.flow.edges if e["source"] == select and e["target"] == "sub:delegate:search"
    )
    editor.inspect_edge(branch["id"])
    assert editor.inspected == ("edge", ("next", select, "sub:delegate:search", 2))
    when = next(w for w in editor._inspector.objects if "wb-edge-when" in getattr(w, "css_classes", []))
    check = next(w for w in editor._inspector.objects if "wb-edge-check" in getattr(w, "css_classes", []))
    assert "valid" in check.object
    when.value_input = "expert ==="  # as typed: a syntax error
    assert "Jinja2 syntax error" in check.object
    when.value_input = "nonsense > 1"
    assert "reads &#x27;nonsense&#x27;, which nothing provides" in check.object
    when.value_input = "'search' in expert | lower"
    assert "wb-condition-ok" in check.object
    editor.set_branch(select, 2, "'search' in expert | lower", order=0)  # Apply, then earlier twice
    branches = editor.spec["subflows"]["delegate"]["nodes"]["select"]["next"]
    assert [b["goto"] for b in branches] == ["search", "filter", "code"]
    assert branches[0]["when"] == "'search' in expert | lower"
    assert editor.inspected == ("edge", ("next", select, "sub:delegate:search", 0)), (
        "the inspector follows it"
    )
    editor.set_branch(select, 0, "", order=2)  # always, and last
    assert editor.spec["subflows"]["delegate"]["nodes"]["select"]["next"][2] == {
        "goto": "search",
        "when": None,
    }
    assert editor.problems == []


def test_the_palette_drops_steps_into_the_subflow_they_land_in_and_keeps_positions():
    editor = TopologyEditor("matpo")
    group = editor.positions["flow:browse"]
    step = editor.drop("map", (group[0] + 40, group[1] + 10), target="flow:browse")
    assert step == "sub:browse:map1" and "map1" in editor.spec["subflows"]["browse"]["nodes"]
    node = {n["id"]: n for n in editor.flow.nodes}[step]
    assert node["parentId"] == "flow:browse" and node["position"]["y"] >= layout.GROUP_TITLE
    boxes = _boxes(editor.flow.nodes)
    assert layout._overlaps(boxes[step], boxes["flow:browse"], 0)
    editor._moved({"node_id": "role:planner", "position": {"x": 900.0, "y": 40.0}})  # dragged on the canvas
    editor.update_entry("role:planner", {"description": "plans"})  # an edit keeps where it was put
    assert {n["id"]: n for n in editor.flow.nodes}["role:planner"]["position"] == {"x": 900.0, "y": 40.0}
    editor.update_entry("role:planner", {}, name="boss")  # so does a rename
    assert {n["id"]: n for n in editor.flow.nodes}["role:boss"]["position"] == {"x": 900.0, "y": 40.0}
    editor.drop("end", (700.0, 700.0))  # the palette's end moves the flow's end there
    assert editor.positions["step:end"] == (672.0, 672.0)
    editor.auto_layout()
    assert editor.positions["role:boss"] != (900.0, 40.0)
    assert editor.flow.viewport["zoom"] <= 1.0
    with pytest.raises(ValueError, match="reserved"):
        editor.add("call", "end")
    assert editor.flow.editor_mode == "side" and not any(editor.flow._node_editors.values()), (
        "no gear editors"
    )


def test_choice_lists_come_from_the_registries_with_plugins_registered_later():
    from workbench.rewards import VERIFIERS, register
    from workbench.tools import TOOL_KINDS, register_tool_kind

    editor = TopologyEditor("marsrl")
    editor.show_form("role:solver")
    form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
    assert "boxed" in form["wb-field-parser"].options.values() and form["wb-field-parser"].value == "boxed"
    assert "strip_think" in form["wb-field-postprocess"].options
    assert set(form["wb-field-reward-kind"].options.values()) == {
        "outcome",
        "answer",
        "verdict",
        "parent",
        "none",
    }
    assert (
        forms.NONE in form["wb-field-reward-verifier"].options
        and "hira_qa" in form["wb-field-reward-judge"].options
    )
    register("close_enough_for_test")(lambda prediction, reference: 1.0)
    register_tool_kind("calculator_for_test", lambda **_: None)
    try:
        editor.show_form("role:verifier1")
        form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
        assert "close_enough_for_test" in form["wb-field-reward-verifier"].options
        editor.add("tool", "calc")
        form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
        editor.show_form("tool:calc")
        form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
        assert {"agent", "bm25", "calculator_for_test"} <= set(form["wb-field-kind"].options)
        editor.show_form("policy:base")
        form = {w.css_classes[0]: w for w in editor._inspector.objects if getattr(w, "css_classes", None)}
        assert {"tiny", "smollm2-135m"} <= set(form["wb-field-model"].options)
        form["wb-field-model"].value_input = "Qwen/Qwen2.5-0.5B-Instruct"  # any other model can be typed
        next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[0].clicks += 1
        assert editor.spec["policies"]["base"]["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
        editor.update_entry("role:solver", forms.form_for("Role", editor.spec["roles"]["solver"], {}).read())
        assert editor.topology.roles["solver"] == load("marsrl").roles["solver"], (
            "a form reads back what it shows"
        )
    finally:
        VERIFIERS.pop("close_enough_for_test", None)
        TOOL_KINDS.pop("calculator_for_test", None)


def test_a_subflow_collapses_to_its_title_and_expands_again():
    editor = TopologyEditor("hira")
    editor.show_form("flow:delegate")
    toggle = next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[1]
    assert toggle.label == "Collapse"
    toggle.clicks += 1
    nodes = {n["id"]: n for n in editor.flow.nodes}
    assert all(n.get("hidden") for i, n in nodes.items() if i.startswith("sub:delegate:"))
    assert (
        nodes["flow:delegate"]["style"]["height"] < 100
        and "5 steps (collapsed)" in nodes["flow:delegate"]["domAttributes"]["data-caption"]
    )
    assert next(o for o in editor._inspector.objects if isinstance(o, pn.Row))[1].label == "Expand"
    editor.update_settings({}, "delegate", name="coordinate")  # a rename keeps it collapsed
    assert editor.layout_data()["collapsed"] == ["flow:coordinate"]
    editor.toggle_collapsed("coordinate")
    assert not any(n.get("hidden") for n in editor.flow.nodes)


def test_save_and_open_keep_the_spec_and_its_layout(tmp_path):
    editor = TopologyEditor("hira")
    editor.toggle_collapsed("delegate")
    editor._moved({"node_id": "role:router", "position": {"x": 1234.0, "y": 56.0}})
    path = editor.save(tmp_path / "mine.yaml")
    text = path.read_text()
    assert from_yaml(text) == load("hira"), "the layout lines are comments every YAML reader ignores"
    assert layout.read_layout(text)["positions"]["role:router"] == [1234.0, 56.0]
    other = TopologyEditor("marsrl")
    other.open(path)
    assert other.topology == load("hira") and other.positions["role:router"] == (1234.0, 56.0)
    assert other.collapsed == {"flow:delegate"}
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("call: router", "call: nobody"))
    other.load(broken)  # an invalid file opens, to be fixed here
    assert any("nobody" in message for _, message in other.problems)
    other._opened(type("Event", (), {"new": b"- not a mapping"})())
    assert "not a topology" in other._message.object, "a bad file is said in the page, not raised"
    assert other.spec["name"] == "hira"


def test_a_notebook_links_panels_stylesheets_from_the_jupyter_server(monkeypatch):
    """What makes the editor look the same offline in JupyterLab (tests/browser/test_jupyterlab.py shows it)."""
    import panel.viewable as viewable
    from bokeh.document import Document
    from bokeh.models import ImportedStyleSheet, UIElement
    from panel.io.resources import CDN_DIST, set_resource_mode

    from widgets import notebook

    monkeypatch.setattr(viewable, "render_mimebundle", lambda model, doc, comm, *rest: model)
    notebook._stylesheets_from_jupyter_server()
    doc = Document()
    with set_resource_mode("cdn"):  # as Panel renders a notebook output
        model = pn.Column(pn.widgets.Button(label="x"), pn.widgets.Select(options=["a"])).get_root(doc)

    def sheets() -> list[str]:
        elements = model.select({"type": UIElement})
        return [s.url for m in elements for s in m.stylesheets if isinstance(s, ImportedStyleSheet)]

    assert any(url.startswith(CDN_DIST) for url in sheets())
    viewable.render_mimebundle(model, doc, None)
    assert sheets() and all(url.startswith("/panel-preview/static/extensions/panel/") for url in sheets())
    assert doc._template_variables["dist_url"] == "/panel-preview/static/extensions/panel/", (
        "and later models"
    )


def test_the_spec_follows_the_canvas_and_the_canvas_follows_the_spec():
    editor = TopologyEditor("marsrl")
    editor.topology = load("debate")
    assert {n["id"] for n in editor.flow.nodes} >= {f"role:{r}" for r in load("debate").roles}
    nodes = [n for n in editor.flow.nodes if n["id"] != "role:" + next(iter(load("debate").roles))]
    editor.flow.nodes = nodes  # what a delete on the canvas sends back
    assert len(editor.spec["roles"]) == len(load("debate").roles) - 1
    editor.flow.edges = [*editor.flow.edges, {"id": "x", "source": "role:" + next(iter(editor.spec["roles"])),
                                               "target": "step:end", "data": {}}]  # fmt: skip
    assert "means nothing" in editor._message.object
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
    assert solver["label"] == "solver · 0.90" and solve["label"] == "solve · 0.90"
    tip = solver["domAttributes"]["title"]
    assert "step 1" in tip and "reward/mean: 0.9" in tip and "accuracy: 0.5" in tip
    assert nodes["role:verifier1"]["style"]["background"] != solver["style"]["background"]
    unmeasured = nodes["role:corrector1"]
    assert "style" not in unmeasured and unmeasured["domAttributes"]["title"] == "role · answer: corrector1"
    branch = edges["next:step:verify1->step:correct1:verdict != 'correct'"]
    assert branch["label"] == "verdict != 'correct' · taken 75% · fixed 33% · broke 0%"
    assert edges["next:step:verify1->step:end:"]["label"] == "taken 25%"
    assert "calls: 3" in branch["domAttributes"]["data-title"]
    assert editor._signals_bar.visible and editor._signal_step.options == [0, 1]
    editor._signal_step.value = 0  # the slider: the Solver's reward was 0.2 then
    nodes, _ = _canvas(editor)
    assert nodes["role:solver"]["label"] == "solver · 0.20"
    assert (
        nodes["role:solver"]["style"]["background"]
        == editor.signals.fill("solver")
        != solver["style"]["background"]
    )
    editor._colour_by.value = "accuracy"
    nodes, _ = _canvas(editor)
    assert nodes["role:solver"]["label"] == "solver · 0.50"
    verifier = nodes["role:verifier1"]  # no accuracy: its own colours and label, its numbers still on hover
    assert "style" not in verifier and verifier["label"] == "verifier1"
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
    assert edits.apply_graph(editor.spec, nodes, edges) == editor.spec == to_dict(load("marsrl"))
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


def test_the_exported_notebook_of_a_topology_built_from_new_runs_under_papermill(tmp_path):
    """ "Export notebook": a topology built from "New" becomes a parameterised notebook that loads the spec,
    rolls it out, trains it and opens its monitor, and runs as exported on the tiny model."""
    import json

    import papermill

    editor = TopologyEditor()
    editor.new("solo")
    editor.update_entry(editor.drop("role", (300, 300)), {}, name="solver")
    editor.update_entry(editor.drop("call", (100, 100)), {}, name="solve")
    editor.connect("step:solve", "role:solver")
    editor.update_settings({"answer": "{{ solve }}"})
    assert editor.problems == [], editor.problems
    path = editor.export_notebook(tmp_path / "solo.ipynb")
    cells = json.loads(path.read_text())["cells"]
    parameters = next(c for c in cells if "parameters" in c["metadata"].get("tags", []))
    assert all(f"{name} = " in parameters["source"] for name in ("model", "tasks", "steps"))
    done = papermill.execute_notebook(
        str(path), str(tmp_path / "out.ipynb"), cwd=str(tmp_path), progress_bar=False, kernel_name="python3",
        parameters={"model": "tiny", "steps": 1, "n_tasks": 1, "batch_size": 1, "group_size": 2, "max_tokens": 8,
                    "runs_dir": str(tmp_path / "runs")},
    )  # fmt: skip
    printed = "".join(o.get("text", "") for c in done["cells"] for o in c.get("outputs", []))
    assert "finished" in printed and "solo | solver" in printed
    assert any("RewardMonitor" in c["source"] for c in done["cells"])
    editor.update_entry("step:solve", {"call": ""})
    with pytest.raises(ValueError, match="problem"):
        editor.export_notebook(tmp_path / "broken.ipynb")

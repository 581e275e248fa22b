"""The TopologyEditor in a real headless Chromium: each paper's system built from an empty canvas through the UI
alone, and every library topology drawn with no two nodes or labels overlapping.

An in-process Panel server serves the editor (``pn.serve``, as ``workbench serve`` serves its tab); one browser
page builds MARS, MarsRL, MATPO, HiRA and MAS-Orchestra one after another. The builder (``Builder``) reads the
library's spec only to know what to do, and does it as a researcher would: "New", palette items dragged onto
the canvas (steps dropped into their subflow's group), node forms filled in and applied, edges drawn from
handle to handle with the mouse, branch conditions and dag agent names set in the edge inspector, the
topology's settings in the settings form, "Auto layout" between phases, and "Save", whose download must load
(with every check) equal to the library's spec. Every server-side error logged meanwhile fails the test.
"""

from __future__ import annotations

import logging
import time
import urllib.request

import panel as pn
import pytest
import yaml

from tests.browser.conftest import free_port, screenshot
from widgets import topology_canvas as canvas
from widgets.topology_editor import TopologyEditor
from widgets.topology_layout import read_layout
from workbench.engine.spec_checks import from_yaml
from workbench.topology import AgentNode, CallNode, DagNode, MapNode, Role, Tool, load, to_dict
from workbench.topology.io import library
from workbench.topology.spec import END

PAPERS = ["mars", "marsrl", "matpo", "hira", "mas_orchestra"]
STEP_MODELS = {"call": CallNode, "agent": AgentNode, "map": MapNode, "dag": DagNode}
#: Fields the builder sets by drawing edges, never in a form.
BY_EDGES = {("call",), ("agent",), ("map",), ("tools",), ("agents",), ("next",), ("subflow",), ("route",),
            ("policy",)}  # fmt: skip


class Errors(logging.Handler):
    """Every record at ERROR or above that the server logs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


#: Where a server-side error is logged: Panel's and Bokeh's loggers do not pass records on to the root one.
LOGGERS = ("", "panel", "bokeh", "tornado")


@pytest.fixture(scope="module")
def served():
    errors = Errors()
    for name in LOGGERS:
        logging.getLogger(name).addHandler(errors)
    port = free_port()
    server = pn.serve(TopologyEditor, port=port, threaded=True, show=False, start=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the server thread answers shortly after it starts
            try:
                urllib.request.urlopen(url, timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield url, errors
    finally:
        server.stop()
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(errors)


@pytest.fixture
def editor_page(browser, request, served):
    url, errors = served
    context = browser.new_context(viewport={"width": 1600, "height": 1100}, accept_downloads=True)
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url + "/")
    page.locator(".react-flow__node").first.wait_for(timeout=60_000)
    yield page, errors, requests
    screenshot(page, request.node.name)
    context.close()


def _yaml(value) -> str:
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=1000)


#: A point of an edge's path (nearest its middle first) where nothing covers it, in page coordinates.
CLEAR_POINT = """(p) => {
  const length = p.getTotalLength(), root = p.getRootNode(), edge = p.closest('.react-flow__edge');
  for (const t of [0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.15, 0.85, 0.1, 0.9]) {
    const m = p.getPointAtLength(length * t), pt = p.ownerSVGElement.createSVGPoint();
    pt.x = m.x; pt.y = m.y;
    const s = pt.matrixTransform(p.getScreenCTM());
    const hit = root.elementFromPoint(s.x, s.y);
    if (hit && edge.contains(hit)) return [s.x, s.y];
  }
  return null;
}"""


#: What kind of input a form field is.
FIELD_KIND = """(el) => {
  const has = (css) => Boolean(el.querySelector(css) || (el.shadowRoot && el.shadowRoot.querySelector(css)));
  return has('.choices') ? 'multi' : has('select') ? 'select' : has('input[type=checkbox]') ? 'checkbox'
    : has('textarea') ? 'textarea' : 'input';
}"""


class Builder:
    """Builds a topology through the editor's UI: palette drags, forms, edges drawn with the mouse."""

    def __init__(self, page) -> None:
        self.page = page
        self.pane = page.locator(".react-flow__pane")
        self.heading = page.locator(".wb-inspector .wb-inspected")

    # ---------------------------------------------------------------- reading the page
    def node(self, identifier: str):
        return self.page.locator(f'.react-flow__node[data-id="{identifier}"]')

    def inspected(self) -> str:
        return self.heading.get_attribute("data-inspected")

    def wait_inspected(self, identifier: str) -> None:
        self.page.locator(f'.wb-inspector .wb-inspected[data-inspected="{identifier}"]').wait_for(
            timeout=20_000
        )

    def click(self, css: str) -> None:
        self.page.locator(f"{css} button").first.click()

    # ---------------------------------------------------------------- acting
    def new(self) -> None:
        from playwright.sync_api import expect

        self.click(".wb-new")
        expect(self.page.locator(".react-flow__node")).to_have_count(2, timeout=20_000)  # its end and policy
        self.wait_inspected("settings")

    def auto_layout(self) -> None:
        before = self.version()
        self.click(".wb-auto-layout")
        self.changed(before)
        self.page.wait_for_timeout(150)  # React Flow places the nodes in its next frames
        self.page.locator(".react-flow__controls-fitview").click()  # fitted to the canvas as it is on screen
        self.page.wait_for_timeout(150)

    def drop(self, kind: str, onto: str | None = None) -> str:
        """Drag a palette item onto the canvas (onto a group node, or an empty spot); the new node's id."""
        before = self.inspected()
        item = self.page.locator(f".wb-palette-{kind}").bounding_box()
        if onto is not None:
            box = self.node(onto).bounding_box()
            # the group's title strip, where no step is
            x, y = box["x"] + min(40, box["width"] / 2), box["y"] + min(10, box["height"] / 8)
        else:
            pane = self.pane.bounding_box()
            x, y = pane["x"] + pane["width"] - 120, pane["y"] + pane["height"] - 60
        self.page.mouse.move(item["x"] + 20, item["y"] + 8)
        self.page.mouse.down()
        self.page.mouse.move(x, y, steps=3)
        self.page.mouse.up()
        for _ in range(400):
            now = self.inspected()
            if now != before:
                return now
            self.page.wait_for_timeout(50)
        raise AssertionError(f"dropping {kind} opened no form")

    def fill(self, values: dict[tuple[str, ...], object]) -> None:
        for path, value in values.items():
            field = self.page.locator(f".wb-inspector .wb-field-{'-'.join(path)}")
            kind = field.evaluate(FIELD_KIND)
            if kind == "multi":  # a multi-choice (post-processors)
                for item in value:
                    field.locator(".choices__inner").click()
                    field.locator(
                        ".choices__list--dropdown .choices__item--choice", has_text=item
                    ).first.click()
                self.page.keyboard.press("Escape")
            elif kind == "select":
                field.locator("select").select_option(label="(none)" if value is None else str(value))
            elif kind == "checkbox":
                field.locator("input[type=checkbox]").set_checked(bool(value))
            elif kind == "textarea":
                field.locator("textarea").fill(value if isinstance(value, str) else _yaml(value))
            else:
                box = field.locator("input").first
                box.fill("" if value is None else str(value))
                box.press("Tab")

    def version(self) -> int:
        return int(self.heading.get_attribute("data-version"))

    def changed(self, before: int, expect: str | None = None) -> None:
        """Wait until the server has taken an edit: the spec's version moved (and ``expect`` is inspected)."""
        shown = f'[data-inspected="{expect}"]' if expect else ""
        for _ in range(400):
            found = self.page.locator(f".wb-inspector .wb-inspected{shown}")
            if found.count() and int(found.first.get_attribute("data-version")) > before:
                return
            self.page.wait_for_timeout(50)
        raise AssertionError(f"the edit was not taken (inspecting {self.inspected()}, waiting for {expect})")

    def apply(self, expect: str) -> None:
        before = self.version()
        self.click(".wb-inspector .wb-apply")
        self.changed(before, expect)

    def connect(self, source: str, target: str, kind: str, again: bool = False) -> None:
        """Draw an edge handle to handle (unless one of that kind is there: a new step calls the first role;
        ``again`` draws one more, a second branch between the same steps)."""
        edge = self.page.locator(f'.react-flow__edge[data-id^="{kind}:{source}->{target}:"]')
        if edge.count() and not again:
            return
        before = self.version()
        handles = self.node(source).locator(".react-flow__handle.source")
        start = (handles.nth(2) if again else handles.first).bounding_box()  # a router's lower handle
        end = self.node(target).locator(".react-flow__handle.target").first.bounding_box()
        self.page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
        self.page.mouse.down()
        self.page.mouse.move(end["x"] + end["width"] / 2, end["y"] + end["height"] / 2, steps=6)
        self.page.mouse.up()
        edge.first.wait_for(state="attached", timeout=20_000)
        self.changed(before)

    def click_edge(self, edge_id_start: str) -> None:
        """Select an edge by clicking its label, or the middle of its path where no node covers it."""
        label = self.page.locator(
            f'.react-flow__edge[data-id^="{edge_id_start}"] .react-flow__edge-textwrapper'
        )
        if label.count():
            box = label.first.bounding_box()
            self.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            return
        path = self.page.locator(
            f'.react-flow__edge[data-id^="{edge_id_start}"] path.react-flow__edge-interaction'
        )
        point = path.first.evaluate(CLEAR_POINT)
        assert point is not None, f"no point of edge {edge_id_start} is clear of nodes"
        self.page.mouse.click(point[0], point[1])

    def settings(self, values: dict[tuple[str, ...], object], flow: str = "") -> None:
        identifier = "settings" if not flow else f"flow:{flow}"
        if flow:
            self.node(identifier).locator(".rf-node-label").click()
        else:
            self.click(".wb-settings-button")
        self.wait_inspected(identifier)
        self.fill(values)
        self.apply("settings" if not flow else f"flow:{values.get(('name',), flow)}")

    def save(self) -> str:
        with self.page.expect_download(timeout=30_000) as download:
            self.page.locator(".wb-save button, .wb-save a").first.click()
        return open(download.value.path(), encoding="utf-8").read()


def _changes(target: dict, initial: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """The form fields whose value must change from ``initial`` to ``target`` (sampling and reward flattened)."""
    out = {}
    for key, value in target.items():
        path = (*prefix, key)
        if path in BY_EDGES:
            continue
        if key in ("sampling", "reward") and not prefix:
            out |= _changes(value, initial.get(key) or {}, path)
        elif value != initial.get(key):
            out[path] = value
    return out


def branch_ui(ui: Builder, sid: str, flow: str, branches: list[dict]) -> None:
    """Draw a step's branches (a new step ends: its first branch drawn replaces that), put them in order with
    the edge inspector's earlier button, and give each its condition there."""
    targets = [b["goto"] for b in branches]
    if targets == [END]:
        return
    drawn = [t for t in targets if t != END] + ([END] if END in targets else [])
    for target in drawn:
        ui.connect(sid, canvas.node_id("step", target, flow), "next")
    for place, target in enumerate(targets):
        at = drawn.index(target)
        tid = canvas.node_id("step", target, flow)
        while at > place:
            ui.click_edge(f"next:{sid}->{tid}:")
            ui.wait_inspected(f"next:{sid}->{tid}")
            ui.click(".wb-inspector .wb-edge-earlier")
            at -= 1
            ui.page.locator(f'.wb-inspector .wb-edge-place[data-order="{at}"]').wait_for(timeout=20_000)
        drawn.remove(target)
        drawn.insert(place, target)
    for target, branch in zip(targets, branches, strict=True):
        if branch.get("when"):
            tid = canvas.node_id("step", target, flow)
            ui.click_edge(f"next:{sid}->{tid}:")
            ui.wait_inspected(f"next:{sid}->{tid}")
            ui.page.locator(".wb-inspector .wb-edge-when input").fill(branch["when"])
            ui.page.locator(".wb-inspector .wb-edge-check .wb-condition-ok").wait_for(timeout=20_000)
            ui.apply(f"next:{sid}->{tid}")


def build(page, name: str) -> str:
    """Build the library's topology ``name`` from an empty canvas through the UI; the saved YAML."""
    spec = to_dict(load(name))
    ui = Builder(page)
    ui.new()
    # roles and tools, each from the palette and its form
    for role, entry in spec["roles"].items():
        made = ui.drop("role")
        initial = Role.model_validate(
            {"messages": [{"role": "user", "content": "{{ question }}"}]}
        ).model_dump(mode="json")
        ui.fill({("name",): role, **_changes(entry, initial)})
        ui.apply(f"role:{role}")
        assert made.startswith("role:")
    for tool, entry in spec["tools"].items():
        ui.drop("tool")
        initial = Tool.model_validate({"kind": "bm25"}).model_dump(mode="json")
        changes = _changes(entry, initial)
        if entry["kind"] == "agent":
            changes.pop(("kind",), None)  # drawing tool -> subflow makes it an agent tool
        ui.fill({("name",): tool, **changes})
        ui.apply(f"tool:{tool}")
    # subflows: a group each, named in its settings
    for subflow in spec["subflows"]:
        made = ui.drop("subflow")
        ui.fill({("name",): subflow})
        ui.apply(f"flow:{subflow}")
        assert made.startswith("flow:")
    ui.auto_layout()
    # the steps of every flow, the start first, each dropped into its flow
    flows = {"": spec["flow"], **spec["subflows"]}
    for flow, body in flows.items():
        order = [body["start"], *[s for s in body["nodes"] if s != body["start"]]]
        for step in order:
            entry = body["nodes"][step]
            kind = canvas.step_kind(entry)
            palette = "router" if kind == "call" and len(entry["next"]) > 1 else kind
            made = ui.drop(palette, onto=f"flow:{flow}" if flow else None)
            created = canvas.parse_id(made)[2]
            seed = {"call": {"call": ""}, "agent": {"agent": "", "tools": []}, "dag": {"dag": "graph", "agents": {}},
                    "map": {"map": "", "over": "items", "into": f"{created}_outputs"}}[kind]  # fmt: skip
            initial = STEP_MODELS[kind].model_validate(seed).model_dump(mode="json")
            ui.fill({("name",): step, **_changes(entry, initial)})
            ui.apply(canvas.node_id("step", step, flow))
        ui.auto_layout()
    # edges, drawn handle to handle: roles, tools, routes, subflows run, then the branches in order
    for flow, body in flows.items():
        for step, entry in body["nodes"].items():
            sid = canvas.node_id("step", step, flow)
            role = canvas.role_of(entry)
            if role is not None:
                ui.connect(sid, f"role:{role}", "calls")
            for tool in entry.get("tools", []):
                ui.connect(sid, f"tool:{tool}", "uses")
            for agent, subflow in (entry.get("agents") or {}).items():
                ui.connect(sid, f"flow:{subflow}", "runs")
                ui.click_edge(f"runs:{sid}->flow:{subflow}:{subflow}")
                ui.wait_inspected(f"runs:{sid}->flow:{subflow}")
                ui.page.locator(".wb-edge-agent input").fill(agent)
                ui.apply(f"runs:{sid}->flow:{subflow}")
    for tool, entry in spec["tools"].items():
        if (entry.get("route") or {}).get("via"):
            ui.connect(f"tool:{tool}", f"role:{entry['route']['via']}", "route")
        if entry["kind"] == "agent":
            ui.connect(f"tool:{tool}", f"flow:{entry['subflow']}", "runs")
    for flow, body in flows.items():
        for step, entry in body["nodes"].items():
            branch_ui(ui, canvas.node_id("step", step, flow), flow, entry["next"])
    # the subflows' and the topology's own settings
    for subflow, body in spec["subflows"].items():
        ui.settings({("name",): subflow, ("inputs",): ", ".join(body["inputs"]), ("answer",): body["answer"],
                     ("max_calls",): body["max_calls"]}, flow=subflow)  # fmt: skip
    ui.settings({("name",): name, ("description",): spec["description"], ("params",): spec["params"] or "",
                 ("answer",): spec["flow"]["answer"], ("max_calls",): spec["flow"]["max_calls"]})  # fmt: skip
    ui.page.locator(".wb-editor-errors .wb-problems").wait_for(state="detached", timeout=20_000)
    ui.auto_layout()  # the finished system laid out as the library's is, and saved so
    screenshot(page, f"editor-built-{name}")
    return ui.save()


def test_each_papers_system_is_built_from_an_empty_canvas_through_the_ui(editor_page):
    page, errors, _ = editor_page
    timings = {}
    for name in PAPERS:
        started = time.monotonic()
        text = build(page, name)
        timings[name] = round(time.monotonic() - started, 1)
        assert from_yaml(text) == load(name), name
        positions = read_layout(text)["positions"]
        assert f"role:{next(iter(load(name).roles))}" in positions, "the layout is saved with the spec"
    print("built in seconds:", timings)
    assert errors.records == [], errors.records[0]


#: What the canvas shows, read from the DOM: nodes (with kind, parent and computed look), node labels, edge
#: labels and edges, every box in page pixels.
CANVAS = """(root) => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  const nodes = [...root.querySelectorAll('.react-flow__node')].map((n) => {
    const style = getComputedStyle(n);
    const kind = [...n.classList].find((c) => c.startsWith('wb-kind-'));
    return {id: n.dataset.id, kind: kind && kind.slice(8), box: box(n),
            label: box(n.querySelector('.rf-node-label')),
            look: [style.backgroundColor, style.borderTopStyle, style.borderTopColor, style.borderTopLeftRadius,
                   style.boxShadow].join(' | ')};
  });
  const labels = [...root.querySelectorAll('.react-flow__edge-textwrapper')].map((l) => ({
    edge: l.closest('.react-flow__edge').dataset.id, box: box(l)}));
  const edges = [...root.querySelectorAll('.react-flow__edge')].map((e) => e.dataset.id);
  const arrowless = [...root.querySelectorAll('.react-flow__edge')]
    .filter((e) => !(e.querySelector('path.react-flow__edge-path') || {getAttribute: () => null}).getAttribute('marker-end'))
    .map((e) => e.dataset.id);
  const gears = root.querySelectorAll('.rf-node-toolbar-button').length;
  return {nodes, labels, edges, arrowless, gears};
}"""


def _overlap(a, b, slack: float = 1.0) -> bool:
    return (
        a[0] + slack < b[0] + b[2] and b[0] + slack < a[0] + a[2]
        and a[1] + slack < b[1] + b[3] and b[1] + slack < a[1] + a[3]
    )  # fmt: skip


def _inside(inner, outer, slack: float = 1.0) -> bool:
    return (
        inner[0] >= outer[0] - slack and inner[1] >= outer[1] - slack
        and inner[0] + inner[2] <= outer[0] + outer[2] + slack and inner[1] + inner[3] <= outer[1] + outer[3] + slack
    )  # fmt: skip


def check_drawing(name: str, drawn: dict) -> None:
    """No two nodes or labels overlap, every role, tool and subflow is connected to what uses it, every kind
    of node looks different from every other, every edge has an arrowhead, and no node has a gear icon."""
    assert drawn["arrowless"] == [], f"{name}: edges without an arrowhead: {drawn['arrowless']}"
    assert drawn["gears"] == 0, f"{name}: a node still has the canvas's own (gear) editor button"
    nodes = {n["id"]: n for n in drawn["nodes"]}
    parent = {i: n["id"] for n in drawn["nodes"] if n["kind"] == "subflow" for i in nodes
              if i.startswith(f"sub:{canvas.parse_id(n['id'])[2]}:")}  # fmt: skip
    ids = sorted(nodes)
    for i, a in enumerate(ids):
        assert _inside(nodes[a]["label"], nodes[a]["box"]), f"{name}: the label of {a} leaves its node"
        for b in ids[i + 1 :]:
            if parent.get(a) == b or parent.get(b) == a:
                assert _inside(
                    nodes[a if parent.get(a) == b else b]["box"], nodes[b if parent.get(a) == b else a]["box"]
                )
                continue
            assert not _overlap(nodes[a]["box"], nodes[b]["box"]), f"{name}: nodes {a} and {b} overlap"
    solid = [n for n in drawn["nodes"] if n["kind"] != "subflow"]
    for i, label in enumerate(drawn["labels"]):
        for node in solid:
            assert not _overlap(label["box"], node["box"]), (
                f"{name}: the label of {label['edge']} covers {node['id']}"
            )
        for other in drawn["labels"][i + 1 :]:
            assert not _overlap(label["box"], other["box"]), (
                f"{name}: labels of {label['edge']} and {other['edge']} overlap"
            )
    into = {}
    for edge in drawn["edges"]:
        kind, _, rest = edge.partition(":")
        target = rest.split("->", 1)[1].rsplit(":", 1)[0]
        into.setdefault(target, set()).add(kind)
    for identifier, node in nodes.items():
        wanted = {"role": {"calls", "route"}, "tool": {"uses"}, "subflow": {"runs"}}.get(node["kind"])
        if wanted:
            assert into.get(identifier, set()) & wanted, (
                f"{name}: {identifier} is connected to nothing that uses it"
            )
    looks = {}
    for node in drawn["nodes"]:
        looks.setdefault(node["kind"], set()).add(node["look"] if "wb-error" not in node["look"] else "")
    kinds = sorted(looks)
    for i, a in enumerate(kinds):
        for b in kinds[i + 1 :]:
            assert not looks[a] & looks[b], f"{name}: {a} and {b} nodes look the same"


def test_every_library_topology_is_drawn_without_overlaps_and_with_every_part_connected(editor_page):
    from playwright.sync_api import expect

    page, errors, requests = editor_page
    flow = page.locator(".react-flow").first
    for name in library():
        page.locator(".wb-editor-load select").select_option(name)
        nodes, _, _ = canvas.graph(to_dict(load(name)))
        expect(page.locator(".react-flow__node")).to_have_count(len(nodes), timeout=20_000)
        for node in nodes:
            page.locator(f'.react-flow__node[data-id="{node["id"]}"]').wait_for(
                state="attached", timeout=20_000
            )
        page.wait_for_timeout(300)  # React Flow measures the nodes, then draws the edges between them
        check_drawing(name, flow.evaluate(CANVAS))
    screenshot(page, "editor-mas_orchestra")
    outside = [
        u
        for u in requests
        if not u.startswith(("http://127.0.0.1", "http://localhost", "ws://", "data:", "blob:"))
    ]
    assert outside == [], f"the editor fetched from elsewhere: {outside[:5]}"
    assert errors.records == [], errors.records[0]


def canvas_top(page) -> float:
    return page.locator(".react-flow").first.bounding_box()["y"]


#: A long condition: its label is cut short on the canvas and shown whole on hover (an SVG <title>).
LONG_WHEN = "'a condition longer than any label' != 'short'"


def test_two_branches_between_one_pair_each_selected_by_its_label_and_the_canvas_never_moves(editor_page):
    """A router with two branches to the same step, built from "New": each label (and each entry of the router
    form's branch list) selects its own branch; a refused edge vanishes at once; the banner, however long,
    never moves the canvas; a cut label shows whole on hover."""
    page, errors, _ = editor_page
    ui = Builder(page)
    ui.new()
    top = canvas_top(page)
    ui.drop("role")
    router = ui.drop("router")
    target = ui.drop("call")
    ui.drop("call")
    ui.drop("call")  # three steps nothing reaches: three problems
    page.locator(".wb-editor-errors .wb-problems li").nth(2).wait_for(timeout=20_000)  # the banner has grown
    assert canvas_top(page) == top, "the banner moved the canvas"
    ui.auto_layout()
    ui.connect(router, target, "next")  # replaces the router's default end
    edge = f"next:{router}->{target}:"
    ui.click_edge(edge)
    ui.wait_inspected(f"next:{router}->{target}")
    page.locator(".wb-inspector .wb-edge-when input").fill(LONG_WHEN)
    ui.apply(f"next:{router}->{target}")
    ui.connect(router, target, "next", again=True)  # a second branch between the same two steps
    labels = page.locator(f'.react-flow__edge[data-id^="{edge}"] .react-flow__edge-textwrapper')
    labels.nth(1).wait_for(timeout=20_000)
    assert canvas_top(page) == top
    paths = page.locator(f'.react-flow__edge[data-id^="{edge}"] path.react-flow__edge-path')
    middles = [p.evaluate("(p) => p.getPointAtLength(p.getTotalLength() / 2).y") for p in paths.all()]
    assert abs(middles[0] - middles[1]) >= 15, f"parallel branches drawn along one line: {middles}"
    for _ in range(2):  # each label, in either order, selects its own branch
        for order, text in ((0, "1: "), (1, "2: else")):
            label = page.locator(
                f'.react-flow__edge[data-id^="{edge}"] .react-flow__edge-textwrapper', has_text=text
            )
            box = label.bounding_box()
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.locator(f'.wb-inspector .wb-edge-place[data-order="{order}"]').wait_for(timeout=20_000)
    titled = page.locator(f'.react-flow__edge[data-id="{edge}{LONG_WHEN}"] > title')
    assert LONG_WHEN in titled.text_content(), "a cut label shows whole on hover"
    pane = ui.pane.bounding_box()
    for order in (1, 0):  # the router form's branch list selects a branch
        page.mouse.click(pane["x"] + pane["width"] - 20, pane["y"] + 20)  # nothing selected, then the router
        ui.node(router).locator(".rf-node-label").click()
        ui.wait_inspected(router)
        page.locator(f".wb-inspector .wb-branch-{order} button").click()
        page.locator(f'.wb-inspector .wb-edge-place[data-order="{order}"]').wait_for(timeout=20_000)
    # an edge that means nothing (role -> step) is refused and vanishes at once
    edges = page.locator(".react-flow__edge")
    count = edges.count()
    role = next(
        i
        for i in (n.get_attribute("data-id") for n in page.locator(".react-flow__node").all())
        if i.startswith("role:")
    )
    start = ui.node(role).locator(".react-flow__handle.source").first.bounding_box()
    end = ui.node(target).locator(".react-flow__handle.target").first.bounding_box()
    page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
    page.mouse.down()
    page.mouse.move(end["x"] + end["width"] / 2, end["y"] + end["height"] / 2, steps=6)
    page.mouse.up()
    page.locator(".wb-editor-notice .wb-notice", has_text="means nothing").wait_for(timeout=20_000)
    for _ in range(40):
        if edges.count() == count:
            break
        page.wait_for_timeout(50)
    assert edges.count() == count, "the refused edge is still drawn"
    assert canvas_top(page) == top
    assert errors.records == [], errors.records[0]


#: The drawn graph against its canvas: the zoom, a step name's size on screen, how much of the canvas it fills.
FILLED = """(root) => {
  const canvas = root.getBoundingClientRect();
  const boxes = [...root.querySelectorAll('.react-flow__node')].map((n) => n.getBoundingClientRect());
  const left = Math.min(...boxes.map((b) => b.left)), right = Math.max(...boxes.map((b) => b.right));
  const top = Math.min(...boxes.map((b) => b.top)), bottom = Math.max(...boxes.map((b) => b.bottom));
  const zoom = new DOMMatrix(getComputedStyle(root.querySelector('.react-flow__viewport')).transform).a;
  const name = root.querySelector('.react-flow__node.wb-kind-call .rf-node-label');
  return {zoom, name: parseFloat(getComputedStyle(name).fontSize) * zoom,
          fill: [(right - left) / canvas.width, (bottom - top) / canvas.height],
          inside: left >= canvas.left - 1 && right <= canvas.right + 1 && top >= canvas.top - 1
                  && bottom <= canvas.bottom + 1};
}"""


def test_auto_layout_fits_the_canvas_at_its_real_size_with_readable_names(browser, served):
    """On a 1600 x 1000 page the canvas fills the window and Auto layout shows mas_orchestra whole with step
    names >= 11 px, filling >= 80% of the canvas's width or height; on a smaller window the view refits."""
    url, errors = served
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    try:
        page.goto(url + "/")
        page.locator(".react-flow__node").first.wait_for(timeout=60_000)
        page.locator(".wb-editor-load select").select_option("mas_orchestra")
        page.locator('.react-flow__node[data-id="flow:reflexion"]').wait_for(timeout=20_000)
        ui = Builder(page)
        ui.changed(0)
        before = ui.version()
        ui.click(".wb-auto-layout")
        ui.changed(before)
        page.wait_for_timeout(500)  # the viewport is sent after the nodes
        flow = page.locator(".react-flow").first
        box = flow.bounding_box()
        assert box["y"] + box["height"] >= 1000 - 40, f"the canvas leaves the window's bottom empty: {box}"
        drawn = flow.evaluate(FILLED)
        screenshot(page, "editor-auto-layout-1600x1000")
        assert drawn["inside"], f"the graph leaves the canvas: {drawn}"
        assert drawn["name"] >= 11, f"step names drawn at {drawn['name']:.1f} px (zoom {drawn['zoom']:.2f})"
        assert max(drawn["fill"]) >= 0.8, f"the graph fills only {drawn['fill']} of the canvas"
        page.set_viewport_size({"width": 1200, "height": 800})  # resized: fitted again to the smaller canvas
        for _ in range(60):
            drawn = flow.evaluate(FILLED)
            if drawn["inside"]:
                break
            page.wait_for_timeout(100)
        assert drawn["inside"] and max(drawn["fill"]) >= 0.8, drawn
    finally:
        context.close()
    assert errors.records == [], errors.records[0]

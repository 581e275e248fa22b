"""TopologyEditor: build and edit a topology on a node-and-edge canvas (panel-reactflow), with an inspector.

Start from an empty topology ("New"), a built-in one, or a file ("Open"). Drag entries from the palette onto
the canvas: flow steps of every kind (call, agent, map, dag, a router, the end), roles, tools, policies and
subflows (drawn as groups, which collapse to their title from their settings; a step dropped into a group
joins that subflow). Draw edges between nodes: a branch (step → step), a role call (step → role), tool use
(agent step → tool), a route (tool → role), a subflow run (agent tool or dag step → subflow) and a policy
(role → policy); the legend under the palette says which is which. Select a node to edit it in its form
(generated from the spec's JSON Schema, with choice lists from the registries; "Apply" also renames, references
included), an edge to edit it in the edge inspector (a branch's ``when``, checked as you type, and its place in
the branch order), or nothing
(or "Settings") for the topology's own settings and its main flow's. After every edit the spec is
validated: each problem is shown on the node it concerns (⚠ in its label, a red border) and listed in a
banner; the inspector follows renames, deletes and loads.

A loaded spec is laid out automatically (``widgets.topology_layout``: no two nodes or labels overlap) and the
layout is kept across edits, node by node; "Auto layout" lays it out again. The canvas fills the space it is
given, and the view is fitted to its real size, measured on the page (``widgets.topology_canvas_page``); the
banner sits in a strip of its own height, so the canvas never moves. "Export notebook" (``export_notebook``)
writes the spec as a papermill-parameterised notebook that rolls it out and trains it
(``widgets.topology_notebook``).

The parts: the inspector's forms are ``widgets.topology_inspector``, the edits from code
``widgets.topology_editor_edits``, a run's signals ``widgets.topology_editor_signals``; spec ↔ graph is
``widgets.topology_canvas`` and ``widgets.topology_spec_edits``. "Save" downloads the spec as
YAML with its layout in comment lines that the engine ignores, "Open" reads one back (``editor.save(path)``
and ``editor.open(path)`` from code).

Two-way sync: ``editor.spec`` is the current spec as data (even when invalid), ``editor.topology``
the last valid ``Topology`` (a param a notebook can watch); setting ``editor.topology`` redraws the
canvas. ``editor.to_yaml()`` / the Export button give YAML that loads back into an equal topology.

The built-in select follows the spec however it was loaded or edited: it names the built-in the spec
is, unedited, and reads "(custom)" otherwise.

A run's signals on the canvas (display only: the spec never changes): ``TopologyEditor(run_dir=RUN)``
opens the run's topology with them, ``editor.show_signals(run_dir, step=None, colour_by="reward/mean")``
shows them over the current spec, ``editor.clear_signals()`` takes them off. Each role node, and each step
running that role, is filled on the diagram's red-to-green scale with its value in the label and every
measure on hover; flow branches carry the shares of calls that took them, fixed and broke an answer
(``workbench.analysis.signals``). A step slider and a measure menu appear while a run is shown, and the
signals stay on through edits (names that still match keep their numbers).

CSS classes a browser test can find: ``wb-editor``, ``wb-editor-load`` (the built-in select), ``wb-new``,
``wb-open``, ``wb-save``, ``wb-export``, ``wb-export-notebook``, ``wb-auto-layout``, ``wb-settings-button``,
``wb-palette-<kind>`` (palette items), ``wb-inspector`` with its title ``wb-inspected`` (``data-inspected``: the
node, edge or "settings" shown; ``data-version``: how many edits the spec has had), ``wb-field-<path>`` (a form
field, ``sampling-max_tokens`` for a nested one), ``wb-apply``, ``wb-delete``, ``wb-collapse``, ``wb-branch-<i>``
(a step's branch ``i`` in its form's list), ``wb-edge-when``, ``wb-edge-check``, ``wb-edge-earlier``,
``wb-edge-later``, ``wb-edge-agent``, ``wb-yaml`` (the exported YAML), ``wb-editor-status`` (the strip holding
``wb-editor-notice`` and the banner, ``wb-editor-errors``), ``wb-editor-signals`` (the step slider, measure menu
and ``wb-clear-signals`` button); canvas nodes carry ``data-id="role:NAME"`` etc. (React Flow's), ``wb-node
wb-kind-<kind>`` and a ``data-caption``; edges ``wb-edge wb-edge-<kind>``.
"""

from __future__ import annotations

import html
import importlib
import io
import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

import panel as pn
import param
import yaml
from panel_reactflow import ReactFlow

from widgets import topology_canvas as canvas
from widgets import topology_forms as forms
from widgets import topology_layout as layout
from widgets import topology_spec_edits as edits
from widgets.topology_canvas_page import CanvasPage, fitted_viewport
from widgets.topology_editor_edits import EditsFromCode
from widgets.topology_editor_signals import RunSignals
from widgets.topology_inspector import Inspector
from widgets.topology_notebook import notebook_for, write_notebook
from widgets.topology_notices import reported
from widgets.topology_style import PALETTE_TYPE, canvas_css, palette_html
from workbench.analysis.signals import (
    run_topology_of,
)
from workbench.engine.spec_checks import from_dict
from workbench.topology import Topology, load, to_dict, to_yaml
from workbench.topology.diagram import Signals
from workbench.topology.io import library
from workbench.topology.spec import END
from workbench.topology.validate import TopologyError

ERROR_STYLE = {"border": "2px solid #c62828", "background": "#ffebee"}
#: The built-in select's label for a spec that is no built-in (or an edited one); its value is "".
CUSTOM = "(custom)"
#: The canvas's height: the window's less what sits above it (at least 480 px); its width is what the row leaves.
CANVAS_HEIGHT_CSS = "max(480px, calc(100vh - 130px))"
STATUS_HEIGHT = 56  # the problem banner's and notices' strip above the canvas


@cache
def _builtin(name: str) -> Topology:
    return load(name)


@cache
def _warm_up() -> None:
    """Import the tool registry in the background: it loads jsonschema (seconds), which the first form or
    validation naming a tool would otherwise wait for."""
    threading.Thread(target=importlib.import_module, args=("workbench.tools",), daemon=True).start()


def _no_editor(*_args: Any, **_kwargs: Any) -> None:
    """The canvas's own per-node editors are off: the inspector beside it edits (no gear icon)."""
    return None


class TopologyEditor(EditsFromCode, RunSignals, pn.viewable.Viewer):
    """A canvas, a palette and an inspector over one topology spec."""

    topology = param.ClassSelector(class_=Topology, default=None, allow_None=True, doc="The last valid spec.")
    problems = param.List(default=[], doc="Validation problems of the current spec: (path, message).")

    def __init__(
        self,
        topology: Topology | dict | str | None = None,
        run_dir: str | Path | None = None,
        step: int | None = None,
        colour_by: str = "reward/mean",
        **params: Any,
    ) -> None:
        """Edit ``topology`` (default: the run's topology where ``run_dir`` is given, else marsrl),
        showing the signals of the run in ``run_dir`` at ``step`` coloured by ``colour_by`` where given."""
        super().__init__(**params)
        _warm_up()
        self.spec: dict = {}
        self.signals: Signals | None = None
        self.positions: dict[str, tuple[float, float]] = {}  # by canvas node id; a subflow's steps relative
        self.routers: set[str] = set()  # call steps placed as routers (drawn so before they branch)
        self.collapsed: set[str] = set()  # subflow groups shown as their title alone
        self._wanted: dict[str, tuple[float, float]] = {}  # where dropped nodes go, if free
        self.inspected: tuple[str, Any] = (
            "settings",
            None,
        )  # ("node", id) | ("edge", key) | ("settings", flow)
        self.version = 0  # how many times the spec was set
        self._fitted: dict | None = None  # the viewport fit_view set last (refitted on resize while shown)
        self._page_sized = False  # whether a page has reported the canvas's size yet
        self._taken_back = 0  # how many times refused edges were taken off the page
        self._run: tuple[Path, Topology, dict[str, float]] | None = None  # run dir, its topology, replays
        self._syncing = self._syncing_select = self._syncing_signals = False
        self.flow = ReactFlow(
            sizing_mode="stretch_width", styles={"height": "100%"}, display_side_bar=False, editor_mode="side",
            default_node_editor=_no_editor, default_edge_editor=_no_editor, node_types=canvas.NODE_TYPES,
            drop_types=[PALETTE_TYPE], min_zoom=0.2, max_zoom=2, stylesheets=[canvas_css()], allow_edge_loops=True,
            css_classes=["wb-canvas"],
        )  # fmt: skip
        self.flow.param.watch(self._canvas_changed, ["nodes", "edges"])
        self.flow.param.watch(self._selected, "selection")
        self.flow.on("node_moved", self._moved)
        self.flow.on("drop", self._dropped)
        self.page = CanvasPage()  # the canvas's size on the page, measured there
        self.page.param.watch(self._resized, "size")
        self._inspector_view = Inspector(self)
        self._inspector = self._inspector_view.column
        self._banner = pn.pane.HTML("", css_classes=["wb-editor-errors"], sizing_mode="stretch_width")
        self._message = pn.pane.HTML("", css_classes=["wb-editor-notice"], sizing_mode="stretch_width")
        self._yaml = pn.pane.HTML("", css_classes=["wb-yaml"], sizing_mode="stretch_width")
        self._load = pn.widgets.Select(
            label="built-in topology", options={CUSTOM: "", **{n: n for n in library()}}, value="",
            css_classes=["wb-editor-load"], width=170,
        )  # fmt: skip
        self._load.param.watch(self._picked, "value")
        self._open = pn.widgets.FileInput(accept=".yaml,.yml,.json", css_classes=["wb-open"], width=230)
        self._open.param.watch(self._opened, "value")
        self._save = pn.widgets.FileDownload(
            callback=self._download, filename="topology.yaml", label="Save", color="success",
            css_classes=["wb-save"], width=90,
        )  # fmt: skip
        self._signals_bar = self._signal_widgets(colour_by)
        self.param.watch(self._topology_set, "topology")
        self.param.watch(self._show_problems, "problems")
        self.load(topology if topology is not None else run_topology_of(run_dir) if run_dir else "marsrl")
        if run_dir is not None:
            self.show_signals(run_dir, step, colour_by)

    # ------------------------------------------------------------------ spec <-> canvas
    def load(self, source: Topology | dict | str | Path, saved_layout: dict | None = None) -> None:
        """Show a built-in topology (by name), a file, a Topology or a dict; laid out automatically unless
        ``saved_layout`` (``layout_data()``'s) or the file says where its nodes go."""
        if isinstance(source, Topology):
            spec = to_dict(source)
        elif isinstance(source, dict):
            spec = source
        elif isinstance(source, Path) or Path(str(source)).suffix in (".yaml", ".yml", ".json"):
            self.open(source)
            return
        else:
            spec = to_dict(load(source))
        self._replace(spec, saved_layout or {})

    def _replace(self, spec: dict, saved: dict) -> None:
        self.positions = {k: tuple(v) for k, v in (saved.get("positions") or {}).items()}
        self.routers = set(saved.get("routers") or [])
        self.collapsed = set(saved.get("collapsed") or [])
        self.inspected = ("settings", canvas.MAIN)
        self.set_spec(spec)
        self.fit_view()

    def new(self, name: str = "untitled") -> None:
        """Start an empty topology: one policy (``base``) and nothing else; the first step becomes the start."""
        self._replace(edits.new_spec(name), {})

    def open(self, path: str | Path) -> None:
        """Load a spec from a YAML/JSON file (invalid ones too, to fix them here), with its saved layout."""
        self._read_text(Path(path).read_text(encoding="utf-8"))

    def _read_text(self, text: str) -> None:
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError("not a topology: a YAML/JSON mapping with name, roles and flow")
        self._replace(data, layout.read_layout(text))

    def save(self, path: str | Path) -> Path:
        """Write the spec as YAML with its layout (comment lines the engine ignores); returns the path."""
        path = Path(path)
        path.write_text(self.to_yaml(with_layout=True), encoding="utf-8")
        return path

    def set_spec(self, spec: dict) -> None:
        """Replace the spec, redraw the canvas, validate and refresh the inspector."""
        self.spec = spec
        self.version += 1
        self._validate()
        self._draw()
        self._show_source()
        self._inspector_view.show()
        self._save.filename = self._filename()

    def builtin_name(self) -> str | None:
        """The built-in topology the current spec is, unedited; None for any other spec."""
        name = self.spec.get("name")
        if self.problems or not isinstance(name, str) or name not in library():
            return None
        return name if self.topology == _builtin(name) else None

    def _show_source(self) -> None:
        """Point the built-in select at the current spec: its name, or (custom) when it is no built-in."""
        value = self.builtin_name() or ""
        if self._load.value != value:
            self._syncing_select = True
            try:
                self._load.value = value
            finally:
                self._syncing_select = False

    @reported
    def _picked(self, event: Any) -> None:
        if event.new and not self._syncing_select:
            self.load(event.new)

    @reported
    def _opened(self, event: Any) -> None:
        if event.new:
            self._read_text(event.new.decode("utf-8"))

    def layout_data(self) -> dict:
        """The current layout: node positions (a subflow's steps relative to it) and the routers placed."""
        data: dict[str, Any] = {
            "positions": {k: [round(v[0], 1), round(v[1], 1)] for k, v in self.positions.items()}
        }
        if self.routers:
            data["routers"] = sorted(self.routers)
        if self.collapsed:
            data["collapsed"] = sorted(self.collapsed)
        return data

    def toggle_collapsed(self, subflow: str) -> None:
        """Collapse a subflow's group to its title (its steps hidden), or expand it again."""
        group = canvas.node_id("flow", subflow)
        self.collapsed ^= {group}
        self.version += 1
        self._draw()
        self._inspector_view.refresh()

    def _draw(self) -> None:
        nodes, edges, scene = canvas.graph(self.spec, self.routers)
        live = {n["id"] for n in nodes}
        kept = {k: v for k, v in self.positions.items() if k in live and k not in self._wanted}
        nodes, edges = canvas.position(nodes, edges, scene, kept, self._wanted)
        self._wanted = {}
        self.positions = {n["id"]: (n["position"]["x"], n["position"]["y"]) for n in nodes}
        for node in nodes:  # a collapsed group hides its steps (and their edges) and keeps its title
            if node.get("parentId") in self.collapsed:
                node["hidden"] = True
            elif node["id"] in self.collapsed:
                steps = sum(1 for n in nodes if n.get("parentId") == node["id"]) - 1
                node["style"] = {"width": 220, "height": layout.GROUP_TITLE + 24}
                node["className"] += " wb-collapsed"
                node["domAttributes"]["data-caption"] += f" · {steps} step{'s' * (steps != 1)} (collapsed)"
        if self.signals is not None:
            nodes, edges = canvas.with_signals(self.spec, nodes, edges, self.signals)
        selection = self.flow.selection or {}
        chosen, chosen_edges = set(selection.get("nodes") or []), set(selection.get("edges") or [])
        for (
            node
        ) in nodes:  # the browser's selection stays as it is (else it sends it again, reopening its form)
            node["selected"] = node["id"] in chosen
        for edge in edges:
            edge["selected"] = edge["id"] in chosen_edges
        flagged = {canvas.node_of(path) for path, _ in self.problems}
        for node in nodes:
            if node["id"] in flagged:
                node["label"] = "⚠ " + node["label"]
                node["className"] += " wb-error"
                node["style"] = {**node.get("style", {}), **ERROR_STYLE}
        self._syncing = True
        try:
            self.flow.param.update(nodes=nodes, edges=edges)
        finally:
            self._syncing = False

    def fit_view(self) -> None:
        """Show the whole canvas: the viewport fitted to every node and centred, at most at full size, in the
        canvas as large as the page draws it (``self.page.size``)."""
        boxes = canvas.absolute_boxes(list(self.flow.nodes))
        if boxes:
            self._fitted = fitted_viewport(boxes, self.page.width_height, self.flow.min_zoom)
            self.flow.viewport = dict(self._fitted)

    def _resized(self, _event: Any) -> None:
        """The page drew the canvas (first, or at another size): fit the view to it, unless it was moved since
        the last fit (the first report always fits: React Flow fits by its own rules when it mounts)."""
        now, fitted = self.flow.viewport, self._fitted
        moved = (
            fitted is not None
            and now is not None
            and any(abs(now.get(k, 0) - v) > 0.5 for k, v in fitted.items())
        )
        if not moved or not self._page_sized:
            self.fit_view()
        self._page_sized = True

    def auto_layout(self) -> None:
        """Lay the canvas out again automatically (forgetting where nodes were moved) and show all of it."""
        self.positions = {}
        self._draw()
        self.fit_view()
        self.version += 1  # the page can tell the new layout has been sent
        self._inspector_view.show()

    @reported
    def _canvas_changed(self, *_events: Any) -> None:
        if self._syncing:
            return
        nodes = [n if isinstance(n, dict) else n.to_dict() for n in self.flow.nodes]
        edges = [e if isinstance(e, dict) else e.to_dict() for e in self.flow.edges]
        present = {n["id"] for n in nodes}
        meaningless = [
            e for e in edges
            if "kind" not in (e.get("data") or {}) and canvas.edge_kind(e["source"], e["target"], self.spec) is None
            and {e["source"], e["target"]} <= present
        ]  # fmt: skip
        self.set_spec(edits.apply_graph(self.spec, nodes, edges))
        if meaningless:
            self._notice(canvas.explain_edge(meaningless[0]["source"], meaningless[0]["target"], self.spec))
            # the page keeps an edge it has just drawn: it is told again, once this round is over
            pn.state.execute(self._take_back, schedule=True)

    def _take_back(self) -> None:
        """Take a refused edge off the page: the canvas's edges sent again, marked so that the page sees a
        change (it redraws its edges only when what it is sent differs from what it was sent last)."""
        self._taken_back += 1
        edges = [{**e, "data": {**e["data"], "redrawn": self._taken_back}} for e in self.flow.edges]
        self._syncing = True
        try:
            self.flow.edges = edges
        finally:
            self._syncing = False

    @reported
    def _moved(self, event: dict) -> None:
        identifier, where = event.get("node_id"), event.get("position") or {}
        if identifier is None or "x" not in where:
            return
        self.positions[identifier] = (float(where["x"]), float(where["y"]))
        if identifier.startswith("sub:"):  # its group grows to hold it
            self._draw()

    @reported
    def _dropped(self, event: dict) -> None:
        kind = event.get("data")
        where = event.get("position") or {"x": 0.0, "y": 0.0}
        target = (event.get("target") or {}).get("node_id") or ""
        self.drop(str(kind), (float(where["x"]), float(where["y"])), target)

    def drop(self, kind: str, where: tuple[float, float], target: str = "") -> str:
        """What dropping a palette item of ``kind`` at canvas point ``where`` on node ``target`` does: adds the
        entry (a step into the subflow it lands in) there and opens its form; returns its canvas id."""
        tkind, tflow, tname = canvas.parse_id(target) if target else ("", canvas.MAIN, "")
        flow = tname if tkind == "flow" else tflow if tkind == "step" else canvas.MAIN
        step_like = kind in (*canvas.STEP_KINDS, "router", "end")
        flow = flow if step_like else canvas.MAIN
        x, y = where
        if flow != canvas.MAIN:  # a subflow's steps sit relative to its group
            gx, gy = self.positions.get(canvas.node_id("flow", flow), (0.0, 0.0))
            x, y = x - gx, y - gy
        if kind == "end":
            identifier = canvas.node_id("step", END, flow)
            self.positions[identifier] = (x - 28, y - 28)
            self._draw()
            return identifier
        name = edits.unique_name(self.spec, kind, flow)
        spec = edits.add_entry(self.spec, kind, name, flow)
        entity = "flow" if kind == "subflow" else kind if kind in ("role", "tool", "policy") else "step"
        identifier = canvas.node_id(entity, name, flow)
        width, height = layout.size_of(canvas._size_kind({"data": {"kind": kind}}))
        self._wanted[identifier] = (x - width / 2, y - height / 2) if kind != "subflow" else (x, y)
        if kind == "router":
            self.routers.add(identifier)
        self.inspected = ("node", identifier)
        self.set_spec(spec)
        return identifier

    def _validate(self) -> None:
        try:
            topology = from_dict(self.spec)
        except TopologyError as error:
            self.problems = [(p.path, p.message) for p in error.problems]
        else:
            self.problems = []
            self._syncing = True
            try:
                self.topology = topology
            finally:
                self._syncing = False
        self._show_problems()
        self._message.object = ""

    def _show_problems(self, *_events: Any) -> None:
        """The banner lists ``self.problems`` as they are now (it follows every change of them)."""
        items = "".join(
            f"<li><b>{html.escape(path)}</b>: {html.escape(message)}</li>" for path, message in self.problems
        )
        shown = f'<ul class="wb-problems">{items}</ul>' if items else ""
        if self._banner.object != shown:
            self._banner.object = shown

    def _notice(self, text: str) -> None:
        self._message.object = f'<p class="wb-notice">{html.escape(text)}</p>'

    def _topology_set(self, event: Any) -> None:
        if not self._syncing and event.new is not None:
            self.load(event.new)

    def to_yaml(self, with_layout: bool = False) -> str:
        """The current spec as YAML (as it stands if it is invalid), with the layout as comment lines if
        ``with_layout``."""
        if not self.problems:
            text = to_yaml(from_dict(self.spec))
        else:
            text = yaml.safe_dump(self.spec, sort_keys=False, allow_unicode=True, width=100)
        return layout.with_layout(text, self.layout_data()) if with_layout else text

    # ------------------------------------------------------------------ inspector
    @reported
    def _selected(self, event: Any) -> None:
        if self._syncing:
            return
        chosen = (event.new or {}).get("nodes") or []
        edges = (event.new or {}).get("edges") or []
        if chosen:
            self.show_form(chosen[0])
        elif edges:
            self.inspect_edge(edges[0])

    def show_form(self, node: str) -> None:
        """Open the form of a canvas node in the inspector."""
        self.inspected = ("node", node)
        self._inspector_view.show()

    def inspect_edge(self, edge_id: str) -> None:
        """Open the edge inspector on a canvas edge."""
        edge = next((e for e in self.flow.edges if e["id"] == edge_id), None)
        if edge is None:
            return
        data = edge.get("data") or {}
        extra = data.get("order") if data.get("kind") == "next" else data.get("agent")
        self.inspected = ("edge", (data.get("kind"), edge["source"], edge["target"], extra))
        self._inspector_view.show()

    def show_settings(self, flow: str = canvas.MAIN) -> None:
        """Open the settings of the topology and its main flow (or of subflow ``flow``) in the inspector."""
        self.inspected = ("settings", flow)
        self._inspector_view.show()

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        button = self._inspector_view.button
        export = button("Export YAML", "wb-export", self._export)
        new = button("New", "wb-new", self.new)
        relayout = button("Auto layout", "wb-auto-layout", self.auto_layout)
        settings = button("Settings", "wb-settings-button", self.show_settings)
        kind = pn.widgets.Select(label="add", options=list(edits.ENTRY_KINDS), width=90)
        new_name = pn.widgets.TextInput(
            label="name", placeholder="name", width=120, css_classes=["wb-add-name"]
        )
        into = pn.widgets.TextInput(label="in subflow", placeholder="(main flow)", width=110)

        def add() -> None:
            self.add(kind.value, forms.typed(new_name).strip(), forms.typed(into).strip())

        palette = pn.pane.HTML(
            palette_html(), width=160, css_classes=["wb-palette-pane"], styles={"overflow-y": "auto", "height": "100%"},
        )  # fmt: skip
        # the banner and notices in a strip of their own height, scrolled: they never move the canvas
        status = pn.Column(
            self._message, self._banner, height=STATUS_HEIGHT, scroll=True, sizing_mode="stretch_width",
            css_classes=["wb-editor-status"],
        )  # fmt: skip
        drawn = pn.Column(
            self.flow, self.page, sizing_mode="stretch_width", styles={"height": "100%"}, margin=0
        )
        return pn.Column(
            pn.FlexBox(
                new,
                self._load,
                self._open,
                self._save,
                export,
                self._notebook_button(),
                relayout,
                settings,
                kind,
                new_name,
                into,
                button("Add", "wb-add", add),
                align_items="end",
                sizing_mode="stretch_width",
            ),  # fmt: skip
            self._signals_bar,
            status,
            pn.Row(
                palette,
                drawn,
                self._inspector,
                sizing_mode="stretch_width",
                styles={"height": CANVAS_HEIGHT_CSS},
            ),
            self._yaml,
            css_classes=["wb-editor"],
            sizing_mode="stretch_width",
        )

    def _filename(self) -> str:
        name = self.spec.get("name")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name or "topology"))
        return f"{safe or 'topology'}.yaml"

    def _download(self) -> io.BytesIO:
        return io.BytesIO(self.to_yaml(with_layout=True).encode("utf-8"))

    def export_notebook(self, path: str | Path) -> Path:
        """Write a notebook that loads this spec, rolls it out, trains it and opens its monitor, with a
        papermill ``parameters`` cell (model, tasks, steps, ...; ``widgets.topology_notebook``); returns the
        path. The spec must be valid."""
        if self.problems:
            raise ValueError(
                f"the spec has {len(self.problems)} problem(s): fix them before exporting a notebook"
            )
        return write_notebook(path, self.to_yaml(), str(self.spec.get("name") or "topology"))

    def _notebook_button(self) -> pn.widgets.FileDownload:
        """ "Export notebook": downloads ``export_notebook``'s notebook."""

        def notebook() -> io.BytesIO | None:
            if self.problems:
                self._notice("fix the spec's problems before exporting a notebook")
                return None
            stem = self._filename().removesuffix(".yaml")
            button.filename = f"{stem}.ipynb"
            text = json.dumps(notebook_for(self.to_yaml(), str(self.spec.get("name") or stem)), indent=1)
            return io.BytesIO(text.encode("utf-8"))

        button = pn.widgets.FileDownload(
            callback=notebook, filename="topology.ipynb", label="Export notebook", css_classes=["wb-export-notebook"],
            width=150,
        )  # fmt: skip
        return button

    def _export(self) -> None:
        self._yaml.object = f"<pre>{html.escape(self.to_yaml())}</pre>"

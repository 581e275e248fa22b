"""TopologyEditor: build and edit a topology on a node-and-edge canvas (panel-reactflow), with an inspector.

Start from an empty topology ("New"), a built-in one, or a file ("Open"). Drag entries from the palette onto
the canvas: flow steps of every kind (call, agent, map, dag, a router, the end), roles, tools, policies and
subflows (drawn as groups, which collapse to their title from their settings; a step dropped into a group
joins that subflow). Draw edges between nodes: a branch (step → step), a role call (step → role), tool use
(agent step → tool), a route (tool → role), a subflow run (agent tool or dag step → subflow) and a policy
(role → policy); the legend under the palette says which is which. Select a node to edit it in its form (generated from the spec's JSON Schema, with
choice lists from the registries; "Apply" also renames, references included), an edge to edit it in the
edge inspector (a branch's ``when``, checked as you type, and its place in the branch order), or nothing
(or "Settings") for the topology's own settings and its main flow's. After every edit the spec is
validated: each problem is shown on the node it concerns (⚠ in its label, a red border) and listed in a
banner; the inspector follows renames, deletes and loads.

A loaded spec is laid out automatically (``widgets.topology_layout``: no two nodes or labels overlap) and the
layout is kept across edits, node by node; "Auto layout" lays it out again. "Save" downloads the spec as
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
``wb-open``, ``wb-save``, ``wb-export``, ``wb-auto-layout``, ``wb-settings-button``, ``wb-palette-<kind>``
(palette items), ``wb-inspector`` with its title ``wb-inspected`` (``data-inspected``: the node, edge or
"settings" shown; ``data-version``: how many edits the spec has had), ``wb-field-<path>`` (a form field,
``sampling-max_tokens`` for a nested one), ``wb-apply``, ``wb-delete``, ``wb-collapse``,
``wb-edge-when``, ``wb-edge-check``, ``wb-edge-earlier``, ``wb-edge-later``, ``wb-edge-agent``,
``wb-yaml`` (the exported YAML), ``wb-editor-errors`` (the banner), ``wb-editor-signals`` (the step slider,
measure menu and ``wb-clear-signals`` button); canvas nodes carry ``data-id="role:NAME"`` etc. (React
Flow's), ``wb-node wb-kind-<kind>`` and a ``data-caption``; edges ``wb-edge wb-edge-<kind>``.
"""

from __future__ import annotations

import copy
import functools
import html
import importlib
import io
import json
import logging
import re
import threading
from collections.abc import Callable
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
from widgets.topology_style import PALETTE_TYPE, canvas_css, palette_html
from workbench.analysis.signals import (
    ROLE_MEASURES,
    complete_steps,
    graph_signals,
    replay_advantages,
    run_topology_of,
)
from workbench.engine.spec_checks import from_dict
from workbench.store import RunReader
from workbench.topology import Topology, load, to_dict, to_yaml
from workbench.topology.diagram import Signals
from workbench.topology.io import library
from workbench.topology.spec import END
from workbench.topology.validate import TopologyError

logger = logging.getLogger(__name__)

#: The JSON Schema definition a form is generated from, by entry kind.
SCHEMA_DEFS = {"role": "Role", "tool": "Tool", "policy": "Policy", "call": "CallNode", "agent": "AgentNode",
               "map": "MapNode", "dag": "DagNode"}  # fmt: skip
ERROR_STYLE = {"border": "2px solid #c62828", "background": "#ffebee"}
#: The built-in select's label for a spec that is no built-in (or an edited one); its value is "".
CUSTOM = "(custom)"
#: What the signals can colour the canvas by.
MEASURES = [*ROLE_MEASURES, "replay/advantage"]
CANVAS_HEIGHT, CANVAS_WIDTH = 640, 720  # the width the first view is fitted to
#: Errors a user's edit can raise: shown in the banner, not logged.
USER_ERRORS = (ValueError, KeyError, TypeError, yaml.YAMLError, TopologyError, FileNotFoundError)


@cache
def _builtin(name: str) -> Topology:
    return load(name)


@cache
def _warm_up() -> None:
    """Import the tool registry in the background: it loads jsonschema (seconds), which the first form or
    validation naming a tool would otherwise wait for."""
    threading.Thread(target=importlib.import_module, args=("workbench.tools",), daemon=True).start()


def _heading(inspected: str, text: str) -> pn.pane.HTML:
    """The inspector's title; ``data-inspected`` names what it shows (a canvas id, an edge, or settings) and
    ``data-version`` counts the spec's changes (a browser test waits for it to move after an edit)."""
    return pn.pane.HTML(
        f'<h4 class="wb-inspected" data-inspected="{html.escape(inspected)}" data-version="0">'
        f"{html.escape(text)}</h4>",
        sizing_mode="stretch_width",
    )


def _no_editor(*_args: Any, **_kwargs: Any) -> None:
    """The canvas's own per-node editors are off: the inspector beside it edits (no gear icon)."""
    return None


def _reported(method: Callable) -> Callable:
    """A UI callback whose errors show in the banner instead of escaping into the server."""

    @functools.wraps(method)
    def run(self: TopologyEditor, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except USER_ERRORS as error:
            self._notice(str(error))
        except Exception as error:  # noqa: BLE001 - a bug: say so on the page and in the log
            logger.exception("topology editor: %s failed", method.__name__)
            self._notice(f"internal error in {method.__name__}: {error!r}")
        return None

    return run


class TopologyEditor(pn.viewable.Viewer):
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
        self._shown: str | None = None  # what the inspector's form shows (rebuilt when this changes)
        self._forms: dict[
            str, tuple
        ] = {}  # an entry form per kind, reused: (form, heading, name, branches, buttons)
        self._run: tuple[Path, Topology, dict[str, float]] | None = None  # run dir, its topology, replays
        self._syncing = self._syncing_select = self._syncing_signals = False
        self.flow = ReactFlow(
            sizing_mode="stretch_width", height=CANVAS_HEIGHT, display_side_bar=False, editor_mode="side",
            default_node_editor=_no_editor, default_edge_editor=_no_editor, node_types=canvas.NODE_TYPES,
            drop_types=[PALETTE_TYPE], min_zoom=0.2, max_zoom=2, stylesheets=[canvas_css()], allow_edge_loops=True,
            css_classes=["wb-canvas"],
        )  # fmt: skip
        self.flow.param.watch(self._canvas_changed, ["nodes", "edges"])
        self.flow.param.watch(self._selected, "selection")
        self.flow.on("node_moved", self._moved)
        self.flow.on("drop", self._dropped)
        self._inspector = pn.Column(
            width=380, height=CANVAS_HEIGHT, scroll=True, css_classes=["wb-inspector"]
        )
        self._banner = pn.pane.HTML(
            "", css_classes=["wb-editor-errors"], sizing_mode="stretch_width",
            styles={"max-height": "110px", "overflow-y": "auto"},
        )  # fmt: skip
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
        self._replace(canvas.new_spec(name), {})

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
        self._inspect()
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

    @_reported
    def _picked(self, event: Any) -> None:
        if event.new and not self._syncing_select:
            self.load(event.new)

    @_reported
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
        self._shown = None
        self._inspect()

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
        """Show the whole canvas: the viewport fitted to every node (at most at full size)."""
        boxes = self._boxes()
        if not boxes:
            return
        left = min(b[0] for b in boxes.values())
        top = min(b[1] for b in boxes.values())
        right = max(b[0] + b[2] for b in boxes.values())
        bottom = max(b[1] + b[3] for b in boxes.values())
        zoom = min(
            1.0, (CANVAS_WIDTH - 40) / max(right - left, 1), (CANVAS_HEIGHT - 40) / max(bottom - top, 1)
        )
        zoom = max(zoom, self.flow.min_zoom)
        self.flow.viewport = {"x": 20 - left * zoom, "y": 20 - top * zoom, "zoom": round(zoom, 4)}

    def _boxes(self) -> dict[str, layout.Box]:
        """Each canvas node's absolute box."""
        nodes = {n["id"]: n for n in self.flow.nodes}
        sizes = canvas.sizes_of(list(nodes.values()))
        boxes = {}
        for identifier, node in nodes.items():
            x, y = node["position"]["x"], node["position"]["y"]
            parent = nodes.get(node.get("parentId"))
            if parent is not None:
                x, y = x + parent["position"]["x"], y + parent["position"]["y"]
            style = node.get("style") or {}
            w, h = sizes.get(identifier) or (style.get("width", 0), style.get("height", 0))
            boxes[identifier] = (x, y, w, h)
        return boxes

    def auto_layout(self) -> None:
        """Lay the canvas out again automatically (forgetting where nodes were moved) and show all of it."""
        self.positions = {}
        self._draw()
        self.fit_view()
        self.version += 1  # the page can tell the new layout has been sent
        self._inspect()

    @_reported
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
        self.set_spec(canvas.apply_graph(self.spec, nodes, edges))
        if meaningless:
            self._notice(canvas.explain_edge(meaningless[0]["source"], meaningless[0]["target"], self.spec))

    @_reported
    def _moved(self, event: dict) -> None:
        identifier, where = event.get("node_id"), event.get("position") or {}
        if identifier is None or "x" not in where:
            return
        self.positions[identifier] = (float(where["x"]), float(where["y"]))
        if identifier.startswith("sub:"):  # its group grows to hold it
            self._draw()

    @_reported
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
        name = canvas.unique_name(self.spec, kind, flow)
        spec = canvas.add_entry(self.spec, kind, name, flow)
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
        items = "".join(
            f"<li><b>{html.escape(path)}</b>: {html.escape(message)}</li>" for path, message in self.problems
        )
        self._banner.object = f'<ul class="wb-problems">{items}</ul>' if items else ""
        self._message.object = ""

    def _notice(self, text: str) -> None:
        self._message.object = f'<p class="wb-notice">{html.escape(text)}</p>'

    def _topology_set(self, event: Any) -> None:
        if not self._syncing and event.new is not None:
            self.load(event.new)

    # ------------------------------------------------------------------ a run's signals
    def show_signals(
        self, run_dir: str | Path, step: int | None = None, colour_by: str = "reward/mean"
    ) -> None:
        """Colour the canvas by the signals of the run in ``run_dir`` at ``step`` (default: its last complete
        step); a ValueError where the run has no such step or ``colour_by`` is not one of ``MEASURES``."""
        if colour_by not in MEASURES:
            raise ValueError(f"colour_by {colour_by!r}: choose one of {', '.join(MEASURES)}")
        run_dir = Path(run_dir)
        with RunReader(run_dir) as reader:  # the replays beside it do not change by step: read them once
            steps, advantages = complete_steps(reader), replay_advantages(reader)
        topology = run_topology_of(run_dir)
        self.signals = graph_signals(run_dir, step, colour_by, topology, advantages)
        self._run = (run_dir, topology, advantages)
        self._syncing_signals = True
        try:
            self._signal_step.param.update(options=steps, value=steps[-1] if step is None else step)
            self._colour_by.value = colour_by
        finally:
            self._syncing_signals = False
        self._signals_bar.visible = True
        self._draw()

    def _signal_widgets(self, colour_by: str) -> pn.Row:
        """The step slider, measure menu and hide button, shown while a run's signals are."""
        self._signal_step = pn.widgets.DiscreteSlider(label="step", options=[0], value=0, width=240)
        self._colour_by = pn.widgets.Select(label="colour by", options=MEASURES, value=colour_by, width=180)
        self._signal_step.param.watch(self._signal_picked, "value")
        self._colour_by.param.watch(self._signal_picked, "value")
        clear = pn.widgets.Button(label="Hide signals", css_classes=["wb-clear-signals"])
        clear.on_click(lambda _e: self.clear_signals())
        return pn.Row(
            self._signal_step, self._colour_by, clear, visible=False, css_classes=["wb-editor-signals"]
        )

    def clear_signals(self) -> None:
        """Take the run's signals off the canvas."""
        self.signals, self._run = None, None
        self._signals_bar.visible = False
        self._draw()

    @_reported
    def _signal_picked(self, _event: Any) -> None:
        if self._syncing_signals or self._run is None:
            return
        run_dir, topology, advantages = self._run
        self.signals = graph_signals(
            run_dir, self._signal_step.value, self._colour_by.value, topology, advantages
        )
        self._draw()

    # ------------------------------------------------------------------ edits
    def add(self, kind: str, name: str, flow: str = canvas.MAIN) -> str:
        """Add an entry called ``name``: a step (``call``, ``agent``, ``map``, ``dag``, ``router``; ``step``
        is a call) to ``flow`` (a subflow's name; default the main flow), or a ``role``, ``tool``, ``policy``
        or ``subflow``; returns its canvas id."""
        self.set_spec(canvas.add_entry(self.spec, kind, name, flow))
        entity = "flow" if kind == "subflow" else kind if kind in ("role", "tool", "policy") else "step"
        identifier = canvas.node_id(entity, name, flow)
        if kind == "router":
            self.routers.add(identifier)
            self._draw()
        return identifier

    def remove(self, node: str) -> None:
        """Remove a canvas node (``role:NAME``, ``tool:NAME``, ``step:NAME``, ``flow:NAME``, ...) as the
        canvas's Delete does (a subflow's group with its steps)."""
        nodes, edges = canvas.to_graph(self.spec, self.positions, self.routers)
        gone = {node} | {n["id"] for n in nodes if n.get("parentId") == node}
        keep = [n for n in nodes if n["id"] not in gone]
        self.set_spec(
            canvas.apply_graph(self.spec, keep, [e for e in edges if not {e["source"], e["target"]} & gone])
        )

    def connect(self, source: str, target: str, when: str | None = None) -> None:
        """Draw an edge as the canvas does: a branch (with ``when``), a role call, a tool use, a route, a
        subflow run or a policy."""
        if canvas.edge_kind(source, target, self.spec) is None:
            raise ValueError(canvas.explain_edge(source, target, self.spec))
        nodes, edges = canvas.to_graph(self.spec, self.positions, self.routers)
        data = {"when": when} if when else {}
        if when:
            data["kind"] = "next"
        self.set_spec(
            canvas.apply_graph(self.spec, nodes, [*edges, {"source": source, "target": target, "data": data}])
        )

    def _entry(self, spec: dict, node: str) -> dict:
        kind, flow, name = canvas.parse_id(node)
        if kind == "flow":
            return spec["subflows"][name]
        return canvas._section(spec, kind, flow)[name]

    def update_entry(self, node: str, fields: dict[str, Any], name: str | None = None) -> None:
        """Set fields of a role, tool, policy, subflow or step (None removes a field), renaming it if
        ``name`` differs; the inspector follows the rename."""
        kind, flow, old = canvas.parse_id(node)
        if kind == "step" and old == END:
            raise ValueError("the end of a flow has no fields")
        spec = copy.deepcopy(self.spec)
        self._entry(spec, node)  # a KeyError names an entry that is gone
        if name and name != old:
            spec = canvas.rename(spec, kind, old, name, flow)
            new_id = canvas.renamed_id(node, name)
            self._renamed(node, new_id)
            node = new_id
        entry = self._entry(spec, node)
        for key, value in fields.items():
            if key in canvas.STEP_KINDS and kind == "step":  # what makes the step the kind it is stays
                entry[key] = value if value is not None else ""
            elif value is None or value == "":
                entry.pop(key, None)
            else:
                entry[key] = value
        if self.inspected == ("node", canvas.renamed_id(node, old)):
            self.inspected = ("node", node)
        self.set_spec(spec)

    def _renamed(self, old: str, new: str) -> None:
        """Positions, routers and the inspector follow a node's rename (a subflow's steps move with it)."""
        moves = {old: new}
        kind, _, old_name = canvas.parse_id(old)
        if kind == "flow":
            new_name = canvas.parse_id(new)[2]
            for identifier in self.positions:
                if identifier.startswith(f"sub:{old_name}:"):
                    moves[identifier] = f"sub:{new_name}:" + identifier[len(f"sub:{old_name}:") :]
        self.positions = {moves.get(k, k): v for k, v in self.positions.items()}
        self.routers = {moves.get(r, r) for r in self.routers}
        self.collapsed = {moves.get(c, c) for c in self.collapsed}
        if self.inspected == ("node", old):
            self.inspected = ("node", new)

    def update_settings(
        self, fields: dict[str, Any], flow: str = canvas.MAIN, name: str | None = None
    ) -> None:
        """Set the topology's own fields (name, description, params) and a flow's (start, answer, max_calls,
        inputs): ``flow`` names a subflow (renamed to ``name`` if given), default the main flow."""
        spec = copy.deepcopy(self.spec)
        if flow != canvas.MAIN and name and name != flow:
            spec = canvas.rename(spec, "flow", flow, name)
            self._renamed(canvas.node_id("flow", flow), canvas.node_id("flow", name))
            if self.inspected == ("settings", flow):
                self.inspected = ("settings", name)
            flow = name
        target = canvas.flows_of(spec)[flow]
        for key, value in fields.items():
            owner = spec if key in ("name", "description", "params") and flow == canvas.MAIN else target
            owner[key] = value
        self.set_spec(spec)

    def set_branch(self, step: str, index: int, when: str | None = None, order: int | None = None) -> None:
        """Set the condition of branch ``index`` of ``step`` (a canvas id; None or "" for always) and move it
        to place ``order`` in the branch order; the edge inspector follows it."""
        kind, flow, name = canvas.parse_id(step)
        spec = copy.deepcopy(self.spec)
        entry = canvas._section(spec, "step", flow)[name]
        branches = entry.get("next") or [{"goto": END, "when": None}]
        branch = dict(branches[index])
        branch["when"] = when.strip() if isinstance(when, str) and when.strip() else None
        rest = branches[:index] + branches[index + 1 :]
        order = index if order is None else max(0, min(order, len(rest)))
        entry["next"] = rest[:order] + [branch] + rest[order:]
        if self.inspected[0] == "edge":
            self.inspected = ("edge", ("next", step, canvas.node_id("step", branch["goto"], flow), order))
        self.set_spec(spec)

    def to_yaml(self, with_layout: bool = False) -> str:
        """The current spec as YAML (as it stands if it is invalid), with the layout as comment lines if
        ``with_layout``."""
        if not self.problems:
            text = to_yaml(from_dict(self.spec))
        else:
            text = yaml.safe_dump(self.spec, sort_keys=False, allow_unicode=True, width=100)
        return layout.with_layout(text, self.layout_data()) if with_layout else text

    # ------------------------------------------------------------------ inspector
    @_reported
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
        self._inspect()

    def inspect_edge(self, edge_id: str) -> None:
        """Open the edge inspector on a canvas edge."""
        edge = next((e for e in self.flow.edges if e["id"] == edge_id), None)
        if edge is None:
            return
        data = edge.get("data") or {}
        extra = data.get("order") if data.get("kind") == "next" else data.get("agent")
        self.inspected = ("edge", (data.get("kind"), edge["source"], edge["target"], extra))
        self._inspect()

    def show_settings(self, flow: str = canvas.MAIN) -> None:
        """Open the settings of the topology and its main flow (or of subflow ``flow``) in the inspector."""
        self.inspected = ("settings", flow)
        self._inspect()

    def _inspect(self) -> None:
        """(Re)build the inspector for what is inspected, as the spec now stands (after renames, deletes and
        loads it shows what is still there, else the settings); an unchanged form is kept as it is."""
        what, key = self.inspected
        shown = self._form_data()
        if shown is not None and shown == self._shown and self._inspector.objects:
            heading = self._inspector.objects[0]  # only its version moves
            heading.object = re.sub(
                r'data-version="\d+"', f'data-version="{self.version}"', heading.object, count=1
            )
            return
        self._shown = shown
        objects = None
        if what == "node":
            objects = self._node_form(key)
        elif what == "edge":
            objects = self._edge_form(key)
        elif what == "settings" and key in canvas.flows_of(self.spec):
            objects = self._settings_form(key)
        if objects is None:
            self.inspected = ("settings", canvas.MAIN)
            objects = self._settings_form(canvas.MAIN)
        heading = objects[0]
        heading.object = heading.object.replace('data-version="0"', f'data-version="{self.version}"', 1)
        self._inspector.objects = objects

    def _form_data(self) -> str | None:
        """Everything the inspector's current form shows, as text (None where it cannot say)."""
        what, key = self.inspected
        names = {k: sorted(self.spec.get(k) or {}) for k in ("roles", "tools", "policies", "subflows")}
        try:
            if what == "node":
                kind, flow, name = canvas.parse_id(key)
                entry = (
                    self.spec["subflows"][name]
                    if kind == "flow"
                    else canvas._section(self.spec, kind, flow).get(name)
                )
                if kind == "flow":
                    entry = {k: v for k, v in entry.items() if k != "nodes"} | {
                        "steps": sorted(entry.get("nodes") or {})
                    }
                data: Any = [
                    key,
                    entry,
                    names,
                    key in self.routers | self.collapsed,
                    forms.registries_signature(),
                ]
            elif what == "edge":
                _, source, _, _ = key
                _, flow, name = canvas.parse_id(source)
                data = [key, canvas.flows_of(self.spec)[flow]["nodes"].get(name)]
            else:
                body = canvas.flows_of(self.spec)[key]
                top = {k: self.spec.get(k) for k in ("name", "description", "params")}
                data = [
                    what,
                    key,
                    canvas.node_id("flow", key) in self.collapsed,
                    top,
                    {k: v for k, v in body.items() if k != "nodes"},
                    sorted(body.get("nodes") or {}),
                ]
            return json.dumps(data, sort_keys=True, default=str)
        except (KeyError, TypeError, AttributeError):
            return None

    def _button(
        self, label: str, css: str, action: Callable[[], None], kind: str = "default"
    ) -> pn.widgets.Button:
        button = pn.widgets.Button(label=label, color=kind, css_classes=[css])
        button.on_click(lambda _event: self._run_action(action))
        return button

    @_reported
    def _run_action(self, action: Callable[[], None]) -> None:
        action()

    def _node_form(self, node: str) -> list | None:
        kind, flow, name = canvas.parse_id(node)
        if kind == "flow":
            return self._settings_form(name) if name in (self.spec.get("subflows") or {}) else None
        try:
            entry = self._entry(self.spec, node)
        except KeyError:
            if kind == "step" and name == END and flow in canvas.flows_of(self.spec):
                where = "the main flow" if flow == canvas.MAIN else f"subflow {flow}"
                return [
                    _heading(node, f"end of {where}"),
                    pn.pane.Markdown("A branch to it finishes the flow."),
                ]
            return None
        form_kind = canvas.step_kind(entry) if kind == "step" else kind
        title = f"{canvas.drawn_kind(entry, self.routers, node) if kind == 'step' else kind} {name}"
        if flow:
            title += f" in subflow {flow}"
        choices = forms.entry_choices(form_kind, self.spec)
        pooled = self._forms.get(form_kind)
        if pooled is None:  # one form per kind of entry, made once: later ones only change what it shows
            form = forms.Form(SCHEMA_DEFS[form_kind], choices, skip={"next"} if kind == "step" else set())
            heading = _heading(node, title)
            name_input = forms.text("name", name, ["wb-field-name"])
            branches = pn.pane.HTML("", css_classes=["wb-branches"], sizing_mode="stretch_width")

            def apply() -> None:
                target = self.inspected[1]
                self.update_entry(target, form.read(), forms.typed(name_input).strip())

            buttons = pn.Row(
                self._button("Apply", "wb-apply", apply, "primary"),
                self._button("Delete", "wb-delete", lambda: self.remove(self.inspected[1]), "danger"),
            )
            pooled = self._forms[form_kind] = (form, heading, name_input, branches, buttons)
        form, heading, name_input, branches, buttons = pooled
        form.fill(entry, choices)
        heading.object = _heading(node, title).object
        name_input.param.update(value=name, value_input=name)
        extra = []
        if kind == "step":
            listed = "".join(
                f"<li>{html.escape(b.get('goto', END))}"
                + (f" when <code>{html.escape(b['when'])}</code>" if b.get("when") else "")
                + "</li>"
                for b in entry.get("next") or [{"goto": END}]
            )
            branches.object = f"<div>branches, in order (select one to edit it):<ol>{listed}</ol></div>"
            extra = [branches]
        return [heading, name_input, *form.widgets, *extra, buttons]

    def _settings_form(self, flow: str) -> list:
        flows = canvas.flows_of(self.spec)
        target = flows[flow]
        steps = list(target.get("nodes") or {})
        start_options = {s: s for s in steps}
        if target.get("start") and target["start"] not in start_options:
            start_options[f"{target['start']} (missing)"] = target["start"]
        widgets: dict[str, pn.widgets.Widget] = {}
        if flow == canvas.MAIN:
            widgets["name"] = forms.text("name", self.spec.get("name", ""), ["wb-field-name"])
            widgets["description"] = forms.text(
                "description", self.spec.get("description", ""), ["wb-field-description"]
            )
            params = self.spec.get("params") or {}
            shown = yaml.safe_dump(params, sort_keys=False).strip() if params else ""
            widgets["params"] = forms.text("params (YAML)", shown, ["wb-field-params"], long=True, height=70)
        else:
            widgets["name"] = forms.text("name", flow, ["wb-field-name"])
            inputs = ", ".join(target.get("inputs") or [])
            widgets["inputs"] = forms.text("inputs (comma-separated)", inputs, ["wb-field-inputs"])
        start = target.get("start") or ""
        if not start_options:
            start_options = {"(no step yet)": start}
        elif start not in start_options.values():
            start = next(iter(start_options.values()))
        widgets["start"] = pn.widgets.Select(
            label="start", options=start_options, value=start, css_classes=["wb-field-start"]
        )
        widgets["answer"] = forms.text(
            "answer (Jinja2)", target.get("answer", ""), ["wb-field-answer"], long=True, height=60
        )
        widgets["max_calls"] = pn.widgets.IntInput(
            label="max_calls", value=target.get("max_calls", 16), start=1, css_classes=["wb-field-max_calls"]
        )

        def apply() -> None:
            values = {k: forms.typed(w) for k, w in widgets.items()}
            name = values.pop("name").strip()
            if flow == canvas.MAIN:
                text = values.pop("params")
                values["params"] = (yaml.safe_load(text) if text.strip() else {}) or {}
                values["name"] = name
                self.update_settings(values)
            else:
                values["inputs"] = [v.strip() for v in values.pop("inputs").split(",") if v.strip()]
                self.update_settings(values, flow, name)

        title = _heading(
            "settings" if flow == canvas.MAIN else canvas.node_id("flow", flow),
            "topology and main flow" if flow == canvas.MAIN else f"subflow {flow}",
        )
        buttons = [self._button("Apply", "wb-apply", apply, "primary")]
        if flow != canvas.MAIN:
            folded = canvas.node_id("flow", flow) in self.collapsed
            buttons.append(
                self._button(
                    "Expand" if folded else "Collapse", "wb-collapse", lambda: self.toggle_collapsed(flow)
                )
            )
            buttons.append(
                self._button(
                    "Delete", "wb-delete", lambda: self.remove(canvas.node_id("flow", flow)), "danger"
                )
            )
        return [title, *widgets.values(), pn.Row(*buttons)]

    def _edge_form(self, key: tuple) -> list | None:
        kind, source, target, extra = key
        present = {n["id"] for n in self.flow.nodes}
        if not {source, target} <= present:
            return None
        title = _heading(f"{kind}:{source}->{target}", f"{kind}: {source} → {target}")
        remove = self._button("Remove edge", "wb-delete", lambda: self._remove_edge(key), "danger")
        if kind == "next":
            return self._branch_form(key, title, remove)
        if kind == "runs" and canvas.parse_id(source)[0] == "step":
            agent = forms.text("agent name (as the graph writes it)", extra or "", ["wb-edge-agent"])

            def rename_agent() -> None:
                self._rename_agent(source, extra, forms.typed(agent).strip(), target)

            return [title, agent, pn.Row(self._button("Apply", "wb-apply", rename_agent, "primary"), remove)]
        meaning = canvas.EDGE_KINDS.get(kind, ("", "", ""))[2]
        return [title, pn.pane.Markdown(meaning), remove]

    def _branch_form(self, key: tuple, title: pn.pane.HTML, remove: pn.widgets.Button) -> list | None:
        _, source, target, order = key
        _, flow, name = canvas.parse_id(source)
        step = (canvas.flows_of(self.spec).get(flow, {}).get("nodes") or {}).get(name)
        branches = (step or {}).get("next") or [{"goto": END}]
        goto = canvas.parse_id(target)[2]
        if order is None or order >= len(branches) or branches[order].get("goto", END) != goto:
            order = next((i for i, b in enumerate(branches) if b.get("goto", END) == goto), None)
        if step is None or order is None:
            return None
        when = forms.text(
            "when (a Jinja2 condition; empty: always)", branches[order].get("when") or "", ["wb-edge-when"]
        )
        check = pn.pane.HTML("", css_classes=["wb-edge-check"], sizing_mode="stretch_width")

        @_reported
        def checked(editor: TopologyEditor, event: Any) -> None:
            check.object = editor._check_condition(source, order, event.new)

        when.param.watch(functools.partial(checked, self), "value_input")
        check.object = self._check_condition(source, order, when.value)
        place = pn.pane.HTML(
            f'<div class="wb-edge-place" data-order="{order}">branch {order + 1} of {len(branches)} '
            "(tried in order: the first that holds is taken)</div>"
        )
        buttons = [
            self._button("Apply", "wb-apply", lambda: self.set_branch(source, order, forms.typed(when)), "primary"),
            self._button("↑ earlier", "wb-edge-earlier", lambda: self.set_branch(source, order, branches[order].get("when"), order - 1)),
            self._button("↓ later", "wb-edge-later", lambda: self.set_branch(source, order, branches[order].get("when"), order + 1)),
        ]  # fmt: skip
        return [title, place, when, check, pn.Row(*buttons), remove]

    def _check_condition(self, step: str, index: int, text: str) -> str:
        """What validation says of branch ``index`` of ``step`` with condition ``text`` (checked as typed)."""
        _, flow, name = canvas.parse_id(step)
        spec = copy.deepcopy(self.spec)
        branch = canvas._section(spec, "step", flow)[name]["next"][index]
        branch["when"] = text.strip() or None
        try:
            from_dict(spec)
        except TopologyError as error:
            mine = [
                p for p in error.problems
                if canvas.node_of(p.path) == step and (p.path.endswith(f".next[{index}]") or f".next[{index}]." in p.path)
            ]  # fmt: skip
            if mine:
                items = "".join(f"<li>{html.escape(p.message)}</li>" for p in mine)
                return f"<ul class='wb-condition-problems'>{items}</ul>"
        return "<span class='wb-condition-ok'>✓ valid</span>"

    def _remove_edge(self, key: tuple) -> None:
        kind, source, target, extra = key
        nodes, edges = canvas.to_graph(self.spec, self.positions, self.routers)
        keep = []
        dropped = False
        for edge in edges:
            data = edge["data"]
            mine = (data["kind"], edge["source"], edge["target"]) == (kind, source, target)
            if mine and kind == "next":
                mine = data.get("order") == extra
            elif mine and kind == "runs" and "agent" in data:
                mine = data["agent"] == extra
            if mine and not dropped:
                dropped = True
                continue
            keep.append(edge)
        self.inspected = ("node", source)
        self.set_spec(canvas.apply_graph(self.spec, nodes, keep))

    def _rename_agent(self, step: str, old: str | None, new: str, subflow: str) -> None:
        if not new:
            raise ValueError("an agent needs a name (the name the orchestrator's graph writes)")
        _, flow, name = canvas.parse_id(step)
        spec = copy.deepcopy(self.spec)
        entry = canvas._section(spec, "step", flow)[name]
        agents = entry.get("agents") or {}
        if new != old and new in agents:
            raise ValueError(f"there is already an agent called {new!r}")
        entry["agents"] = {(new if a == old else a): s for a, s in agents.items()}
        self.inspected = ("edge", ("runs", step, subflow, new))
        self.set_spec(spec)

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        export = self._button("Export YAML", "wb-export", self._export)
        new = self._button("New", "wb-new", self.new)
        relayout = self._button("Auto layout", "wb-auto-layout", self.auto_layout)
        settings = self._button("Settings", "wb-settings-button", self.show_settings)
        kind = pn.widgets.Select(label="add", options=list(canvas.ENTRY_KINDS), width=90)
        new_name = pn.widgets.TextInput(
            label="name", placeholder="name", width=120, css_classes=["wb-add-name"]
        )
        into = pn.widgets.TextInput(label="in subflow", placeholder="(main flow)", width=110)

        def add() -> None:
            self.add(kind.value, forms.typed(new_name).strip(), forms.typed(into).strip())

        palette = pn.pane.HTML(
            palette_html(), width=170, height=CANVAS_HEIGHT, css_classes=["wb-palette-pane"],
            styles={"overflow-y": "auto"},
        )  # fmt: skip
        return pn.Column(
            pn.Row(new, self._load, self._open, self._save, export, relayout, settings),
            pn.Row(kind, new_name, into, self._button("Add", "wb-add", add), align="end"),
            self._signals_bar,
            self._banner,
            self._message,
            pn.Row(palette, self.flow, self._inspector),
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

    def _export(self) -> None:
        self._yaml.object = f"<pre>{html.escape(self.to_yaml())}</pre>"

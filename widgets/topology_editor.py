"""TopologyEditor: edit a topology on a node-and-edge canvas (panel-reactflow), with a form per node.

Load a built-in topology (or pass one); roles, tools and the main flow's steps are canvas nodes, flow
branches, role calls and tool use are edges (``widgets.topology_canvas``). Deleting a node or edge on
the canvas, or drawing a new edge, changes the spec; "Add" adds a role, tool or step; selecting a node
opens a form generated from the spec's JSON Schema for that kind of entry (plain fields as inputs,
nested ones as YAML), whose "Apply" also renames. After every edit the spec is validated: each
problem is shown on the node it concerns (⚠ in its label, a red border) and listed in a banner.

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

CSS classes a browser test can find: ``wb-editor``, ``wb-editor-load`` (the built-in select),
``wb-field-<name>`` (a form field), ``wb-apply``, ``wb-export``, ``wb-yaml`` (the exported YAML),
``wb-editor-errors`` (the banner), ``wb-editor-signals`` (the step slider, measure menu and
``wb-clear-signals`` button); canvas nodes carry ``data-id="role:NAME"`` etc. (React Flow's), and with
signals a ``title`` (their numbers on hover).
"""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from typing import Any

import panel as pn
import param
import yaml
from panel_reactflow import ReactFlow

from widgets import topology_canvas as canvas
from workbench.analysis.signals import (
    ROLE_MEASURES,
    complete_steps,
    graph_signals,
    replay_advantages,
    run_topology_of,
)
from workbench.engine.spec_checks import from_dict
from workbench.store import RunReader
from workbench.topology import Topology, json_schema, load, to_dict, to_yaml
from workbench.topology.diagram import Signals
from workbench.topology.io import library
from workbench.topology.validate import TopologyError

#: The JSON Schema definition a form is generated from, by canvas node kind (steps: by their node kind).
SCHEMA_DEFS = {"role": "Role", "tool": "Tool", "call": "CallNode", "agent": "AgentNode", "map": "MapNode",
               "dag": "DagNode"}  # fmt: skip
ERROR_STYLE = {"border": "2px solid #c62828", "background": "#ffebee"}
#: The built-in select's label for a spec that is no built-in (or an edited one); its value is "".
CUSTOM = "(custom)"
#: What the signals can colour the canvas by.
MEASURES = [*ROLE_MEASURES, "replay/advantage"]


@cache
def _builtin(name: str) -> Topology:
    return load(name)


def _field_widget(name: str, schema: dict, value: Any) -> pn.widgets.Widget:
    kind = schema.get("type")
    classes = [f"wb-field-{name}"]
    if "enum" in schema:
        return pn.widgets.Select(label=name, options=list(schema["enum"]), value=value, css_classes=classes)
    if kind == "string":
        return pn.widgets.TextInput(label=name, value=value or "", css_classes=classes)
    if kind == "integer":
        return pn.widgets.IntInput(label=name, value=value, css_classes=classes)
    if kind == "number":
        return pn.widgets.FloatInput(label=name, value=value, css_classes=classes)
    if kind == "boolean":
        return pn.widgets.Checkbox(name=name, value=bool(value), css_classes=classes)
    text = "" if value is None else yaml.safe_dump(value, sort_keys=False).strip()
    return pn.widgets.TextAreaInput(label=f"{name} (YAML)", value=text, height=90, css_classes=classes)


def _read(widget: pn.widgets.Widget) -> Any:
    if isinstance(widget, pn.widgets.TextAreaInput):
        return yaml.safe_load(widget.value) if widget.value.strip() else None
    return widget.value


class TopologyEditor(pn.viewable.Viewer):
    """A canvas and a form over one topology spec."""

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
        self.spec: dict = {}
        self.signals: Signals | None = None
        self._run: tuple[Path, Topology, dict[str, float]] | None = None  # run dir, its topology, replays
        self._syncing = self._syncing_select = self._syncing_signals = False
        self.flow = ReactFlow(sizing_mode="stretch_width", height=520, display_side_bar=False)
        self.flow.param.watch(self._canvas_changed, ["nodes", "edges"])
        self.flow.param.watch(self._selected, "selection")
        self._form = pn.Column(pn.pane.Markdown("Select a node to edit it."), sizing_mode="stretch_width")
        self._banner = pn.pane.HTML("", css_classes=["wb-editor-errors"], sizing_mode="stretch_width")
        self._yaml = pn.pane.HTML("", css_classes=["wb-yaml"], sizing_mode="stretch_width")
        self._load = pn.widgets.Select(
            label="built-in topology", options={CUSTOM: "", **{n: n for n in library()}}, value="",
            css_classes=["wb-editor-load"],
        )  # fmt: skip
        self._load.param.watch(self._picked, "value")
        self._signals_bar = self._signal_widgets(colour_by)
        self.param.watch(self._topology_set, "topology")
        self.load(topology if topology is not None else run_topology_of(run_dir) if run_dir else "marsrl")
        if run_dir is not None:
            self.show_signals(run_dir, step, colour_by)

    # ------------------------------------------------------------------ spec <-> canvas
    def load(self, source: Topology | dict | str) -> None:
        """Show a built-in topology (by name), a file, a Topology or a dict."""
        if isinstance(source, Topology):
            spec = to_dict(source)
        elif isinstance(source, dict):
            spec = source
        else:
            spec = to_dict(load(source))
        self.set_spec(spec)

    def set_spec(self, spec: dict) -> None:
        """Replace the spec, redraw the canvas and validate."""
        self.spec = spec
        self._validate()
        self._draw()
        self._show_source()

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

    def _picked(self, event: Any) -> None:
        if event.new and not self._syncing_select:
            self.load(event.new)

    def _draw(self) -> None:
        nodes, edges = canvas.to_graph(self.spec)
        if self.signals is not None:
            nodes, edges = canvas.with_signals(self.spec, nodes, edges, self.signals)
        flagged = {canvas.node_of(path) for path, _ in self.problems}
        for node in nodes:
            if node["id"] in flagged:
                node["label"] = "⚠ " + node["label"]
                node["style"] = ERROR_STYLE
        self._syncing = True
        try:
            self.flow.param.update(nodes=nodes, edges=edges)
        finally:
            self._syncing = False

    def _canvas_changed(self, *_events: Any) -> None:
        if self._syncing:
            return
        nodes = [n if isinstance(n, dict) else n.to_dict() for n in self.flow.nodes]
        edges = [e if isinstance(e, dict) else e.to_dict() for e in self.flow.edges]
        self.set_spec(canvas.apply_graph(self.spec, nodes, edges))

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

    def _topology_set(self, event: Any) -> None:
        if not self._syncing and event.new is not None:
            self.set_spec(to_dict(event.new))

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

    def _signal_picked(self, _event: Any) -> None:
        if self._syncing_signals or self._run is None:
            return
        run_dir, topology, advantages = self._run
        self.signals = graph_signals(
            run_dir, self._signal_step.value, self._colour_by.value, topology, advantages
        )
        self._draw()

    # ------------------------------------------------------------------ edits
    def add(self, kind: str, name: str) -> None:
        """Add a role, tool or step called ``name``."""
        self.set_spec(canvas.add_entry(self.spec, kind, name))

    def remove(self, node: str) -> None:
        """Remove a canvas node (``role:NAME``, ``tool:NAME``, ``step:NAME``) as the canvas's Delete does."""
        nodes, edges = canvas.to_graph(self.spec)
        keep = [n for n in nodes if n["id"] != node]
        self.set_spec(
            canvas.apply_graph(self.spec, keep, [e for e in edges if node not in (e["source"], e["target"])])
        )

    def connect(self, source: str, target: str, when: str | None = None) -> None:
        """Draw an edge as the canvas does: a branch, a role call or a tool use."""
        if canvas.edge_kind(source, target) is None:
            raise ValueError(f"an edge from {source} to {target} means nothing: start at a flow step")
        nodes, edges = canvas.to_graph(self.spec)
        data = {"when": when} if when else {}
        self.set_spec(
            canvas.apply_graph(self.spec, nodes, [*edges, {"source": source, "target": target, "data": data}])
        )

    def update_entry(self, node: str, fields: dict[str, Any], name: str | None = None) -> None:
        """Set fields of a role, tool or step (None removes a field), renaming it if ``name`` differs."""
        kind, old = canvas.split_id(node)
        spec = canvas.rename(self.spec, kind, old, name) if name and name != old else self.spec
        name = name or old
        section = {"role": spec["roles"], "tool": spec.get("tools", {}), "step": spec["flow"]["nodes"]}[kind]
        entry = section[name]
        for key, value in fields.items():
            if value is None or value == "":
                entry.pop(key, None)
            else:
                entry[key] = value
        self.set_spec(spec)

    def to_yaml(self) -> str:
        """The current spec as YAML (the last valid topology if the current spec is invalid)."""
        if not self.problems:
            return to_yaml(from_dict(self.spec))
        return yaml.safe_dump(self.spec, sort_keys=False, allow_unicode=True, width=100)

    # ------------------------------------------------------------------ form
    def _selected(self, event: Any) -> None:
        chosen = (event.new or {}).get("nodes") or []
        if chosen:
            self.show_form(chosen[0])

    def show_form(self, node: str) -> None:
        kind, name = canvas.split_id(node)
        if kind == "step" and name == canvas.END:
            self._form.objects = [pn.pane.Markdown("`end` finishes the episode.")]
            return
        section = {
            "role": self.spec["roles"],
            "tool": self.spec.get("tools", {}),
            "step": self.spec["flow"]["nodes"],
        }
        entry = section[kind].get(name, {})
        schema_kind = kind if kind != "step" else next((k for k in SCHEMA_DEFS if k in entry), "call")
        definition = json_schema()["$defs"][SCHEMA_DEFS[schema_kind]]
        skip = {"next"} if kind == "step" else set()
        name_input = pn.widgets.TextInput(label="name", value=name, css_classes=["wb-field-name"])
        widgets = {
            field: _field_widget(field, _simple(sub), entry.get(field, sub.get("default")))
            for field, sub in definition.get("properties", {}).items()
            if field not in skip
        }
        apply = pn.widgets.Button(name="Apply", button_type="primary", css_classes=["wb-apply"])

        def on_apply(_event: Any) -> None:
            try:
                self.update_entry(node, {f: _read(w) for f, w in widgets.items()}, name_input.value.strip())
            except (ValueError, yaml.YAMLError) as error:
                self._banner.object = f'<p class="wb-problems">{html.escape(str(error))}</p>'

        apply.on_click(on_apply)
        title = pn.pane.Markdown(f"#### {kind} `{name}`")
        self._form.objects = [title, name_input, *widgets.values(), apply]

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        export = pn.widgets.Button(name="Export YAML", css_classes=["wb-export"])
        export.on_click(lambda _e: setattr(self._yaml, "object", f"<pre>{html.escape(self.to_yaml())}</pre>"))
        kind = pn.widgets.Select(label="add", options=["role", "tool", "step"], width=90)
        new_name = pn.widgets.TextInput(placeholder="name", width=140, css_classes=["wb-add-name"])
        add = pn.widgets.Button(name="Add", css_classes=["wb-add"])

        def on_add(_event: Any) -> None:
            try:
                self.add(kind.value, new_name.value.strip())
            except ValueError as error:
                self._banner.object = f'<p class="wb-problems">{html.escape(str(error))}</p>'

        add.on_click(on_add)
        return pn.Column(
            pn.Row(self._load, kind, new_name, add, export),
            self._signals_bar,
            self._banner,
            pn.Row(self.flow, pn.Column(self._form, width=380)),
            self._yaml,
            css_classes=["wb-editor"],
            sizing_mode="stretch_width",
        )


def _simple(schema: dict) -> dict:
    """A property's schema with ``anyOf [X, null]`` reduced to X (optional fields)."""
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(options) == 1:
        return {**options[0], "default": schema.get("default")}
    return schema

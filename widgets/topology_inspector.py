"""The TopologyEditor's inspector: the form of what is selected on the canvas, beside it.

A node's form (generated from the spec's JSON Schema by ``widgets.topology_forms``, one per kind of entry, made
once and refilled), with "Apply" (renames too) and "Delete" and, for a step, its branches in order (each one
selects that branch); an edge's form (a branch's ``when``, checked as typed, and its place in the branch order;
a dag agent's name; "Remove edge"); the settings of the topology and its main flow, or of a subflow. The
inspector shows what ``editor.inspected`` names as the spec now stands and keeps an unchanged form as it is.

The title (class ``wb-inspected``) carries ``data-inspected`` (the node, edge or "settings" shown) and
``data-version`` (how many edits the spec has had: a browser test waits for it to move).
"""

from __future__ import annotations

import copy
import functools
import html
import json
import re
from collections.abc import Callable
from typing import Any

import panel as pn
import yaml

from widgets import topology_canvas as canvas
from widgets import topology_forms as forms
from widgets import topology_spec_edits as edits
from widgets.topology_notices import reported
from workbench.engine.spec_checks import from_dict
from workbench.topology.spec import END
from workbench.topology.validate import TopologyError

#: The JSON Schema definition a form is generated from, by entry kind.
SCHEMA_DEFS = {"role": "Role", "tool": "Tool", "policy": "Policy", "call": "CallNode", "agent": "AgentNode",
               "map": "MapNode", "dag": "DagNode"}  # fmt: skip


def heading_pane(inspected: str, text: str) -> pn.pane.HTML:
    """The inspector's title; ``data-inspected`` names what it shows (a canvas id, an edge, or settings) and
    ``data-version`` counts the spec's changes (a browser test waits for it to move after an edit)."""
    return pn.pane.HTML(
        f'<h4 class="wb-inspected" data-inspected="{html.escape(inspected)}" data-version="0">'
        f"{html.escape(text)}</h4>",
        sizing_mode="stretch_width",
    )


#: A branch of the list: its whole text, wrapped, left-aligned.
BRANCH_CSS = ".bk-btn { white-space: normal; text-align: left; overflow-wrap: anywhere; height: auto; }"


class Inspector:
    """The forms of one ``TopologyEditor`` (``editor``: what it inspects, its spec and its edits)."""

    def __init__(self, editor: Any) -> None:
        self.editor = editor
        self.column = pn.Column(
            width=340, styles={"height": "100%"}, scroll=True, css_classes=["wb-inspector"]
        )
        self._shown: str | None = None  # what the form shows (rebuilt when this changes)
        self._forms: dict[
            str, tuple
        ] = {}  # an entry form per kind, reused: (form, heading, name, branches, buttons)

    def _notice(self, text: str) -> None:
        self.editor._notice(text)

    def refresh(self) -> None:
        """Rebuild the form even if what it shows looks unchanged."""
        self._shown = None
        self.show()

    def show(self) -> None:
        """(Re)build the inspector for what is inspected, as the spec now stands (after renames, deletes and
        loads it shows what is still there, else the settings); an unchanged form is kept as it is."""
        what, key = self.editor.inspected
        shown = self._form_data()
        if shown is not None and shown == self._shown and self.column.objects:
            heading = self.column.objects[0]  # only its version moves
            heading.object = re.sub(
                r'data-version="\d+"', f'data-version="{self.editor.version}"', heading.object, count=1
            )
            return
        self._shown = shown
        objects = None
        if what == "node":
            objects = self._node_form(key)
        elif what == "edge":
            objects = self._edge_form(key)
        elif what == "settings" and key in canvas.flows_of(self.editor.spec):
            objects = self._settings_form(key)
        if objects is None:
            self.editor.inspected = ("settings", canvas.MAIN)
            objects = self._settings_form(canvas.MAIN)
        heading = objects[0]
        heading.object = heading.object.replace(
            'data-version="0"', f'data-version="{self.editor.version}"', 1
        )
        self.column.objects = objects

    def _form_data(self) -> str | None:
        """Everything the inspector's current form shows, as text (None where it cannot say)."""
        what, key = self.editor.inspected
        names = {k: sorted(self.editor.spec.get(k) or {}) for k in ("roles", "tools", "policies", "subflows")}
        try:
            if what == "node":
                kind, flow, name = canvas.parse_id(key)
                entry = (
                    self.editor.spec["subflows"][name]
                    if kind == "flow"
                    else canvas.section(self.editor.spec, kind, flow).get(name)
                )
                if kind == "flow":
                    entry = {k: v for k, v in entry.items() if k != "nodes"} | {
                        "steps": sorted(entry.get("nodes") or {})
                    }
                data: Any = [
                    key,
                    entry,
                    names,
                    key in self.editor.routers | self.editor.collapsed,
                    forms.registries_signature(),
                ]
            elif what == "edge":
                _, source, _, _ = key
                _, flow, name = canvas.parse_id(source)
                data = [key, canvas.flows_of(self.editor.spec)[flow]["nodes"].get(name)]
            else:
                body = canvas.flows_of(self.editor.spec)[key]
                top = {k: self.editor.spec.get(k) for k in ("name", "description", "params")}
                data = [
                    what,
                    key,
                    canvas.node_id("flow", key) in self.editor.collapsed,
                    top,
                    {k: v for k, v in body.items() if k != "nodes"},
                    sorted(body.get("nodes") or {}),
                ]
            return json.dumps(data, sort_keys=True, default=str)
        except (KeyError, TypeError, AttributeError):
            return None

    def button(
        self, label: str, css: str, action: Callable[[], None], kind: str = "default"
    ) -> pn.widgets.Button:
        button = pn.widgets.Button(label=label, color=kind, css_classes=[css])
        button.on_click(lambda _event: self._run_action(action))
        return button

    @reported
    def _run_action(self, action: Callable[[], None]) -> None:
        action()

    def _node_form(self, node: str) -> list | None:
        kind, flow, name = canvas.parse_id(node)
        if kind == "flow":
            return self._settings_form(name) if name in (self.editor.spec.get("subflows") or {}) else None
        try:
            entry = self.editor._entry(self.editor.spec, node)
        except KeyError:
            if kind == "step" and name == END and flow in canvas.flows_of(self.editor.spec):
                where = "the main flow" if flow == canvas.MAIN else f"subflow {flow}"
                return [
                    heading_pane(node, f"end of {where}"),
                    pn.pane.Markdown("A branch to it finishes the flow."),
                ]
            return None
        form_kind = canvas.step_kind(entry) if kind == "step" else kind
        title = f"{canvas.drawn_kind(entry, self.editor.routers, node) if kind == 'step' else kind} {name}"
        if flow:
            title += f" in subflow {flow}"
        choices = forms.entry_choices(form_kind, self.editor.spec)
        pooled = self._forms.get(form_kind)
        if pooled is None:  # one form per kind of entry, made once: later ones only change what it shows
            form = forms.Form(SCHEMA_DEFS[form_kind], choices, skip={"next"} if kind == "step" else set())
            heading = heading_pane(node, title)
            name_input = forms.text("name", name, ["wb-field-name"])
            branches = pn.Column(sizing_mode="stretch_width", css_classes=["wb-branches"], margin=0)

            def apply() -> None:
                target = self.editor.inspected[1]
                self.editor.update_entry(target, form.read(), forms.typed(name_input).strip())

            buttons = pn.Row(
                self.button("Apply", "wb-apply", apply, "primary"),
                self.button(
                    "Delete", "wb-delete", lambda: self.editor.remove(self.editor.inspected[1]), "danger"
                ),
            )
            pooled = self._forms[form_kind] = (form, heading, name_input, branches, buttons)
        form, heading, name_input, branches, buttons = pooled
        form.fill(entry, choices)
        heading.object = heading_pane(node, title).object
        name_input.param.update(value=name, value_input=name)
        extra = []
        if kind == "step":
            branches.objects = self._branch_list(node, entry)
            extra = [branches]
        return [heading, name_input, *form.widgets, *extra, buttons]

    def _branch_list(self, node: str, entry: dict) -> list:
        """A step's branches in order, each a button opening that branch in the edge inspector (its whole
        condition on it, however long)."""
        _, flow, _ = canvas.parse_id(node)
        items: list = [pn.pane.HTML("branches, in order (select one to edit it):", margin=(4, 10, 0, 10))]
        for order, branch in enumerate(entry.get("next") or [{"goto": END}]):
            goto = branch.get("goto", END)
            text = f"{order + 1}: {goto}" + (f" when {branch['when']}" if branch.get("when") else "")
            key = ("next", node, canvas.node_id("step", goto, flow), order)
            item = self.button(text, "wb-branch", functools.partial(self.show_edge, key))
            item.param.update(
                css_classes=["wb-branch", f"wb-branch-{order}"],
                button_type="light",
                sizing_mode="stretch_width",
            )
            items.append(item)
        return items

    def show_edge(self, key: tuple) -> None:
        """Open the edge inspector on the edge ``key`` ((kind, source, target, order or agent))."""
        self.editor.inspected = ("edge", key)
        self.show()

    def _settings_form(self, flow: str) -> list:
        flows = canvas.flows_of(self.editor.spec)
        target = flows[flow]
        steps = list(target.get("nodes") or {})
        start_options = {s: s for s in steps}
        if target.get("start") and target["start"] not in start_options:
            start_options[f"{target['start']} (missing)"] = target["start"]
        widgets: dict[str, pn.widgets.Widget] = {}
        if flow == canvas.MAIN:
            widgets["name"] = forms.text("name", self.editor.spec.get("name", ""), ["wb-field-name"])
            widgets["description"] = forms.text(
                "description", self.editor.spec.get("description", ""), ["wb-field-description"]
            )
            params = self.editor.spec.get("params") or {}
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
                self.editor.update_settings(values)
            else:
                values["inputs"] = [v.strip() for v in values.pop("inputs").split(",") if v.strip()]
                self.editor.update_settings(values, flow, name)

        title = heading_pane(
            "settings" if flow == canvas.MAIN else canvas.node_id("flow", flow),
            "topology and main flow" if flow == canvas.MAIN else f"subflow {flow}",
        )
        buttons = [self.button("Apply", "wb-apply", apply, "primary")]
        if flow != canvas.MAIN:
            folded = canvas.node_id("flow", flow) in self.editor.collapsed
            buttons.append(
                self.button(
                    "Expand" if folded else "Collapse",
                    "wb-collapse",
                    lambda: self.editor.toggle_collapsed(flow),
                )
            )
            buttons.append(
                self.button(
                    "Delete", "wb-delete", lambda: self.editor.remove(canvas.node_id("flow", flow)), "danger"
                )
            )
        return [title, *widgets.values(), pn.Row(*buttons)]

    def _edge_form(self, key: tuple) -> list | None:
        kind, source, target, extra = key
        present = {n["id"] for n in self.editor.flow.nodes}
        if not {source, target} <= present:
            return None
        title = heading_pane(f"{kind}:{source}->{target}", f"{kind}: {source} → {target}")
        remove = self.button("Remove edge", "wb-delete", lambda: self._remove_edge(key), "danger")
        if kind == "next":
            return self._branch_form(key, title, remove)
        if kind == "runs" and canvas.parse_id(source)[0] == "step":
            agent = forms.text("agent name (as the graph writes it)", extra or "", ["wb-edge-agent"])

            def rename_agent() -> None:
                self._rename_agent(source, extra, forms.typed(agent).strip(), target)

            return [title, agent, pn.Row(self.button("Apply", "wb-apply", rename_agent, "primary"), remove)]
        meaning = canvas.EDGE_KINDS.get(kind, ("", "", ""))[2]
        return [title, pn.pane.Markdown(meaning), remove]

    def _branch_form(self, key: tuple, title: pn.pane.HTML, remove: pn.widgets.Button) -> list | None:
        _, source, target, order = key
        _, flow, name = canvas.parse_id(source)
        step = (canvas.flows_of(self.editor.spec).get(flow, {}).get("nodes") or {}).get(name)
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

        @reported
        def checked(inspector: Inspector, event: Any) -> None:
            check.object = inspector._check_condition(source, order, event.new)

        when.param.watch(functools.partial(checked, self), "value_input")
        check.object = self._check_condition(source, order, when.value)
        place = pn.pane.HTML(
            f'<div class="wb-edge-place" data-order="{order}">branch {order + 1} of {len(branches)} '
            "(tried in order: the first that holds is taken)</div>"
        )
        buttons = [
            self.button("Apply", "wb-apply", lambda: self.editor.set_branch(source, order, forms.typed(when)), "primary"),
            self.button("↑ earlier", "wb-edge-earlier", lambda: self.editor.set_branch(source, order, branches[order].get("when"), order - 1)),
            self.button("↓ later", "wb-edge-later", lambda: self.editor.set_branch(source, order, branches[order].get("when"), order + 1)),
        ]  # fmt: skip
        return [title, place, when, check, pn.Row(*buttons), remove]

    def _check_condition(self, step: str, index: int, text: str) -> str:
        """What validation says of branch ``index`` of ``step`` with condition ``text`` (checked as typed)."""
        _, flow, name = canvas.parse_id(step)
        spec = copy.deepcopy(self.editor.spec)
        branch = canvas.section(spec, "step", flow)[name]["next"][index]
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
        nodes, edges = canvas.to_graph(self.editor.spec, self.editor.positions, self.editor.routers)
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
        self.editor.inspected = ("node", source)
        self.editor.set_spec(edits.apply_graph(self.editor.spec, nodes, keep))

    def _rename_agent(self, step: str, old: str | None, new: str, subflow: str) -> None:
        if not new:
            raise ValueError("an agent needs a name (the name the orchestrator's graph writes)")
        _, flow, name = canvas.parse_id(step)
        spec = copy.deepcopy(self.editor.spec)
        entry = canvas.section(spec, "step", flow)[name]
        agents = entry.get("agents") or {}
        if new != old and new in agents:
            raise ValueError(f"there is already an agent called {new!r}")
        entry["agents"] = {(new if a == old else a): s for a, s in agents.items()}
        self.editor.inspected = ("edge", ("runs", step, subflow, new))
        self.editor.set_spec(spec)

"""The TopologyEditor's edits from code: the same changes the canvas, the palette and the forms make.

``add`` (a step of any kind into a flow, a role, tool, policy or subflow), ``remove`` (as the canvas's Delete),
``connect`` (an edge, as drawn), ``update_entry`` (a form's Apply, renames and references included),
``update_settings`` (the topology's and a flow's own fields) and ``set_branch`` (a branch's condition and place
in the order). Each builds the new spec with ``widgets.topology_spec_edits`` and hands it to the editor's
``set_spec``, which validates, redraws and refreshes the inspector; positions, routers and the inspector follow
renames.
"""

from __future__ import annotations

import copy
from typing import Any

from widgets import topology_canvas as canvas
from widgets import topology_spec_edits as edits
from workbench.topology.spec import END


class EditsFromCode:
    """Edits of a ``TopologyEditor``'s spec (a mixin: it uses the editor's spec, positions and ``set_spec``)."""

    spec: dict
    positions: dict[str, tuple[float, float]]
    routers: set[str]
    collapsed: set[str]
    inspected: tuple[str, Any]

    def add(self, kind: str, name: str, flow: str = canvas.MAIN) -> str:
        """Add an entry called ``name``: a step (``call``, ``agent``, ``map``, ``dag``, ``router``; ``step``
        is a call) to ``flow`` (a subflow's name; default the main flow), or a ``role``, ``tool``, ``policy``
        or ``subflow``; returns its canvas id."""
        self.set_spec(edits.add_entry(self.spec, kind, name, flow))
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
            edits.apply_graph(self.spec, keep, [e for e in edges if not {e["source"], e["target"]} & gone])
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
            edits.apply_graph(self.spec, nodes, [*edges, {"source": source, "target": target, "data": data}])
        )

    def _entry(self, spec: dict, node: str) -> dict:
        kind, flow, name = canvas.parse_id(node)
        if kind == "flow":
            return spec["subflows"][name]
        return canvas.section(spec, kind, flow)[name]

    def update_entry(self, node: str, fields: dict[str, Any], name: str | None = None) -> None:
        """Set fields of a role, tool, policy, subflow or step (None removes a field), renaming it if
        ``name`` differs; the inspector follows the rename."""
        kind, flow, old = canvas.parse_id(node)
        if kind == "step" and old == END:
            raise ValueError("the end of a flow has no fields")
        spec = copy.deepcopy(self.spec)
        self._entry(spec, node)  # a KeyError names an entry that is gone
        if name and name != old:
            spec = edits.rename(spec, kind, old, name, flow)
            new_id = edits.renamed_id(node, name)
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
        if self.inspected == ("node", edits.renamed_id(node, old)):
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
            spec = edits.rename(spec, "flow", flow, name)
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
        entry = canvas.section(spec, "step", flow)[name]
        branches = entry.get("next") or [{"goto": END, "when": None}]
        branch = dict(branches[index])
        branch["when"] = when.strip() if isinstance(when, str) and when.strip() else None
        rest = branches[:index] + branches[index + 1 :]
        order = index if order is None else max(0, min(order, len(rest)))
        entry["next"] = rest[:order] + [branch] + rest[order:]
        if self.inspected[0] == "edge":
            self.inspected = ("edge", ("next", step, canvas.node_id("step", branch["goto"], flow), order))
        self.set_spec(spec)

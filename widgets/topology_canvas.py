"""A topology spec as a node-and-edge graph, and back: what the TopologyEditor's canvas shows and edits.

Canvas nodes: ``role:NAME``, ``tool:NAME``, ``step:NAME`` (a node of the main flow) and ``step:end``.
Edges: ``next`` (step → step: a flow branch; its ``when`` rides on the edge), ``calls`` (step → the role
the step calls, acts as or maps over) and ``uses`` (agent step → a tool it may call). Applying a graph
to a spec keeps every field the canvas does not show: a removed node removes its entry, a removed or
added edge removes or adds the branch, role or tool it stands for; validation then says what broke
(``node_of`` maps a problem's path to the canvas node it concerns). Subflows are kept, not drawn.

``with_signals`` colours a graph by a run's signals (``workbench.topology.diagram.Signals``) for display:
a role node, and each step that runs the role, filled on the diagram's red-to-green scale with the
``colour_by`` value in its label and every measure in its hover title (``domAttributes.title``); a flow
branch labelled with the share of calls that took it (and the answers it fixed or broke). Only labels,
styles and titles change, none of which ``apply_graph`` reads: the signals never reach the spec.
"""

from __future__ import annotations

import copy

from workbench.topology.diagram import Signals, measures_text
from workbench.topology.spec import END

#: The field of a flow node that names its role, by node kind.
ROLE_FIELDS = ("call", "agent", "map")
X_STEP, Y_STEP = 230, 130


def node_id(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def split_id(identifier: str) -> tuple[str, str]:
    kind, _, name = identifier.partition(":")
    return kind, name


def _role_of(node: dict) -> str | None:
    return next((node[f] for f in ROLE_FIELDS if f in node), None)


def _order(flow: dict) -> list[str]:
    """Flow nodes breadth-first from the start, then any unreachable ones."""
    nodes, seen, queue = flow.get("nodes", {}), [], [flow.get("start")]
    while queue:
        name = queue.pop(0)
        if name in nodes and name not in seen:
            seen.append(name)
            queue += [b.get("goto") for b in nodes[name].get("next", [{"goto": END}])]
    return seen + [n for n in nodes if n not in seen]


def to_graph(spec: dict) -> tuple[list[dict], list[dict]]:
    """Canvas nodes and edges for ``spec`` (a topology as plain data), laid out by flow order."""
    flow = spec.get("flow", {})
    steps = flow.get("nodes", {})
    order = _order(flow)
    nodes: list[dict] = []
    edges: list[dict] = []
    role_x: dict[str, float] = {}
    for i, name in enumerate(order):
        nodes.append(_node("step", name, i * X_STEP, 0))
        step = steps[name]
        role = _role_of(step)
        if role is not None:
            role_x.setdefault(role, i * X_STEP)
            edges.append(_edge("calls", name, role))
        for tool in step.get("tools", []):
            edges.append(_edge("uses", name, tool))
        for branch in step.get("next", [{"goto": END}]):
            edges.append(_edge("next", name, branch.get("goto", END), branch.get("when")))
    nodes.append(_node("step", END, len(order) * X_STEP, 0))
    for j, role in enumerate(spec.get("roles", {})):
        nodes.append(_node("role", role, role_x.get(role, j * X_STEP), Y_STEP + (j % 2) * 40))
    for j, tool in enumerate(spec.get("tools", {})):
        nodes.append(_node("tool", tool, j * X_STEP, 2 * Y_STEP + 60))
    return nodes, edges


def _node(kind: str, name: str, x: float, y: float) -> dict:
    label = {"step": name, "role": f"role · {name}", "tool": f"tool · {name}"}[kind]
    return {"id": node_id(kind, name), "type": "panel", "label": label, "position": {"x": x, "y": y},
            "data": {"kind": kind, "name": name}}  # fmt: skip


def _edge(kind: str, source_step: str, target: str, when: str | None = None) -> dict:
    target_kind = {"next": "step", "calls": "role", "uses": "tool"}[kind]
    source, target_id = node_id("step", source_step), node_id(target_kind, target)
    data = {"kind": kind} if when is None else {"kind": kind, "when": when}
    label = when if kind == "next" and when else (None if kind == "next" else kind)
    return {"id": f"{kind}:{source}->{target_id}:{when or ''}", "source": source, "target": target_id,
            "label": label, "data": data}  # fmt: skip


def with_signals(
    spec: dict, nodes: list[dict], edges: list[dict], signals: Signals
) -> tuple[list[dict], list[dict]]:
    """Copies of ``spec``'s canvas ``nodes`` and ``edges`` coloured and labelled by ``signals``."""
    steps = spec.get("flow", {}).get("nodes", {})
    out_nodes = []
    for node in copy.deepcopy(nodes):
        kind, name = split_id(node["id"])
        role = name if kind == "role" else _role_of(steps.get(name, {})) if kind == "step" else None
        measured = signals.roles.get(role) if role is not None else None
        if measured:
            _measured_node(node, role, measured, signals)
        out_nodes.append(node)
    out_edges = []
    for edge in copy.deepcopy(edges):
        if (edge.get("data") or {}).get("kind") == "next":
            source, target = split_id(edge["source"])[1], split_id(edge["target"])[1]
            measured = signals.edges.get((source, "<end>" if target == END else target))
            if measured:
                _measured_edge(edge, source, target, measured)
        out_edges.append(edge)
    return out_nodes, out_edges


def _measured_node(node: dict, role: str, measured: dict[str, float], signals: Signals) -> None:
    fill = signals.fill(role)
    if fill is not None:
        node["style"] = {"background": fill}
    if signals.colour_by in measured:
        node["label"] += f" · {measured[signals.colour_by]:.2f}"
    node["domAttributes"] = {"title": f"{signals.title}\nrole {role}\n{measures_text(measured)}"}


def _measured_edge(edge: dict, source: str, target: str, measured: dict[str, float]) -> None:
    shares = [f"{name} {measured[name]:.0%}" for name in ("taken", "fixed", "broke") if name in measured]
    if shares:
        when = (edge.get("data") or {}).get("when")
        edge["label"] = " · ".join([when, *shares] if when else shares)
    edge["domAttributes"] = {"title": f"{source} → {target}\n{measures_text(measured)}"}


def edge_kind(source: str, target: str) -> str | None:
    """What an edge drawn from ``source`` to ``target`` means, or None if it means nothing."""
    kinds = (split_id(source)[0], split_id(target)[0])
    return {("step", "step"): "next", ("step", "role"): "calls", ("step", "tool"): "uses"}.get(kinds)


def apply_graph(spec: dict, nodes: list[dict], edges: list[dict]) -> dict:
    """``spec`` changed to match the canvas: entries of removed nodes dropped, edges turned into fields."""
    out = copy.deepcopy(spec)
    present = {split_id(n["id"]) for n in nodes}
    for kind, section in (("role", out.setdefault("roles", {})), ("tool", out.setdefault("tools", {}))):
        for name in list(section):
            if (kind, name) not in present:
                del section[name]
    flow = out.setdefault("flow", {})
    steps = flow.setdefault("nodes", {})
    for name in list(steps):
        if ("step", name) not in present:
            del steps[name]
    by_source: dict[str, dict[str, list[dict]]] = {}
    for edge in edges:
        kind = edge_kind(edge["source"], edge["target"])
        if kind is None:
            continue
        source, target = split_id(edge["source"])[1], split_id(edge["target"])[1]
        when = (edge.get("data") or {}).get("when")
        by_source.setdefault(source, {}).setdefault(kind, []).append({"target": target, "when": when})
    for name, step in steps.items():
        links = by_source.get(name, {})
        # Branches are tried in order: a condition drawn after an unconditional edge goes before it;
        # an edge drawn twice is one branch.
        ordered = sorted(links.get("next", []), key=lambda link: link["when"] is None)
        branches = [{"goto": link["target"], "when": link["when"]} for link in ordered]
        step["next"] = [b for i, b in enumerate(branches) if b not in branches[:i]] or [
            {"goto": END, "when": None}
        ]
        called = links.get("calls", [])
        field = next((f for f in ROLE_FIELDS if f in step), None)
        if field is not None and called:
            step[field] = called[-1]["target"]
        if "agent" in step:
            step["tools"] = [link["target"] for link in links.get("uses", [])]
    return out


def add_entry(spec: dict, kind: str, name: str) -> dict:
    """``spec`` with a new role, tool or flow step called ``name`` (a minimal valid-looking entry)."""
    out = copy.deepcopy(spec)
    if not name or ":" in name:
        raise ValueError(f"name {name!r} must be non-empty and contain no ':'")
    if kind == "role":
        section, entry = (
            out.setdefault("roles", {}),
            {"messages": [{"role": "user", "content": "{{ question }}"}]},
        )
    elif kind == "tool":
        section, entry = out.setdefault("tools", {}), {"kind": "bm25"}
    elif kind == "step":
        first_role = next(iter(out.get("roles", {})), "")
        section, entry = out.setdefault("flow", {}).setdefault("nodes", {}), {"call": first_role}
    else:
        raise ValueError(f"kind {kind!r}: choose role, tool or step")
    if name in section:
        raise ValueError(f"there is already a {kind} called {name!r}")
    section[name] = entry
    return out


def rename(spec: dict, kind: str, old: str, new: str) -> dict:
    """``spec`` with a role, tool or step renamed everywhere it is referred to."""
    if old == new:
        return copy.deepcopy(spec)
    out = add_entry(spec, kind, new)  # validates the new name
    section = {"role": out["roles"], "tool": out.get("tools", {}), "step": out["flow"]["nodes"]}[kind]
    section[new] = section.pop(old)
    flow = out["flow"]
    for tool in out.get("tools", {}).values():
        route = tool.get("route") or {}
        if kind == "role" and route.get("via") == old:
            route["via"] = new
    if kind == "step" and flow.get("start") == old:
        flow["start"] = new
    for step in flow["nodes"].values():
        for field in ROLE_FIELDS:
            if kind == "role" and step.get(field) == old:
                step[field] = new
        if kind == "tool":
            step["tools"] = [new if t == old else t for t in step.get("tools", [])]
        if kind == "step":
            for branch in step.get("next", []):
                if branch.get("goto") == old:
                    branch["goto"] = new
    return out


def node_of(path: str) -> str | None:
    """The canvas node a validation problem's path concerns (``roles.solver.reward`` → ``role:solver``)."""
    parts = path.split(".")
    if len(parts) >= 2 and parts[0] == "roles":
        return node_id("role", parts[1].split("[")[0])
    if len(parts) >= 2 and parts[0] == "tools":
        return node_id("tool", parts[1].split("[")[0])
    if len(parts) >= 3 and parts[:2] == ["flow", "nodes"]:
        return node_id("step", parts[2].split("[")[0])
    return None

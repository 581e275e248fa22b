"""A topology spec as a node-and-edge graph, and back: what the TopologyEditor's canvas shows and edits.

Canvas nodes, each with its own shape and colour (``KINDS``; class ``wb-node wb-kind-<kind>``):

- flow steps: ``step:NAME`` in the main flow, ``sub:FLOW:NAME`` in subflow FLOW, drawn by their kind (``call``,
  ``agent``, ``map``, ``dag``; a call step with several branches is a ``router``), and one ``end`` per flow
  (``step:end``, ``sub:FLOW:end``);
- each subflow as a group, ``flow:FLOW``, its steps inside it;
- ``role:NAME``, ``tool:NAME`` and ``policy:NAME``.

Edges (class ``wb-edge wb-edge-<kind>``, each kind its own colour and dash, all with arrowheads):

- ``next``: step → step of the same flow, a branch; its ``when`` and its place in the branch order ride on
  the edge (data ``when``, ``order``) and label it;
- ``calls``: step → the role it calls, acts as or maps over; ``uses``: agent step → a tool in its ``tools:``
  (drawing one from a call step makes it an agent step);
- ``route``: tool → the role that distils its output (``route.via``, MARS's System 1);
- ``runs``: agent tool → the subflow it runs; dag step → each subflow its agents map to (data ``agent``, the
  agent's name, labels it);
- ``plays``: role → its policy.

``apply_graph`` turns a changed graph back into the spec by difference with the spec's own graph: a removed
node removes its entry, a removed or added edge clears or sets the field it stands for, and everything the
canvas does not show is kept; validation then says what broke (``node_of`` maps a problem's path to its node).
Node names must not contain ``:`` (the editor refuses them).

``with_signals`` colours a graph by a run's signals (``workbench.topology.diagram.Signals``) for display:
a role node, and each step that runs the role, filled on the diagram's red-to-green scale with the
``colour_by`` value in its label and every measure in its hover title (``domAttributes.title``); a flow
branch labelled with the share of calls that took it (and the answers it fixed or broke). Only labels,
styles and titles change, none of which ``apply_graph`` reads: the signals never reach the spec.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable
from typing import Any

from widgets import topology_layout as layout
from workbench.topology.diagram import Signals, measures_text
from workbench.topology.spec import END

#: The field of a flow step that names its role, by step kind.
ROLE_FIELDS = ("call", "agent", "map")
STEP_KINDS = ("call", "agent", "map", "dag")
#: Every kind of canvas node: (fill, border, what the legend says).
KINDS = {
    "call": ("#e8f0fe", "#3b6fd8", "call step: one call of a role"),
    "router": ("#e0f7fa", "#00838f", "router: a call step that branches on conditions"),
    "agent": ("#e6f4ea", "#2e8b57", "agent step: a role in a tool loop"),
    "map": ("#fff3e0", "#d9822b", "map step: a role over many items"),
    "dag": ("#f3e8fd", "#8e44ad", "dag step: runs a graph a role wrote"),
    "end": ("#37474f", "#263238", "end of a flow"),
    "role": ("#fffde7", "#b08900", "role: an agent's prompt and policy"),
    "tool": ("#eceff1", "#546e7a", "tool: search, python, or a subflow"),
    "policy": ("#fce4ec", "#ad1457", "policy: the model that plays roles"),
    "subflow": ("rgba(236, 239, 241, 0.45)", "#90a4ae", "subflow: steps run with a fresh context"),
}
#: Every kind of edge: (colour, dash, what the legend says).
EDGE_KINDS = {
    "next": ("#37474f", None, "branch (label: order and condition)"),
    "calls": ("#b08900", "6 3", "step calls a role"),
    "uses": ("#546e7a", "2 3", "agent step may call a tool"),
    "route": ("#00838f", "6 3", "tool output distilled by a role"),
    "runs": ("#8e44ad", "8 4", "runs a subflow"),
    "plays": ("#ad1457", "1 3", "role played by a policy"),
}
MAIN = ""  # the main flow's key among the flows


# ---------------------------------------------------------------------------------------------------- ids
def node_id(kind: str, name: str, flow: str = MAIN) -> str:
    """The canvas id of a node: ``step:NAME`` / ``sub:FLOW:NAME`` for steps, ``flow:NAME`` for a subflow's
    group, ``role:NAME``, ``tool:NAME``, ``policy:NAME``."""
    if kind == "step" and flow != MAIN:
        return f"sub:{flow}:{name}"
    return f"{kind}:{name}"


def parse_id(identifier: str) -> tuple[str, str, str]:
    """(kind, flow, name) of a canvas id: kind is step, flow, role, tool or policy; flow is MAIN but for a
    subflow's steps."""
    kind, _, rest = identifier.partition(":")
    if kind == "sub":
        flow, _, name = rest.partition(":")
        return "step", flow, name
    return kind, MAIN, rest


def split_id(identifier: str) -> tuple[str, str]:
    """(kind, name) of a canvas id (a subflow step's name without its flow)."""
    kind, _, name = parse_id(identifier)
    return kind, name


def flows_of(spec: dict) -> dict[str, dict]:
    """The spec's flows by key: MAIN for the main flow, then each subflow by name."""
    return {MAIN: spec.get("flow") or {}, **(spec.get("subflows") or {})}


def step_kind(step: dict) -> str:
    return next((k for k in ("agent", "map", "dag") if k in step), "call")


def role_of(step: dict) -> str | None:
    return next((step[f] for f in ROLE_FIELDS if f in step), None)


def _branches(step: dict) -> list[dict]:
    branches = step.get("next")
    return branches if isinstance(branches, list) else [{"goto": END}]


def drawn_kind(step: dict, routers: Iterable[str] = (), identifier: str = "") -> str:
    """How a step is drawn: its kind, or ``router`` for a call step that branches (or was placed as one)."""
    kind = step_kind(step)
    if kind == "call" and (len(_branches(step)) > 1 or identifier in set(routers)):
        return "router"
    return kind


# ---------------------------------------------------------------------------------------------------- graph
def graph(spec: dict, routers: Iterable[str] = ()) -> tuple[list[dict], list[dict], layout.Canvas]:
    """Canvas nodes and edges of ``spec`` (unpositioned) and what the layout needs to know of them."""
    routers = set(routers)
    roles, tools = spec.get("roles") or {}, spec.get("tools") or {}
    policies = spec.get("policies") or {}
    nodes: list[dict] = []
    edges: list[dict] = []
    parts: list[layout.FlowPart] = []
    for flow_name, flow in flows_of(spec).items():
        group = None if flow_name == MAIN else node_id("flow", flow_name)
        if group is not None:
            nodes.append(_group(flow_name, flow, spec))
        steps = flow.get("nodes") or {}
        start = flow.get("start")
        part = layout.FlowPart(group, [], node_id("step", start, flow_name) if start in steps else None,
                               node_id("step", END, flow_name), [])  # fmt: skip
        for name, step in steps.items():
            sid = node_id("step", name, flow_name)
            part.steps.append(sid)
            kind = drawn_kind(step, routers, sid)
            role = role_of(step)
            caption = kind if role is None else f"{kind} · {role}"
            node = _node(sid, kind, name, caption, group, start=name == start)
            nodes.append(node)
            if role is not None and role in roles:
                edges.append(_edge("calls", sid, node_id("role", role)))
            for tool in step.get("tools", []) if kind == "agent" else []:
                if tool in tools:
                    edges.append(_edge("uses", sid, node_id("tool", tool)))
            if kind == "dag":
                for agent, subflow in (step.get("agents") or {}).items():
                    if subflow in (spec.get("subflows") or {}):
                        edges.append(_edge("runs", sid, node_id("flow", subflow), agent=agent))
            branches = _branches(step)
            for order, branch in enumerate(branches):
                target = branch.get("goto", END)
                if target != END and target not in steps:
                    continue
                tid = node_id("step", target, flow_name)
                edges.append(_edge("next", sid, tid, when=branch.get("when"), order=order, of=len(branches)))
                part.branches.append((sid, tid))
        nodes.append(_node(part.end, "end", END, "end", group))
        parts.append(part)
    for name, role in roles.items():
        rid = node_id("role", name)
        reward = ((role.get("reward") or {}).get("kind")) or "outcome"
        trained = role.get("trainable", True) and reward != "none"
        nodes.append(_node(rid, "role", name, f"role · {reward}" if trained else "role · frozen"))
        policy = role.get("policy", "base")
        if policy in policies:
            edges.append(_edge("plays", rid, node_id("policy", policy)))
    for name, tool in tools.items():
        tid = node_id("tool", name)
        nodes.append(_node(tid, "tool", name, f"tool · {tool.get('kind', '?')}"))
        via = (tool.get("route") or {}).get("via")
        if via in roles:
            edges.append(_edge("route", tid, node_id("role", via)))
        if tool.get("kind") == "agent" and tool.get("subflow") in (spec.get("subflows") or {}):
            edges.append(_edge("runs", tid, node_id("flow", tool["subflow"])))
    for name, policy in policies.items():
        model = (policy or {}).get("model") or "base model"
        caption = f"policy · {model}" + (" + LoRA" if (policy or {}).get("adapter") else "")
        nodes.append(_node(node_id("policy", name), "policy", name, caption))
    canvas = layout.Canvas(
        flows=parts,
        roles=[node_id("role", r) for r in roles],
        tools=[node_id("tool", t) for t in tools],
        policies=[node_id("policy", p) for p in policies],
        links=[(e["source"], e["target"]) for e in edges if e["data"]["kind"] != "next"],
    )
    return nodes, edges, canvas


def to_graph(
    spec: dict,
    positions: dict[str, tuple[float, float]] | None = None,
    routers: Iterable[str] = (),
) -> tuple[list[dict], list[dict]]:
    """Canvas nodes and edges for ``spec`` (a topology as plain data), at ``positions`` where given and laid out
    automatically elsewhere, with every edge label moved clear of nodes and other labels."""
    nodes, edges, canvas = graph(spec, routers)
    return position(nodes, edges, canvas, positions or {})


def sizes_of(nodes: list[dict]) -> dict[str, tuple[float, float]]:
    return {n["id"]: layout.size_of(_size_kind(n)) for n in nodes if n["data"]["kind"] != "subflow"}


def _size_kind(node: dict) -> str:
    kind = node["data"]["kind"]
    return kind if kind in layout.SIZES else "step"


def position(
    nodes: list[dict],
    edges: list[dict],
    canvas: layout.Canvas,
    kept: dict[str, tuple[float, float]],
    wanted: dict[str, tuple[float, float]] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Give ``nodes`` positions (``kept`` where known; ``wanted``, or the automatic layout's, moved down until
    free for the others), size each group to hold its steps, and move edge labels clear of everything."""
    wanted = wanted or {}
    sizes = sizes_of(nodes)
    if all(n["id"] in kept for n in nodes):  # nothing new: no automatic layout needed
        auto, group_sizes = {}, {}
    else:
        auto, group_sizes = layout.arrange(canvas, sizes)
    where = {n["id"]: tuple(kept[n["id"]]) for n in nodes if n["id"] in kept}
    children: dict[str, list[str]] = {}
    for node in nodes:
        if node.get("parentId"):
            children.setdefault(node["parentId"], []).append(node["id"])
    if (
        where or wanted
    ):  # new nodes go where wanted (or the automatic layout puts them), moved down until free
        for node in nodes:
            if node["id"] not in where:
                spot = wanted.get(node["id"]) or auto.get(node["id"], (0.0, 0.0))
                where[node["id"]] = _free_spot(node, spot, where, nodes, sizes, group_sizes)
    else:
        where = {n["id"]: tuple(auto.get(n["id"], (0.0, 0.0))) for n in nodes}
    boxes: dict[str, layout.Box] = {}
    for node in nodes:
        node["position"] = {"x": float(where[node["id"]][0]), "y": float(where[node["id"]][1])}
        if node["data"]["kind"] == "subflow":
            inside = children.get(node["id"], [])
            width = max([where[c][0] + sizes[c][0] for c in inside] + [200.0])  # as wide as its steps need
            height = max([where[c][1] + sizes[c][1] for c in inside] + [100.0])
            node["style"] = {
                "width": round(width + layout.GROUP_PAD),
                "height": round(height + layout.GROUP_PAD),
            }
            w, h = node["style"]["width"], node["style"]["height"]
        else:
            w, h = sizes[node["id"]]
        boxes[node["id"]] = (node["position"]["x"], node["position"]["y"], w, h)
    for node in nodes:  # a group's steps are placed relative to it
        parent = node.get("parentId")
        if parent in boxes:
            x, y, w, h = boxes[node["id"]]
            boxes[node["id"]] = (x + boxes[parent][0], y + boxes[parent][1], w, h)
    groups = [n["id"] for n in nodes if n["data"]["kind"] == "subflow"]
    labelled = []
    for edge in edges:
        spots = _route(edge, boxes)
        if edge.get("label") and spots is not None:
            labelled.append((edge["id"], *spots, edge["label"], edge["source"]))
    offsets = layout.place_labels(boxes, labelled, groups)
    for edge in edges:
        if edge.get("label"):
            _offset_label(edge, offsets.get(edge["id"], (0.0, 0.0)))
    return nodes, edges


STEP_OFFSET = 20.0  # how far a stepped edge runs out of its handle before it turns


def _route(edge: dict, boxes: dict[str, layout.Box]) -> tuple[layout.Point, layout.Point] | None:
    """Choose how ``edge`` is drawn from where its ends are; return where React Flow centres its label and
    where the label is best put.

    A branch back to an earlier step, and one that skips layers, is drawn stepped (``smoothstep``): a loop
    back runs along the gap between rows, a skip turns right after its source and runs in the lane below the
    steps it passes. Others are curves, labelled at their middle; a loop on one node is labelled above it."""
    if edge["source"] not in boxes or edge["target"] not in boxes:
        return None
    sx, sy, sw, sh = boxes[edge["source"]]
    tx, ty, tw, th = boxes[edge["target"]]
    start, end = (sx + sw, sy + sh / 2), (tx, ty + th / 2)
    edge.pop("type", None)
    edge.pop("pathOptions", None)
    middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
    if edge["source"] == edge["target"]:  # drawn behind its node, out of the right side and into the left
        edge["type"] = "smoothstep"
        edge["pathOptions"] = {"offset": STEP_OFFSET, "borderRadius": 8}
        return middle, (sx + sw / 2, sy - layout.LABEL_H / 2 - 6)
    if edge["data"].get("kind") != "next":
        return middle, middle
    backwards = tx + tw / 2 <= sx + sw / 2
    skips = tx - (sx + sw) > layout.X_GAP * 1.5 and abs(start[1] - end[1]) > 1
    if not (backwards or skips):
        return middle, middle
    step = 0.0 if skips else 0.5
    edge["type"] = "smoothstep"
    edge["pathOptions"] = {"offset": STEP_OFFSET, "borderRadius": 8, "stepPosition": step}
    gapped_start, gapped_end = start[0] + STEP_OFFSET, end[0] - STEP_OFFSET
    anchor = (gapped_start + (gapped_end - gapped_start) * step, middle[1])
    if skips:  # on the lane it runs along, before its target
        return anchor, (
            gapped_end - layout.label_size(edge["label"] or "")[0] / 2 - 10,
            end[1] - layout.LABEL_H,
        )
    return anchor, anchor


def _free_spot(
    node: dict,
    wanted: tuple[float, float],
    where: dict[str, tuple[float, float]],
    nodes: list[dict],
    sizes: dict[str, tuple[float, float]],
    group_sizes: dict[str, tuple[float, float]],
) -> tuple[float, float]:
    """``wanted``, or the first spot below it where ``node`` overlaps no placed node of its own parent."""
    parent = node.get("parentId")
    size = sizes.get(node["id"]) or group_sizes.get(node["id"], (260.0, 120.0))
    others = [
        (*where[n["id"]], *(sizes.get(n["id"]) or group_sizes.get(n["id"], (260.0, 120.0))))
        for n in nodes
        if n["id"] in where and n.get("parentId") == parent
    ]
    x, y = wanted
    if parent is not None:  # inside its group, below the group's title
        x, y = max(x, layout.GROUP_PAD / 2), max(y, layout.GROUP_TITLE + 4)
    for _ in range(200):
        box = (x, y, *size)
        if not any(layout._overlaps(box, other, 8.0) for other in others):
            break
        y += size[1] / 2
    return (x, y)


def _offset_label(edge: dict, offset: tuple[float, float]) -> None:
    move = {"transform": f"translate({offset[0]:.0f}px, {offset[1]:.0f}px)"}
    edge["labelStyle"] = {**edge.get("labelStyle", {}), **move}
    edge["labelBgStyle"] = {**edge.get("labelBgStyle", {}), **move}


def _node(
    identifier: str, kind: str, name: str, caption: str, parent: str | None = None, start: bool = False
) -> dict:
    classes = f"wb-node wb-kind-{kind}" + (" wb-start" if start else "")
    node = {"id": identifier, "type": _TYPES.get(kind, "panel"), "label": name, "position": {"x": 0.0, "y": 0.0},
            "data": {"kind": kind, "name": name}, "className": classes,
            "domAttributes": {"data-caption": ("▶ start · " if start else "") + caption,
                              "title": f"{caption}: {name}"}}  # fmt: skip
    if parent is not None:
        node["parentId"] = parent
        node["extent"] = "parent"
        node["data"]["flow"] = parse_id(parent)[2]
    return node


#: Node types (see ``NODE_TYPES``): an end, a policy and a group take edges but start none.
_TYPES = {"end": "wb_sink", "policy": "wb_sink", "subflow": "wb_group"}
NODE_TYPES = {
    "wb_sink": {"type": "wb_sink", "label": "sink", "outputs": []},
    "wb_group": {"type": "wb_group", "label": "subflow", "outputs": []},
}


def _group(name: str, flow: dict, spec: dict) -> dict:
    """A subflow's group; its caption says what runs it (an agent tool, a dag's agent names) and its inputs."""
    runs = [f"tool {t}" for t, tool in (spec.get("tools") or {}).items() if tool.get("subflow") == name]
    for each in flows_of(spec).values():
        for step in (each.get("nodes") or {}).values():
            runs += [f"as {a}" for a, s in (step.get("agents") or {}).items() if s == name]
    inputs = ", ".join(flow.get("inputs") or [])
    caption = " · ".join(["subflow", *runs] + ([f"inputs: {inputs}"] if inputs else []))
    return _node(node_id("flow", name), "subflow", name, caption)


def _edge(
    kind: str,
    source: str,
    target: str,
    when: str | None = None,
    order: int = 0,
    of: int = 1,
    agent: str | None = None,
) -> dict:
    colour, dash, _ = EDGE_KINDS[kind]
    data: dict[str, Any] = {"kind": kind}
    label = None
    if kind == "next":
        data |= {"when": when, "order": order}
        if of > 1:
            label = layout.short_label(
                ("↺ " if source == target else "") + f"{order + 1}: {when if when else 'else'}"
            )
        elif when:
            label = layout.short_label(("↺ " if source == target else "") + when)
    if kind == "runs" and agent is not None:
        data["agent"] = agent
    identifier = f"{kind}:{source}->{target}:{when or agent or ''}"
    style: dict[str, Any] = {"stroke": colour, "strokeWidth": 1.6}
    if kind == "plays":
        style["strokeOpacity"] = 0.45
    if dash:
        style["strokeDasharray"] = dash
    edge = {"id": identifier, "source": source, "target": target, "label": label, "data": data,
            "markerEnd": {"type": "arrowclosed", "color": colour, "width": 18, "height": 18},
            "style": style, "className": f"wb-edge wb-edge-{kind}" + (" wb-loop" if source == target else "")}  # fmt: skip
    if label:
        edge["labelStyle"] = {"fontFamily": "'DejaVu Sans Mono', monospace", "fontSize": "11px"}
        edge["labelBgStyle"] = {"fill": "#ffffff", "fillOpacity": 0.92}
        edge["labelBgPadding"] = [layout.LABEL_PAD, layout.LABEL_PAD / 2]
    if when:
        edge["domAttributes"] = {"title": f"when {when}"}
    return edge


def edge_kind(source: str, target: str, spec: dict | None = None) -> str | None:
    """What an edge drawn from ``source`` to ``target`` means, or None if it means nothing."""
    (skind, sflow, sname), (tkind, tflow, _) = parse_id(source), parse_id(target)
    if skind == "step" and sname == END:
        return None
    if skind == "step":
        if tkind == "step":
            return "next" if sflow == tflow else None
        if tkind == "flow":
            if spec is not None:
                step = (flows_of(spec).get(sflow, {}).get("nodes") or {}).get(sname, {})
                return "runs" if step_kind(step) == "dag" else None
            return "runs"
        return {"role": "calls", "tool": "uses"}.get(tkind)
    return {("tool", "role"): "route", ("tool", "flow"): "runs", ("role", "policy"): "plays"}.get(
        (skind, tkind)
    )


def explain_edge(source: str, target: str, spec: dict | None = None) -> str:
    """Why an edge from ``source`` to ``target`` means nothing, and what can be drawn instead."""
    (skind, sflow, _), (tkind, tflow, _) = parse_id(source), parse_id(target)
    if skind == "step" and tkind == "step" and sflow != tflow:
        return "a branch stays inside one flow: draw it to a step of the same flow"
    if skind == "step" and tkind == "flow":
        return "only a dag step runs subflows (an agent tool runs one too: draw tool → subflow)"
    return (
        f"an edge from a {skind} to a {tkind} means nothing: draw step → step (a branch), step → role (calls), "
        "agent step → tool (uses), tool → role (route), tool or dag step → subflow (runs), role → policy (plays)"
    )


# ---------------------------------------------------------------------------------------------------- signals
def with_signals(
    spec: dict, nodes: list[dict], edges: list[dict], signals: Signals
) -> tuple[list[dict], list[dict]]:
    """Copies of ``spec``'s canvas ``nodes`` and ``edges`` coloured and labelled by ``signals``."""
    flows = flows_of(spec)
    out_nodes = []
    for node in copy.deepcopy(nodes):
        kind, flow, name = parse_id(node["id"])
        steps = flows.get(flow, {}).get("nodes") or {}
        role = name if kind == "role" else role_of(steps.get(name, {})) if kind == "step" else None
        measured = signals.roles.get(role) if role is not None else None
        if measured:
            _measured_node(node, role, measured, signals)
        out_nodes.append(node)
    out_edges = []
    for edge in copy.deepcopy(edges):
        if edge["data"].get("kind") == "next" and parse_id(edge["source"])[1] == MAIN:
            source, target = split_id(edge["source"])[1], split_id(edge["target"])[1]
            measured = signals.edges.get((source, "<end>" if target == END else target))
            if measured:
                _measured_edge(edge, source, target, measured)
        out_edges.append(edge)
    return out_nodes, out_edges


def _measured_node(node: dict, role: str, measured: dict[str, float], signals: Signals) -> None:
    fill = signals.fill(role)
    if fill is not None:
        node["style"] = {**node.get("style", {}), "background": fill}
    if signals.colour_by in measured:
        node["label"] += f" · {measured[signals.colour_by]:.2f}"
    title = f"{signals.title}\nrole {role}\n{measures_text(measured)}"
    node["domAttributes"] = {**node.get("domAttributes", {}), "title": title}


def _measured_edge(edge: dict, source: str, target: str, measured: dict[str, float]) -> None:
    shares = [f"{name} {measured[name]:.0%}" for name in ("taken", "fixed", "broke") if name in measured]
    if shares:
        when = edge["data"].get("when")
        edge["label"] = " · ".join([when, *shares] if when else shares)
        edge.setdefault("labelStyle", {"fontSize": "11px"})
    edge["domAttributes"] = {"title": f"{source} → {target}\n{measures_text(measured)}"}


# ---------------------------------------------------------------------------------------------------- edits
def _key(edge: dict, spec: dict) -> tuple | None:
    data = edge.get("data") or {}
    kind = data.get("kind") or edge_kind(edge["source"], edge["target"], spec)
    if kind is None:
        return None
    extra = data.get("when") if kind == "next" else data.get("agent") if kind == "runs" else None
    return (kind, edge["source"], edge["target"], extra)


def apply_graph(spec: dict, nodes: list[dict], edges: list[dict]) -> dict:
    """``spec`` changed to match the canvas: the entries of removed nodes dropped, each removed or added edge
    turned into the field it stands for (compared with ``spec``'s own graph, so what the canvas cannot show
    is kept as it is)."""
    out = copy.deepcopy(spec)
    old_nodes, old_edges, _ = graph(spec)
    present = {n["id"] for n in nodes}
    for node in old_nodes:
        if node["id"] not in present:
            _remove_node(out, node["id"])
    old = Counter(k for k in (_key(e, spec) for e in old_edges) if k is not None)
    new = Counter(k for k in (_key(e, spec) for e in edges) if k is not None)
    for key in old - new:
        if {key[1], key[2]} <= present:
            _remove_edge(out, key)
    for key in new - old:
        _add_edge(out, key)
    return out


def _section(spec: dict, kind: str, flow: str = MAIN) -> dict:
    if kind == "step":
        return flows_of(spec)[flow].setdefault("nodes", {})
    return spec.setdefault(
        {"role": "roles", "tool": "tools", "policy": "policies", "flow": "subflows"}[kind], {}
    )


def _remove_node(spec: dict, identifier: str) -> None:
    kind, flow, name = parse_id(identifier)
    if kind == "step" and name == END:
        return
    if kind == "step" and flow not in flows_of(spec):
        return  # its subflow went first
    _section(spec, kind, flow).pop(name, None)
    if kind == "step":  # branches to it go too (a step left without one ends)
        for step in _section(spec, "step", flow).values():
            kept = [b for b in _branches(step) if b.get("goto") != name]
            step["next"] = kept or [{"goto": END, "when": None}]


def _remove_edge(spec: dict, key: tuple) -> None:
    kind, source, target, extra = key
    skind, sflow, sname = parse_id(source)
    tname = parse_id(target)[2]
    if skind == "step":
        step = _section(spec, "step", sflow).get(sname)
        if step is None:
            return
        if kind == "next":
            branches = _branches(step)
            gone = next(
                (i for i, b in enumerate(branches) if b.get("goto", END) == tname and b.get("when") == extra),
                None,
            )
            if gone is not None:
                step["next"] = branches[:gone] + branches[gone + 1 :] or [{"goto": END, "when": None}]
        elif kind == "calls":
            field = next((f for f in ROLE_FIELDS if f in step), None)
            if field is not None and step[field] == tname:
                step[field] = ""
        elif kind == "uses":
            step["tools"] = [t for t in step.get("tools", []) if t != tname]
        elif kind == "runs":
            step["agents"] = {a: s for a, s in (step.get("agents") or {}).items() if (a, s) != (extra, tname)}
    elif kind == "route":
        tool = _section(spec, "tool").get(sname)
        if tool is not None:
            tool["route"] = None
    elif kind == "runs":
        tool = _section(spec, "tool").get(sname)
        if tool is not None:
            tool["subflow"] = None
    elif kind == "plays":
        role = _section(spec, "role").get(sname)
        if role is not None:
            role["policy"] = "base"


def _add_edge(spec: dict, key: tuple) -> None:
    kind, source, target, extra = key
    skind, sflow, sname = parse_id(source)
    tname = parse_id(target)[2]
    if skind == "step":
        step = _section(spec, "step", sflow).get(sname)
        if step is None:
            return
        if kind == "next":
            _add_branch(step, tname, extra)
        elif kind == "calls":
            field = next((f for f in ROLE_FIELDS if f in step), None)
            if field is not None:
                step[field] = tname
        elif kind == "uses":
            if step_kind(step) == "call":  # a call step given a tool becomes an agent step
                step["agent"] = step.pop("call")
            if "agent" in step and tname not in step.setdefault("tools", []):
                step["tools"].append(tname)
        elif kind == "runs" and step_kind(step) == "dag":
            agents = step.setdefault("agents", {})
            name = extra or tname
            while name in agents:
                name += "_"
            agents[name] = tname
    elif kind == "route":
        tool = _section(spec, "tool").get(sname)
        if tool is not None:
            tool["route"] = {**(tool.get("route") or {}), "via": tname}
    elif kind == "runs":
        tool = _section(spec, "tool").get(sname)
        if tool is not None:
            tool["kind"], tool["subflow"] = "agent", tname
    elif kind == "plays":
        role = _section(spec, "role").get(sname)
        if role is not None:
            role["policy"] = tname


def _add_branch(step: dict, target: str, when: str | None) -> None:
    """A new branch: an unconditional one replaces a lone default ``goto: end`` or goes last; a conditional one
    goes before the first unconditional branch (branches are tried in order)."""
    branches = _branches(step)
    new = {"goto": target, "when": when}
    if new in branches:
        return
    if (
        not when
        and len(branches) == 1
        and branches[0].get("goto", END) == END
        and branches[0].get("when") is None
    ):
        branches = []  # an unconditional branch replaces the default end; a conditional one goes before it
    always = next((i for i, b in enumerate(branches) if b.get("when") is None), len(branches))
    step["next"] = branches[:always] + [new] + branches[always:] if when else [*branches, new]


def new_spec(name: str = "untitled") -> dict:
    """An empty topology: one policy, no roles, tools or steps (the first step added becomes the start)."""
    return {"name": name, "description": "", "params": {}, "policies": {"base": {"model": None, "adapter": None}},
            "roles": {}, "tools": {}, "flow": {"start": "", "nodes": {}, "max_calls": 16, "answer": "",
                                               "inputs": []}, "subflows": {}}  # fmt: skip


#: What ``add_entry`` can add, and the palette offers.
ENTRY_KINDS = ("call", "agent", "map", "dag", "router", "role", "tool", "policy", "subflow")


def add_entry(spec: dict, kind: str, name: str, flow: str = MAIN) -> dict:
    """``spec`` with a new entry called ``name``: a step (``call``, ``agent``, ``map``, ``dag``, ``router``;
    ``step`` is a call) in ``flow``, or a ``role``, ``tool``, ``policy`` or ``subflow``. A step added to a
    flow without a start becomes its start."""
    out = copy.deepcopy(spec)
    check_name(name)
    kind = "call" if kind in ("step", "router") else kind
    first_role = next(iter(out.get("roles") or {}), "")
    if kind in STEP_KINDS:
        flows = flows_of(out)
        if flow not in flows:
            raise ValueError(f"no subflow called {flow!r}")
        if name == END:
            raise ValueError(f"'{END}' is reserved for the end of a flow; pick another name")
        section = flows[flow].setdefault("nodes", {})
        entry: dict[str, Any] = {
            "call": {"call": first_role},
            "agent": {"agent": first_role, "tools": []},
            "map": {"map": first_role, "over": "items", "into": f"{name}_outputs"},
            "dag": {"dag": "graph", "agents": {}},
        }[kind]
        entry["next"] = [{"goto": END, "when": None}]
        what = "step"
    elif kind == "role":
        section = out.setdefault("roles", {})
        entry, what = {"messages": [{"role": "user", "content": "{{ question }}"}]}, "role"
        if "base" not in (out.get("policies") or {"base": {}}) and out.get("policies"):
            entry["policy"] = next(iter(out["policies"]))
    elif kind == "tool":
        section, entry, what = out.setdefault("tools", {}), {"kind": "bm25"}, "tool"
    elif kind == "policy":
        section, entry, what = out.setdefault("policies", {}), {"model": None, "adapter": None}, "policy"
    elif kind == "subflow":
        section, what = out.setdefault("subflows", {}), "subflow"
        entry = {"start": "", "nodes": {}, "max_calls": 16, "answer": "", "inputs": []}
    else:
        raise ValueError(f"kind {kind!r}: choose one of {', '.join(ENTRY_KINDS)}")
    if name in section:
        raise ValueError(f"there is already a {what} called {name!r}" + (f" in {flow}" if flow else ""))
    section[name] = entry
    if kind in STEP_KINDS:
        target = flows_of(out)[flow]
        if target.get("start") not in section:
            target["start"] = name
    return out


def check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip() or ":" in name or name != name.strip():
        raise ValueError(f"name {name!r} must be non-empty, without ':' and without spaces around it")


def unique_name(spec: dict, kind: str, flow: str = MAIN) -> str:
    """A free name for a new entry of ``kind`` (``call1``, ``role2``, ...)."""
    kind = "call" if kind in ("step", "router") else kind
    section_kind = "step" if kind in STEP_KINDS else "flow" if kind == "subflow" else kind
    taken = set(_section(copy.deepcopy(spec), section_kind, flow))
    base = {"subflow": "subflow", "policy": "policy"}.get(kind, kind)
    i = 1
    while f"{base}{i}" in taken:
        i += 1
    return f"{base}{i}"


def rename(spec: dict, kind: str, old: str, new: str, flow: str = MAIN) -> dict:
    """``spec`` with a role, tool, policy, subflow (kind ``flow``) or step of ``flow`` renamed everywhere it
    is referred to."""
    if old == new:
        return copy.deepcopy(spec)
    check_name(new)
    out = copy.deepcopy(spec)
    section = _section(out, kind, flow)
    if new in section:
        raise ValueError(f"there is already a {'subflow' if kind == 'flow' else kind} called {new!r}")
    if kind == "step" and new == END:
        raise ValueError(f"'{END}' is reserved for the end of a flow; pick another name")
    section[new] = section.pop(old)
    flows = flows_of(out)
    for tool in (out.get("tools") or {}).values():
        if kind == "role" and (tool.get("route") or {}).get("via") == old:
            tool["route"]["via"] = new
        if kind == "flow" and tool.get("subflow") == old:
            tool["subflow"] = new
    if kind == "policy":
        for role in (out.get("roles") or {}).values():
            if role.get("policy", "base") == old:
                role["policy"] = new
    if kind == "step" and flows[flow].get("start") == old:
        flows[flow]["start"] = new
    for flow_name, each in flows.items():
        for step in (each.get("nodes") or {}).values():
            for field in ROLE_FIELDS:
                if kind == "role" and step.get(field) == old:
                    step[field] = new
            if kind == "tool" and "tools" in step:
                step["tools"] = [new if t == old else t for t in step["tools"]]
                options = step.get("protocol_options") or {}
                if options.get("tool") == old:
                    options["tool"] = new
            if kind == "flow" and "agents" in step:
                step["agents"] = {a: (new if s == old else s) for a, s in step["agents"].items()}
            if kind == "step" and flow_name == flow:
                for branch in _branches(step):
                    if branch.get("goto") == old:
                        branch["goto"] = new
    return out


def renamed_id(identifier: str, new: str) -> str:
    """The canvas id of the node ``identifier`` once renamed to ``new`` (the same flow)."""
    kind, flow, _ = parse_id(identifier)
    return node_id(kind, new, flow)


def node_of(path: str) -> str | None:
    """The canvas node a validation problem's path concerns (``roles.solver.reward`` → ``role:solver``,
    ``subflows.browse.nodes.work.agent`` → ``sub:browse:work``)."""
    parts = [p.split("[")[0] for p in path.split(".")]
    if len(parts) >= 2 and parts[0] in ("roles", "tools", "policies"):
        return node_id({"roles": "role", "tools": "tool", "policies": "policy"}[parts[0]], parts[1])
    if len(parts) >= 3 and parts[:2] == ["flow", "nodes"]:
        return node_id("step", parts[2])
    if len(parts) >= 4 and parts[0] == "subflows" and parts[2] == "nodes":
        return node_id("step", parts[3], parts[1])
    if len(parts) >= 2 and parts[0] == "subflows":
        return node_id("flow", parts[1])
    return None

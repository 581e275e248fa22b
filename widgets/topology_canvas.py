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

The edits that turn a changed graph back into the spec are in ``widgets.topology_spec_edits``; ``node_of`` maps a
validation problem's path to its node.

``with_signals`` colours a graph by a run's signals (``workbench.topology.diagram.Signals``) for display:
a role node, and each step that runs the role, filled on the diagram's red-to-green scale with the
``colour_by`` value in its label and every measure in its hover title (``domAttributes.title``); a flow
branch labelled with the share of calls that took it (and the answers it fixed or broke). Only labels,
styles and titles change, none of which ``apply_graph`` reads: the signals never reach the spec.
"""

from __future__ import annotations

import copy
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


def section(spec: dict, kind: str, flow: str = MAIN) -> dict:
    """The part of ``spec`` holding entries of ``kind`` (a flow's steps for ``step``), made if missing."""
    if kind == "step":
        return flows_of(spec)[flow].setdefault("nodes", {})
    return spec.setdefault(
        {"role": "roles", "tool": "tools", "policy": "policies", "flow": "subflows"}[kind], {}
    )


def step_kind(step: dict) -> str:
    return next((k for k in ("agent", "map", "dag") if k in step), "call")


def role_of(step: dict) -> str | None:
    return next((step[f] for f in ROLE_FIELDS if f in step), None)


def branches_of(step: dict) -> list[dict]:
    """A step's branches (a step without any ends)."""
    branches = step.get("next")
    return branches if isinstance(branches, list) else [{"goto": END}]


def drawn_kind(step: dict, routers: Iterable[str] = (), identifier: str = "") -> str:
    """How a step is drawn: its kind, or ``router`` for a call step that branches (or was placed as one)."""
    kind = step_kind(step)
    if kind == "call" and (len(branches_of(step)) > 1 or identifier in set(routers)):
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
            branches = branches_of(step)
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
    _spread_parallel(nodes, edges)
    edges.sort(
        key=lambda e: bool(e.get("label"))
    )  # labelled edges drawn last, over the others: a label selects its edge
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


def absolute_boxes(nodes: list[dict]) -> dict[str, layout.Box]:
    """Each positioned canvas node's box on the canvas (a subflow's steps moved by their group's position)."""
    by_id = {n["id"]: n for n in nodes}
    sizes = sizes_of(nodes)
    boxes = {}
    for identifier, node in by_id.items():
        x, y = node["position"]["x"], node["position"]["y"]
        parent = by_id.get(node.get("parentId"))
        if parent is not None:
            x, y = x + parent["position"]["x"], y + parent["position"]["y"]
        style = node.get("style") or {}
        boxes[identifier] = (
            x,
            y,
            *(sizes.get(identifier) or (style.get("width", 0), style.get("height", 0))),
        )
    return boxes


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
    start = (sx + sw, sy + sh * LANES.get(edge.get("sourceHandle"), 0.5))
    end = (tx, ty + th * LANES.get(edge.get("targetHandle"), 0.5))
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
    offset = STEP_OFFSET * (1 + list(LANES).index(edge.get("sourceHandle", "middle")) / 2)  # parallel: apart
    edge["type"] = "smoothstep"
    edge["pathOptions"] = {"offset": offset, "borderRadius": 8, "stepPosition": step}
    gapped_start, gapped_end = start[0] + offset, end[0] - offset
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


#: Node types (see ``NODE_TYPES``): an end, a policy and a group take edges but start none; a router has three
#: handles for its branches (two branches to one step are drawn from two of them).
_TYPES = {"end": "wb_sink", "policy": "wb_sink", "subflow": "wb_group", "router": "wb_fan_out"}
#: A node's handles where parallel branches leave or arrive, at a quarter, half and three quarters of its side.
LANES = {"upper": 0.25, "middle": 0.5, "lower": 0.75}
_LANES = list(LANES)
NODE_TYPES = {
    "wb_sink": {"type": "wb_sink", "label": "sink", "outputs": []},
    "wb_group": {"type": "wb_group", "label": "subflow", "outputs": []},
    "wb_fan_out": {"type": "wb_fan_out", "label": "step", "outputs": _LANES},
    "wb_fan_in": {"type": "wb_fan_in", "label": "step", "inputs": _LANES},
    "wb_fan_both": {"type": "wb_fan_both", "label": "step", "inputs": _LANES, "outputs": _LANES},
    "wb_sink_fan_in": {"type": "wb_sink_fan_in", "label": "end", "inputs": _LANES, "outputs": []},
}


def _spread_parallel(nodes: list[dict], edges: list[dict]) -> None:
    """Draw branches between the same two steps apart: each leaves and arrives at a handle of its own (the
    upper and lower ones for two), so their curves and labels never lie on one line; the nodes they join get
    the three handles (other edges there use the middle one, as every edge of a router does)."""
    pairs: dict[tuple[str, str], list[dict]] = {}
    for edge in edges:
        if edge["data"]["kind"] == "next" and edge["source"] != edge["target"]:
            pairs.setdefault((edge["source"], edge["target"]), []).append(edge)
    fan_out = {n["id"] for n in nodes if n["type"] == "wb_fan_out"}  # routers
    fan_in: set[str] = set()
    for (source, target), group in pairs.items():
        if len(group) < 2:
            continue
        fan_out.add(source)
        fan_in.add(target)
        lanes = ["upper", "lower"] if len(group) == 2 else [_LANES[i % 3] for i in range(len(group))]
        for edge, lane in zip(group, lanes, strict=True):
            edge["sourceHandle"] = edge["targetHandle"] = lane
    for edge in edges:
        if edge["source"] in fan_out:
            edge.setdefault("sourceHandle", "middle")
        if edge["target"] in fan_in:
            edge.setdefault("targetHandle", "middle")
    for node in nodes:
        out, into = node["id"] in fan_out, node["id"] in fan_in
        if node["type"] == "wb_sink" and into:
            node["type"] = "wb_sink_fan_in"
        elif node["type"] in ("panel", "wb_fan_out") and (out or into):
            node["type"] = "wb_fan_both" if out and into else "wb_fan_out" if out else "wb_fan_in"


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
            "style": style, "className": f"wb-edge wb-edge-{kind}" + (" wb-loop" if source == target else ""),
            "interactionWidth": 12}  # fmt: skip
    if label:
        edge["labelStyle"] = {"fontFamily": "'DejaVu Sans Mono', monospace", "fontSize": "11px"}
        edge["labelBgStyle"] = {"fill": "#ffffff", "fillOpacity": 0.92}
        edge["labelBgPadding"] = [layout.LABEL_PAD, layout.LABEL_PAD / 2]
    if when:  # the whole condition on hover (a long label is cut short)
        edge["domAttributes"] = {"data-title": f"branch {order + 1} of {of}: when {when}"}
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
    edge["domAttributes"] = {"data-title": f"{source} → {target}\n{measures_text(measured)}"}


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

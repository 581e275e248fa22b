"""Edits of a topology spec as plain data: what the TopologyEditor's canvas and forms change.

``apply_graph`` turns a changed canvas graph (``widgets.topology_canvas``) back into the spec by difference with
the spec's own graph: a removed node removes its entry, a removed or added edge clears or sets the field it
stands for, and everything the canvas does not show is kept; validation then says what broke. ``add_entry``,
``rename`` (references included), ``new_spec`` and ``unique_name`` are the palette's and the forms' edits. Every
function returns a new spec and leaves the one given as it was. Names must not contain ``:`` (``check_name``).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from widgets.topology_canvas import (
    MAIN,
    ROLE_FIELDS,
    STEP_KINDS,
    branches_of,
    edge_kind,
    flows_of,
    graph,
    node_id,
    parse_id,
    section,
    step_kind,
)
from workbench.topology.spec import END


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


def _remove_node(spec: dict, identifier: str) -> None:
    kind, flow, name = parse_id(identifier)
    if kind == "step" and name == END:
        return
    if kind == "step" and flow not in flows_of(spec):
        return  # its subflow went first
    section(spec, kind, flow).pop(name, None)
    if kind == "step":  # branches to it go too (a step left without one ends)
        for step in section(spec, "step", flow).values():
            kept = [b for b in branches_of(step) if b.get("goto") != name]
            step["next"] = kept or [{"goto": END, "when": None}]


def _remove_edge(spec: dict, key: tuple) -> None:
    kind, source, target, extra = key
    skind, sflow, sname = parse_id(source)
    tname = parse_id(target)[2]
    if skind == "step":
        step = section(spec, "step", sflow).get(sname)
        if step is None:
            return
        if kind == "next":
            branches = branches_of(step)
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
        tool = section(spec, "tool").get(sname)
        if tool is not None:
            tool["route"] = None
    elif kind == "runs":
        tool = section(spec, "tool").get(sname)
        if tool is not None:
            tool["subflow"] = None
    elif kind == "plays":
        role = section(spec, "role").get(sname)
        if role is not None:
            role["policy"] = "base"


def _add_edge(spec: dict, key: tuple) -> None:
    kind, source, target, extra = key
    skind, sflow, sname = parse_id(source)
    tname = parse_id(target)[2]
    if skind == "step":
        step = section(spec, "step", sflow).get(sname)
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
        tool = section(spec, "tool").get(sname)
        if tool is not None:
            tool["route"] = {**(tool.get("route") or {}), "via": tname}
    elif kind == "runs":
        tool = section(spec, "tool").get(sname)
        if tool is not None:
            tool["kind"], tool["subflow"] = "agent", tname
    elif kind == "plays":
        role = section(spec, "role").get(sname)
        if role is not None:
            role["policy"] = tname


def _add_branch(step: dict, target: str, when: str | None) -> None:
    """A new branch: an unconditional one replaces a lone default ``goto: end`` or goes last; a conditional one
    goes before the first unconditional branch (branches are tried in order)."""
    branches = branches_of(step)
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
        entries = flows[flow].setdefault("nodes", {})
        entry: dict[str, Any] = {
            "call": {"call": first_role},
            "agent": {"agent": first_role, "tools": []},
            "map": {"map": first_role, "over": "items", "into": f"{name}_outputs"},
            "dag": {"dag": "graph", "agents": {}},
        }[kind]
        entry["next"] = [{"goto": END, "when": None}]
        what = "step"
    elif kind == "role":
        entries = out.setdefault("roles", {})
        entry, what = {"messages": [{"role": "user", "content": "{{ question }}"}]}, "role"
        if "base" not in (out.get("policies") or {"base": {}}) and out.get("policies"):
            entry["policy"] = next(iter(out["policies"]))
    elif kind == "tool":
        entries, entry, what = out.setdefault("tools", {}), {"kind": "bm25"}, "tool"
    elif kind == "policy":
        entries, entry, what = out.setdefault("policies", {}), {"model": None, "adapter": None}, "policy"
    elif kind == "subflow":
        entries, what = out.setdefault("subflows", {}), "subflow"
        entry = {"start": "", "nodes": {}, "max_calls": 16, "answer": "", "inputs": []}
    else:
        raise ValueError(f"kind {kind!r}: choose one of {', '.join(ENTRY_KINDS)}")
    if name in entries:
        raise ValueError(f"there is already a {what} called {name!r}" + (f" in {flow}" if flow else ""))
    entries[name] = entry
    if kind in STEP_KINDS:
        target = flows_of(out)[flow]
        if target.get("start") not in entries:
            target["start"] = name
    return out


def check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip() or ":" in name or name != name.strip():
        raise ValueError(f"name {name!r} must be non-empty, without ':' and without spaces around it")


def unique_name(spec: dict, kind: str, flow: str = MAIN) -> str:
    """A free name for a new entry of ``kind`` (``call1``, ``role2``, ...)."""
    kind = "call" if kind in ("step", "router") else kind
    section_kind = "step" if kind in STEP_KINDS else "flow" if kind == "subflow" else kind
    taken = set(section(copy.deepcopy(spec), section_kind, flow))
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
    entries = section(out, kind, flow)
    if new in entries:
        raise ValueError(f"there is already a {'subflow' if kind == 'flow' else kind} called {new!r}")
    if kind == "step" and new == END:
        raise ValueError(f"'{END}' is reserved for the end of a flow; pick another name")
    entries[new] = entries.pop(old)
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
                for branch in branches_of(step):
                    if branch.get("goto") == old:
                        branch["goto"] = new
    return out


def renamed_id(identifier: str, new: str) -> str:
    """The canvas id of the node ``identifier`` once renamed to ``new`` (the same flow)."""
    kind, flow, _ = parse_id(identifier)
    return node_id(kind, new, flow)

"""MAS-Orchestra's orchestrator output: ``<agent>`` / ``<edge>`` XML read into a validated DAG.

Registered as the ``mas_xml`` parser. A graph that breaks a rule (an undeclared endpoint, no
start, not exactly one sink, a disconnected agent, a cycle, several agents without edges) is a
``FormatError`` naming the rule, so the rollout scores it 0 and goes on. With no ``<agent>``
the output is a direct answer (``<answer>``, else the whole text), as in the paper's parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from workbench.engine.parsers import FormatError, UnreadableJson, loads_json, register_parser

AGENT_NAMES = ("CoTAgent", "SCAgent", "DebateAgent", "ReflexionAgent", "WebSearchAgent")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def _tag(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
    return m.group(1).strip() if m else None


def _roles(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        roles = loads_json(text)
    except (json.JSONDecodeError, UnreadableJson):
        roles = [r.strip(" '\"") for r in text.strip("[]").split(",")]
    if not isinstance(roles, list):
        raise FormatError(f"debate_roles must be a list of role names, got JSON {type(roles).__name__}")
    return [str(r) for r in roles if isinstance(r, str) and len(r.strip()) >= 2]


@register_parser("mas_xml")
def parse_mas(text: str) -> dict[str, Any]:
    """The orchestrator's graph: agents (id, name, input, roles), edges, order, sink; or a direct answer."""
    agents = []
    for i, block in enumerate(re.findall(r"<agent>(.*?)</agent>", text, flags=re.S)):
        name = _tag(block, "agent_name")
        agent_id = (
            _tag(block, "agent_id") or _tag(block, "agent_output_id") or (f"A{i + 1}" if name else None)
        )
        if not name or not agent_id:
            continue
        name = name.strip()
        if name not in AGENT_NAMES:
            raise FormatError(f"unknown agent_name '{name}'; use one of {', '.join(AGENT_NAMES)}")
        roles = _roles(_tag(block, "debate_roles"))
        if name == "DebateAgent" and len(roles) < 2:
            raise FormatError(f"DebateAgent {agent_id} needs at least two debate_roles")
        agents.append(
            {"id": agent_id, "name": name, "input": _tag(block, "agent_input") or "", "roles": roles}
        )
    answer = _tag(text, "answer")
    if not agents:
        return direct_answer(answer if answer is not None else text.strip())
    edge_block = _tag(text, "edge") or ""
    edges = re.findall(r"<from>\s*([^<]+?)\s*</from>\s*(?:</from>)?\s*<to>\s*([^<]+?)\s*</to>", edge_block)
    return checked_graph(agents, edges, answer)


def direct_answer(answer: str) -> dict[str, Any]:
    """An output without agents: the orchestrator answered itself."""
    return {"agents": [], "edges": [], "order": [], "sink": None, "answer": answer}


def checked_graph(agents: list[dict], edges: list[tuple[str, str]], answer: str | None) -> dict[str, Any]:
    """The parsers' result for ``agents`` and ``edges``, checked: unique ids, edges for several agents, and
    ``validate_graph``'s rules; a broken graph is a ``FormatError``."""
    ids = [a["id"] for a in agents]
    if len(set(ids)) != len(ids):
        raise FormatError("agent ids must be unique")
    if len(agents) > 1 and not edges:
        raise FormatError("multiple agents require edges")
    order, sink = validate_graph(ids, edges)
    return {
        "agents": agents,
        "edges": [list(e) for e in edges],
        "order": order,
        "sink": sink,
        "answer": answer,
    }


def validate_graph(ids: list[str], edges: list[tuple[str, str]]) -> tuple[list[list[str]], str]:
    """Topological levels and the unique sink, or a FormatError naming the broken rule (the paper's H.2 rules)."""
    known = set(ids)
    for a, b in edges:
        for end in (a, b):
            if end not in known:
                raise FormatError(f"edge endpoint '{end}' is not a declared agent_id")
        if a == b:
            raise FormatError(f"self-loop on '{a}'")
    sources, targets = {a for a, _ in edges}, {b for _, b in edges}
    starts = [i for i in ids if i not in targets]
    sinks = [i for i in ids if i not in sources]
    if not starts:
        raise FormatError("no start agent (every agent has an incoming edge)")
    if len(sinks) != 1:
        raise FormatError(
            f"exactly one sink agent is required, found {len(sinks)}: {', '.join(sinks) or 'none'}"
        )
    incoming = {i: 0 for i in ids}
    for _, b in edges:
        incoming[b] += 1
    levels, ready, seen = [], [i for i in ids if incoming[i] == 0], 0
    while ready:
        levels.append(ready)
        seen += len(ready)
        nxt = []
        for node in ready:
            for a, b in edges:
                if a == node:
                    incoming[b] -= 1
                    if incoming[b] == 0:
                        nxt.append(b)
        ready = nxt
    if seen != len(ids):
        raise FormatError("the agent graph has a cycle")
    reaches_sink = {sinks[0]}
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            if b in reaches_sink and a not in reaches_sink:
                reaches_sink.add(a)
                changed = True
    if reaches_sink != known:
        missing = ", ".join(sorted(known - reaches_sink))
        raise FormatError(f"agents not connected to the sink: {missing}")
    return levels, sinks[0]


def substitute(text: str, results: dict[str, str]) -> str:
    """Replace ``${ID}`` with the result of agent ID (unknown ids are left as written)."""
    return PLACEHOLDER.sub(lambda m: results.get(m.group(1), m.group(0)), text)


def degree(graph: Any) -> dict[str, float] | None:
    """The degree of an emitted MAS: its sub-agents, its depth (the longest chain of agents, the number of
    topological levels) and its edges; None when ``graph`` is not a parsed graph (a ``mas_xml`` or
    ``mas_lines`` parser's output). A direct answer (no agent) has degree 0."""
    if not isinstance(graph, dict) or not {"agents", "edges", "order"} <= graph.keys():
        return None
    return {
        "agents": float(len(graph["agents"])),
        "depth": float(len(graph["order"])),
        "edges": float(len(graph["edges"])),
    }

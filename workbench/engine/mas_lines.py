"""A compact form of MAS-Orchestra's agent graph, one line per agent and per edge, for small models.

Registered as the ``mas_lines`` parser. The paper's orchestrator writes ``<agent>``/``<edge>`` XML
(``mas_xml``), some forty tokens an agent, which a 135M model does not copy reliably from a few-shot
transcript; this says the same graph in call-like lines::

    A1 = CoTAgent("What is 1 + 6?")
    A2 = CoTAgent("What is ${A1} + 2?")
    A1 -> A2

An agent line names the agent's id, its type and its input (``""``: the whole task); a DebateAgent takes its
roles as a second argument, ``DebateAgent("...", ["Optimist", "Skeptic"])``. In an input, ``${X}`` stands for
agent X's answer, and so does X written alone as a word, so ids named after a task's variables let the lines
copy the task (``k = CoTAgent("1 + 6")`` then ``p = CoTAgent("k + 2")``); an id that is also a word of some
input (``a``) is read as a reference there too. A reference to X in Y's input is an edge X -> Y (the paper's
rule 12: edges and data flow agree), and edge lines (``X -> Y``) add others: the graph's edges are both. The
result is the ``mas_xml`` parser's: ``agents`` (id, name, input with references as ``${X}``, roles),
``edges``, ``order`` (topological levels), ``sink`` and ``answer``, checked by the same rules (known agent
types, unique ids, more than one agent needs edges, declared endpoints, one start at least, exactly one sink,
connected, acyclic), a broken one being a ``FormatError``. Lines that are neither are ignored, as the paper's
parser ignores text around its tags; with no agent line the output is a direct answer (the text after
``Answer:``, else the whole text).
"""

from __future__ import annotations

import json
import re
from typing import Any

from workbench.engine.mas_graph import AGENT_NAMES, PLACEHOLDER, checked_graph, direct_answer
from workbench.engine.parsers import FormatError, UnreadableJson, loads_json, register_parser

_AGENT = re.compile(r'^\s*([A-Za-z0-9_]+)\s*=\s*([A-Za-z]+)\(\s*"(.*?)"\s*(?:,\s*(\[.*\]))?\s*\)\s*$')
_EDGE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*->\s*([A-Za-z0-9_]+)\s*$")
_ANSWER = re.compile(r"^\s*Answer:\s*(.*?)\s*$", re.M)


def _roles(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        roles = loads_json(text)
    except (json.JSONDecodeError, UnreadableJson):
        raise FormatError(
            f'debate roles must be a JSON list of names, e.g. ["Optimist", "Skeptic"]; got {text[:60]}'
        ) from None
    if not isinstance(roles, list):
        raise FormatError(f"debate roles must be a list of names, got {text[:60]}")
    return [r for r in roles if isinstance(r, str) and len(r.strip()) >= 2]


def _references(text: str, ids: set[str]) -> str:
    """``text`` with every whole word that is one of ``ids`` (outside ``${...}``) written as ``${id}``."""
    if not ids:
        return text
    names = "|".join(sorted((re.escape(i) for i in ids), key=len, reverse=True))
    return re.sub(rf"(?<![\w{{])({names})(?![\w}}])", r"${\1}", text)


@register_parser("mas_lines")
def parse_mas_lines(text: str) -> dict[str, Any]:
    """The orchestrator's graph from agent and edge lines, or a direct answer; see the module's docstring."""
    agents: list[dict[str, Any]] = []
    edges: list[tuple[str, str]] = []
    for line in text.splitlines():
        agent = _AGENT.match(line)
        if agent:
            agent_id, name, given, roles_text = agent.groups()
            if name not in AGENT_NAMES:
                raise FormatError(f"unknown agent type '{name}'; use one of {', '.join(AGENT_NAMES)}")
            roles = _roles(roles_text)
            if name == "DebateAgent" and len(roles) < 2:
                raise FormatError(f"DebateAgent {agent_id} needs at least two debate roles")
            agents.append({"id": agent_id, "name": name, "input": given.strip(), "roles": roles})
            continue
        edge = _EDGE.match(line)
        if edge:
            edges.append((edge.group(1), edge.group(2)))
    declared = {a["id"] for a in agents}
    for agent in agents:  # ${X} in Y's input: the edge X -> Y (a self-reference or an unknown id is no edge)
        agent["input"] = _references(agent["input"], declared - {agent["id"]})
        for upstream in PLACEHOLDER.findall(agent["input"]):
            link = (upstream, agent["id"])
            if upstream in declared and upstream != agent["id"] and link not in edges:
                edges.append(link)
    answer = _ANSWER.findall(text)
    if not agents:
        return direct_answer(answer[-1] if answer else text.strip())
    return checked_graph(agents, edges, answer[-1] if answer else None)

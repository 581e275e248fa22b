"""Checks a topology beyond its types, naming the path of each problem and how to fix it.

These are the checks the spec alone answers: names, references between its parts, the shape of its flows.
Checks that need the engine's registries (parsers, protocols, templates, verifiers, tool kinds) are
``workbench.engine.spec_checks``; they pass their full check in as ``checks`` so that every problem is
still reported at once.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workbench.topology.spec import (
    END,
    AgentNode,
    CallNode,
    DagNode,
    Flow,
    MapNode,
    PlainDataError,
    Role,
    Topology,
)


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


Checks = Callable[[Topology], list[Problem]]  # a check of a whole spec: every problem it finds


class TopologyError(ValueError):
    """An invalid topology; ``problems`` lists every problem found, each with its path."""

    def __init__(self, name: str, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid topology '{name}' ({len(problems)} problem(s)):\n{lines}")


_NODE_TAGS = {"call", "agent", "map", "dag"}


def unknown(what: str, name: str, known: Iterable[str], fix: str) -> str:
    """``unknown <what> '<name>'``, the closest known name if one is close, and how to fix it."""
    near = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    return f"unknown {what} '{name}'{hint}; {fix}"


_PLAIN_NAME = re.compile(r"[^\s.\[\]'\"]+(?: [^\s.\[\]'\"]+)*")


def at(parent: str, name: Any) -> str:
    """The path of ``name`` in the mapping at ``parent``: ``roles.solver``, or ``roles[' ']`` for a name that
    would not read as one (empty, blank, with dots, brackets or control characters)."""
    if isinstance(name, int):
        return f"{parent}[{name}]"
    text = str(name)
    step = f".{text}" if _PLAIN_NAME.fullmatch(text) and text.isprintable() else f"[{text!r}]"
    return f"{parent}{step}".lstrip(".") if parent else step.lstrip(".")


def data_path(loc: tuple[Any, ...]) -> list[Any]:
    """A pydantic error location as a path into the spec's data: without a node's kind tag, which pydantic
    puts in the location of tagged unions."""
    return [p for i, p in enumerate(loc) if not (i >= 2 and loc[i - 2] == "nodes" and p in _NODE_TAGS)]


def problems_despite_types(
    data: dict[str, Any], error: ValidationError, rounds: int = 3, checks: Checks | None = None
) -> list[Problem]:
    """The cross-field problems of ``data`` that a type error hid: the badly typed or unknown fields are left
    out (their defaults stand in), and the rest is checked as a whole (by ``checks``, default :func:`check`).
    None where a required field is the problem, or leaving fields out does not give a spec."""
    try:
        return _problems_despite_types(data, error, rounds, checks or check)
    except (RecursionError, ValueError, TypeError):
        return []  # a spec too broken to check further: its type errors stand


def _problems_despite_types(
    data: dict[str, Any], error: ValidationError, rounds: int, checks: Checks
) -> list[Problem]:
    import copy

    pruned, removed = copy.deepcopy(data), []
    for _ in range(rounds):
        for e in error.errors():
            path = data_path(e["loc"])
            if e["type"] == "missing" or not path or path[-1] == "[key]":
                return []
            parent = pruned
            for part in path[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and path[-1] in parent:
                del parent[path[-1]]
                removed.append(path)
        try:
            topology = Topology.model_validate(pruned)
        except ValidationError as again:
            error = again
            continue
        left_out = {_path_text(path) for path in removed}
        return [p for p in checks(topology) if not any(p.path.startswith(q) for q in left_out)]
    return []


def _path_text(path: list[Any]) -> str:
    text = ""
    for part in path:
        text = at(text, part)
    return text


def problems_from_pydantic(error: ValidationError) -> list[Problem]:
    out = []
    for e in error.errors():
        loc = data_path(e["loc"])
        message, below = e["msg"], ""
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, PlainDataError):  # a value deep inside params or options: name its own path
            message, below = cause.reason, cause.where
        if loc and loc[-1] == "[key]":  # a mapping's key is wrong, not its value
            loc.pop()
            message = f"the name {loc.pop()!r} is not valid: {message}" if len(loc) > 1 else message
        if e["type"] == "extra_forbidden" and loc:  # a misspelt field: name the one it may be
            near = difflib.get_close_matches(str(loc[-1]), _fields_at(e["loc"][:-1]), n=1, cutoff=0.6)
            message += f" (did you mean '{near[0]}'?)" if near else ""
        path = ""
        for p in loc:
            path = at(path, p)
        if below:
            path = f"{path}{'' if below.startswith('[') else '.'}{below}"
        out.append(Problem(path or "(top level)", message))
    return out


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the spec model at pydantic location ``loc`` (mapping keys, list indexes and
    tagged-union tags stepped through), or [] where no model is."""
    from pydantic import BaseModel

    kind: Any = Topology
    for part in loc:
        kind = _model_in(kind, part)
        if kind is None:
            return []
    return list(kind.model_fields) if isinstance(kind, type) and issubclass(kind, BaseModel) else []


def _model_in(kind: Any, part: Any) -> Any:
    """What ``part`` of a location leads to inside ``kind`` (a model class, or a container/union annotation)."""
    from pydantic import BaseModel

    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (dict, list, tuple) and args:
        return args[-1]  # a mapping's value or a list's item: ``part`` is its key or index
    members = [_model_in(a, None) or a for a in args]  # a union: its members, unwrapped
    members = [typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members]
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    tagged = [m for m in models if m.__name__.lower() == f"{part}node"]  # a flow node's kind tag
    if tagged:
        return tagged[0]
    return _model_in(models[0], part) if len(models) == 1 else None


def check(topology: Topology) -> list[Problem]:
    """Every problem in ``topology`` that the spec alone shows, beyond what its types already guarantee."""
    problems: list[Problem] = []
    roles = topology.roles
    named = {"policies": topology.policies, "roles": roles, "tools": topology.tools}
    named |= {"subflows": topology.subflows, "flow.nodes": topology.flow.nodes}
    named |= {at(at("subflows", n), "nodes"): f.nodes for n, f in topology.subflows.items()}
    for where, mapping in named.items():
        for name in mapping:
            if not name.strip():
                problems.append(Problem(at(where, name), "a name must not be empty or blank; rename it"))

    for name, role in roles.items():
        base = at("roles", name)
        if role.policy not in topology.policies:
            problems.append(
                Problem(
                    f"{base}.policy",
                    unknown("policy", role.policy, topology.policies, "declare it under policies"),
                )
            )
        if not role.messages:
            problems.append(Problem(f"{base}.messages", "a role needs at least one message"))
        if role.prefill and role.mode != "raw":
            problems.append(
                Problem(
                    f"{base}.prefill",
                    "a prefill needs mode: raw (chat turns are re-rendered by the template)",
                )
            )
        problems += _check_reward(base, role)

    for name, tool in topology.tools.items():
        base = at("tools", name)
        if tool.kind == "agent" and tool.subflow not in topology.subflows:
            problems.append(
                Problem(
                    f"{base}.subflow",
                    unknown(
                        "subflow",
                        tool.subflow,
                        topology.subflows,
                        f"use one of {sorted(topology.subflows)}",
                    ),
                )
            )
        if tool.route is not None and tool.route.via not in roles:
            problems.append(
                Problem(
                    f"{base}.route.via",
                    unknown("role", tool.route.via, roles, f"use one of {sorted(roles)}"),
                )
            )
        problems += _check_secrets(f"{base}.options", tool.options)

    _check_flow(topology, "flow", topology.flow, problems)
    for name, flow in topology.subflows.items():
        _check_flow(topology, at("subflows", name), flow, problems)
    return problems


def _check_reward(base: str, role: Role) -> list[Problem]:
    rule, out = role.reward, []
    if rule.judge is not None and rule.kind not in ("outcome", "answer"):
        out.append(
            Problem(
                f"{base}.reward.judge",
                f"a judge scores answers; it needs kind outcome or answer, not {rule.kind}",
            )
        )
    if rule.balance == "verdicts" and rule.kind != "verdict":
        out.append(
            Problem(
                f"{base}.reward.balance",
                f"balance verdicts weighs what a verdict judged; it needs kind verdict, not {rule.kind}",
            )
        )
    return out


_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth")


def _check_secrets(base: str, options: dict[str, Any]) -> list[Problem]:
    """Tool options that would put a key in the spec, which is stored with every run (never quoted here)."""
    from workbench.api_keys import url_hides_secrets

    problems = []
    for option, value in options.items():
        words = str(option).lower().replace("-", "_").split("_")
        if words[-1] not in ("env", "file") and any(w in _SECRET_WORDS or w == "apikey" for w in words):
            problems.append(
                Problem(
                    f"{base}.{option}",
                    "a key must not be written into a topology (it is stored with every run); put it in an "
                    "environment variable or a key file and name that (api_key_env, api_key_file)",
                )
            )
        elif (
            isinstance(value, str) and value.startswith(("http://", "https://")) and url_hides_secrets(value)
        ):
            problems.append(
                Problem(
                    f"{base}.{option}",
                    "this URL carries credentials, a query or a fragment (not shown: it may hold a key); "
                    "give scheme://host:port[/path] and the key in the environment or a key file",
                )
            )
    return problems


def _check_flow(topology: Topology, where: str, flow: Flow, problems: list[Problem]) -> None:
    roles = topology.roles
    if flow.start not in flow.nodes:
        problems.append(
            Problem(
                f"{where}.start", unknown("node", flow.start, flow.nodes, f"use one of {sorted(flow.nodes)}")
            )
        )
    for name, node in flow.nodes.items():
        base = at(f"{where}.nodes", name)
        if name == END:
            problems.append(Problem(base, f"'{END}' is reserved for the end of an episode; rename the node"))
        role_field, role_name = _role_of(node)
        if getattr(node, "select", None) is not None and (where != "flow" or name == flow.start):
            problems.append(
                Problem(
                    f"{base}.select",
                    "select fans out over upstream outputs of the main flow; "
                    "it cannot be on a subflow or on the start node",
                )
            )
        if isinstance(node, DagNode):
            for agent, subflow in node.agents.items():
                if subflow not in topology.subflows:
                    problems.append(
                        Problem(
                            f"{base}.agents.{agent}",
                            unknown(
                                "subflow",
                                subflow,
                                topology.subflows,
                                f"use one of {sorted(topology.subflows)}",
                            ),
                        )
                    )
        elif role_name not in roles:
            problems.append(
                Problem(
                    f"{base}.{role_field}", unknown("role", role_name, roles, f"use one of {sorted(roles)}")
                )
            )
        if isinstance(node, AgentNode):
            for i, tool in enumerate(node.tools):
                if tool not in topology.tools:
                    problems.append(
                        Problem(
                            f"{base}.tools[{i}]",
                            unknown("tool", tool, topology.tools, "declare it under tools"),
                        )
                    )
        for i, branch in enumerate(node.next):
            if branch.goto != END and branch.goto not in flow.nodes:
                problems.append(
                    Problem(
                        f"{base}.next[{i}].goto",
                        unknown("node", branch.goto, flow.nodes, f"use a node name or '{END}'"),
                    )
                )
        if not node.next:
            problems.append(Problem(f"{base}.next", f"a node needs at least one branch (use goto: {END})"))
        always = next((i for i, b in enumerate(node.next) if b.when is None), None)
        if always is not None and always < len(node.next) - 1:
            problems.append(
                Problem(
                    f"{base}.next[{always + 1}]",
                    f"never taken: branches are tried in order and next[{always}] has no 'when'; "
                    "put the unconditional branch last",
                )
            )

    reachable = _reachable(flow)
    for name in flow.nodes:
        if name not in reachable and flow.start in flow.nodes:
            problems.append(
                Problem(at(f"{where}.nodes", name), "unreachable from start; connect it or remove it")
            )


def _role_of(node: CallNode | AgentNode | MapNode | DagNode) -> tuple[str, str]:
    if isinstance(node, DagNode):
        return "dag", ""
    if isinstance(node, AgentNode):
        return "agent", node.agent
    if isinstance(node, MapNode):
        return "map", node.map
    return "call", node.call


def _reachable(flow: Flow) -> set[str]:
    nodes = flow.nodes
    seen: set[str] = set()
    todo = [flow.start]
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        todo.extend(b.goto for b in nodes[name].next)
    return seen


def validate(topology: Topology, checks: Checks | None = None) -> Topology:
    """Return ``topology`` if valid, else raise ``TopologyError`` listing every problem that ``checks``
    (default :func:`check`) finds."""
    problems = (checks or check)(topology)
    if problems:
        raise TopologyError(topology.name, problems)
    return topology

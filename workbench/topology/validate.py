"""Checks a topology beyond its types, naming the path of each problem and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import jinja2.meta
from pydantic import ValidationError

from workbench.engine.parsers import PARSERS, POSTPROCESS
from workbench.topology.spec import END, Topology

# Variables every episode starts with.
EPISODE_VARIABLES = frozenset({"question", "task"})
# Names a node's bind expressions can read.
OUTPUT_VARIABLES = frozenset({"text", "parsed", "raw", "finish_reason", "format_error"})

_env = jinja2.Environment()


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class TopologyError(ValueError):
    """An invalid topology; ``problems`` lists every problem found, each with its path."""

    def __init__(self, name: str, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid topology '{name}' ({len(problems)} problem(s)):\n{lines}")


def problems_from_pydantic(error: ValidationError) -> list[Problem]:
    out = []
    for e in error.errors():
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        out.append(Problem(path or "(top level)", e["msg"]))
    return out


def _variables(source: str, path: str, problems: list[Problem], expression: bool) -> set[str]:
    try:
        text = "{{ " + source + " }}" if expression else source
        return set(jinja2.meta.find_undeclared_variables(_env.parse(text)))
    except jinja2.TemplateSyntaxError as e:
        problems.append(Problem(path, f"Jinja2 syntax error: {e.message}; fix the template or expression"))
        return set()


def check(topology: Topology) -> list[Problem]:
    """Every problem in ``topology`` beyond what its types already guarantee."""
    problems: list[Problem] = []
    flow = topology.flow
    roles = topology.roles
    provided = set(EPISODE_VARIABLES) | {v for node in flow.nodes.values() for v in node.bind}

    for name, role in roles.items():
        base = f"roles.{name}"
        if role.policy not in topology.policies:
            problems.append(
                Problem(f"{base}.policy", f"unknown policy '{role.policy}'; declare it under policies")
            )
        if role.parser is not None and role.parser not in PARSERS:
            problems.append(
                Problem(
                    f"{base}.parser", f"unknown parser '{role.parser}'; known: {', '.join(sorted(PARSERS))}"
                )
            )
        for i, step in enumerate(role.postprocess):
            if step not in POSTPROCESS:
                known = ", ".join(sorted(POSTPROCESS))
                problems.append(
                    Problem(f"{base}.postprocess[{i}]", f"unknown post-processor '{step}'; known: {known}")
                )
        for i, message in enumerate(role.messages):
            path = f"{base}.messages[{i}].content"
            for var in sorted(_variables(message.content, path, problems, expression=False) - provided):
                problems.append(
                    Problem(path, f"template variable '{var}' is provided by nothing; bind it in a flow node")
                )
        if not role.messages:
            problems.append(Problem(f"{base}.messages", "a role needs at least one message"))

    if flow.start not in flow.nodes:
        problems.append(
            Problem("flow.start", f"unknown node '{flow.start}'; use one of {sorted(flow.nodes)}")
        )
    for name, node in flow.nodes.items():
        base = f"flow.nodes.{name}"
        if name == END:
            problems.append(Problem(base, f"'{END}' is reserved for the end of an episode; rename the node"))
        if node.call not in roles:
            problems.append(
                Problem(f"{base}.call", f"unknown role '{node.call}'; use one of {sorted(roles)}")
            )
        for var, expr in node.bind.items():
            path = f"{base}.bind.{var}"
            readable = OUTPUT_VARIABLES | provided
            for unknown in sorted(_variables(expr, path, problems, expression=True) - readable):
                problems.append(Problem(path, f"expression reads '{unknown}', which nothing provides"))
        for i, branch in enumerate(node.next):
            if branch.goto != END and branch.goto not in flow.nodes:
                problems.append(
                    Problem(
                        f"{base}.next[{i}].goto", f"unknown node '{branch.goto}'; use a node name or '{END}'"
                    )
                )
            if branch.when is not None:
                path = f"{base}.next[{i}].when"
                for unknown in sorted(_variables(branch.when, path, problems, expression=True) - provided):
                    problems.append(Problem(path, f"condition reads '{unknown}', which nothing provides"))
        if not node.next:
            problems.append(Problem(f"{base}.next", f"a node needs at least one branch (use goto: {END})"))
    _variables(flow.answer, "flow.answer", problems, expression=False)

    reachable = _reachable(topology)
    for name in flow.nodes:
        if name not in reachable and flow.start in flow.nodes:
            problems.append(
                Problem(f"flow.nodes.{name}", "unreachable from flow.start; connect it or remove it")
            )
    return problems


def _reachable(topology: Topology) -> set[str]:
    nodes = topology.flow.nodes
    seen: set[str] = set()
    todo = [topology.flow.start]
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        todo.extend(b.goto for b in nodes[name].next)
    return seen


def validate(topology: Topology) -> Topology:
    """Return ``topology`` if valid, else raise ``TopologyError`` listing every problem."""
    problems = check(topology)
    if problems:
        raise TopologyError(topology.name, problems)
    return topology

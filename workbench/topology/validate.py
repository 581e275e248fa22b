"""Checks a topology beyond its types, naming the path of each problem and how to fix it."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta
from pydantic import ValidationError

from workbench.engine.parsers import PARSERS, POSTPROCESS, VERDICT_PARSERS
from workbench.engine.templating import templates
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

# Variables every episode starts with; inside a routed or agent tool, its call's ``arguments`` too.
EPISODE_VARIABLES = frozenset({"question", "task", "arguments"})
PROTOCOLS = frozenset({"json_tool_call", "mcp_xml", "tags"})
# Names a node's bind expressions can read.
OUTPUT_VARIABLES = frozenset({"text", "parsed", "raw", "finish_reason", "format_error", "answer"})

_env = jinja2.Environment()
_env.filters.update(templates.filters)


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


_NODE_TAGS = {"call", "agent", "map", "dag"}


def _unknown(what: str, name: str, known: Iterable[str], fix: str) -> str:
    """``unknown <what> '<name>'``, the closest known name if one is close, and how to fix it."""
    near = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    return f"unknown {what} '{name}'{hint}; {fix}"


_PLAIN_NAME = re.compile(r"[^\s.\[\]'\"]+(?: [^\s.\[\]'\"]+)*")


def _at(parent: str, name: Any) -> str:
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


def problems_despite_types(data: dict[str, Any], error: ValidationError, rounds: int = 3) -> list[Problem]:
    """The cross-field problems of ``data`` that a type error hid: the badly typed or unknown fields are left
    out (their defaults stand in), and the rest is checked as a whole. None where a required field is the
    problem, or leaving fields out does not give a spec."""
    try:
        return _problems_despite_types(data, error, rounds)
    except (RecursionError, ValueError, TypeError):
        return []  # a spec too broken to check further: its type errors stand


def _problems_despite_types(data: dict[str, Any], error: ValidationError, rounds: int) -> list[Problem]:
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
        return [p for p in check(topology) if not any(p.path.startswith(q) for q in left_out)]
    return []


def _path_text(path: list[Any]) -> str:
    text = ""
    for part in path:
        text = _at(text, part)
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
            path = _at(path, p)
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


def _variables(source: str, path: str, problems: list[Problem], expression: bool) -> set[str]:
    try:
        text = "{{ " + source + " }}" if expression else source
        return set(jinja2.meta.find_undeclared_variables(_env.parse(text)))
    except jinja2.TemplateSyntaxError as e:
        problems.append(Problem(path, f"Jinja2 syntax error: {e.message}; fix the template or expression"))
    except RecursionError:  # Jinja2 parses recursively: thousands of nested brackets or blocks overflow it
        problems.append(
            Problem(path, "nested too deeply for Jinja2 to parse; simplify the template or expression")
        )
    return set()


def _provided(topology: Topology) -> set[str]:
    """Every variable some flow, subflow, fan-out or route can set."""
    provided = set(EPISODE_VARIABLES) | set(topology.params)
    for flow in [topology.flow, *topology.subflows.values()]:
        provided |= set(flow.inputs)
        for node in flow.nodes.values():
            provided |= set(getattr(node, "bind", {}))
            if isinstance(node, MapNode):
                provided |= {node.item, node.into}
            if isinstance(node, DagNode):
                provided.add(node.into)
    provided |= {t.route.variable for t in topology.tools.values() if t.route is not None}
    return provided


def check(topology: Topology) -> list[Problem]:
    """Every problem in ``topology`` beyond what its types already guarantee."""
    problems: list[Problem] = []
    roles = topology.roles
    provided = _provided(topology)
    named = {"policies": topology.policies, "roles": roles, "tools": topology.tools}
    named |= {"subflows": topology.subflows, "flow.nodes": topology.flow.nodes}
    named |= {_at(_at("subflows", n), "nodes"): f.nodes for n, f in topology.subflows.items()}
    for where, mapping in named.items():
        for name in mapping:
            if not name.strip():
                problems.append(Problem(_at(where, name), "a name must not be empty or blank; rename it"))

    for name, role in roles.items():
        base = _at("roles", name)
        if role.policy not in topology.policies:
            problems.append(
                Problem(
                    f"{base}.policy",
                    _unknown("policy", role.policy, topology.policies, "declare it under policies"),
                )
            )
        if role.parser is not None and role.parser not in PARSERS:
            problems.append(
                Problem(
                    f"{base}.parser",
                    _unknown("parser", role.parser, PARSERS, f"known: {', '.join(sorted(PARSERS))}"),
                )
            )
        for i, step in enumerate(role.postprocess):
            if step not in POSTPROCESS:
                known = ", ".join(sorted(POSTPROCESS))
                problems.append(
                    Problem(
                        f"{base}.postprocess[{i}]",
                        _unknown("post-processor", step, POSTPROCESS, f"known: {known}"),
                    )
                )
        for i, message in enumerate(role.messages):
            path = f"{base}.messages[{i}].content"
            for var in sorted(_variables(message.content, path, problems, expression=False) - provided):
                problems.append(
                    Problem(path, f"template variable '{var}' is provided by nothing; bind it in a flow node")
                )
        if not role.messages:
            problems.append(Problem(f"{base}.messages", "a role needs at least one message"))
        if role.prefill:
            if role.mode != "raw":
                problems.append(
                    Problem(
                        f"{base}.prefill",
                        "a prefill needs mode: raw (chat turns are re-rendered by the template)",
                    )
                )
            for var in sorted(
                _variables(role.prefill, f"{base}.prefill", problems, expression=False) - provided
            ):
                problems.append(
                    Problem(
                        f"{base}.prefill",
                        f"template variable '{var}' is provided by nothing; bind it in a flow node",
                    )
                )
        problems += _check_reward(base, role)

    for name, tool in topology.tools.items():
        base = _at("tools", name)
        if tool.kind == "agent":
            if tool.subflow not in topology.subflows:
                problems.append(
                    Problem(
                        f"{base}.subflow",
                        _unknown(
                            "subflow",
                            tool.subflow,
                            topology.subflows,
                            f"use one of {sorted(topology.subflows)}",
                        ),
                    )
                )
            for var, expr in tool.inputs.items():
                _variables(expr, f"{base}.inputs.{var}", problems, expression=True)
            for var, expr in tool.outputs.items():
                _variables(expr, f"{base}.outputs.{var}", problems, expression=True)
        else:
            kinds = _tool_kinds()
            if kinds and tool.kind not in kinds:
                problems.append(
                    Problem(
                        f"{base}.kind",
                        _unknown("tool kind", tool.kind, kinds, f"known: agent, {', '.join(kinds)}"),
                    )
                )
        if tool.route is not None and tool.route.via not in roles:
            problems.append(
                Problem(
                    f"{base}.route.via",
                    _unknown("role", tool.route.via, roles, f"use one of {sorted(roles)}"),
                )
            )
        problems += _check_secrets(f"{base}.options", tool.options)

    _check_flow(topology, "flow", topology.flow, provided, problems)
    for name, flow in topology.subflows.items():
        _check_flow(topology, _at("subflows", name), flow, provided, problems)
    return problems


def _check_reward(base: str, role: Role) -> list[Problem]:
    from workbench.rewards import VERIFIERS

    rule, out = role.reward, []
    if rule.verifier is not None and rule.verifier not in VERIFIERS:
        known = ", ".join(sorted(VERIFIERS))
        out.append(
            Problem(
                f"{base}.reward.verifier", _unknown("verifier", rule.verifier, VERIFIERS, f"known: {known}")
            )
        )
    if rule.judge is not None:
        from workbench.rewards.judge import JUDGE_PROMPTS

        if rule.judge not in JUDGE_PROMPTS:
            known = ", ".join(JUDGE_PROMPTS)
            out.append(
                Problem(
                    f"{base}.reward.judge",
                    _unknown("judge prompt", rule.judge, JUDGE_PROMPTS, f"known: {known}"),
                )
            )
        if rule.kind not in ("outcome", "answer"):
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
    if rule.kind == "verdict" and role.parser not in VERDICT_PARSERS:
        out.append(
            Problem(
                f"{base}.reward.kind",
                "a verdict reward reads a verdict parser's output; set parser: verdict or yes_no",
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


def _tool_kinds() -> list[str]:
    try:
        from workbench.tools import TOOL_KINDS
    except ImportError:  # tools not installed in this build: skip the check
        return []
    return sorted(TOOL_KINDS)


def _check_flow(
    topology: Topology, where: str, flow: Flow, provided: set[str], problems: list[Problem]
) -> None:
    roles = topology.roles
    if flow.start not in flow.nodes:
        problems.append(
            Problem(
                f"{where}.start", _unknown("node", flow.start, flow.nodes, f"use one of {sorted(flow.nodes)}")
            )
        )
    for name, node in flow.nodes.items():
        base = _at(f"{where}.nodes", name)
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
            _variables(node.dag, f"{base}.dag", problems, expression=True)
            for agent, subflow in node.agents.items():
                if subflow not in topology.subflows:
                    problems.append(
                        Problem(
                            f"{base}.agents.{agent}",
                            _unknown(
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
                    f"{base}.{role_field}", _unknown("role", role_name, roles, f"use one of {sorted(roles)}")
                )
            )
        if isinstance(node, AgentNode):
            for i, tool in enumerate(node.tools):
                if tool not in topology.tools:
                    problems.append(
                        Problem(
                            f"{base}.tools[{i}]",
                            _unknown("tool", tool, topology.tools, "declare it under tools"),
                        )
                    )
            if node.protocol not in PROTOCOLS:
                problems.append(
                    Problem(
                        f"{base}.protocol",
                        _unknown(
                            "protocol", node.protocol, PROTOCOLS, f"known: {', '.join(sorted(PROTOCOLS))}"
                        ),
                    )
                )
            else:
                problems += _check_protocol(f"{base}.protocol_options", node)
            if node.final_prompt is not None:
                _variables(node.final_prompt, f"{base}.final_prompt", problems, expression=False)
        if isinstance(node, MapNode):
            _variables(node.over, f"{base}.over", problems, expression=True)
        for var, expr in getattr(node, "bind", {}).items():
            path = f"{base}.bind.{var}"
            readable = OUTPUT_VARIABLES | provided
            for unknown in sorted(_variables(expr, path, problems, expression=True) - readable):
                problems.append(Problem(path, f"expression reads '{unknown}', which nothing provides"))
        for i, branch in enumerate(node.next):
            if branch.goto != END and branch.goto not in flow.nodes:
                problems.append(
                    Problem(
                        f"{base}.next[{i}].goto",
                        _unknown("node", branch.goto, flow.nodes, f"use a node name or '{END}'"),
                    )
                )
            if branch.when is not None:
                path = f"{base}.next[{i}].when"
                for unknown in sorted(_variables(branch.when, path, problems, expression=True) - provided):
                    problems.append(Problem(path, f"condition reads '{unknown}', which nothing provides"))
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
    _variables(flow.answer, f"{where}.answer", problems, expression=False)

    reachable = _reachable(flow)
    for name in flow.nodes:
        if name not in reachable and flow.start in flow.nodes:
            problems.append(
                Problem(_at(f"{where}.nodes", name), "unreachable from start; connect it or remove it")
            )


def _check_protocol(path: str, node: AgentNode) -> list[Problem]:
    """Options the node's protocol does not take, lacks, or cannot use (the engine builds it from them)."""
    from workbench.engine.protocols import make_protocol

    options = node.protocol_options
    try:
        make_protocol(node.protocol, **options)
    except (TypeError, ValueError) as e:
        message = re.sub(r"^[\w.]*\(\) ", "", str(e))  # "Tags.__init__() got ..." -> "got ..."
        return [Problem(path, f"{message}; see workbench.engine.protocols for the {node.protocol} options")]
    out = [
        Problem(f"{path}.{key}", f"must be a string, not {type(value).__name__}")
        for key, value in options.items()
        if not isinstance(value, str)
    ]
    out += [
        Problem(f"{path}.{key}", "must not be empty: the protocol finds calls by it")
        for key in ("begin", "end")
        if options.get(key) == ""
    ]
    tool = options.get("tool")
    if (
        isinstance(tool, str) and tool not in node.tools
    ):  # the tool the tags call must be one the node may call
        out.append(
            Problem(
                f"{path}.tool",
                _unknown("tool", tool, node.tools, f"list it in the node's tools {node.tools}"),
            )
        )
    return out


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


def validate(topology: Topology) -> Topology:
    """Return ``topology`` if valid, else raise ``TopologyError`` listing every problem."""
    problems = check(topology)
    if problems:
        raise TopologyError(topology.name, problems)
    return topology

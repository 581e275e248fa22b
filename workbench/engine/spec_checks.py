"""The checks of a topology that need the engine's registries, and loading a spec with every check.

``workbench.topology`` checks what the spec alone shows: names, references between its parts, the shape of
its flows. What a spec names from a registry is checked here, where the registries are known: parsers and
post-processors, protocols and their options, prompt templates and expressions (syntax, filters, the
variables they read), verifiers, judge prompts and tool kinds. :func:`load`, :func:`from_dict` and
:func:`from_yaml` load a spec with both kinds of check and report every problem at once; they are how a
spec is loaded for running, by ``wb.load_topology`` and by ``workbench topology validate``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from workbench.engine.parsers import PARSERS, POSTPROCESS, VERDICT_PARSERS
from workbench.engine.protocols import make_protocol
from workbench.engine.templating import templates
from workbench.rewards import VERIFIERS
from workbench.rewards.judge import JUDGE_PROMPTS
from workbench.topology import io
from workbench.topology.spec import AgentNode, DagNode, Flow, MapNode, Role, Topology
from workbench.topology.validate import Problem, at, unknown
from workbench.topology.validate import check as own_check
from workbench.topology.validate import validate as own_validate

# Variables every episode starts with; inside a routed or agent tool, its call's ``arguments`` too.
EPISODE_VARIABLES = frozenset({"question", "task", "arguments"})
PROTOCOLS = frozenset({"json_tool_call", "mcp_xml", "tags"})
# Names a node's bind expressions can read.
OUTPUT_VARIABLES = frozenset({"text", "parsed", "raw", "finish_reason", "format_error", "answer"})

_env = jinja2.Environment()
_env.filters.update(templates.filters)


def check(topology: Topology) -> list[Problem]:
    """Every problem in ``topology``: the spec's own (``workbench.topology.check``), then what it names
    from the registries."""
    return own_check(topology) + registry_problems(topology)


def validate(topology: Topology) -> Topology:
    """Return ``topology`` if valid, else raise ``TopologyError`` listing every problem :func:`check` finds."""
    return own_validate(topology, check)


def from_dict(data: Any, name: str = "topology") -> Topology:
    """Build a topology from plain data with every check (``workbench.topology.from_dict`` and the registries')."""
    return io.from_dict(data, name, checks=check)


def from_yaml(text: str) -> Topology:
    """Build a topology from YAML (or JSON) text with every check."""
    return io.from_yaml(text, checks=check)


def load(source: str | Path) -> Topology:
    """Load a topology by built-in name, or from a YAML/JSON file, with every check."""
    return io.load(source, checks=check)


def registry_problems(topology: Topology) -> list[Problem]:
    """The problems in what ``topology`` names from the registries, and in its templates and expressions."""
    problems: list[Problem] = []
    provided = _provided(topology)
    for name, role in topology.roles.items():
        base = at("roles", name)
        if role.parser is not None and role.parser not in PARSERS:
            problems.append(
                Problem(
                    f"{base}.parser",
                    unknown("parser", role.parser, PARSERS, f"known: {', '.join(sorted(PARSERS))}"),
                )
            )
        for i, step in enumerate(role.postprocess):
            if step not in POSTPROCESS:
                known = ", ".join(sorted(POSTPROCESS))
                problems.append(
                    Problem(
                        f"{base}.postprocess[{i}]",
                        unknown("post-processor", step, POSTPROCESS, f"known: {known}"),
                    )
                )
        for i, message in enumerate(role.messages):
            path = f"{base}.messages[{i}].content"
            for var in sorted(_variables(message.content, path, problems, expression=False) - provided):
                problems.append(
                    Problem(path, f"template variable '{var}' is provided by nothing; bind it in a flow node")
                )
        if role.prefill:
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
        base = at("tools", name)
        if tool.kind == "agent":
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
                        unknown("tool kind", tool.kind, kinds, f"known: agent, {', '.join(kinds)}"),
                    )
                )

    _check_flow("flow", topology.flow, provided, problems)
    for name, flow in topology.subflows.items():
        _check_flow(at("subflows", name), flow, provided, problems)
    return problems


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


def _check_reward(base: str, role: Role) -> list[Problem]:
    rule, out = role.reward, []
    if rule.verifier is not None and rule.verifier not in VERIFIERS:
        known = ", ".join(sorted(VERIFIERS))
        out.append(
            Problem(
                f"{base}.reward.verifier", unknown("verifier", rule.verifier, VERIFIERS, f"known: {known}")
            )
        )
    if rule.judge is not None and rule.judge not in JUDGE_PROMPTS:
        known = ", ".join(JUDGE_PROMPTS)
        out.append(
            Problem(
                f"{base}.reward.judge",
                unknown("judge prompt", rule.judge, JUDGE_PROMPTS, f"known: {known}"),
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


def _tool_kinds() -> list[str]:
    try:
        from workbench.tools import TOOL_KINDS
    except ImportError:  # tools not installed in this build: skip the check
        return []
    return sorted(TOOL_KINDS)


def _check_flow(where: str, flow: Flow, provided: set[str], problems: list[Problem]) -> None:
    for name, node in flow.nodes.items():
        base = at(f"{where}.nodes", name)
        if isinstance(node, DagNode):
            _variables(node.dag, f"{base}.dag", problems, expression=True)
        if isinstance(node, AgentNode):
            if node.protocol not in PROTOCOLS:
                problems.append(
                    Problem(
                        f"{base}.protocol",
                        unknown(
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
            for name_read in sorted(_variables(expr, path, problems, expression=True) - readable):
                problems.append(Problem(path, f"expression reads '{name_read}', which nothing provides"))
        for i, branch in enumerate(node.next):
            if branch.when is not None:
                path = f"{base}.next[{i}].when"
                for name_read in sorted(_variables(branch.when, path, problems, expression=True) - provided):
                    problems.append(Problem(path, f"condition reads '{name_read}', which nothing provides"))
    _variables(flow.answer, f"{where}.answer", problems, expression=False)


def _check_protocol(path: str, node: AgentNode) -> list[Problem]:
    """Options the node's protocol does not take, lacks, or cannot use (the engine builds it from them)."""
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
                unknown("tool", tool, node.tools, f"list it in the node's tools {node.tools}"),
            )
        )
    return out

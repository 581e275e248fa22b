"""The topology spec: roles, policies and flow of a multi-agent system, as plain typed data.

A spec is what the editor draws, the engine runs, the trainer reads and the reports key on.
It round-trips through YAML/JSON and exports a JSON Schema (``Topology.model_json_schema()``).
Templates are Jinja2; conditions and bindings are Jinja2 expressions evaluated over the
episode's variables (``question``, ``task`` and whatever earlier nodes bound).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

END = "end"
# How deeply params and options may nest: a spec is stored with every run as JSON.
MAX_DEPTH = 32
MAX_VALUES = 100_000  # values in one field (YAML aliases can repeat a list a billion times in a few lines)
_SCALARS = (str, bool, int, type(None))


class PlainDataError(ValueError):
    """A value in params or options that YAML/JSON cannot hold; ``where`` is its path below the field."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it is what YAML and JSON hold (mappings with string keys, lists, strings, finite
    numbers, booleans, null) nested at most ``MAX_DEPTH`` deep, ``MAX_VALUES`` in all; tuples become
    lists. Walked without recursion, so garbage nested thousands deep is refused, not a stack overflow."""
    out: dict[str, Any] = dict.fromkeys(value)  # keys in their order; values filled in as they are walked
    todo: list[tuple[Any, Any, Any, str, int]] = [
        (out, key, item, _below("", key), 1) for key, item in value.items()
    ]
    seen = 0
    while todo:
        parent, key, item, path, depth = todo.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise PlainDataError(path, f"more than {MAX_VALUES} values in one field")
        if depth > MAX_DEPTH:
            raise PlainDataError(path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PlainDataError(path, f"{item} is not a finite number (JSON cannot hold it)")
            parent[key] = item
        elif isinstance(item, _SCALARS):
            parent[key] = item
        elif isinstance(item, dict):
            for k in item:
                if not isinstance(k, str):
                    raise PlainDataError(path, f"the key {k!r} is not a string")
            parent[key] = copy = dict.fromkeys(item)
            todo += [(copy, k, v, _below(path, k), depth + 1) for k, v in item.items()]
        elif isinstance(item, list | tuple):
            parent[key] = copy = [None] * len(item)
            todo += [(copy, i, v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item)]
        else:
            raise PlainDataError(
                path,
                f"a value of type {type(item).__name__} is not plain data "
                "(use null, true/false, numbers, strings, lists and mappings)",
            )
    return out


def _below(path: str, key: str) -> str:
    plain = key and key.isprintable() and not any(c in key for c in ".[]'\" ") and key.strip() == key
    return f"{path}.{key}".lstrip(".") if plain else f"{path}[{key!r}]"


# Settings and options: plain data, as a YAML or JSON file would hold them.
PlainData = Annotated[dict[str, Any], AfterValidator(_plain)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Spec):
    """How a role's completions are sampled."""

    max_tokens: int = Field(256, ge=1, description="Most tokens one call may generate.")
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(
        None,
        ge=1,
        description="Sample among the k most likely tokens; unset: the whole vocabulary (vLLM's -1).",
    )


class Message(_Spec):
    """One chat message of a role's prompt; ``content`` is a Jinja2 template."""

    role: Literal["system", "user", "assistant"]
    content: str


class RewardRule(_Spec):
    """How a role's calls are rewarded and grouped for advantages: the role's training rule."""

    kind: Literal["outcome", "answer", "verdict", "parent", "none"] = Field(
        "outcome",
        description=(
            "outcome: the episode's final answer checked against the reference, broadcast to this role (MARS); "
            "answer: this call's own answer checked (MarsRL Solver, Corrector); verdict: 1 when this call's "
            "verdict equals the true correctness of the solution it judged (MarsRL Verifier); parent: the "
            "reward and advantage of the call that invoked it (MATPO workers); none: no reward, never trained."
        ),
    )
    verifier: str | None = Field(None, description="Verifier name; None uses the task's own verifier.")
    judge: str | None = Field(
        None,
        description=(
            "An LLM judge prompt (hle, simpleqa, hira_qa, hira_webwalker, mas_orchestra) that scores the answer "
            "instead of the verifier (outcome and answer rules); the rollout needs a judge backend."
        ),
    )
    format_weight: float = Field(
        0.0, ge=0.0, le=1.0, description="Reward = (1 - w) * accuracy + w * format validity (MATPO: 0.1)."
    )
    group_by: Literal["task", "input"] = Field(
        "task",
        description="Advantage groups: per task and role, or per role and input (the call it consumed; MarsRL).",
    )
    balance: Literal["none", "random", "advantage_weighted", "verdicts"] = Field(
        "none",
        description=(
            "After advantages: resample this role to exactly G samples per task (MARS's System 1): random "
            "down/up-sampling, or drawn in proportion to |advantage|; or, for a verdict role, keep as many "
            "advantage groups judging correct solutions as wrong ones (verdicts)."
        ),
    )


class Role(_Spec):
    """An agent: its prompt, the policy that plays it, how it samples and how its output is read."""

    description: str = ""
    messages: list[Message] = Field(description="Chat prompt; contents are Jinja2 templates.")
    policy: str = Field("base", description="Which policy (model or adapter) generates this role.")
    sampling: Sampling = Field(default_factory=Sampling)
    parser: str | None = Field(None, description="Name of the output parser (see workbench.engine.parsers).")
    postprocess: list[str] = Field(
        default_factory=list, description="Text transforms applied before other roles see the output."
    )
    trainable: bool = Field(True, description="Whether this role's tokens train its policy.")
    mode: Literal["chat", "raw"] = Field(
        "chat", description="chat: turns go through the chat template; raw: text is appended (HiRA planner)."
    )
    prefill: str = Field(
        "",
        description=(
            "raw mode: Jinja2 text the reply starts with, part of the prompt and never trained "
            "(a few-shot transcript's next 'Question: ...' line, so a small model continues the pattern)."
        ),
    )
    stop: list[str] = Field(default_factory=list, description="Extra stop strings for this role.")
    reward: RewardRule = Field(default_factory=RewardRule, description="How this role is rewarded.")


class Route(_Spec):
    """Send a tool's raw output through a role (MARS's System 1) instead of straight back."""

    via: str = Field(description="Role that distils the tool output (one stateless call per bin).")
    capacity: int = Field(2048, ge=1, description="Bin capacity in tokens for First-Fit-Decreasing packing.")
    variable: str = Field("documents", description="Template variable holding one bin's text.")


class Tool(_Spec):
    """A tool a role may call: a backend kind with options, or an agent (a subflow) exposed as a tool."""

    kind: str = Field(description="Backend kind (bm25, python, web_search, ...) or 'agent'.")
    description: str = ""
    options: PlainData = Field(default_factory=dict, description="Options for the tool backend.")
    subflow: str | None = Field(None, description="For kind 'agent': the subflow that runs as this tool.")
    inputs: dict[str, str] = Field(
        default_factory=dict,
        description="For kind 'agent': subflow variables from expressions over the call's arguments.",
    )
    outputs: dict[str, str] = Field(
        default_factory=dict,
        description="For kind 'agent': caller variables to set from the subflow's final variables (e.g. memory).",
    )
    truncate: int | None = Field(None, ge=1, description="Cut the result to this many characters.")
    route: Route | None = None
    timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="Seconds before the call is recorded as timed out."
    )


class Branch(_Spec):
    """One outgoing edge: taken when ``when`` (a Jinja2 expression) is true, or always if empty."""

    goto: str
    when: str | None = None


class Select(_Spec):
    """Grouped agentic rollout (MarsRL): pick k upstream outputs, then sample a group for each.

    Applies where a node is reached by many branches of one task (rollouts run with a group size):
    of the upstream outputs arriving here, ``k`` are chosen by ``strategy`` and each is sampled
    ``samples`` times, so every group shares one input. Branches that arrive here but are not
    chosen stop; a node no branch reaches (say, no Verifier flagged an error) ends the task early.
    """

    k: int = Field(2, ge=1, description="Upstream outputs to carry forward per task.")
    samples: int | None = Field(
        None, ge=1, description="Samples per chosen input; None: the run's group size."
    )
    strategy: Literal["random", "balanced", "adaptive"] = Field(
        "adaptive",
        description=(
            "random: uniform; balanced: as many upstream rewards 1 as 0; adaptive: prefer upstream outputs "
            "whose reward equals `prefer`, then fill with the others."
        ),
    )
    prefer: Literal[0, 1] = Field(
        0,
        description="For adaptive: the upstream reward preferred (Verifier: 0, wrong solutions; Corrector: 1).",
    )


class CallNode(_Spec):
    """Call a role, bind variables from its output, then follow the first branch that matches."""

    call: str = Field(description="Role to call.")
    bind: dict[str, str] = Field(
        default_factory=dict,
        description="Variables to set from the output: name -> expression over text, parsed, raw.",
    )
    next: list[Branch] = Field(default_factory=lambda: [Branch(goto=END)])
    select: Select | None = Field(
        None, description="Grouped rollout: fan out over k chosen upstream outputs."
    )


class AgentNode(_Spec):
    """A multi-turn agent: the role generates, its tool calls run, results return, until it answers.

    The whole loop is one call (one training sample) whose completion interleaves the role's turns
    (trainable) with inserted tool results (masked); routed and agent tools add child calls.
    """

    agent: str = Field(description="Role that acts.")
    tools: list[str] = Field(default_factory=list, description="Tools it may call.")
    protocol: str = Field(
        "json_tool_call", description="How calls and answers are written (engine.protocols)."
    )
    protocol_options: PlainData = Field(default_factory=dict)
    max_turns: int = Field(10, ge=1, description="Bound on generations in the loop.")
    max_tool_calls: int | None = Field(
        None, ge=0, description="Bound on tool calls; reaching it ends the loop."
    )
    refuse_duplicates: str | None = Field(
        None, description="If set, a repeated identical call is not run and this text is returned instead."
    )
    result_role: Literal["user", "tool"] = Field("user", description="Chat role that carries tool results.")
    final_prompt: str | None = Field(
        None, description="Jinja2 text inserted after the loop for one last turn without tools (a summary)."
    )
    final_when: Literal["always", "limit"] = Field(
        "always", description="Ask for the final turn always, or only when the turn limit cut the loop."
    )
    bind: dict[str, str] = Field(default_factory=dict)
    next: list[Branch] = Field(default_factory=lambda: [Branch(goto=END)])
    select: Select | None = Field(
        None, description="Grouped rollout: fan out over k chosen upstream outputs."
    )


class MapNode(_Spec):
    """Fan out: run a role once per item of a list, concurrently, and collect the outputs."""

    map: str = Field(description="Role to call for every item.")
    over: str = Field(description="Expression giving the items (a list, or a number n for n samples).")
    item: str = Field("item", description="Variable name of the current item inside the role's templates.")
    into: str = Field(description="Variable receiving the list of outputs (post-processed texts).")
    bind: dict[str, str] = Field(
        default_factory=dict, description="Variables from text (list) and parsed (list)."
    )
    next: list[Branch] = Field(default_factory=lambda: [Branch(goto=END)])


class DagNode(_Spec):
    """Run a multi-agent graph that a role emitted (MAS-Orchestra): agents in topological order.

    ``dag`` evaluates to a parsed graph (the ``mas_xml`` parser's output: agents with id, name,
    input and roles; edges). Each agent runs the subflow its name maps to, with ``task_info`` (the
    original task plus its sub-task, ``${ID}`` replaced by upstream results), ``sub_task`` (the
    sub-task alone, empty for the whole task) and ``roles``; the sink's answer lands in ``into``.
    Agents of one topological level run concurrently.
    """

    dag: str = Field(description="Expression giving the parsed graph.")
    agents: dict[str, str] = Field(description="Agent name (as the graph writes it) -> subflow.")
    into: str = Field("result", description="Variable receiving the sink agent's answer.")
    next: list[Branch] = Field(default_factory=lambda: [Branch(goto=END)])


def _node_kind(value: Any) -> str:
    # a value that is neither a mapping nor a node is read as a call node, whose validation names the problem
    keys = value if isinstance(value, dict) else getattr(value, "__dict__", {})
    for kind in ("agent", "map", "dag"):
        if kind in keys:
            return kind
    return "call"


Node = Annotated[
    Annotated[CallNode, Tag("call")]
    | Annotated[AgentNode, Tag("agent")]
    | Annotated[MapNode, Tag("map")]
    | Annotated[DagNode, Tag("dag")],
    Discriminator(_node_kind),
]


class Flow(_Spec):
    """The graph of nodes an episode walks, from ``start`` until it reaches ``end``."""

    start: str
    nodes: dict[str, Node]
    max_calls: int = Field(16, ge=1, description="Bound on calls per episode (every loop needs one).")
    answer: str = Field("", description="Jinja2 template giving the episode's final answer.")
    inputs: list[str] = Field(default_factory=list, description="Variables a subflow receives.")


class Policy(_Spec):
    """A trainable or frozen generator: the shared base model by default, or a LoRA adapter of it."""

    model: str | None = Field(None, description="Model name; None means the run's base model.")
    adapter: str | None = Field(
        None, description="A LoRA adapter directory served on the base model (vLLM multi-LoRA); one per role."
    )


class Topology(_Spec):
    """A whole multi-agent system."""

    name: str
    description: str = ""
    params: PlainData = Field(
        default_factory=dict,
        description="Settings every template can read (e.g. dom: high); overridable per run.",
    )
    policies: dict[str, Policy] = Field(default_factory=lambda: {"base": Policy()})
    roles: dict[str, Role]
    tools: dict[str, Tool] = Field(default_factory=dict)
    flow: Flow
    subflows: dict[str, Flow] = Field(
        default_factory=dict, description="Flows run with a fresh context, e.g. an agent exposed as a tool."
    )


def with_sampling(topology: Topology, **overrides: Any) -> Topology:
    """A copy of ``topology`` whose roles all sample with ``overrides`` (temperature, top_p, max_tokens)."""
    roles = {
        name: role.model_copy(update={"sampling": role.sampling.model_copy(update=overrides)})
        for name, role in topology.roles.items()
    }
    return topology.model_copy(update={"roles": roles})

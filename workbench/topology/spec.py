"""The topology spec: roles, policies and flow of a multi-agent system, as plain typed data.

A spec is what the editor draws, the engine runs, the trainer reads and the reports key on.
It round-trips through YAML/JSON and exports a JSON Schema (``Topology.model_json_schema()``).
Templates are Jinja2; conditions and bindings are Jinja2 expressions evaluated over the
episode's variables (``question``, ``task`` and whatever earlier nodes bound).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

END = "end"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Spec):
    """How a role's completions are sampled."""

    max_tokens: int = Field(256, ge=1, description="Most tokens one call may generate.")
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")


class Message(_Spec):
    """One chat message of a role's prompt; ``content`` is a Jinja2 template."""

    role: Literal["system", "user", "assistant"]
    content: str


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


class Branch(_Spec):
    """One outgoing edge: taken when ``when`` (a Jinja2 expression) is true, or always if empty."""

    goto: str
    when: str | None = None


class CallNode(_Spec):
    """Call a role, bind variables from its output, then follow the first branch that matches."""

    call: str = Field(description="Role to call.")
    bind: dict[str, str] = Field(
        default_factory=dict,
        description="Variables to set from the output: name -> expression over text, parsed, raw.",
    )
    next: list[Branch] = Field(default_factory=lambda: [Branch(goto=END)])


class Flow(_Spec):
    """The graph of nodes an episode walks, from ``start`` until it reaches ``end``."""

    start: str
    nodes: dict[str, CallNode]
    max_calls: int = Field(16, ge=1, description="Bound on calls per episode (every loop needs one).")
    answer: str = Field("", description="Jinja2 template giving the episode's final answer.")


class Policy(_Spec):
    """A trainable or frozen generator: the shared base model by default."""

    model: str | None = Field(None, description="Model name; None means the run's base model.")


class Topology(_Spec):
    """A whole multi-agent system."""

    name: str
    description: str = ""
    policies: dict[str, Policy] = Field(default_factory=lambda: {"base": Policy()})
    roles: dict[str, Role]
    flow: Flow

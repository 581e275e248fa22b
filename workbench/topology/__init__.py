"""Topology specs: the one description of a multi-agent system that every part of the workbench reads."""

from workbench.topology import diagram
from workbench.topology.io import from_dict, from_yaml, json_schema, library, load, to_dict, to_json, to_yaml
from workbench.topology.spec import (
    END,
    AgentNode,
    Branch,
    CallNode,
    DagNode,
    Flow,
    MapNode,
    Message,
    Policy,
    Role,
    Route,
    Sampling,
    Tool,
    Topology,
)
from workbench.topology.validate import Problem, TopologyError, check, validate

# A Topology shows as its diagram in a notebook. The hooks are set where spec and diagram meet: the spec is
# plain data and imports no drawing, the diagram imports the spec.
Topology._repr_svg_ = diagram.to_svg
Topology._repr_html_ = diagram.notebook_html

__all__ = [
    "END",
    "AgentNode",
    "Branch",
    "CallNode",
    "DagNode",
    "Flow",
    "MapNode",
    "Message",
    "Policy",
    "Problem",
    "Role",
    "Route",
    "Sampling",
    "Tool",
    "Topology",
    "TopologyError",
    "check",
    "from_dict",
    "from_yaml",
    "json_schema",
    "library",
    "load",
    "to_dict",
    "to_json",
    "to_yaml",
    "validate",
]

"""Topology specs: the one description of a multi-agent system that every part of the workbench reads."""

from workbench.topology.io import from_dict, from_yaml, json_schema, library, load, to_dict, to_json, to_yaml
from workbench.topology.spec import END, Branch, CallNode, Flow, Message, Policy, Role, Sampling, Topology
from workbench.topology.validate import Problem, TopologyError, check, validate

__all__ = [
    "END",
    "Branch",
    "CallNode",
    "Flow",
    "Message",
    "Policy",
    "Problem",
    "Role",
    "Sampling",
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

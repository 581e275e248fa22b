"""Reading and writing topology specs (YAML/JSON), and the built-in library of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workbench.topology.spec import Topology
from workbench.topology.validate import Problem, TopologyError, problems_from_pydantic, validate

LIBRARY = Path(__file__).parent / "library"


def library() -> list[str]:
    """Names of the built-in topologies."""
    return sorted(p.stem for p in LIBRARY.glob("*.yaml"))


def from_dict(data: Any, name: str = "topology") -> Topology:
    """Build and validate a topology from plain data."""
    if not isinstance(data, dict):
        raise TopologyError(
            name, [Problem("(top level)", "a topology is a mapping with name, roles and flow")]
        )
    try:
        topology = Topology.model_validate(data)
    except ValidationError as e:
        raise TopologyError(str(data.get("name", name)), problems_from_pydantic(e)) from None
    return validate(topology)


def load(source: str | Path) -> Topology:
    """Load a topology by built-in name, or from a YAML/JSON file."""
    path = Path(source)
    if not path.exists() and str(source) in library():
        path = LIBRARY / f"{source}.yaml"
    if not path.exists():
        raise FileNotFoundError(
            f"no topology '{source}': give a YAML/JSON file or one of the built-ins: {', '.join(library())}"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TopologyError(path.name, [Problem("(file)", f"not valid YAML: {e}")]) from None
    return from_dict(data, name=path.stem)


def to_dict(topology: Topology) -> dict[str, Any]:
    return topology.model_dump(mode="json", exclude_defaults=False)


def to_yaml(topology: Topology) -> str:
    return yaml.safe_dump(to_dict(topology), sort_keys=False, allow_unicode=True, width=100)


def from_yaml(text: str) -> Topology:
    return from_dict(yaml.safe_load(text))


def to_json(topology: Topology) -> str:
    return json.dumps(to_dict(topology), indent=2)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a topology (what the visual editor generates its forms from)."""
    return Topology.model_json_schema()

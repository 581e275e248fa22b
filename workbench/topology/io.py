"""Reading and writing topology specs (YAML/JSON), and the built-in library of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workbench.topology.spec import Topology
from workbench.topology.validate import (
    Checks,
    Problem,
    TopologyError,
    problems_despite_types,
    problems_from_pydantic,
    validate,
)
from workbench.yaml_dumper import SafeDumper

LIBRARY = Path(__file__).parent / "library"


def library() -> list[str]:
    """Names of the built-in topologies."""
    return sorted(p.stem for p in LIBRARY.glob("*.yaml"))


def from_dict(data: Any, name: str = "topology", *, checks: Checks | None = None) -> Topology:
    """Build and validate a topology from plain data: its types, then ``checks`` (default: the spec's own,
    ``check``; ``workbench.engine.spec_checks`` adds the registries')."""
    if not isinstance(data, dict):
        raise TopologyError(
            name, [Problem("(top level)", "a topology is a mapping with name, roles and flow")]
        )
    try:
        topology = Topology.model_validate(data)
    except ValidationError as e:
        given = data.get("name")  # the spec's own name if it has a readable one (it may be garbage)
        title = given if isinstance(given, str) and given.strip() else name
        problems = problems_from_pydantic(e) + problems_despite_types(data, e, checks=checks)  # all at once
        raise TopologyError(title if len(title) <= 100 else title[:100] + "...", problems) from None
    return validate(topology, checks)


def load(source: str | Path, *, checks: Checks | None = None) -> Topology:
    """Load a topology by built-in name, or from a YAML/JSON file (validated as :func:`from_dict` does)."""
    path = Path(source)
    if not path.exists() and str(source) in library():
        path = LIBRARY / f"{source}.yaml"
    if not path.exists():
        raise FileNotFoundError(
            f"no topology '{source}': give a YAML/JSON file or one of the built-ins: {', '.join(library())}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TopologyError(path.name, [Problem("(file)", f"not UTF-8 text: {e}")]) from None
    except IsADirectoryError:
        raise TopologyError(path.name, [Problem("(file)", "a directory, not a YAML/JSON file")]) from None
    return _parse(text, path.stem, path.name, checks)


def _parse(text: str, name: str, source: str, checks: Checks | None) -> Topology:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(source, [Problem("(file)", f"not valid YAML: {e}")]) from None
    except RecursionError:  # PyYAML composes recursively: thousands of nested brackets overflow it
        raise TopologyError(source, [Problem("(file)", "not valid YAML: nested too deeply")]) from None
    return from_dict(data, name=name, checks=checks)


def to_dict(topology: Topology) -> dict[str, Any]:
    return topology.model_dump(mode="json", exclude_defaults=False)


def to_yaml(topology: Topology) -> str:
    return yaml.dump(to_dict(topology), Dumper=SafeDumper, sort_keys=False, allow_unicode=True, width=100)


def from_yaml(text: str, *, checks: Checks | None = None) -> Topology:
    """Build and validate a topology from YAML (or JSON) text; bad YAML is a ``TopologyError`` too."""
    return _parse(text, "topology", "topology", checks)


def to_json(topology: Topology) -> str:
    return json.dumps(to_dict(topology), indent=2)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a topology (what the visual editor generates its forms from)."""
    return Topology.model_json_schema()

"""PyYAML's safe dumper with one mend: a string holding U+0085 (NEL) is written double-quoted, where YAML
escapes it. Written raw, as PyYAML does otherwise, it reads back as a line break folded into a space."""

from __future__ import annotations

import yaml


class SafeDumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "\x85" in value else None)


SafeDumper.add_representer(str, _represent_str)

"""The TopologyEditor's inspector forms: generated from the spec's JSON Schema, with choice lists from the registries.

``entry_form`` builds the widgets for one entry (a role, tool, policy or flow step; ``settings_form`` for the
topology's own and a flow's settings): plain fields as inputs, the always-present nested ones (a role's
``sampling`` and ``reward``) flattened into their own fields, other nested data as YAML. Fields that name
something from a registry are choice lists read when the form opens, so a notebook's own plugins appear:
parsers and post-processors, verifiers, judge prompts, tool kinds, protocols, and models for a policy
(the local registry; any other name can be typed). Fields that name parts of the spec (a step's role, an
agent's tools, a role's policy, an agent tool's subflow, a flow's start) list those parts.

Every field widget carries the CSS class ``wb-field-<path>`` (``wb-field-sampling-max_tokens``), which the
browser tests use; ``read`` turns the widgets back into the entry's data.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

import panel as pn
import yaml

from workbench.topology import json_schema

NONE = "(none)"
#: Fields shown as multi-line text.
LONG_TEXT = {"prefill", "final_prompt", "answer", "refuse_duplicates", "over", "dag"}
#: Nested models flattened into their own fields (always present, so never None).
FLATTENED = {"Sampling", "RewardRule"}


@cache
def _schema() -> dict:
    return json_schema()


def registries() -> dict[str, list[str]]:
    """Names the spec may take from the registries, plugins included (read now, not cached)."""
    from workbench.engine.parsers import PARSERS, POSTPROCESS
    from workbench.engine.spec_checks import PROTOCOLS
    from workbench.rewards import VERIFIERS
    from workbench.rewards.judge import JUDGE_PROMPTS

    try:
        from workbench.tools import TOOL_KINDS

        tool_kinds = sorted(TOOL_KINDS)
    except ImportError:  # tools not installed: any name can be typed
        tool_kinds = []
    return {
        "parsers": sorted(PARSERS),
        "postprocess": sorted(POSTPROCESS),
        "verifiers": sorted(VERIFIERS),
        "judges": list(JUDGE_PROMPTS),
        "tool_kinds": ["agent", *tool_kinds],
        "protocols": sorted(PROTOCOLS),
        "models": models(),
    }


def registries_signature() -> tuple[int, ...]:
    """How many names each registry holds (a form's choices change when a notebook registers more)."""
    from workbench.engine.parsers import PARSERS, POSTPROCESS
    from workbench.rewards import VERIFIERS
    from workbench.rewards.judge import JUDGE_PROMPTS

    tools = sys.modules.get("workbench.tools")
    return (
        len(PARSERS),
        len(POSTPROCESS),
        len(VERIFIERS),
        len(JUDGE_PROMPTS),
        len(getattr(tools, "TOOL_KINDS", ())),
    )


def models() -> list[str]:
    """The local registry's models (built-in and cached); a policy may name any other model too."""
    from workbench.models.registry import BUILTIN_MODELS

    names = list(BUILTIN_MODELS)
    try:
        from workbench.models.registry import list_models

        names += [m.name for m in list_models() if m.name not in names]
    except Exception:  # noqa: BLE001 - an unreadable cache still leaves the built-in names
        pass
    return names


def _css(path: tuple[str, ...]) -> list[str]:
    return [f"wb-field-{'-'.join(path)}"]


def _optional(schema: dict) -> dict:
    """A property's schema with ``anyOf [X, null]`` reduced to X, marked optional."""
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(options) == 1 and len(schema.get("anyOf", [])) == 2:
        return {**options[0], "default": schema.get("default"), "optional": True}
    return schema


def _ref(schema: dict) -> str | None:
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else None


@dataclass
class Field:
    """A form field: its widget, what it offers and how its value is shown and read back."""

    widget: pn.widgets.Widget
    kind: str  # select, multi, free, text, integer, number, boolean, yaml
    default: Any = None  # the schema's default, shown where the entry has no value
    optional: bool = False  # a select offering (none)
    empty: Any = None  # what an empty YAML text means ({} for a mapping, [] for a list)

    def set(self, value: Any, options: list[str] | None = None) -> None:
        """Show ``value`` (the schema default where None and there is one), offering ``options``."""
        widget = self.widget
        if self.kind == "select":
            choices = ({NONE: ""} if self.optional else {}) | {str(o): o for o in options or []}
            if value is not None and value not in choices.values():
                choices[f"{value} (unknown)"] = (
                    value  # what the spec says stays, even a name nothing registers
                )
            if value is None:
                value = "" if self.optional else next(iter(choices.values()), "")
            widget.param.update(options=choices, value=value)
        elif self.kind == "multi":
            widget.param.update(
                options=list(dict.fromkeys([*(options or []), *(value or [])])), value=list(value or [])
            )
        elif self.kind in ("free", "text"):
            widget.param.update(value=value or "", value_input=value or "")
            if self.kind == "free":
                widget.options = list(options or [])
        elif self.kind == "yaml":
            shown = (
                ""
                if value in (None, {}, [])
                else yaml.safe_dump(value, sort_keys=False, allow_unicode=True).strip()
            )
            widget.param.update(value=shown, value_input=shown)
        elif self.kind == "boolean":
            widget.value = bool(value)
        else:
            widget.value = value

    def read(self) -> Any:
        value = typed(self.widget)
        if self.kind == "yaml":
            return yaml.safe_load(value) if value.strip() else copy.deepcopy(self.empty)
        if self.kind == "select" and value == "" and self.optional:
            return None
        return value


def text(label: str, value: str, css: list[str], long: bool = False, **params: Any) -> pn.widgets.Widget:
    """A text input that reads back what is typed in it, entered or not (``typed``)."""
    kind = pn.widgets.TextAreaInput if long else pn.widgets.TextInput
    value = value or ""
    return kind(label=label, value=value, value_input=value, css_classes=css, **params)


def _field(path: tuple[str, ...], schema: dict, choice: tuple | None) -> Field:
    """An empty field for the property ``schema`` at ``path`` (``choice``: its choice list's kind, if any)."""
    label, css = ".".join(path), _css(path)
    schema = _optional(schema)
    optional, default = bool(schema.get("optional")), schema.get("default")
    if choice is not None:
        if choice[0] == "multi":
            return Field(pn.widgets.MultiChoice(label=label, options=[], css_classes=css), "multi", default)
        if choice[0] == "free":
            widget = pn.widgets.AutocompleteInput(
                label=label, options=[], restrict=False, min_characters=0, css_classes=css,
                placeholder=choice[2] if len(choice) > 2 else "",
            )  # fmt: skip
            return Field(widget, "free", default)
        return Field(
            pn.widgets.Select(label=label, css_classes=css),
            "select",
            default,
            optional or choice[0] == "optional",
        )
    kind = schema.get("type")
    if "enum" in schema:
        return Field(pn.widgets.Select(label=label, css_classes=css), "select", default, optional)
    if kind == "string":
        long = path[-1] in LONG_TEXT
        return Field(text(label, "", css, long=long, **({"height": 80} if long else {})), "text", default)
    if kind == "integer":
        return Field(pn.widgets.IntInput(label=label, css_classes=css), "integer", default)
    if kind == "number":
        return Field(pn.widgets.FloatInput(label=label, css_classes=css), "number", default)
    if kind == "boolean":
        return Field(pn.widgets.Checkbox(label=label, css_classes=css), "boolean", default)
    height = 140 if path[-1] == "messages" else 80
    empty = {} if kind == "object" and not optional else [] if kind == "array" and not optional else None
    return Field(text(f"{label} (YAML)", "", css, long=True, height=height), "yaml", default, empty=empty)


class Form:
    """The fields of one kind of entry (a schema definition), made once and filled with any entry of that kind:
    the inspector keeps one per kind and only changes what its widgets show."""

    def __init__(
        self, definition: str, choices: dict[tuple[str, ...], Any], skip: set[str] = frozenset()
    ) -> None:
        self.definition, self.skip = definition, set(skip)
        self.fields: dict[tuple[str, ...], Field] = {}
        self._options = {path: list(choice[1]) for path, choice in choices.items()}
        self._enums: dict[tuple[str, ...], list] = {}
        self._build(definition, choices, ())

    def _build(self, definition: str, choices: dict, prefix: tuple[str, ...]) -> None:
        for name, sub in _schema()["$defs"][definition].get("properties", {}).items():
            path = (*prefix, name)
            if not prefix and name in self.skip:
                continue
            if _ref(sub) in FLATTENED:
                self._build(_ref(sub), choices, path)
                continue
            self.fields[path] = _field(path, sub, choices.get(path))
            enum = _optional(sub).get("enum")
            if enum is not None and path not in choices:
                self._enums[path] = list(enum)

    def fill(self, entry: dict, choices: dict[tuple[str, ...], Any]) -> Form:
        """Show ``entry`` (schema defaults where it has no value), offering the choice lists ``choices``."""
        for path, field in self.fields.items():
            value: Any = entry
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            present = _has(entry, path)
            options = list(choices[path][1]) if path in choices else self._enums.get(path)
            field.set(value if present else field.default, options)
        return self

    @property
    def widgets(self) -> list[pn.widgets.Widget]:
        return [f.widget for f in self.fields.values()]

    def read(self) -> dict[str, Any]:
        """The entry data the fields hold (YAML parsed; an empty optional field is None)."""
        out: dict[str, Any] = {}
        for path, field in self.fields.items():
            target = out
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = field.read()
        return out


def _has(entry: dict, path: tuple[str, ...]) -> bool:
    value: Any = entry
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def form_for(definition: str, entry: dict, choices: dict, skip: set[str] = frozenset()) -> Form:
    """A new form for ``definition`` showing ``entry``."""
    return Form(definition, choices, skip).fill(entry, choices)


def typed(widget: pn.widgets.Widget) -> Any:
    """A widget's value; for a text input what it holds now, typed but not yet entered included."""
    if isinstance(widget, pn.widgets.TextInput | pn.widgets.TextAreaInput | pn.widgets.AutocompleteInput):
        return widget.value_input if widget.value_input is not None else widget.value
    return widget.value


def entry_choices(kind: str, spec: dict) -> dict[tuple[str, ...], Any]:
    """The choice lists of an entry's form: from the registries and from the spec's own parts."""
    found = registries()
    roles = list(spec.get("roles") or {})
    tools = list(spec.get("tools") or {})
    if kind == "role":
        return {
            ("parser",): ("optional", found["parsers"]),
            ("postprocess",): ("multi", found["postprocess"]),
            ("policy",): ("required", list(spec.get("policies") or {"base": {}})),
            ("reward", "verifier"): ("optional", found["verifiers"]),
            ("reward", "judge"): ("optional", found["judges"]),
        }
    if kind == "tool":
        return {
            ("kind",): ("required", found["tool_kinds"]),
            ("subflow",): ("optional", list(spec.get("subflows") or {})),
        }
    if kind == "policy":
        return {("model",): ("free", found["models"], "the run's base model")}
    if kind in ("call", "agent", "map"):
        out: dict[tuple[str, ...], Any] = {(kind,): ("required", roles)}
        if kind == "agent":
            out[("tools",)] = ("multi", tools)
            out[("protocol",)] = ("required", found["protocols"])
        return out
    return {}

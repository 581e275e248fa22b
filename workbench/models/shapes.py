"""Named model shapes: published architectures as transformers configs, with no weights and no hub.

``workbench/models/shapes/<name>.json`` hold the architecture fields (layers, widths, heads, vocabulary,
experts) of the models the papers train: Qwen2.5-0.5B/1.5B/7B, Qwen3-14B, Qwen3-30B-A3B (a mixture of
experts), SmolLM2-135M, and ``qwen2-mini``, a small shape of the Qwen2.5 family for CPU tests. Memory,
FLOPs and throughput depend on the shape, not on the weights' values, so a shape is all they need.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHAPES = Path(__file__).parent / "shapes"


def names() -> list[str]:
    """The named shapes."""
    return sorted(p.stem for p in SHAPES.glob("*.json"))


def config(name: str) -> Any:
    """The transformers config of shape ``name``."""
    from transformers import AutoConfig

    path = SHAPES / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(names())}")
    data = json.loads(path.read_text())
    return AutoConfig.for_model(data.pop("model_type"), **data)


def model_config(model: Any) -> Any:
    """A transformers config for ``model``: a config object as it is, a named shape (case-insensitive), or
    a model the local registry resolves (``tiny``, a checkpoint directory); ``ValueError`` when none."""
    if not isinstance(model, str):
        return model
    if model.lower() in names():
        return config(model.lower())
    from transformers import AutoConfig

    from workbench.models.registry import resolve

    try:
        return AutoConfig.from_pretrained(resolve(model))
    except Exception as error:  # noqa: BLE001 - unknown name, hub id offline, unreadable directory
        raise ValueError(
            f"no model config for {model!r}: {error}; named shapes: {', '.join(names())}"
        ) from error

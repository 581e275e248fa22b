"""A Jupyter-first research workbench for multi-agent LLM systems trained with reinforcement learning.

``import workbench as wb`` is cheap: heavy parts (torch, transformers, the store) load on first use.

    topology = wb.load_topology("marsrl")
    tasks = wb.generate_tasks("arithmetic", n=8, seed=0)
    result = wb.rollout(topology, tasks, model="smollm2-135m")
    engine = wb.start_engine("smollm2-135m", backend="vllm")   # started once: wb.rollout(..., backend=engine), cell after cell
    run = wb.train("marsrl", config=wb.TrainConfig(steps=20))   # returns at once; run.wait()
    wb.compare(["runs/a", "runs/b"])    # config diff, seed groups, curves, held-out outcomes (widgets.Compare draws it)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    # loading with every check, the registries' included (workbench.topology alone checks the spec itself)
    "load_topology": ("workbench.engine.spec_checks", "load"),
    "topology_from_yaml": ("workbench.engine.spec_checks", "from_yaml"),
    "topology_from_dict": ("workbench.engine.spec_checks", "from_dict"),
    "validate_topology": ("workbench.engine.spec_checks", "validate"),
    "Topology": ("workbench.topology", "Topology"),
    "generate_tasks": ("workbench.tasks", "generate"),
    "load_tasks": ("workbench.tasks", "load_tasks"),
    "Task": ("workbench.tasks", "Task"),
    "resolve_model": ("workbench.models", "resolve"),
    "rollout": ("workbench.runs", "rollout"),
    "start_engine": ("workbench.backends.warm", "start_engine"),
    "replay": ("workbench.analysis.replay", "replay"),
    "replay_calls": ("workbench.analysis.replay_batch", "replay_calls"),
    "graph_signals": ("workbench.analysis.signals", "graph_signals"),
    "compare": ("workbench.analysis.compare", "Comparison"),
    "topology_diagram": ("workbench.analysis.signals", "topology_diagram"),
    "train": ("workbench.training", "train"),
    "resume": ("workbench.training", "resume"),
    "TrainConfig": ("workbench.rl.config", "TrainConfig"),
    "RunReader": ("workbench.store", "RunReader"),
    "list_runs": ("workbench.store", "list_runs"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'workbench' has no attribute '{name}'") from None
    return getattr(importlib.import_module(module), attr)

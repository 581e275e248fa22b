"""Trained weights and AdamW state as ``torch.distributed.checkpoint`` (DCP) shards.

Every rank of a trainer group calls ``save_shards``/``load_shards`` on the same directory (a lone trainer
calls them with no process group): each writes the shards it holds (FSDP2's DTensor shards, or whole tensors
for a plain module) and reads back whatever the ranks of this run hold, so a checkpoint written by 2 ranks
resumes on 1 or 4 and the other way round. The models are keyed by their first policy name, so a tensor's
key is ``policy.parameter``; only the optimizer's parameters are stored (a LoRA run keeps its adapters,
never the base; the frozen KL reference is no trainer model). ``read_trained`` gives the full trained
tensors in one process with no process group (export, the driver, ``checkpoint.trained_weights``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

MODEL, OPTIMIZER = "model", "optimizer"
# the trained tensors are chosen here (the optimizer's); AdamW has no state for a role not trained yet
_PARTIAL = StateDictOptions(strict=False)


def save_shards(
    directory: Path, models: Mapping[str, torch.nn.Module], optimizer: torch.optim.Optimizer
) -> None:
    """Write this rank's shards of the trained weights and of ``optimizer``'s state into ``directory``.

    An optimizer that has not stepped yet is left out (DCP would otherwise make it take a zero step)."""
    module = _modules(models)
    with _all_trained(optimizer):
        state = {MODEL: _trained_state(module, optimizer)}
        if optimizer.state:
            state[OPTIMIZER] = get_optimizer_state_dict(module, optimizer)
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=Path(directory), no_dist=not _grouped())


def load_shards(
    directory: Path, models: Mapping[str, torch.nn.Module], optimizer: torch.optim.Optimizer
) -> None:
    """Restore the trained weights and ``optimizer``'s state from ``directory``, resharded to this group."""
    directory, module = Path(directory), _modules(models)
    paths = _metadata(directory).planner_data.values()
    stepped = {path[2] for path in paths if path[:2] == (OPTIMIZER, "state")}  # parameters with AdamW state
    with _all_trained(optimizer):
        state = {MODEL: _trained_state(module, optimizer)}
        if (
            stepped
        ):  # a template of the right shards (a fresh optimizer's is made by a zero step, then replaced)
            template = get_optimizer_state_dict(module, optimizer)
            template["state"] = {k: v for k, v in template["state"].items() if k in stepped}  # as saved
            state[OPTIMIZER] = template
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=directory, no_dist=not _grouped())
        set_model_state_dict(module, state[MODEL], options=_PARTIAL)
        if stepped:
            set_optimizer_state_dict(module, optimizer, state[OPTIMIZER], options=_PARTIAL)
        else:  # saved before the first step: no state, as then
            optimizer.load_state_dict({"state": {}, "param_groups": optimizer.state_dict()["param_groups"]})


def read_trained(directory: Path) -> dict[str, torch.Tensor]:
    """The full trained tensors in ``directory``, keyed ``policy/parameter``, read in this process alone."""
    metadata = _metadata(Path(directory))
    template: dict[str, torch.Tensor] = {}
    for flat, path in metadata.planner_data.items():
        if len(path) == 2 and path[0] == MODEL:
            stored = metadata.state_dict_metadata[flat]
            template[path[1]] = torch.empty(stored.size, dtype=stored.properties.dtype)
    with _single_process_quiet():
        dcp.load({MODEL: template}, checkpoint_id=Path(directory), no_dist=True)
    return {key.replace(".", "/", 1): value for key, value in template.items()}


def _modules(models: Mapping[str, torch.nn.Module]) -> torch.nn.ModuleDict:
    """The unique models, each under its first policy name (unique parameter names for DCP)."""
    unique: dict[int, tuple[str, torch.nn.Module]] = {}
    for name, model in models.items():
        if "." in name:
            raise ValueError(
                f"policy name {name!r} has a '.': sharded checkpoints key tensors policy.parameter"
            )
        unique.setdefault(id(model), (name, model))
    return torch.nn.ModuleDict(dict(unique.values()))


def _trained_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's part of the optimizer's parameters (under every name, tied ones too) as DCP sees them."""
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    names = {n for n, p in module.named_parameters(remove_duplicate=False) if id(p) in trained}
    state = {k: v for k, v in get_model_state_dict(module).items() if k in names}
    if len(state) != len(names):
        raise RuntimeError(f"trained parameters DCP does not name: {sorted(names - set(state))[:5]}")
    return state


@contextmanager
def _all_trained(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Every parameter of ``optimizer`` marked trained meanwhile: DCP keeps the AdamW state of trained
    parameters only, and peft marks the adapters of every policy but the active one frozen."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


def _metadata(directory: Path) -> dcp.Metadata:
    return dcp.FileSystemReader(directory).read_metadata()


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Without a process group DCP warns on every call that it assumes one process, which is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield

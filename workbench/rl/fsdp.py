"""FSDP2 for trainer ranks: policies sharded over the group with ``fully_shard``, and their full weights and
optimizer state gathered out of (or spread into) the shards.

Each decoder layer (the classes transformers names in ``_no_split_modules``) is a unit of its own and the
rest of the model (embeddings, tied LM head, final norm) the root unit. Gradients are summed over the ranks,
not averaged: the trainer's loss is already normalised over the whole mini-batch. On a GPU with a bf16
compute dtype the units gather bf16 weights for compute and reduce fp32 gradients into the fp32 shards
(``MixedPrecisionPolicy``), which replaces autocast and the trainer's compute weights; on CPUs all is fp32.

The trainer's forward (``workbench.rl.packing.token_logprobs``: the decoder, then the LM head a chunk of
rows at a time) does not go through the model's ``forward``: it is registered as a forward method of the
root unit, so the root's weights (embeddings, tied head) are gathered for it and its gradients reduced.

Gradient accumulation without communication: when ``defers_gradient_sync`` says so (the memory plan's rule:
the trained parameters' full fp32 gradient small beside the GPU, or no GPU), the trainer turns each model's
gradient sync off (``set_gradient_sync``, FSDP2's ``set_requires_gradient_sync``) for its micro-batches but
the last of an optimizer step (of a role, when each role's gradient is measured): the backward passes before
it leave their gradients unsharded on the rank, summed, and the last one reduce-scatters the sum, one
collective per unit instead of one per unit and micro-batch. Every rank runs the same passes on the same
models in the same order, so every rank turns the same sync on and off and the collectives match.

Gathering is a collective: every rank calls ``full_state`` / ``full_optimizer_state`` in the same order,
and only rank 0 keeps what it gathers, one tensor at a time on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from workbench.rl import packing


def is_sharded(model: Any) -> bool:
    return isinstance(model, FSDPModule)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` (itself when it is not sharded); writing to it writes the shard."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard_models(models: Iterable[torch.nn.Module], device_type: str, dtype: torch.dtype) -> None:
    """Shard each of ``models`` (in place) over the default process group: its decoder layers, then itself.

    ``dtype`` is the compute dtype: bf16 on CUDA gathers bf16 weights and reduces fp32 gradients.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    policy = mixed_precision(device_type, dtype)
    for model in {id(m): m for m in models}.values():
        layers = _layer_classes(model)
        for module in list(model.modules()):
            if type(module).__name__ in layers:
                fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.token_logprobs = partial(packing.token_logprobs, model)
        register_fsdp_forward_method(model, "token_logprobs")
        for unit in model.modules():
            if isinstance(unit, FSDPModule):  # plain sums, which gloo reduces too (no pre-multiplied sum)
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)


def mixed_precision(device_type: str, dtype: torch.dtype) -> MixedPrecisionPolicy:
    """The units' precision: on CUDA with a bf16 compute dtype, bf16 weights gathered for compute and fp32
    gradients reduced into the fp32 shards; elsewhere the parameters' own dtype throughout."""
    mixed = device_type == "cuda" and dtype == torch.bfloat16
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if mixed else None, reduce_dtype=torch.float32 if mixed else None
    )


def token_logprobs(
    model: Any, batch: Any, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``workbench.rl.packing.token_logprobs``, through the root unit's hooks when ``model`` is sharded."""
    forward = model.token_logprobs if is_sharded(model) else partial(packing.token_logprobs, model)
    return forward(batch, temperature, with_entropy=with_entropy)


def set_gradient_sync(model: Any, on: bool) -> None:
    """Whether ``model``'s next backward reduce-scatters its gradients (FSDP2's ``set_requires_gradient_sync``
    on every unit); off, they stay unsharded on this rank and accumulate until a backward with it on. Nothing
    for a model that is not sharded."""
    if is_sharded(model):
        model.set_requires_gradient_sync(on)


def defers_gradient_sync(parameters: Iterable[torch.Tensor], device: torch.device) -> bool:
    """Whether trainer ranks training ``parameters`` (sharded or not: their full sizes count) on ``device``
    reduce-scatter an optimizer step's gradients once, on its last micro-batch
    (``workbench.rl.memory_plan.defers_gradient_sync``: the rule the memory plan counts with)."""
    from workbench.rl.memory_plan import defers_gradient_sync as rule

    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    return rule(sum(p.numel() for p in parameters), memory)


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """The class names of the transformers model's repeated layers, also under a peft wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(getattr(inner, "_no_split_modules", None) or [])


@torch.no_grad()
def full_state(
    models: dict[str, torch.nn.Module], keep: Callable[[str], bool] = lambda key: True
) -> dict[str, torch.Tensor]:
    """The full tensors of ``models``' state (keyed ``name/key``, those ``keep`` keeps) on the CPU, on rank 0
    ({} on the others); gathered one tensor at a time, a tied one once."""
    import torch.distributed as dist

    lead = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name, model in models.items():
        seen: dict[int, torch.Tensor] = {}
        for key, value in model.state_dict(keep_vars=True).items():  # a tied parameter: the same object
            if not keep(key):
                continue
            if id(value) not in seen:
                full = value.full_tensor() if isinstance(value, DTensor) else value
                seen[id(value)] = full.detach().to("cpu").contiguous() if lead else full
            if lead:
                out[f"{name}/{key}"] = seen[id(value)]
    return out


@torch.no_grad()
def load_full(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy full tensors (keys of ``model.state_dict()``) into this rank's shards; no communication."""
    current = model.state_dict()
    unexpected = sorted(set(weights) - set(current))
    if unexpected:
        raise RuntimeError(f"weights do not fit the model: unexpected {unexpected[:5]}")
    for key, full in weights.items():
        target = current[key]
        local(target).copy_(local(_spread(full, target)))


def _spread(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` sharded as ``like`` is (itself when ``like`` is not a DTensor), each rank cutting its own part."""
    full = full.to(device=local(like).device, dtype=like.dtype)
    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


@torch.no_grad()
def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` as a lone trainer's (full tensors on the CPU), on rank 0 (None on the others)."""
    import torch.distributed as dist

    state = optimizer.state_dict()
    lead = dist.get_rank() == 0
    for per_param in state["state"].values():
        for field, value in per_param.items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            per_param[field] = full.cpu() if lead and isinstance(full, torch.Tensor) else full
    return state if lead else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a lone trainer's optimizer state (full tensors) into the optimizer of sharded parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    spread = {
        index: {
            field: _spread(v, params[index]) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
            for field, v in per_param.items()
        }
        for index, per_param in state["state"].items()
    }
    optimizer.load_state_dict({**state, "state": spread})

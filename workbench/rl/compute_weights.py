"""Low-precision copies of the trained weights, made once per optimizer step, that the forward pass reads.

Under ``torch.autocast`` a trained model keeps fp32 master weights and every linear layer casts its weight
(and bias) to bf16 on every call: once per layer per micro-batch in the forward, and the cast's backward turns
each weight's bf16 gradient back into fp32 before it is accumulated. With several micro-batches per optimizer
step the same casts are made again and again from weights that have not changed. Mixed-precision trainers
(Megatron-LM's bf16 parameters beside fp32 main weights, DeepSpeed's bf16 optimizer) instead hold a bf16
copy of the weights that the optimizer refreshes after each step, and accumulate gradients into fp32.

:class:`ComputeWeights` does that for the trainer, for the weights of ``torch.nn.Linear`` layers that train in
fp32 (the decoder's projections, LoRA adapters; not the embedding and the tied LM head, whose chunked head
accumulates its gradient over chunks in the weight's own dtype, nor norms, which compute in fp32 anyway):

- :meth:`ComputeWeights.refresh` copies the masters into the bf16 copies (after every optimizer step; the
  trainer calls it), each copy holding exactly the bf16 value autocast's cast would have made;
- inside :meth:`ComputeWeights.forward` each such layer's parameter is the copy, so autocast finds bf16
  weights and casts nothing; outside, the model is unchanged (checkpoints, a rollout backend sharing the
  model object and ``state_dict`` see the fp32 masters);
- the backward pass accumulates each copy's gradient into its master's ``.grad`` in fp32 (a hook after the
  copy's gradient is accumulated: the first micro-batch's is cast, later ones added), and clears the copy's,
  so the optimizer, gradient clipping and data-parallel sums see fp32 gradients on the masters as before.

The forward's values are those of autocast (the copies are autocast's casts, made earlier), so losses and
gradients equal the autocast path's up to the order of bf16 rounding (``tests/test_compute_weights.py``).
Gradient checkpointing recomputes a layer in the backward pass outside :meth:`forward`: the recompute casts the
master again, the same bf16 values, and the gradient still reaches the copy the forward used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch


class ComputeWeights:
    """bf16 (``dtype``) copies of the fp32 trained weights of ``models``' linear layers (module docstring)."""

    def __init__(self, models: Iterable[torch.nn.Module], dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        self.slots: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []  # (layer, name, master)
        self.copies: dict[int, torch.nn.Parameter] = {}  # id(master) -> its copy
        self._master: dict[int, torch.nn.Parameter] = {}  # id(copy) -> its master
        heads = set()
        seen_models = set()
        for model in models:
            if id(model) in seen_models:
                continue
            seen_models.add(id(model))
            head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
            if head is not None:
                heads.add(id(head))
            for module in model.modules():
                if type(module) is not torch.nn.Linear or id(module) in heads:
                    continue
                for name, master in module.named_parameters(recurse=False):
                    if master.requires_grad and master.dtype == torch.float32:
                        self._add(module, name, master)
        self.masters = [self._master[id(c)] for c in self.copies.values()]
        self.refresh()

    def _add(self, module: torch.nn.Module, name: str, master: torch.nn.Parameter) -> None:
        if id(master) not in self.copies:
            copy = torch.nn.Parameter(master.detach().to(self.dtype), requires_grad=True)
            copy.register_post_accumulate_grad_hook(self._to_master)
            self.copies[id(master)] = copy
            self._master[id(copy)] = master
        self.slots.append((module, name, master))

    def __len__(self) -> int:
        return len(self.copies)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the fp32 masters into their bf16 copies: once per optimizer step, before its micro-batches (so a
        checkpoint loaded or weights broadcast in between are picked up too); one fused copy."""
        if self.copies:
            torch._foreach_copy_(list(self.copies.values()), self.masters)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Inside, the linear layers hold the bf16 copies as their parameters (a dict entry swapped, nothing
        dispatched); the masters are put back on the way out."""
        for module, name, master in self.slots:
            module._parameters[name] = self.copies[id(master)]
        try:
            yield
        finally:
            for module, name, master in self.slots:
                module._parameters[name] = master

    def _to_master(self, copy: torch.Tensor) -> None:
        """The copy's gradient, just accumulated, into its master's fp32 ``.grad``; the copy's cleared."""
        master = self._master[id(copy)]
        grad = copy.grad
        if grad is None:
            return
        with torch.no_grad():
            if master.grad is None:
                master.grad = grad.to(master.dtype)
            else:
                master.grad.add_(grad)
        copy.grad = None


def make_compute_weights(
    setting: bool | None, models: Iterable[torch.nn.Module], device: torch.device, dtype: torch.dtype
) -> ComputeWeights | None:
    """The trainer's compute weights, or None: ``setting`` True (or None on CUDA) in a half-precision compute
    ``dtype``; an fp32 trainer has nothing to cast."""
    on = setting if setting is not None else device.type == "cuda"
    if not on or dtype not in (torch.bfloat16, torch.float16):
        return None
    weights = ComputeWeights(models, dtype)
    return weights if len(weights) else None


def forward_scope(weights: ComputeWeights | None) -> Any:
    """``weights.forward()``, or nothing to do when there are none."""
    return weights.forward() if weights is not None else contextlib.nullcontext()

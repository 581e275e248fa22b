"""Where a model runs and in what precision: ``device`` and ``dtype`` as configuration, never hard-coded.

``auto`` means CUDA with bf16 where a GPU exists, else the CPU with fp32. The numerics follow mixed
precision as the field does it (torch AMP, TRL/accelerate's ``bf16=True``):

- a **trained** model keeps fp32 master weights, and AdamW keeps fp32 state; its forward and backward
  run under ``torch.autocast`` in the compute dtype (bf16 matrix products, fp32 reductions and softmax),
  and log-probs are taken from logits upcast to fp32;
- a **frozen** model (a KL reference, a LoRA base, a rollout-only model) is stored in the compute dtype
  itself: nothing accumulates small updates into it, so fp32 would only double its memory.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

DEVICES = "auto | cpu | cuda | cuda:N"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def device_problem(device: str) -> str | None:
    """Why ``device`` is not a device setting, or None (the check ``TrainConfig`` runs)."""
    if not isinstance(device, str):
        return f"device must be one of {DEVICES}, got {device!r}"
    if device in ("auto", "cpu", "cuda"):
        return None
    kind, _, index = device.partition(":")
    if kind == "cuda" and index.isdigit():
        return None
    return f"device must be one of {DEVICES}, got {device!r}"


def dtype_problem(dtype: str) -> str | None:
    """Why ``dtype`` is not a precision setting, or None."""
    if isinstance(dtype, str) and (dtype == "auto" or dtype in DTYPES):
        return None
    return f"dtype must be auto, float32 or bfloat16, got {dtype!r}"


@dataclass(frozen=True)
class Placement:
    """A resolved device and compute dtype."""

    device: torch.device
    dtype: torch.dtype

    @classmethod
    def resolve(cls, device: str = "auto", dtype: str = "auto") -> Placement:
        """``device``/``dtype`` settings made concrete; a CUDA device this machine lacks is a ``ValueError``."""
        for problem in (device_problem(device), dtype_problem(dtype)):
            if problem:
                raise ValueError(problem)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        where = torch.device(device)
        if where.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {device!r}: this machine has no CUDA GPU (use device: cpu or auto)")
            if where.index is not None and where.index >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s)")
        if dtype == "auto":
            dtype = "bfloat16" if where.type == "cuda" else "float32"
        return cls(where, DTYPES[dtype])

    @property
    def mixed(self) -> bool:
        """Whether compute runs in a lower precision than the fp32 master weights."""
        return self.dtype != torch.float32

    def autocast(self) -> Any:
        """The context a trained model's forward runs in: autocast to the compute dtype, or nothing in fp32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def place_trained(self, model: Any) -> Any:
        """``model`` (in place) on the device with fp32 weights: the master copy the optimizer updates."""
        return model.to(device=self.device, dtype=torch.float32)

    def place_frozen(self, model: Any) -> Any:
        """``model`` (in place) on the device in the compute dtype: a copy nothing trains."""
        return model.to(device=self.device, dtype=self.dtype)

    def freeze_untrained(self, model: Any) -> Any:
        """The parameters of ``model`` that do not train (a LoRA base) in the compute dtype; the trained
        ones (the adapters) stay fp32."""
        for parameter in model.parameters():
            if not parameter.requires_grad:
                parameter.data = parameter.data.to(self.dtype)
        return model

    def describe(self) -> str:
        precision = "fp32" if not self.mixed else f"{str(self.dtype).removeprefix('torch.')} autocast"
        return f"{self.device} ({precision})"


def placement_of(model: Any) -> Placement:
    """The placement a model object already has: its device, and fp32 unless it is stored in bf16."""
    parameter = next(model.parameters())
    return Placement(
        parameter.device, parameter.dtype if parameter.dtype in DTYPES.values() else torch.float32
    )

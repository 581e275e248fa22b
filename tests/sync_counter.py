"""Counting host synchronisations under a torch dispatch mode, on any device (a CPU included).

On a GPU a host sync is any op that makes the CPU wait for the device: a scalar read (``item``, ``float``,
``int``, ``bool`` of a tensor), an op whose output size depends on the data (``nonzero``, boolean-mask
indexing, ``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``), a comparison that
returns a Python value (``equal``), a copy from the device to the host (``.cpu()``, ``.tolist()``,
``.numpy()``). :class:`SyncCounter` counts what the code asks for, whatever device it runs on, so a CPU
run shows the syncs the same code would make on a GPU:

- at the dispatcher: ``aten._local_scalar_dense`` (what ``item``/``float``/``int``/``bool`` become),
  ``aten.nonzero`` and ``aten.argwhere``, ``aten.index``/``aten.index_put_`` with a boolean or uint8 index
  (they call ``nonzero`` inside the kernel, below the mode), ``aten.masked_select``, ``aten.unique*``,
  ``aten.repeat_interleave`` without ``output_size``, ``aten.equal``/``aten.allclose``, and
  ``aten._to_copy``/``aten.copy_`` from a non-CPU tensor to the CPU;
- at the Python level, ``Tensor.tolist``, ``Tensor.numpy`` and ``Tensor.cpu`` of a CPU tensor: they read
  its memory directly (or return it) and dispatch nothing, so the mode would not see them; on a GPU they
  are the device-to-host copy the dispatcher sees (``_to_copy``), counted there and not twice.

What is not told apart on a CPU: a read of a tensor the code keeps on the host on purpose (a CPU generator's
draw, a bookkeeping tensor) counts like a read of a device tensor. Code measured with it should keep host
bookkeeping in Python values, not tensors, so that every count is a sync on a GPU.

Use::

    with SyncCounter() as syncs:
        step()
    syncs.total, syncs.by_op, syncs.sites  # a count, a Counter by op, a Counter by (op, file:line)

``where=True`` records each sync's call site (the innermost frame outside torch), to find what to fix;
``with syncs.paused():`` leaves out what runs inside (a CPU stand-in for a GPU kernel, say, whose own reads
the kernel does not make).
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: Ops that always make the host wait for the device.
ALWAYS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.argwhere.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.equal.default: "equal",
    aten.allclose.default: "equal",
}
_INDEXING = {
    aten.index.Tensor,
    aten.index_put_.default,
    aten.index_put.default,
    aten._index_put_impl_.default,
}
_REPEAT = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_PYTHON_READS = ("tolist", "numpy", "cpu")


def _is_cpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


def sync_kind(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The kind of host sync the dispatched op ``func(*args, **kwargs)`` makes, or None."""
    if func in ALWAYS:
        return ALWAYS[func]
    if func in _INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return "mask_index"
        return None
    if func in _REPEAT:
        return None if kwargs.get("output_size") is not None else "repeat_interleave"
    if func is aten._to_copy.default:
        source = args[0]
        if isinstance(source, torch.Tensor) and source.device.type != "cpu" and _is_cpu(kwargs.get("device")):
            return "device_to_host"
        return None
    if func is aten.copy_.default:
        destination, source = args[0], args[1]
        if (
            isinstance(source, torch.Tensor)
            and source.device.type != "cpu"
            and destination.device.type == "cpu"
        ):
            return "device_to_host"
    return None


def _site() -> str:
    """The innermost call site outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename.replace("\\", "/")
        if "/torch/" not in name and not name.endswith("sync_counter.py"):
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


class SyncCounter(TorchDispatchMode):
    """Counts host syncs (module docstring) while active: ``total``, ``by_op``, and ``sites`` if ``where``."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.where = where
        self.by_op: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()
        self._saved: dict[str, Any] = {}
        self._paused = 0

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def reset(self) -> None:
        self.by_op.clear()
        self.sites.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing inside is counted."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def count(self, kind: str) -> None:
        if self._paused:
            return
        self.by_op[kind] += 1
        if self.where:
            self.sites[(kind, _site())] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        kind = sync_kind(func, args, kwargs)
        if kind is not None:
            self.count(kind)
        return func(*args, **kwargs)

    def __enter__(self) -> SyncCounter:
        for name in _PYTHON_READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counted(name, original))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()

    def _counted(self, name: str, original: Any) -> Any:
        counter = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.device.type == "cpu":  # elsewhere the dispatcher sees the copy
                counter.count(name)
            return original(tensor, *args, **kwargs)

        return read

"""Checkpoints of a training run: model weights, optimizer, step, policy version and RNG states.

The weights are a policy set's trained tensors (the adapters only, for LoRA). A checkpoint is written into a hidden temporary directory and renamed into place, so a run killed
while saving leaves either the previous checkpoint or the new one, never half of one. Resuming
loads the newest complete checkpoint; the store's steps after it are discarded and redone, so no
step is lost or duplicated.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.store.layout import storage_error

STATE_FILE = "trainer_state.json"


def save(
    run_dir: Path, step: int, policies: Any, optimizer: Any, state: dict[str, Any], keep: int = 2
) -> Path:
    """Write the checkpoint of ``step`` under ``run_dir/checkpoints/step-NNNNNN`` atomically.

    A write the file system refuses (disk full, read-only) raises a ``StorageError`` naming the path and
    the cause, and leaves the previous checkpoints as they were.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _save(policies.state(), tmp / "weights.pt")  # the trained weights of every policy
        _save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        _save(rng, tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    except (OSError, RuntimeError) as error:
        refused = _os_error(error)
        if refused is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(refused, final, "write checkpoint") from error
    for old in complete(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _save(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file, so that a refused write surfaces as the OS error behind it."""
    with open(path, "wb") as file:
        torch.save(obj, file)


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind ``error`` (torch wraps a failed write in a RuntimeError), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def complete(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest(run_dir: Path) -> Path | None:
    found = complete(run_dir)
    return found[-1] if found else None


def trained_weights(path: Path) -> dict[str, torch.Tensor]:
    """The trained tensors kept in the checkpoint at ``path``, keyed ``policy/parameter``."""
    return torch.load(Path(path) / "weights.pt", weights_only=True)


def load(path: Path, policies: Any, optimizer: Any) -> dict[str, Any]:
    """Restore weights, optimizer and RNG states from ``path``; returns the saved trainer state."""
    policies.load_state(trained_weights(path))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return json.loads((path / STATE_FILE).read_text())

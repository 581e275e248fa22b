"""Checkpoints of a training run: trained weights, optimizer, step, policy version and RNG states.

The trained weights (the adapters only, for LoRA) and AdamW's state are ``torch.distributed.checkpoint``
shards (``workbench.rl.sharded_checkpoint``) in the checkpoint's ``shards/``, written by the lone trainer or
by every rank of a trainer group, so a run resumes on another number of ranks. A checkpoint is written into a
hidden temporary directory, the RNG states and ``trainer_state.json`` last, and renamed into place, so a run
killed while saving leaves either the previous checkpoint or the new one, never half of one. Resuming loads
the newest complete checkpoint; the store's steps after it are discarded and redone, so no step is lost or
duplicated. Checkpoints written before the shards (``weights.pt`` and ``optimizer.pt``) still load.

The trainer passed is a ``PolicyTrainer`` (its ``models`` and ``optimizer`` are written here) or a trainer
group with ``save_shards(directory)`` and ``load_shards(directory)``, which every one of its ranks does.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import CheckpointException

from workbench.rl import sharded_checkpoint
from workbench.store.layout import storage_error

STATE_FILE = "trainer_state.json"
SHARDS = "shards"


def save(run_dir: Path, step: int, trainer: Any, state: dict[str, Any], keep: int = 2) -> Path:
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
        if hasattr(trainer, "save_shards"):  # a trainer group: each rank writes its shards
            trainer.save_shards(tmp / SHARDS)
        else:
            sharded_checkpoint.save_shards(tmp / SHARDS, trainer.models, trainer.optimizer)
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        with open(tmp / "rng.pt", "wb") as file:  # a refused write surfaces as the OS error behind it
            torch.save(rng, file)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}))
        _remove(final)
        tmp.rename(final)
    except (OSError, RuntimeError, CheckpointException) as error:
        refused = _os_error(error)
        if refused is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(refused, final, "write checkpoint") from error
    for old in complete(run_dir)[:-keep] if keep > 0 else []:
        _remove(old)
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint directory, first renamed out of ``complete``'s sight: a kill while its files
    are deleted must not leave a half checkpoint that looks complete."""
    if path.exists():
        trash = path.with_name(f".trash-{path.name}")
        shutil.rmtree(trash, ignore_errors=True)
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error`` (torch wraps a failed write in a RuntimeError, DCP in a
    ``CheckpointException`` per rank), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        if isinstance(error, CheckpointException):
            for failure, _ in error.failures.values():
                if (found := _os_error(failure)) is not None:
                    return found
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
    """The full trained tensors kept in the checkpoint at ``path``, keyed ``policy/parameter``."""
    if (Path(path) / SHARDS).is_dir():
        return sharded_checkpoint.read_trained(Path(path) / SHARDS)
    return torch.load(Path(path) / "weights.pt", weights_only=True)


def load(path: Path, policies: Any, trainer: Any) -> dict[str, Any]:
    """Restore weights, optimizer and RNG states from ``path``; returns the saved trainer state.

    ``policies`` are the driver's: a lone trainer trains their models; a trainer group's ranks load their
    shards and the driver's policies the full trained weights."""
    path = Path(path)
    if not (path / SHARDS).is_dir():  # written before the shards
        policies.load_state(trained_weights(path))
        trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    elif hasattr(trainer, "load_shards"):
        trainer.load_shards(path / SHARDS)
        policies.load_state(trained_weights(path))
    else:
        sharded_checkpoint.load_shards(path / SHARDS, trainer.models, trainer.optimizer)
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return json.loads((path / STATE_FILE).read_text())

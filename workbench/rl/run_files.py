"""A training run's own files beside its store: their names, writing them, and reading its config back.

``wb.train`` writes them and its background process reads them (``workbench.training``); an export reads
them too (``workbench.rl.export``), which is why they live below the application layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from workbench.rl.config import TrainConfig

CONFIG_FILE = "train_config.yaml"
TOPOLOGY_FILE = "topology.yaml"


def run_config(run_dir: str | Path) -> TrainConfig:
    """The training config of the run in ``run_dir``.

    A run killed after its store was made but before ``train_config.yaml`` was written still has the
    config in its store: it is read from there and the file is written, so the run can be resumed.
    """
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.exists() and (run_dir / "config.yaml").exists():
        from workbench.store import RunReader

        stored = RunReader(run_dir).config
        if stored.get("kind") != "train":
            raise ValueError(f"{run_dir} is not a training run (its config has kind {stored.get('kind')!r})")
        config = TrainConfig.from_dict({k: v for k, v in stored.items() if k != "kind"})
        write_run_file(path, config.to_yaml())
        return config
    return TrainConfig.from_yaml(path)


@contextlib.contextmanager
def storage_errors(path: Path) -> Iterator[None]:
    """Re-raise an OSError met writing ``path`` as a StorageError naming the path and the cause."""
    from workbench.store.layout import storage_error

    try:
        yield
    except OSError as error:
        raise storage_error(error, path) from error


def write_run_file(path: Path, text: str) -> None:
    """Write one of a run's files (its config, topology); a refused write names the path and the cause."""
    with storage_errors(path):
        path.write_text(text)

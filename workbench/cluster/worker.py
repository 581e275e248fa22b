"""One rollout worker of a cluster run: its own copy of the policies, a backend serving them, the engine.

The class is plain Python; ``workbench.cluster.pool`` turns it into a Ray actor. A worker is built from
the run's topology (as a spec dict) and training config, so a replacement is identical to the worker it
replaces; the pool then hands it the current weights before it rolls anything out.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


class RolloutWorker:
    def __init__(self, spec: dict[str, Any], config: dict[str, Any], seed: int, plugins: bytes | None = None):
        from workbench.engine import plugins as run_plugins
        from workbench.rl.config import TrainConfig
        from workbench.rl.parts import load_policies, rollout_engine
        from workbench.topology import from_dict

        self.config = TrainConfig.from_dict(config)
        run_plugins.import_modules(self.config.plugins)  # the run's own tool kinds, verifiers, ... first
        run_plugins.restore(plugins)
        topology = from_dict(spec)
        self.policies, _ = load_policies(topology, self.config, seed)
        for model in self.policies.unique_models().values():
            model.eval()
        self.backends = self.policies.backends(self.config.backend, self.config.model)
        self.engine = rollout_engine(topology, self.config, self.backends, self.config.make_judge())
        self.workdir = Path(tempfile.mkdtemp(prefix="workbench-worker-"))

    def set_weights(self, weights: dict[str, Any], version: int) -> int:
        """Load the trainer's weights (``PolicySet.state()``) and serve them as policy ``version``."""
        import torch

        with torch.no_grad():
            self.policies.load_state(weights)
        self.policies.sync(self.backends, self.workdir, version, self.config.sync_timeout_s)
        return version

    def rollout(self, tasks: list[Any], group_size: int) -> list[Any]:
        """Every task rolled out ``group_size`` times: the episodes, scored, in task order."""
        from workbench.backends.loop_thread import run_sync

        return run_sync(lambda: self.engine.run(tasks, group_size=group_size))

    def pid(self) -> int:
        return os.getpid()

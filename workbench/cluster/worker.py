"""One rollout worker of a cluster run: its own copy of the policies, a backend serving them, the engine.

The class is plain Python; ``workbench.cluster.pool`` turns it into a Ray actor. A worker is built from
the run's topology (as a spec dict) and training config, so a replacement is identical to the worker it
replaces; the pool then hands it the current weights before it rolls anything out.

Under the sync and async schedulers each ``rollout`` call rolls out one shard of one batch. Under the
pipeline the worker runs the rollout half of ``PipelineScheduler`` over the groups it was given: each
``level`` call advances every one of them by one level and admits the step's new ones, and (with
``max_staleness: 1``) starts the next level before it returns, so that level decodes while the update runs;
its backends then serve a copy of the weights that a push refreshes between two batches, as in one process.
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
        from workbench.rl.scheduling import rollout_backends
        from workbench.rl.scheduling.pipeline import overlaps
        from workbench.topology import from_dict

        self.config = TrainConfig.from_dict(config)
        run_plugins.import_modules(self.config.plugins)  # the run's own tool kinds, verifiers, ... first
        run_plugins.restore(plugins)
        topology = from_dict(spec)
        self.policies, _ = load_policies(topology, self.config, seed)
        for model in self.policies.unique_models().values():
            model.eval()
        # the pipeline's next level decodes while a push of new weights arrives: it needs its own copy
        beside = self.config.scheduler == "pipeline" and overlaps(
            self.config.max_staleness, bool(self.config.segment_len)
        )
        self.backends = self.policies.backends(self.config.backend, self.config.model, own_weights=beside)
        served = rollout_backends(self.backends, self.config.segment_len)  # metered, segmented if asked
        self.engine = rollout_engine(topology, self.config, served, self.config.make_judge())
        self.workdir = Path(tempfile.mkdtemp(prefix="workbench-worker-"))
        self._pipeline: Any = None  # the pipeline's rollout half, made by the first ``level``
        self._batches: dict[int, list[Any]] = {}  # step -> the new tasks the driver sent for it
        self._started: dict[int, list[Any]] = {}  # steps whose new tasks started during this call

    def set_weights(self, weights: dict[str, Any], version: int) -> int:
        """Load the trainer's weights (``PolicySet.state()``) and serve them as policy ``version``."""
        import torch

        with torch.no_grad():
            self.policies.load_state(weights)
        self.policies.sync(self.backends, self.workdir, version, self.config.sync_timeout_s)
        if self._pipeline is not None:  # a level in flight keeps its weights; the next one takes these
            self._pipeline.published(version)
        return version

    def rollout(self, tasks: list[Any], group_size: int, step: int | None = None) -> list[Any]:
        """Every task rolled out ``group_size`` times: the episodes, scored, in task order; ``step`` seeds
        their requests (``workbench.engine.Rollout``), so a shard draws the same on any worker."""
        from workbench.backends.loop_thread import run_sync

        return run_sync(lambda: self.engine.run(tasks, group_size=group_size, step=step))

    def level(self, step: int, batches: dict[int, list[Any]]) -> dict[str, Any]:
        """Step ``step`` of the pipeline on this worker's groups; ``batches``: the new tasks of ``step`` (and
        of ``step + 1``, which the level started ahead of the update takes), by step.

        Returns the episodes that finished (stored at this step), the views of what trains now, the
        worker's ``id`` of each of their calls (the driver matches a call trained before its episode
        ended with the copy that arrives when it ends), and the tasks of the groups started during this
        call, by step.
        """
        from workbench.rl.scheduling import make_scheduler

        config = self.config
        self._batches.update(batches)
        if self._pipeline is None:
            self._pipeline = make_scheduler(
                "pipeline",
                self.engine,
                self._batch,
                config.group_size,
                step,
                config.steps,
                config.max_staleness,
                drain_every=config.checkpoint_every,
                carry=bool(config.segment_len),
            )
        self._started = {}
        got = self._pipeline.rollout(step)
        self._batches = {s: tasks for s, tasks in self._batches.items() if s > step}
        return {
            "episodes": got.episodes,
            "train": got.train,
            "episode_ids": [[id(c) for c in e.calls] for e in got.episodes],
            "train_ids": [[id(c) for c in e.calls] for e in got.train],
            "started": self._started,
        }

    def _batch(self, step: int) -> list[Any]:
        tasks = self._batches.pop(step, [])
        self._started[step] = tasks
        return tasks

    def pid(self) -> int:
        return os.getpid()

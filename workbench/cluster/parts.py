"""A training run's parts on the cluster: what ``workbench.rl.loop.setup`` builds them with when the config
names a cluster (``workbench.training.run_training`` passes them; the loop itself knows nothing of Ray).

The rollout always runs on a pool of workers, under the scheduler the config names (sync, async or
pipeline); the update runs on a group of trainer ranks with ``cluster_trainers``, else in the driver as
without a cluster.
"""

from __future__ import annotations

from typing import Any

from workbench.cluster.pipeline import ClusterPipelineScheduler
from workbench.cluster.placement import Needs, run_needs
from workbench.cluster.pool import RolloutPool
from workbench.cluster.scheduler import ClusterAsyncScheduler, ClusterScheduler
from workbench.cluster.trainers import TrainerGroup
from workbench.engine import plugins
from workbench.rl.loop import Run, local_trainer
from workbench.rl.scheduling import pipeline
from workbench.topology import to_dict


def needs(run: Run) -> Needs:
    """What the run reserves on the cluster; the part built first checks it before any actor starts (the
    second finds the same totals), so a run that cannot be placed fails in seconds, naming both sides."""
    device = getattr(getattr(run.policies, "placement", None), "device", None)
    return run_needs(run.config, driver=str(device) if device is not None and device.type != "cpu" else None)


def trainer_for(run: Run, reference: Any) -> Any:
    """A group of ``cluster_trainers`` trainer ranks over the run's policies; with none, the driver's trainer."""
    config = run.config
    if not config.cluster_trainers:
        return local_trainer(run, reference)
    return TrainerGroup(
        config.cluster,
        to_dict(run.topology),
        config.to_dict(),
        run.policies,
        config.cluster_trainers,
        config.cluster_cpus_per_trainer,
        config.cluster_gpus_per_trainer,
        log=run.log,
        plugins=plugins.snapshot(),
        needs=needs(run),
    )


def scheduler_for(run: Run) -> Any:
    """The config's scheduler with the rollout on a pool of ``cluster_workers`` rollout workers."""
    config = run.config
    if config.scheduler == "pipeline":  # a topology or setting it cannot run fails before any worker starts
        pipeline.check(run.engine, config.max_staleness, bool(config.segment_len))
    pool = RolloutPool(
        config.cluster,
        to_dict(run.topology),
        config.to_dict(),
        config.cluster_workers,
        config.cluster_cpus_per_worker,
        config.cluster_gpus_per_worker,
        config.cluster_max_restarts,
        log=run.log,
        plugins=plugins.snapshot(),
        needs=needs(run),
    )
    try:
        weights, version = run.policies.state, run.policy_version
        if config.scheduler == "async":
            return ClusterAsyncScheduler(
                pool,
                run.batch_for,
                config.group_size,
                weights,
                version,
                run.start,
                config.steps,
                config.max_staleness,
            )
        if config.scheduler == "pipeline":
            return ClusterPipelineScheduler(pool, run.batch_for, weights, version, config.steps)
        return ClusterScheduler(pool, run.batch_for, config.group_size, weights, version)
    except BaseException:
        pool.close()
        raise

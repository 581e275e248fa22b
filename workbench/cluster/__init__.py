"""Scale-out on Ray: rollout workers as Ray actors, the training loop and the run store on the driver.

``TrainConfig.cluster`` names the cluster (``local`` starts one on this machine; ``ray://host:10001`` or
``auto`` joins a running one). Each worker (``workbench.cluster.worker``) owns a copy of the policies and a
backend serving them; the pool (``workbench.cluster.pool``) splits a step's tasks among the workers, pushes
the new weights after every update and replaces a worker that dies, rolling its tasks out again, so a step
stores each episode once. The run's scheduler decides how far the workers run ahead of the update: ``sync``
and ``async`` (``workbench.cluster.scheduler``) or MarsRL's agent-level ``pipeline``, each worker advancing
its own groups (``workbench.cluster.pipeline``). With ``cluster_trainers`` the update too runs on the
cluster, as a data-parallel group of trainer ranks (``workbench.cluster.trainers``). Before any actor starts, what the run reserves is
checked against what the cluster has (``workbench.cluster.placement``): a run that cannot be placed fails
with ``PlacementError``, naming both. Ray is imported only here, and only when a run names a cluster.
"""

from __future__ import annotations

from workbench.cluster.pipeline import ClusterPipelineScheduler
from workbench.cluster.placement import PlacementError
from workbench.cluster.pool import RolloutPool, WorkerLostError
from workbench.cluster.scheduler import ClusterAsyncScheduler, ClusterScheduler
from workbench.cluster.trainers import TrainerGroup, TrainerLostError

__all__ = [
    "ClusterAsyncScheduler",
    "ClusterPipelineScheduler",
    "ClusterScheduler",
    "PlacementError",
    "RolloutPool",
    "TrainerGroup",
    "TrainerLostError",
    "WorkerLostError",
]

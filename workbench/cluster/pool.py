"""A pool of rollout workers on a Ray cluster: split a step's tasks, gather the episodes, replace the lost.

Tasks are split into contiguous shards, one per worker, so a task's whole group is rolled out by one
worker and the episodes come back in task order, as from one process. A worker that dies mid-step (its
process killed, its node lost) is replaced by a new actor built the same way, given the current weights,
and its shard is rolled out again; nothing of a step is returned until every shard is in, so a retried
shard is never stored twice. After ``max_restarts`` replacements in one step the step fails with
``WorkerLostError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.cluster.placement import Needs, connect, rollout_workers, wait_started


class WorkerLostError(RuntimeError):
    """Rollout workers kept dying: more replacements in one step than the run allows."""


def shards(items: list[Any], n: int) -> list[list[Any]]:
    """``items`` in ``n`` contiguous shards whose sizes differ by at most one (empty shards dropped)."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return [s for s in out if s]


class RolloutPool:
    def __init__(
        self,
        address: str,
        spec: dict[str, Any],
        config: dict[str, Any],
        n_workers: int,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        max_restarts: int = 3,
        log: Callable[[str], None] = print,
        plugins: bytes | None = None,
        needs: Needs | None = None,
    ):
        """``needs``: the whole run's actors, checked against the cluster before any worker starts
        (``workbench.cluster.placement``); None: not checked."""
        import ray

        from workbench.cluster.worker import RolloutWorker

        self.started_ray = connect(address, needs)
        self.group = rollout_workers(n_workers, cpus_per_worker, gpus_per_worker)
        self._actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(RolloutWorker)
        self.spec, self.config, self.max_restarts, self.log = spec, config, max_restarts, log
        self.plugins = plugins  # workbench.engine.plugins.snapshot() of the driver
        self._seeds = iter(range(int(config.get("seed", 0)) * 1000, 1 << 62))
        self._weights: tuple[Any, int] | None = None
        self.replaced = 0  # workers replaced over the pool's life
        self.workers = [self._new_worker() for _ in range(n_workers)]
        started = [w.pid.remote() for w in self.workers]
        wait_started(started, self.group, log)  # saying what they wait for while Ray cannot place them
        ray.get(started)  # every worker built (model loaded) before step 0

    def _new_worker(self) -> Any:
        worker = self._actor.remote(self.spec, self.config, next(self._seeds), self.plugins)
        if self._weights is not None:
            worker.set_weights.remote(*self._weights)  # runs before any later call on this actor
        return worker

    def set_weights(self, weights: dict[str, Any], version: int) -> None:
        """Push the trainer's weights to every worker and wait until each serves them."""
        import ray

        self._weights = (ray.put(weights), version)
        self._gather(lambda i: self.workers[i].set_weights.remote(*self._weights), len(self.workers))

    def pids(self) -> list[int]:
        """The process id of each worker (tests kill them)."""
        return self._gather(lambda i: self.workers[i].pid.remote(), len(self.workers))[0]

    def rollout(self, tasks: list[Any], group_size: int) -> tuple[list[Any], dict[str, float]]:
        """The episodes of ``tasks`` (``group_size`` each, in task order) and the step's cluster metrics."""
        parts = shards(tasks, len(self.workers))
        results, retried = self._gather(
            lambda i: self.workers[i].rollout.remote(parts[i], group_size), len(parts)
        )
        return [e for part in results for e in part], {
            "cluster/workers": float(len(self.workers)),
            "cluster/workers_replaced": float(len(retried)),
            "cluster/tasks_retried": float(sum(len(parts[i]) for i in retried)),
        }

    def _gather(self, submit: Callable[[int], Any], n: int) -> tuple[list[Any], list[int]]:
        """The results of ``submit(i)`` for workers ``0..n-1``, in order, and the workers replaced on the way.

        ``submit`` reads ``self.workers[i]`` when called, so a retry goes to the replacement.
        """
        import ray
        from ray.exceptions import RayActorError

        pending = {submit(i): i for i in range(n)}
        values: dict[int, Any] = {}
        retried: list[int] = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            try:
                values[i] = ray.get(ready[0])
            except RayActorError as error:
                if len(retried) >= self.max_restarts:
                    raise WorkerLostError(
                        f"{len(retried) + 1} rollout workers died in one step (cluster_max_restarts is "
                        f"{self.max_restarts}); last: {str(error).splitlines()[0]}"
                    ) from error
                self.log(
                    f"rollout worker {i} died ({type(error).__name__}); replacing it and retrying its work"
                )
                self.replaced += 1
                retried.append(i)
                self.workers[i] = self._new_worker()
                wait_started([self.workers[i].pid.remote()], replace(self.group, count=1), self.log)
                pending[submit(i)] = i
        return [values[i] for i in range(n)], retried

    def close(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self.started_ray:
            ray.shutdown()

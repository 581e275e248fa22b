"""A pool of rollout workers on a Ray cluster: split a step's tasks, gather the episodes, replace the lost.

Tasks are split into contiguous shards, one per worker, so a task's whole group is rolled out by one
worker and the episodes come back in task order, as from one process. A batch is sent (``submit``) and
gathered (``collect``) apart, so a scheduler can keep batches running on the workers while the update runs.
Weights go to the workers without waiting (``push_weights``): Ray runs one caller's calls to an actor in the
order they were made, so they land between two of a worker's batches, never during one. A worker that dies
mid-step (its process killed, its node lost) is replaced by a new actor built the same way, given the current
weights, and its shard is rolled out again; nothing of a batch is returned until every shard is in, so a
retried shard is never stored twice. After ``max_restarts`` replacements in one step the step fails with
``WorkerLostError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.cluster.placement import Needs, connect, rollout_workers, wait_started


class WorkerLostError(RuntimeError):
    """Rollout workers kept dying: more replacements in one step than the run allows."""


def shards(items: list[Any], n: int, keep_empty: bool = False) -> list[list[Any]]:
    """``items`` in ``n`` contiguous shards whose sizes differ by at most one (empty shards dropped unless
    ``keep_empty``: then shard ``i`` is always worker ``i``'s)."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out if keep_empty else [s for s in out if s]


#: Sends shard ``i`` to ``actor`` (the slot's worker when called; a replacement on a retry): the call's ref.
Send = Callable[[Any, int], Any]


@dataclass
class Pending:
    """One call per shard, sent and not yet gathered: each call's ref, its shard and the actor it went to."""

    send: Send
    n: int
    sizes: list[int] = field(default_factory=list)  # tasks per shard (the step's metrics)
    calls: dict[Any, tuple[int, Any]] = field(default_factory=dict)  # ref -> (shard, actor)


@dataclass
class Gathered:
    """A batch's results in shard order, and which shards went to a new worker on the way."""

    values: list[Any]
    replaced: list[int]  # shards whose worker died and was replaced while this batch was gathered
    redone: list[int]  # shards sent again (to a replacement, made now or for an earlier batch)


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
        self._pushes: list[Any] = []  # weight pushes not yet seen to land
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
        self.collect(
            self.submit(lambda worker, i: worker.set_weights.remote(*self._weights), len(self.workers))
        )

    def push_weights(self, weights: dict[str, Any], version: int) -> None:
        """Queue the trainer's weights on every worker without waiting: each loads them after the calls
        sent to it before (a batch it is rolling out ends with the weights it began with) and before any
        sent after. A worker that dies before it loads them is replaced with them by the next ``collect``."""
        import ray

        self._check_pushes()
        self._weights = (ray.put(weights), version)
        self._pushes += [worker.set_weights.remote(*self._weights) for worker in self.workers]

    def _check_pushes(self) -> None:
        """Raise the error of a weight push that failed on a live worker (weights that do not fit, say);
        a push to a worker that died is dropped: the worker's next batch replaces it."""
        import ray
        from ray.exceptions import RayActorError

        if not self._pushes:
            return
        done, self._pushes = ray.wait(self._pushes, num_returns=len(self._pushes), timeout=0)
        for ref in done:
            with contextlib.suppress(RayActorError):
                ray.get(ref)

    def pids(self) -> list[int]:
        """The process id of each worker (tests kill them)."""
        return self.collect(self.submit(lambda worker, i: worker.pid.remote(), len(self.workers))).values

    def rollout(
        self, tasks: list[Any], group_size: int, step: int | None = None
    ) -> tuple[list[Any], dict[str, float]]:
        """The episodes of ``tasks`` (``group_size`` each, in task order) and the step's cluster metrics;
        ``step``: the training step they belong to (their requests' seeds: the same whichever worker)."""
        return self.finish_rollout(self.submit_rollout(tasks, group_size, step))

    def submit_rollout(self, tasks: list[Any], group_size: int, step: int | None = None) -> Pending:
        """Send ``tasks`` to the workers, a shard each, without waiting; ``finish_rollout`` gathers them."""
        parts = shards(tasks, len(self.workers))
        pending = self.submit(lambda worker, i: worker.rollout.remote(parts[i], group_size, step), len(parts))
        pending.sizes = [len(p) for p in parts]
        return pending

    def finish_rollout(self, pending: Pending) -> tuple[list[Any], dict[str, float]]:
        """The episodes of a ``submit_rollout`` (in task order) and its cluster metrics."""
        got = self.collect(pending)
        return [e for part in got.values for e in part], {
            "cluster/workers": float(len(self.workers)),
            "cluster/workers_replaced": float(len(got.replaced)),
            "cluster/tasks_retried": float(sum(pending.sizes[i] for i in got.redone)),
        }

    def submit(self, send: Send, n: int) -> Pending:
        """``send(worker i, i)`` for workers ``0..n-1``, not waiting for the results."""
        pending = Pending(send, n)
        for i in range(n):
            self._send(pending, i)
        return pending

    def _send(self, pending: Pending, i: int) -> None:
        worker = self.workers[i]
        pending.calls[pending.send(worker, i)] = (i, worker)

    def collect(self, pending: Pending) -> Gathered:
        """The results of a ``submit``, in shard order, once every call is in.

        A call whose worker died goes again to the worker now in its slot: a new one if the dead worker is
        still there (it is replaced, given the current weights, at most ``max_restarts`` times in one
        collect), else the replacement already made (for an earlier batch queued on the same dead worker).
        """
        import ray
        from ray.exceptions import RayActorError

        self._check_pushes()
        values: dict[int, Any] = {}
        replaced: list[int] = []
        redone: list[int] = []
        while pending.calls:
            ready, _ = ray.wait(list(pending.calls), num_returns=1)
            i, worker = pending.calls.pop(ready[0])
            try:
                values[i] = ray.get(ready[0])
            except RayActorError as error:
                if self.workers[i] is worker:  # not replaced yet
                    if len(replaced) >= self.max_restarts:
                        raise WorkerLostError(
                            f"{len(replaced) + 1} rollout workers died in one step (cluster_max_restarts is "
                            f"{self.max_restarts}); last: {str(error).splitlines()[0]}"
                        ) from error
                    self.log(
                        f"rollout worker {i} died ({type(error).__name__}); replacing it and retrying its work"
                    )
                    self.replaced += 1
                    replaced.append(i)
                    self.workers[i] = self._new_worker()
                    wait_started([self.workers[i].pid.remote()], replace(self.group, count=1), self.log)
                redone.append(i)
                self._send(pending, i)
        return Gathered([values[i] for i in range(pending.n)], replaced, redone)

    def close(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self.started_ray:
            ray.shutdown()

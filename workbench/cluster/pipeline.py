"""The agent-level pipeline on Ray workers: each worker advances its own groups one level a step.

Each step the driver splits the step's new problems into one contiguous shard per worker and calls every
worker's ``level`` (``workbench.cluster.worker``), which runs the rollout half of ``PipelineScheduler`` over
the groups it holds: the new problems' first agents decode beside the next agent of the earlier ones, and
every call scored in the level comes back to train at once. With ``max_staleness: 1`` a worker starts its next
level before it answers, so that level decodes while the update runs (from the worker's own copy of the
weights, which the push after the update refreshes between two batches); each call keeps the policy version it
was generated with. Checkpoint steps and the last step drain every group, as in one process, so a run killed
and resumed from its last checkpoint has no group half done and stores each step once.

A call trained before its episode ended comes back again, as a new copy, with the finished episode: the driver
gives that copy the advantage and training step the loop gave the first (matched by the worker's id of the
call).

A worker lost mid-step is replaced (given the current weights) and every group it held starts again on the
replacement, from its first agent, beside the step's new problems (``cluster/groups_restarted``): the calls of
a lost group that trained in earlier steps stay trained, and its episodes are stored once, when the restarted
group finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workbench.cluster.pool import RolloutPool, shards
from workbench.cluster.scheduler import OnPool
from workbench.rl.scheduling.base import BatchFor, StepRollout


class ClusterPipelineScheduler(OnPool):
    def __init__(
        self,
        pool: RolloutPool,
        batch_for: BatchFor,
        weights: Callable[[], dict[str, Any]],
        version: int,
        last_step: int,
    ):
        """The pipeline's settings (``max_staleness``, ``segment_len``, the checkpoints it drains at) reach
        the workers with the run's config; ``workbench.cluster.parts`` checks them first
        (``workbench.rl.scheduling.pipeline.check``)."""
        self.pool, self.batch_for, self.weights = pool, batch_for, weights
        self.version, self.last_step = version, last_step
        n = len(pool.workers)
        self.owner: list[Any] = list(pool.workers)  # the actor that holds each slot's groups
        self.held: list[list[Any]] = [[] for _ in range(n)]  # tasks of the groups live on each slot's worker
        self.ahead: list[set[int]] = [set() for _ in range(n)]  # steps whose groups a worker started early
        # (slot, the worker's id of a call) -> the call, trained before its episode ended
        self.trained: dict[tuple[int, int], Any] = {}
        pool.push_weights(weights(), version)

    def rollout(self, step: int) -> StepRollout:
        started = time.perf_counter()
        n = len(self.pool.workers)
        new = shards(self.batch_for(step), n, keep_empty=True)
        following = (
            shards(self.batch_for(step + 1), n, keep_empty=True) if step + 1 < self.last_step else None
        )
        sent_to: list[Any] = list(self.owner)

        def send(worker: Any, i: int) -> Any:
            batch = [] if step in self.ahead[i] else list(new[i])
            if worker is not self.owner[i]:  # a replacement: the lost worker's groups start again on it
                batch = self.held[i] + batch
            sent_to[i] = worker
            batches = {step: batch}
            if following is not None:
                batches[step + 1] = list(following[i])
            return worker.level.remote(step, batches)

        got = self.pool.collect(self.pool.submit(send, n))
        episodes, train, restarted, retried = [], [], 0, 0
        for i, result in enumerate(got.values):
            if sent_to[i] is not self.owner[i]:
                early = len(new[i]) if step in self.ahead[i] else 0
                restarted += len(self.held[i]) - early
                retried += len(self.held[i]) + len(new[i]) - early
                self.owner[i], self.held[i], self.ahead[i] = sent_to[i], [], set()
                self.trained = {key: c for key, c in self.trained.items() if key[0] != i}
            self._account(i, step, result)
            episodes += result["episodes"]
            train += result["train"]
        return StepRollout(
            episodes,
            train,
            time.perf_counter() - started,
            {
                "cluster/workers": float(n),
                "cluster/workers_replaced": float(len(got.replaced)),
                "cluster/tasks_retried": float(retried),
                "cluster/groups_restarted": float(restarted),
            },
        )

    def _account(self, i: int, step: int, result: dict[str, Any]) -> None:
        """Track slot ``i``'s live groups; hand a finished episode's calls what their trained copies got."""
        for s, tasks in result["started"].items():
            self.held[i] += tasks
            if s > step:
                self.ahead[i].add(s)
        self.ahead[i] = {s for s in self.ahead[i] if s > step}
        for view, ids in zip(result["train"], result["train_ids"], strict=True):
            for call, key in zip(view.calls, ids, strict=True):
                self.trained[(i, key)] = call
        for episode, ids in zip(result["episodes"], result["episode_ids"], strict=True):
            for call, key in zip(episode.calls, ids, strict=True):
                earlier = self.trained.pop((i, key), None)
                if earlier is not None and earlier is not call:  # trained at an earlier step
                    call.advantage = earlier.advantage
                    if "trained_step" in earlier.timings:
                        call.timings["trained_step"] = earlier.timings["trained_step"]
            if episode.sample == 0:  # one per group: the group has finished
                done = next((k for k, task in enumerate(self.held[i]) if task.id == episode.task_id), None)
                if done is not None:
                    del self.held[i][done]

    def published(self, step: int) -> None:
        self.version += 1
        self.pool.push_weights(self.weights(), self.version)

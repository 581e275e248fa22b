"""The trainer as a Ray actor group: data-parallel ranks that update the policies in step.

Each ``TrainerRank`` builds the run's policies and optimizer as the driver would, takes the driver's
weights, and joins a ``torch.distributed`` group (gloo) led by rank 0. A step's samples go to every rank
(one copy in Ray's object store); each trains on its share of every mini-batch and the gradients are
summed over the ranks (``workbench.rl.data_parallel``), so the ranks stay identical and apply the update
one process would. The driver then loads rank 0's weights into its own policies, from where they reach
the rollout workers, the held-out evaluation and the checkpoints.

Checkpoints see the group through ``optimizer``: saving reads rank 0's optimizer state; loading (after
``checkpoint.load`` has restored the driver's weights) sends weights and optimizer state to every rank,
so a checkpoint written by a group resumes in one process and the other way round. A rank that dies
fails the step with ``TrainerLostError``; the run then resumes from its last checkpoint.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from workbench.cluster.placement import Needs, connect, trainer_ranks, wait_started


class TrainerLostError(RuntimeError):
    """A trainer rank died: the step cannot finish; resume the run from its last checkpoint."""


class TrainerRank:
    def __init__(
        self, spec: dict[str, Any], config: dict[str, Any], rank: int, size: int, plugins: bytes | None = None
    ):
        from workbench.engine import plugins as run_plugins
        from workbench.rl.config import TrainConfig
        from workbench.rl.parts import load_policies
        from workbench.topology import from_dict

        self.config = TrainConfig.from_dict(config)
        run_plugins.import_modules(self.config.plugins)
        run_plugins.restore(plugins)
        self.rank, self.size = rank, size
        self.policies, self.ref = load_policies(
            from_dict(spec), self.config, self.config.seed, with_reference=bool(self.config.kl_coef)
        )
        self.trainer: Any = None

    def address(self) -> str:
        """host:port where rank 0 waits for the others (a port free on this node)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return f"{host}:{probe.getsockname()[1]}"

    def join(self, address: str) -> int:
        from workbench.rl.data_parallel import join
        from workbench.rl.parts import policy_trainer

        shard = join(address, self.rank, self.size, on_gpu=self.policies.placement.device.type == "cuda")
        self.trainer = policy_trainer(self.policies, self.config, self.ref, shard)
        return self.rank

    def load(self, weights: dict[str, Any], optimizer_state: dict[str, Any] | None = None) -> None:
        self.policies.load_state(weights)
        if optimizer_state is not None:
            self.trainer.optimizer.load_state_dict(optimizer_state)

    def step(self, samples: list[Any], step_index: int) -> dict[str, Any]:
        metrics = self.trainer.step(samples, step_index)
        for model in self.policies.unique_models().values():
            model.eval()
        return metrics

    def weights(self) -> dict[str, Any]:
        return self.policies.state()

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's state on the CPU: the driver that checkpoints it may have no GPU (``load_state_dict`` moves
        it back to each parameter's device)."""
        import torch

        state = self.trainer.optimizer.state_dict()
        return torch.utils._pytree.tree_map(lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, state)

    def pid(self) -> int:
        return os.getpid()


class _GroupOptimizer:
    """The group's optimizer as checkpoints see it: rank 0's state out, every rank's state in."""

    def __init__(self, group: TrainerGroup):
        self.group = group

    def state_dict(self) -> dict[str, Any]:
        return self.group._get([self.group.ranks[0].optimizer_state.remote()])[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.group.load(self.group.policies.state(), state)


class TrainerGroup:
    """``size`` trainer ranks on the cluster at ``address``, standing in for one ``PolicyTrainer``."""

    def __init__(
        self,
        address: str,
        spec: dict[str, Any],
        config: dict[str, Any],
        policies: Any,
        size: int,
        cpus_per_rank: float = 1.0,
        gpus_per_rank: float = 0.0,
        log: Callable[[str], None] = print,
        plugins: bytes | None = None,
        needs: Needs | None = None,
    ):
        """``needs``: the whole run's actors, checked against the cluster before any rank starts
        (``workbench.cluster.placement``); None: not checked."""
        import ray

        self.started_ray = connect(address, needs)
        self.policies, self.log = policies, log
        actor = ray.remote(num_cpus=cpus_per_rank, num_gpus=gpus_per_rank)(TrainerRank)
        self.ranks = [actor.remote(spec, config, rank, size, plugins) for rank in range(size)]
        # every rank placed and built before rank 0 waits for the others in the group's first collective
        started = [rank.pid.remote() for rank in self.ranks]
        wait_started(started, trainer_ranks(size, cpus_per_rank, gpus_per_rank), log)
        self._get(started)
        leader = self._get([self.ranks[0].address.remote()])[0]
        self._get([rank.join.remote(leader) for rank in self.ranks])
        self.load(policies.state())
        self.optimizer = _GroupOptimizer(self)
        self.updates = 0  # optimizer steps taken, as PolicyTrainer counts them

    def load(self, weights: dict[str, Any], optimizer_state: dict[str, Any] | None = None) -> None:
        import ray

        shared = ray.put(weights), ray.put(optimizer_state)
        self._get([rank.load.remote(*shared) for rank in self.ranks])

    def step(self, samples: list[Any], step_index: int = 0) -> dict[str, Any]:
        """Every rank trains on its share of ``samples``; the driver's policies take the new weights."""
        import ray

        shared = ray.put(samples)
        metrics = self._get([rank.step.remote(shared, step_index) for rank in self.ranks])[0]
        self.policies.load_state(self._get([self.ranks[0].weights.remote()])[0])
        self.updates += metrics["optimizer_steps"]
        return {**metrics, "cluster/trainers": float(len(self.ranks))}

    def pids(self) -> list[int]:
        return self._get([rank.pid.remote() for rank in self.ranks])

    def _get(self, refs: list[Any]) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError

        try:  # the first failure counts: the other ranks may wait for the lost one in a collective
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready[0])
            return ray.get(refs)
        except RayActorError as error:
            raise TrainerLostError(
                f"a trainer rank died ({str(error).splitlines()[0]}); the step cannot finish: "
                "resume the run (workbench train --resume) to restart from its last checkpoint"
            ) from error

    def close(self) -> None:
        import ray

        for rank in self.ranks:
            ray.kill(rank)
        self.ranks = []
        if self.started_ray:
            ray.shutdown()

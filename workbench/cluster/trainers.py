"""The trainer as a Ray actor group: FSDP2 ranks that update the policies in step.

Each ``TrainerRank`` builds the run's policies as the driver would, joins a ``torch.distributed`` group
(NCCL on GPUs, gloo on CPUs) led by rank 0, shards its policies over it (``workbench.rl.fsdp``) and takes
the driver's weights into its shards. A step's samples go to every rank (one copy in Ray's object store);
each trains on its share of every mini-batch and FSDP sums the gradients over the ranks, so the group
applies the update one process would. Every rank then gathers the full weights, one tensor at a time to
the CPU (a collective), and the driver loads rank 0's into its own policies, from where they reach the
rollout workers, the held-out evaluation and the checkpoints (``sync/bytes``, ``sync/seconds``).

Checkpoints: every rank writes its own shards of the trained weights and AdamW state
(``save_shards``, ``workbench.rl.sharded_checkpoint``) and reads back its part of whatever a checkpoint holds
(``load_shards``), so a checkpoint written by a group resumes in one process or on another number of ranks,
and the other way round. A checkpoint from before the shards goes in through ``optimizer``, whose state is
the full one gathered to rank 0. A rank that dies fails the step with ``TrainerLostError``; the run then
resumes from its last checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
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
        """Full weights (keyed as ``PolicySet.state``) and a lone trainer's optimizer state into this rank's shards."""
        from workbench.rl.fsdp import load_full, load_optimizer_state

        for name, model in self.policies.unique_models().items():
            prefix = f"{name}/"
            load_full(model, {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
        if optimizer_state is not None:
            load_optimizer_state(self.trainer.optimizer, optimizer_state)

    def step(self, samples: list[Any], step_index: int) -> dict[str, Any]:
        metrics = self.trainer.step(samples, step_index)
        for model in self.policies.unique_models().values():
            model.eval()
        return metrics

    def weights(self) -> dict[str, Any]:
        """The trained weights as ``PolicySet.state`` keys them, full, on the CPU: rank 0's ({} elsewhere).
        Every rank must take part: the gathers are collectives."""
        from workbench.rl.fsdp import full_state

        lora = self.policies.mode == "lora"
        return full_state(self.policies.unique_models(), lambda key: not lora or "lora_" in key)

    def optimizer_state(self) -> dict[str, Any] | None:
        """AdamW's full state on the CPU, as a lone trainer's (the driver that checkpoints it may have no GPU):
        rank 0's (None elsewhere). Every rank must take part."""
        from workbench.rl.fsdp import full_optimizer_state

        return full_optimizer_state(self.trainer.optimizer)

    def save_shards(self, directory: str) -> None:
        """Write this rank's shards of the checkpoint into ``directory`` (every rank at once)."""
        from workbench.rl.sharded_checkpoint import save_shards

        save_shards(Path(directory), self.trainer.models, self.trainer.optimizer)

    def load_shards(self, directory: str) -> None:
        """Read this rank's part of the checkpoint in ``directory``, resharded to this group (every rank at once)."""
        from workbench.rl.sharded_checkpoint import load_shards

        load_shards(Path(directory), self.trainer.models, self.trainer.optimizer)

    def pid(self) -> int:
        return os.getpid()


class _GroupOptimizer:
    """The group's optimizer as checkpoints see it: rank 0's state out, every rank's state in."""

    def __init__(self, group: TrainerGroup):
        self.group = group

    def state_dict(self) -> dict[str, Any]:
        return self.group._get([rank.optimizer_state.remote() for rank in self.group.ranks])[0]

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
        started = time.perf_counter()
        weights = self._get([rank.weights.remote() for rank in self.ranks])[0]
        self.policies.load_state(weights)
        synced = {
            "sync/bytes": float(sum(v.numel() * v.element_size() for v in weights.values())),
            "sync/seconds": time.perf_counter() - started,
        }
        self.updates += metrics["optimizer_steps"]
        return {**metrics, **synced, "cluster/trainers": float(len(self.ranks))}

    def save_shards(self, directory: Path) -> None:
        """Every rank writes its shards of the checkpoint into ``directory`` (``workbench.rl.checkpoint.save``)."""
        self._get([rank.save_shards.remote(str(directory)) for rank in self.ranks])

    def load_shards(self, directory: Path) -> None:
        """Every rank reads its part of the checkpoint in ``directory`` (``workbench.rl.checkpoint.load``)."""
        self._get([rank.load_shards.remote(str(directory)) for rank in self.ranks])

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

"""The parts every process of a run builds alike from its topology and training config.

The driver (``workbench.rl.loop``), a cluster's rollout workers and its trainer ranks each load the
policies, and build the trainer over them or the rollout engine over their backends, the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.engine import Rollout
from workbench.rl.config import TrainConfig
from workbench.rl.policies import PolicySet
from workbench.rl.trainer import PolicyTrainer
from workbench.topology import Topology


def load_policies(
    topology: Topology, config: TrainConfig, seed: int, with_reference: bool = False
) -> tuple[PolicySet, Any]:
    """Seed torch with ``seed``, then load the config's model as its policy set; with ``with_reference``
    also the frozen KL reference (else None)."""
    torch.manual_seed(seed)
    return PolicySet.load(topology, config, with_reference=with_reference)


def policy_trainer(
    policies: PolicySet, config: TrainConfig, reference: Any = None, shard: Any = None
) -> PolicyTrainer:
    """The trainer of ``policies`` with the config's optimizer. Given ``shard`` (its rank in a group, joined),
    the policies (and the reference) are first sharded over the group with FSDP2, in place."""
    if shard is not None:
        from workbench.rl.fsdp import shard_models

        models = [*policies.unique_models().values(), *([reference] if reference is not None else [])]
        shard_models(models, policies.placement.device.type, policies.placement.dtype)
    return PolicyTrainer(
        policies.models, config.optim(), ref_model=reference, activate=policies.activate, shard=shard
    )


def rollout_engine(
    topology: Topology, config: TrainConfig, backends: dict[str, Any], judge: Any = None
) -> Rollout:
    """The engine that rolls ``topology`` out on ``backends`` within the config's token limit, each request
    seeded from the run's seed (and, in training, the step: the schedulers pass it), so a run repeats itself
    whatever shares a decode batch and wherever it rolls out."""
    return Rollout(topology, backends, max_tokens=config.max_tokens, judge=judge, seed=config.seed)

"""Sharded checkpoints (``torch.distributed.checkpoint``): a lone trainer's round trip for every policy layout,
resharding between FSDP2 groups of 2 and 4 gloo ranks and one process, and kill -9 while one is written.

The ranks and the writers killed are forked from one fork server (``tests.test_fsdp.forked``), which imported
torch, transformers and the workbench once for them all.
"""

from __future__ import annotations

import copy
import multiprocessing
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

import workbench as wb
from tests.grpo_samples import grpo_groups
from tests.test_fsdp import fork_server, forked  # noqa: F401 (the module's fork server)
from workbench.models import load as load_model
from workbench.rl import checkpoint
from workbench.rl.config import TrainConfig
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.rl.sharded_checkpoint import load_shards, read_trained, save_shards
from workbench.rl.trainer import PolicyTrainer

ROLES = ("solver", "verifier1", "corrector1")


def _trainer(layout: str) -> tuple[PolicySet, PolicyTrainer]:
    config = TrainConfig(
        model="tiny",
        topology="marsrl",
        policies=layout,
        policy_per_role=layout != "shared",
        learning_rate=1e-2,
        mini_batch_size=6,
    )
    topology = wb.load_topology("marsrl")
    if config.policy_per_role:
        topology = per_role_policies(topology)
    model, tokenizer = load_model("tiny")
    policies = PolicySet.from_config(topology, model, tokenizer, config)
    return policies, PolicyTrainer(policies.models, config.optim(), activate=policies.activate)


def _samples(layout: str, seed: int) -> list:
    samples = grpo_groups(600, groups=1, size=6, seed=seed, roles=ROLES, policy="base", longest=6)
    for sample in samples:
        sample.policy = sample.policy if layout == "shared" else sample.role
    return samples


def _weights(policies: PolicySet) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policies.state().items()}  # on the CPU the state is the live tensors


def _optimizer_state(trainer: PolicyTrainer) -> dict:
    return {
        k: {n: v.clone() for n, v in s.items()} for k, s in trainer.optimizer.state_dict()["state"].items()
    }


@pytest.mark.parametrize("layout", ["shared", "separate", "lora"])
def test_a_lone_trainer_resumes_its_weights_adamw_state_and_next_update_exactly(layout, tmp_path):
    policies, trainer = _trainer(layout)
    trainer.step(_samples(layout, 0))
    saved, moments = _weights(policies), _optimizer_state(trainer)
    path = checkpoint.save(tmp_path, 3, trainer, {"policy_version": 1, "updates": trainer.updates})
    assert (path / checkpoint.SHARDS).is_dir() and not (path / "weights.pt").exists()
    trainer.step(_samples(layout, 1))
    uninterrupted = _weights(policies)

    stored = checkpoint.trained_weights(path)
    assert stored.keys() == saved.keys()  # a LoRA run stores the adapters only
    assert layout != "lora" or all("lora_" in k for k in stored)
    assert all(torch.equal(stored[k], saved[k]) for k in saved)

    resumed_policies, resumed = _trainer(layout)
    assert checkpoint.load(checkpoint.latest(tmp_path), resumed_policies, resumed)["step"] == 3
    assert all(torch.equal(v, saved[k]) for k, v in resumed_policies.state().items())
    restored = _optimizer_state(resumed)
    assert restored.keys() == moments.keys()
    for index, state in moments.items():
        for name, value in state.items():
            assert torch.equal(restored[index][name], value), (index, name)
    resumed.step(_samples(layout, 1))
    assert all(torch.equal(v, uninterrupted[k]) for k, v in resumed_policies.state().items())


def test_a_checkpoint_written_before_the_shards_still_loads(tmp_path):
    policies, trainer = _trainer("shared")
    trainer.step(_samples("shared", 0))
    path = tmp_path / "checkpoints" / "step-000000"
    checkpoint.save(tmp_path, 0, trainer, {"policy_version": 1})
    torch.save(policies.state(), path / "weights.pt")  # the old layout: whole files, no shards
    torch.save(trainer.optimizer.state_dict(), path / "optimizer.pt")
    for file in (path / checkpoint.SHARDS).iterdir():
        file.unlink()
    (path / checkpoint.SHARDS).rmdir()
    resumed_policies, resumed = _trainer("shared")
    checkpoint.load(path, resumed_policies, resumed)
    assert all(torch.equal(v, policies.state()[k]) for k, v in resumed_policies.state().items())
    assert checkpoint.trained_weights(path).keys() == policies.state().keys()


# ---------------------------------------------------------------- resharding with FSDP2 over gloo

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
_BATCH = torch.arange(3, 3 + 2 * 24).reshape(2, 24) % 600


def _model_and_optimizer(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The tiny model (each decoder layer and the root sharded over ``world`` ranks when > 0) and AdamW."""
    model, _ = load_model("tiny")
    if world:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _update(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(input_ids=_BATCH, labels=_BATCH).loss.backward()
    optimizer.step()


def _full(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full weights and AdamW state, keyed by parameter name (gathered on rank 0; copies, not live tensors)."""
    full = {
        "weights": get_model_state_dict(model, options=_FULL),
        "adamw": get_optimizer_state_dict(model, optimizer, options=_FULL).get("state", {}),
    }
    return copy.deepcopy(full)


def _resume(world: int, kind: str, directory: str) -> tuple[dict, dict]:
    """Write (after one update) or load the shards in ``directory``; the state then, and after one update."""
    model, optimizer = _model_and_optimizer(world)
    if kind == "write":
        _update(model, optimizer)
        save_shards(Path(directory), {"base": model}, optimizer)
    else:
        load_shards(Path(directory), {"base": model}, optimizer)
    then = _full(model, optimizer)
    _update(model, optimizer)
    return then, _full(model, optimizer)


def _rank(rank: int, world: int, init: str, jobs: list[tuple[str, str, str]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        for kind, directory, out in jobs:
            result = _resume(world, kind, directory)
            if rank == 0:
                torch.save(result, out)
    finally:
        dist.destroy_process_group()


def _group(tmp_path: Path, world: int, jobs: list[tuple[str, str, str]]) -> None:
    forked(_rank, (world, str(tmp_path / f"init-{world}"), jobs), nprocs=world)


def _assert_same(got: dict, expected: dict, exact: bool = True) -> None:
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-7)

    assert got["weights"].keys() == expected["weights"].keys()
    for key, value in expected["weights"].items():
        assert same(got["weights"][key], value), key
    assert got["adamw"].keys() == expected["adamw"].keys()
    for key, state in expected["adamw"].items():
        for name, value in state.items():
            assert same(got["adamw"][key][name], value), (key, name)


def test_fsdp_shards_reshard_from_2_ranks_to_1_and_4_and_from_1_to_2(tmp_path):
    torch.manual_seed(0)
    lone_dir, pair_dir = str(tmp_path / "lone"), str(tmp_path / "pair")
    lone = _resume(0, "write", lone_dir)  # one process, no group
    _group(
        tmp_path,
        2,
        [("write", pair_dir, str(tmp_path / "pair.pt")), ("load", lone_dir, str(tmp_path / "1to2.pt"))],
    )
    _group(tmp_path, 4, [("load", pair_dir, str(tmp_path / "2to4.pt"))])
    pair = torch.load(tmp_path / "pair.pt", weights_only=False)
    _assert_same(pair[0], lone[0], exact=False)  # the group's first update is the lone one's
    for name, written in (("2to1", pair), ("2to4", pair), ("1to2", lone)):
        if name == "2to1":
            got = _resume(0, "load", pair_dir)
        else:
            got = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        _assert_same(got[0], written[0])  # the state written is the state loaded
        _assert_same(got[1], written[1], exact=False)  # and the next update the uninterrupted one
    trained = read_trained(Path(pair_dir))
    assert trained.keys() == {f"base/{k}" for k in pair[0]["weights"]}
    assert all(torch.equal(trained[f"base/{k}"], v) for k, v in pair[0]["weights"].items())


# ---------------------------------------------------------------- kill -9 while a checkpoint is written


def _adamw_on_tiny() -> SimpleNamespace:
    """A trainer as ``checkpoint`` sees one: the tiny model and AdamW."""
    model, _ = load_model("tiny")
    return SimpleNamespace(models={"base": model}, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))


def _step(trainer: SimpleNamespace) -> None:
    for p in trainer.models["base"].parameters():
        p.grad = torch.full_like(p, 0.5)
    trainer.optimizer.step()


def _write_until_killed(run_dir: str) -> None:
    """Resume from the newest checkpoint in ``run_dir``, then step and checkpoint (keeping two) forever."""
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.disable_progress_bar()  # its lock is a semaphore that a process killed leaves to clean up
    trainer, step = _adamw_on_tiny(), 0
    if (latest := checkpoint.latest(run_dir)) is not None:
        step = checkpoint.load(latest, None, trainer)["step"] + 1
    while True:
        _step(trainer)
        checkpoint.save(run_dir, step, trainer, {"policy_version": step}, keep=2)
        step += 1


def test_kill_9_while_writing_shards_leaves_the_previous_checkpoint_whole(tmp_path):
    context, chooser, committed = multiprocessing.get_context("forkserver"), random.Random(0), -1
    for _ in range(3):
        writer = context.Process(target=_write_until_killed, args=(str(tmp_path),))
        writer.start()
        try:
            deadline = time.monotonic() + 120
            while (latest := checkpoint.latest(tmp_path)) is None or int(latest.name[5:]) <= committed:
                assert writer.is_alive() and time.monotonic() < deadline, "the writer saved nothing new"
                time.sleep(0.02)
            time.sleep(chooser.uniform(0.0, 0.5))
        finally:
            writer.kill()  # SIGKILL
            writer.join()
        latest = checkpoint.latest(tmp_path)
        step = int(latest.name[5:])
        assert step > committed, "no committed step is lost"
        committed = step
    # the newest complete checkpoint loads, and is the state of an uninterrupted run after as many steps
    resumed, expected = _adamw_on_tiny(), _adamw_on_tiny()
    assert checkpoint.load(checkpoint.latest(tmp_path), None, resumed)["step"] == committed
    for _ in range(committed + 1):
        _step(expected)
    for got, want in zip(
        resumed.models["base"].parameters(), expected.models["base"].parameters(), strict=True
    ):
        assert torch.equal(got, want)
    got_state, want_state = resumed.optimizer.state_dict()["state"], expected.optimizer.state_dict()["state"]
    assert all(torch.equal(got_state[i]["exp_avg_sq"], want_state[i]["exp_avg_sq"]) for i in want_state)
    assert len(checkpoint.complete(tmp_path)) <= 2, "keep=2 prunes older checkpoints"

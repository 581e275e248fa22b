"""FSDP2 trainer ranks (issue 48): two ranks over gloo apply the update one trainer applies.

One group of two processes runs every case (shared weights, a model per role, a LoRA adapter per role, a
shared model with the KL reference) on the tiny model while this process runs the lone trainer on the
same weights and samples; the first optimizer step's gradients (after FSDP's reduction) and parameters
are compared, then the weights after the whole step and the optimizer state gathered out of the shards.
The ranks defer the gradients' reduce-scatter to each model's last micro-batch of a role's gradient (the
default off a GPU) and count their reduce-scatters; three cases run again with a sample a micro-batch and
the roles' gradients not measured (one gradient an optimizer step, of several micro-batches): shared weights
syncing after every micro-batch, and deferred with a model per role and with LoRA per role (several models
or adapters accumulating unsharded in one gradient).

The ranks are forked from a fork server that imported torch, transformers, peft and these tests once
(``forked``; ``tests/test_sharded_checkpoint.py``'s ranks and writers too): a process spawned afresh imports
them again, 7 to 14 s of CPU each.
"""

from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.forkserver
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.multiprocessing as mp

import workbench as wb
from workbench.models import load as load_model
from workbench.rl.config import TrainConfig
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.rl.samples import Sample

CASES: dict[str, dict[str, Any]] = {
    "shared": {"policies": "shared"},
    "separate": {"policies": "separate", "policy_per_role": True},
    "lora": {"policies": "lora", "policy_per_role": True},
    "shared_kl": {"policies": "shared", "kl_coef": 0.1},
}
#: The ranks' runs: each case as the trainer defaults (deferred syncs, each role's gradient measured), and three
#: more, each compared with its case's lone trainer: (case, trainer config fields set, whether syncs are deferred).
ONE_GRADIENT = {"measure_role_gradients": False, "token_budget": 24}  # a sample a micro-batch
RUNS: dict[str, tuple[str, dict[str, Any], bool]] = {
    **{case: (case, {}, True) for case in CASES},
    "shared, one gradient a step, synced every micro-batch": ("shared", ONE_GRADIENT, False),
    "separate, one gradient a step": ("separate", ONE_GRADIENT, True),
    "lora, one gradient a step": ("lora", ONE_GRADIENT, True),
}


#: What the ranks import, imported once by the fork server they are forked from (it runs no torch op: a process
#: forked after OpenMP's threads started could hang in them). Each then imports only its test module.
PRELOAD = [
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "transformers.models.qwen2.modeling_qwen2",
    "peft",
    "workbench.rl.parts",
    "workbench.rl.fsdp",
    "workbench.rl.checkpoint",
    "tests.grpo_samples",
]


def forked(fn: Callable[..., None], args: tuple, nprocs: int, join: bool = True) -> Any:
    """``torch.multiprocessing.spawn``, each process forked from the fork server (``fork_server``)."""
    return mp.start_processes(fn, args=args, nprocs=nprocs, join=join, start_method="forkserver")


@pytest.fixture(scope="module", autouse=True)
def fork_server() -> Iterator[None]:
    """The fork server, importing ``PRELOAD`` while the module's first tests run; stopped after the module (it
    holds ~0.5 GB)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
    yield
    multiprocessing.forkserver._forkserver._stop()


def some_samples(tokenizer: Any, n: int = 10) -> list[Sample]:
    """Samples of three roles (each with its policy when per role) with varied lengths and advantages."""
    roles = ["solver", "verifier1", "corrector1"]
    out = []
    for i in range(n):
        prompt = tokenizer(f"Question {i}: what is {i} + {2 * i}?")["input_ids"]
        completion = tokenizer(" The answer is" + " really" * (i % 4) + f" {3 * i}.")["input_ids"]
        mask = [1] * len(completion)
        mask[0] = 0 if i % 3 == 0 else 1  # a masked token here and there
        out.append(
            Sample(
                prompt_ids=prompt,
                completion_ids=completion,
                mask=mask,
                old_logprobs=[-2.0] * len(completion),
                role=roles[i % 3],
                policy="base",
                advantage=(-1.0) ** i * (0.5 + i / n),
            )
        )
    return out


def build(case: str) -> tuple[TrainConfig, PolicySet, Any, list[Sample]]:
    """The case's config, policies (seeded alike in every process), KL reference and samples."""
    # AdamW's first step moves a weight by lr * g / (|g| + eps): where |g| is near eps (1e-8) the sums' order
    # shows (at lr 1e-3, 3e-6 on a gradient of 7e-9 whose tensor agrees within 1e-5); lr 1e-4 keeps it under 1e-6
    fields = dict(model="tiny", topology="marsrl", tasks="arithmetic", learning_rate=1e-4)
    # 10 samples in mini-batches of 4, 4 and 2: the ranks' shares of a role differ
    cfg = TrainConfig(**fields, mini_batch_size=4, **CASES[case])
    topology = wb.load_topology("marsrl")
    if cfg.policy_per_role:
        topology = per_role_policies(topology)
    torch.manual_seed(0)
    model, tokenizer = load_model("tiny")
    reference = copy.deepcopy(model).eval() if cfg.kl_coef else None
    policies = PolicySet.from_config(topology, model, tokenizer, cfg)
    samples = some_samples(tokenizer)
    for s in samples:
        s.policy = s.role if cfg.policy_per_role else s.policy
    return cfg, policies, reference, samples


def first_step(trainer: Any) -> dict[str, list]:
    """Filled at the trainer's first optimizer step: its gradients and, after it, its parameters (full)."""
    from torch.distributed.tensor import DTensor

    def full(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    seen: dict[str, list] = {}

    def before(*_: Any) -> None:
        if "grads" not in seen:
            seen["grads"] = [full(p.grad) for p in trainer.parameters]

    def after(*_: Any) -> None:
        if "params" not in seen:
            seen["params"] = [full(p) for p in trainer.parameters]

    trainer.optimizer.register_step_pre_hook(before)
    trainer.optimizer.register_step_post_hook(after)
    return seen


def count_reduce_scatters(trainer: Any, samples: list[Sample]) -> dict[str, int]:
    """Filled during the trainer's steps: FSDP's reduce-scatters, and how many there would be syncing once per
    model and gradient (``deferred``) or after every micro-batch (``every``), from the passes the trainer runs
    and the units (``fully_shard`` modules) that hold trained parameters."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    trained = {id(p) for p in trainer.parameters}

    def units(model: Any) -> int:  # counted while the parameters are the sharded ones, the trainer's
        fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
        own = {m: {id(p) for p in m.parameters()} for m in fsdp}
        for m in fsdp:  # a unit's own parameters: not those of the units inside it
            own[m] -= {key for sub in fsdp if sub is not m and sub in set(m.modules()) for key in own[sub]}
        return sum(bool(own[m] & trained) for m in fsdp)

    unit_count = {id(m): units(m) for m in trainer.models.values()}
    counts = {"reduce_scatters": 0, "deferred": 0, "every": 0, "passes": 0}
    reduce_scatter, sync_points = dist.reduce_scatter_single, trainer._sync_points

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts["reduce_scatters"] += 1
        return reduce_scatter(*args, **kwargs)

    def planned(batch: Any, passes: list) -> set[int]:  # called once per gradient, with its passes
        models = [trainer.models[batch[micro[0]].policy] for micro, _ in passes]
        counts["passes"] += len(passes)
        counts["every"] += sum(unit_count[id(m)] for m in models)
        counts["deferred"] += sum(unit_count[id(m)] for m in {id(m): m for m in models}.values())
        return sync_points(batch, passes)

    dist.reduce_scatter_single = counted
    trainer._sync_points = planned
    return counts


def _rank(rank: int, store: str, out: str) -> None:
    import dataclasses

    import torch.distributed as dist

    from workbench.rl.data_parallel import Shard
    from workbench.rl.fsdp import full_optimizer_state, full_state, load_full, load_optimizer_state
    from workbench.rl.parts import policy_trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    results = {}
    reduce_scatter = dist.reduce_scatter_single
    for run, (case, options, defer) in RUNS.items():
        cfg, policies, reference, samples = build(case)
        initial = policies.state()
        trainer = policy_trainer(policies, cfg, reference, Shard(rank, 2))
        assert trainer.defer_sync  # the default off a GPU
        trainer.defer_sync = defer
        trainer.config = dataclasses.replace(trainer.config, **options)
        for name, model in policies.unique_models().items():  # full weights into the shards
            load_full(model, {k.split("/", 1)[1]: v for k, v in initial.items() if k.startswith(f"{name}/")})
        seen = first_step(trainer)
        counts = count_reduce_scatters(trainer, samples)
        metrics = trainer.step(samples, step_index=3)
        dist.reduce_scatter_single = reduce_scatter
        counts["deferring"] = trainer.defer_sync
        if run != case:
            if rank == 0:
                results[run] = {**seen, "metrics": metrics, "counts": counts}
            continue
        lora = policies.mode == "lora"
        weights = full_state(policies.unique_models(), lambda key, lora=lora: not lora or "lora_" in key)
        optimizer = full_optimizer_state(trainer.optimizer)
        if case == "shared":  # the gathered state, loaded back into the shards, gathers the same
            shared = [optimizer]
            dist.broadcast_object_list(shared)
            load_optimizer_state(trainer.optimizer, shared[0])
            again = full_optimizer_state(trainer.optimizer)
        if rank == 0:
            results[case] = {**seen, "metrics": metrics, "weights": weights, "optimizer": optimizer}
            results[case]["counts"] = counts
            if case == "shared":
                results[case]["optimizer_again"] = again
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_two_fsdp_ranks_over_gloo_apply_the_update_one_trainer_applies(tmp_path: Path) -> None:
    from workbench.rl.parts import policy_trainer

    out = tmp_path / "ranks.pt"
    group = forked(_rank, (str(tmp_path / "store"), str(out)), nprocs=2, join=False)
    alone = {}
    for case in CASES:  # meanwhile, the lone trainer on the same weights and samples
        cfg, policies, reference, samples = build(case)
        trainer = policy_trainer(policies, cfg, reference)
        seen = first_step(trainer)
        metrics = trainer.step(samples, step_index=3)
        alone[case] = {**seen, "metrics": metrics, "weights": policies.state(), "optimizer": None}
        alone[case]["optimizer"] = trainer.optimizer.state_dict()
    while not group.join():
        pass
    ranks = torch.load(out, weights_only=False)
    worst: dict[str, float] = {"grad": 0.0, "param": 0.0}
    for case, lone in alone.items():
        got = ranks[case]
        assert [g is None for g in got["grads"]] == [g is None for g in lone["grads"]], case
        assert any(g is not None for g in lone["grads"]), case
        for a, b in zip(got["grads"], lone["grads"], strict=True):
            if b is not None:
                worst["grad"] = max(worst["grad"], relative(a, b))
                assert relative(a, b) < 1e-5, case
        for a, b in zip(got["params"], lone["params"], strict=True):
            worst["param"] = max(worst["param"], float((a - b).abs().max()))
            assert torch.allclose(a, b, rtol=0, atol=1e-6), case
        expected, metrics = lone["metrics"], got["metrics"]
        for key in ("samples", "optimizer_steps", "trained_tokens", "clip_fraction"):
            assert metrics[key] == expected[key], (case, key)
        for key in ("loss", "grad_norm", "ratio/mean", "kl"):
            assert abs(metrics[key] - expected[key]) <= 1e-5 * abs(expected[key]) + 1e-7, (case, key)
        for role, values in expected["per_role"].items():
            norm = metrics["per_role"][role]["grad_norm"]
            assert abs(norm - values["grad_norm"]) <= 1e-5 * values["grad_norm"], (case, role)
        # after the step's three optimizer steps
        assert got["weights"].keys() == lone["weights"].keys(), case
        for key, value in lone["weights"].items():
            assert torch.allclose(got["weights"][key], value, rtol=1e-4, atol=1e-6), (case, key)
        assert got["optimizer"]["state"].keys() == lone["optimizer"]["state"].keys(), case
        for k, state in lone["optimizer"]["state"].items():
            assert int(got["optimizer"]["state"][k]["step"]) == int(state["step"])
            assert torch.allclose(got["optimizer"]["state"][k]["exp_avg"], state["exp_avg"], atol=1e-6)
    again = ranks["shared"]["optimizer_again"]["state"]
    for k, state in ranks["shared"]["optimizer"]["state"].items():
        assert torch.equal(again[k]["exp_avg_sq"], state["exp_avg_sq"])
    # the other runs: the same first optimizer step as their case's lone trainer (measured or not, the
    # gradient is the sum of the roles')
    for run, (case, _, _) in RUNS.items():
        if run == case:
            continue
        got, lone = ranks[run], alone[case]
        for a, b in zip(got["grads"], lone["grads"], strict=True):
            assert (a is None) == (b is None), run
            if b is not None:
                worst["grad"] = max(worst["grad"], relative(a, b))
                assert relative(a, b) < 1e-5, run
        for a, b in zip(got["params"], lone["params"], strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-6), run
        assert abs(got["metrics"]["loss"] - lone["metrics"]["loss"]) <= 1e-5 * abs(lone["metrics"]["loss"])
    # one reduce-scatter per unit of a model that trains, per optimizer step and role (or per optimizer step,
    # the roles not measured), not per micro-batch; the every-micro-batch run reduce-scatters after each pass
    for run, got in ranks.items():
        counts = got["counts"]
        expected = counts["deferred" if counts["deferring"] else "every"]
        assert counts["reduce_scatters"] == expected, (run, counts)
        if run != RUNS[run][0]:  # several micro-batches a gradient: one reduce-scatter for them all
            assert counts["every"] > counts["deferred"], (run, counts)
        print(
            f"{run}: {counts['reduce_scatters']} reduce-scatters, {counts['passes']} passes (synced once per model "
            f"and gradient: {counts['deferred']}, after every pass: {counts['every']})"
        )
    print(f"largest differences: gradients {worst['grad']:.2e} relative, parameters {worst['param']:.2e}")


def test_on_cuda_in_bf16_the_units_gather_bf16_weights_and_reduce_fp32_gradients():
    """The GPU branch's precision, decided without a GPU: bf16 compute on CUDA only; fp32 everywhere else."""
    from workbench.rl.fsdp import mixed_precision

    gpu = mixed_precision("cuda", torch.bfloat16)
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    for device_type, dtype in (("cuda", torch.float32), ("cpu", torch.bfloat16), ("cpu", torch.float32)):
        plain = mixed_precision(device_type, dtype)
        assert (plain.param_dtype, plain.reduce_dtype) == (None, None), (device_type, dtype)


def test_placement_advises_only_the_changes_the_memory_plan_says_fit():
    """When trainer ranks do not fit their GPUs, the advice names the changes the plan says fit, not LoRA (or
    anything else) unconditionally (qwen2-mini on GPUs of a few MiB: the same sums as a 7B on 80 GB)."""
    from workbench.cluster.placement import Needs, memory_fixes, memory_problem, trainer_ranks
    from workbench.rl.memory_plan import PlanSettings

    mib = 1 / 1024  # GiB

    def fixes(**settings: Any) -> list[str]:
        return [fix.split(" (")[0] for fix in memory_fixes("qwen2-mini", PlanSettings(**settings))]

    # weights, gradients and AdamW state take the room: shards or adapters fit; checkpointing is on already
    # and a smaller micro-batch saves too little
    weights = {"gpus": 1, "token_budget": 128, "gpu_memory_gib": 24 * mib}
    assert fixes(**weights) == ["cluster_trainers: 2", "policies: lora"]
    # a micro-batch's activations take it: checkpointing or a smaller one, not LoRA nor more ranks
    activations = {
        "gpus": 2,
        "gradient_checkpointing": False,
        "token_budget": 4096,
        "gpu_memory_gib": 300 * mib,
    }
    assert fixes(**activations) == ["gradient_checkpointing: true", "token_budget: 2048"]
    # none alone: the fewest that fit together
    fp32 = {"gpus": 1, "gradient_checkpointing": False, "mixed_precision": False, "token_budget": 256}
    (together,) = fixes(**fp32, gpu_memory_gib=24 * mib)
    assert together.startswith("together, ") and "cluster_trainers" not in together
    assert fixes(**fp32, gpu_memory_gib=16 * mib) == []  # the head's logits alone are more

    def problem(settings: dict, nodes: list | None = None) -> str:
        gib = settings.pop("gpu_memory_gib")
        needs = Needs(
            (trainer_ranks(settings["gpus"], 1.0, 1.0),), None, "qwen2-mini", PlanSettings(**settings), gib
        )
        found = memory_problem(needs, nodes)
        assert found is not None and found.startswith(
            "needs more GPU memory than each trainer rank has: qwen2-mini"
        )
        return found

    found = problem(dict(weights), [{"CPU": 8.0, "GPU": 1.0}])
    assert "it fits with any of: cluster_trainers: 2" in found and "policies: lora" in found
    assert "gradient_checkpointing" not in found and "token_budget:" not in found
    assert "(cluster_trainers: 2 needs 2 GPUs; the cluster has 1)" in found
    found = problem(dict(activations))
    assert "gradient_checkpointing: true" in found and "lora" not in found and "cluster_trainers" not in found
    assert "nothing the plan can change fits it" in problem({**fp32, "gpu_memory_gib": 16 * mib})


def test_the_memory_plan_counts_the_gradients_a_deferred_sync_keeps_unsharded():
    """Ranks defer the reduce-scatter while the full fp32 gradient is at most a tenth of the GPU (always off
    one); the plan then counts it whole on every rank, and one unit's gradients otherwise."""
    import torch

    from workbench.rl.fsdp import defers_gradient_sync
    from workbench.rl.memory_plan import DEFER_SYNC_SHARE, GIB, plan

    small = plan("qwen2-mini", gpus=2, token_budget=128, gpu_memory_gib=1.0)
    full = 4 * small.measured.parameters
    assert full <= DEFER_SYNC_SHARE * GIB and small.terms["unsharded_gradients"] == full
    tight = plan("qwen2-mini", gpus=2, token_budget=128, gpu_memory_gib=full / DEFER_SYNC_SHARE / GIB / 2)
    assert tight.terms["unsharded_gradients"] == 0
    assert small.terms["unsharded_layers"] < tight.terms["unsharded_layers"]  # a unit's gradients, not all
    assert plan("qwen2-mini", gpus=1, token_budget=128).terms["unsharded_gradients"] == 0  # nothing to reduce
    assert defers_gradient_sync([torch.zeros(10**6)], torch.device("cpu"))  # the host's memory
    # the GPU branch reads the device's memory (a stand-in with CUDA's signature: 40 MB, 4 MB of fp32 gradient)
    gpu = type("Properties", (), {"total_memory": 40 * 10**6})()
    with mock.patch.object(torch.cuda, "get_device_properties", lambda device: gpu):
        assert defers_gradient_sync([torch.zeros(10**6)], torch.device("cuda", 0))  # 4 MB: a tenth
        assert not defers_gradient_sync([torch.zeros(10**6 + 1)], torch.device("cuda", 0))

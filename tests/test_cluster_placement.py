"""Placement of a cluster run (issue 39): what it reserves, checked against the Ray cluster before any actor starts.

The check and the "still waiting" lines are pure functions of the run's settings and the cluster's resources,
tested here without Ray; one end-to-end test runs the over-subscribed command of the issue (two rollout
workers and two trainer ranks on a local cluster of 2 CPUs) and sees it fail in seconds, naming both sides.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import workbench as wb
from workbench.cluster import placement
from workbench.cluster.placement import Needs, problems, rollout_workers, run_needs, trainer_ranks, waiting
from workbench.rl.config import TrainConfig

THE_ISSUES_RUN = "needs 4 CPUs: 2 rollout workers x 1 + 2 trainer ranks x 1; the cluster has 2 — lower"


def test_a_run_needs_its_workers_and_trainer_ranks_as_its_config_sets_them():
    config = TrainConfig(model="tiny", cluster="local", cluster_workers=3, cluster_cpus_per_worker=0.5)
    assert run_needs(config) == Needs((rollout_workers(3, 0.5, 0.0),))
    config = TrainConfig(
        model="tiny",
        cluster="local",
        cluster_trainers=2,
        cluster_gpus_per_trainer=1,
        cluster_cpus_per_trainer=2,
    )
    needs = run_needs(config.to_dict(), driver="cuda:0")
    assert (needs.groups, needs.driver) == (
        (rollout_workers(2, 1.0, 0.0), trainer_ranks(2, 2.0, 1.0)),
        "cuda:0",
    )
    assert needs.model == "tiny" and needs.memory.gpus == 2  # GPU trainer ranks: FSDP ranks, memory planned


def test_an_over_subscribed_run_is_named_with_what_the_cluster_has():
    needs = Needs((rollout_workers(2), trainer_ranks(2)))
    (found,) = problems(needs, {"CPU": 2.0, "memory": 1e9})
    assert found.startswith(THE_ISSUES_RUN)
    assert (
        "cluster_cpus_per_worker, cluster_cpus_per_trainer or the counts (cluster_workers, cluster_trainers)"
        in found
    )
    assert problems(needs, {"CPU": 4.0}) == [] and problems(needs, {"CPU": 4.0}, [{"CPU": 4.0}]) == []
    # without trainer ranks their settings are not named; a fraction of a CPU each adds up
    (alone,) = problems(Needs((rollout_workers(3),)), {"CPU": 2.0})
    assert (
        alone.startswith("needs 3 CPUs: 3 rollout workers x 1; the cluster has 2") and "trainer" not in alone
    )
    assert problems(Needs((rollout_workers(3, 0.1),)), {"CPU": 0.3}) == []  # 0.30000000000000004 fits
    with pytest.raises(
        placement.PlacementError, match="cannot be placed on the Ray cluster: it needs 4 CPUs"
    ):
        placement.check(needs, {"CPU": 2.0})


def test_gpus_are_counted_apart_and_the_drivers_own_model_is_named():
    needs = Needs((rollout_workers(2, 1, 1), trainer_ranks(1, 1, 0)), driver="cuda:0")
    (found,) = problems(needs, {"CPU": 8.0, "GPU": 1.0})
    assert found.startswith(
        "needs 2 GPUs: 2 rollout workers x 1; the cluster has 1 — lower cluster_gpus_per_worker"
    )
    assert "the driver's own model, on cuda:0, is outside Ray's count" in found
    assert problems(Needs((rollout_workers(2, 1, 1),)), {"CPU": 8.0}) == [
        "needs 2 GPUs: 2 rollout workers x 1; the cluster has 0 — lower cluster_gpus_per_worker or the counts "
        "(cluster_workers), or give the cluster more GPUs"
    ]


def test_an_actor_must_fit_on_one_node_not_only_in_the_sum():
    needs = Needs((rollout_workers(1, 3, 0), trainer_ranks(1, 1, 1)))
    nodes = [{"CPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}]
    (found,) = problems(needs, {"CPU": 4.0, "GPU": 1.0}, nodes)
    assert found == (
        "needs 3 CPUs on one node for each rollout worker; no node of the cluster has that much (its nodes have "
        "2 CPUs; 2 CPUs, 1 GPU) — lower cluster_cpus_per_worker"
    )
    assert (
        problems(Needs((rollout_workers(1, 2, 0), trainer_ranks(1, 1, 1))), {"CPU": 4.0, "GPU": 1.0}, nodes)
        == []
    )


def test_actors_that_wait_say_what_for():
    group = rollout_workers(2)
    line = waiting(group, 1, 10.2, {"CPU": 0.0}, {"CPU": 2.0})
    assert line.startswith("1 of 2 rollout workers not started after 10 s: Ray holds them (PENDING_CREATION)")
    assert "until it can reserve 1 CPU for each; free now: 0 of 2 CPUs (other actors or jobs" in line
    assert waiting(group, 2, 5, {"CPU": 1.0}, {"CPU": 2.0}).endswith("still loading their policies")


def test_waiting_for_actors_logs_every_few_seconds_until_all_answer(monkeypatch):
    rounds = iter([["b", "c"], ["c"], []])  # what is still pending after each wait

    def wait(refs, num_returns, timeout):
        assert num_returns == len(refs) and timeout == 0.01
        return [], next(rounds)

    fake = SimpleNamespace(
        wait=wait, available_resources=lambda: {"CPU": 0.0}, cluster_resources=lambda: {"CPU": 2}
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    lines: list[str] = []
    placement.wait_started(["a", "b", "c"], trainer_ranks(3), lines.append, every=0.01)
    assert [line.split(" not started")[0] for line in lines] == [
        "2 of 3 trainer ranks",
        "1 of 3 trainer ranks",
    ]


@pytest.mark.slow
def test_the_issues_over_subscribed_run_fails_in_seconds_naming_both_sides(tmp_path):
    """Two rollout workers and two trainer ranks on a local cluster of 2 CPUs (this machine's, pinned so on
    bigger machines too): it used to wait for ever with its actors PENDING_CREATION."""
    command = [
        sys.executable,
        "-m",
        "workbench.cli",
        "train",
        "--set",
        "model=tiny",
        "--set",
        "topology=marsrl_cpu",
    ]
    for setting in (
        "steps=3",
        "cluster=local",
        "cluster_workers=2",
        "cluster_trainers=2",
        f"runs_dir={tmp_path}",
    ):
        command += ["--set", setting]
    env = {**os.environ, "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 2}), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=120, cwd=Path(__file__).parent
    )
    took = time.monotonic() - started
    assert result.returncode != 0, result.stdout + result.stderr
    assert THE_ISSUES_RUN in result.stderr, result.stderr
    assert took < 60, f"took {took:.0f} s"
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert wb.RunReader(run_dir).info()["status"] == "failed"


def test_fsdp_trainer_ranks_are_checked_against_each_gpus_memory_before_start():
    """A 7B full fine-tune on 2 ranks of 80 GiB GPUs without checkpointing does not fit (the memory plan's
    numbers say why); with it, it does; the GPU's memory comes from the config, else the cluster's GPU type."""
    seven = TrainConfig(
        model="qwen2.5-7b",
        topology="marsrl_cpu",
        cluster="local",
        cluster_trainers=2,
        cluster_gpus_per_trainer=1,
        gradient_checkpointing=False,
        token_budget=8192,
        cluster_gpu_memory_gib=80,
    )
    needs = run_needs(seven)
    assert needs.memory.gpus == 2 and needs.memory.policies == "shared" and needs.gpu_memory_gib == 80
    (found,) = problems(needs, {"CPU": 16.0, "GPU": 8.0})
    assert found.startswith("needs more GPU memory than each trainer rank has: qwen2.5-7b (shared")
    assert "on 2 GPUs:" in found and "does not fit in 72.0 GiB" in found and "adamw state 28.4" in found
    checkpointed = run_needs(dataclasses.replace(seven, gradient_checkpointing=True))
    assert problems(checkpointed, {"CPU": 16.0, "GPU": 8.0}) == []
    lora = run_needs(
        dataclasses.replace(seven, policies="lora", gradient_checkpointing=True, cluster_gpu_memory_gib=None)
    )
    assert lora.gpu_memory_gib is None and lora.memory.policies == "lora"
    h100 = [{"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 1.0}]
    assert problems(lora, {"CPU": 16.0, "GPU": 8.0}, h100) == []
    unknown_gpu = dataclasses.replace(needs, gpu_memory_gib=None)
    assert problems(unknown_gpu, {"CPU": 16.0, "GPU": 8.0}) == []  # not known: not checked
    assert "needs more GPU memory" in problems(unknown_gpu, {"CPU": 16.0, "GPU": 8.0}, h100)[0]
    # trainer ranks on CPUs are not planned
    assert run_needs(dataclasses.replace(seven, cluster_gpus_per_trainer=0)).memory is None

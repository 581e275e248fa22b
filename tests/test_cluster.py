"""Scale-out on Ray (issue 8): rollout workers and trainer ranks as Ray actors, and what happens when one dies.

One local Ray cluster (4 logical CPUs: two rollout workers and two trainer ranks) serves the module. Runs use the tiny local model and MarsRL's topology,
so a step is a second or two; the kill tests find the worker while it executes a rollout (Ray titles
the process ``ray::RolloutWorker.rollout``) and SIGKILL it there, mid-step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch

import workbench as wb
from tests.test_fsdp import some_samples
from workbench.cluster import RolloutPool, TrainerGroup, TrainerLostError, WorkerLostError
from workbench.cluster.pool import shards
from workbench.models import load as load_model
from workbench.rl.config import TrainConfig
from workbench.rl.loop import load_tasks_for, task_order
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.rl.trainer import PolicyTrainer
from workbench.topology import to_dict
from workbench.training import create, run_training


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def kill_a_worker_mid_rollout(timeout: float = 120.0, title: str = "ray::RolloutWorker.rollout") -> int:
    """SIGKILL the first actor process of this test's Ray cluster (a descendant of this process: the other
    tests on the machine have their own) seen executing ``title`` (a rollout by default); its pid."""
    deadline = time.monotonic() + timeout
    me = psutil.Process()
    while time.monotonic() < deadline:
        for process in me.children(recursive=True):
            try:
                if title in " ".join(process.cmdline()):
                    process.kill()
                    return process.pid
            except psutil.Error:  # ended meanwhile
                continue
        time.sleep(0.005)
    raise AssertionError(f"no actor was seen executing {title}")


def config(tmp_path: Path, **overrides) -> TrainConfig:
    fields = dict(
        model="tiny",
        topology="marsrl",
        tasks="arithmetic",
        n_tasks=16,
        steps=3,
        batch_size=4,
        group_size=4,
        max_tokens=16,  # plumbing, not learning: short calls keep a step of four tasks x G=4 brief
        checkpoint_every=100,
        runs_dir=str(tmp_path),
    )
    return TrainConfig(**{**fields, **overrides})


def assert_each_step_stores_every_episode_once(run_dir: Path, steps: int, per_step: int) -> None:
    reader = wb.RunReader(run_dir)
    assert reader.integrity_check() == "ok"
    table = reader.steps()
    assert table["step"].tolist() == list(range(steps)) and set(table["status"]) == {"complete"}
    episodes = reader.episodes()
    for step, group in episodes.groupby("step"):
        keys = list(zip(group["task_id"], group["task_meta"].map(lambda m: m["sample"]), strict=True))
        assert len(keys) == per_step and len(set(keys)) == per_step, f"step {step}: lost or duplicated"


def test_importing_the_workbench_does_not_import_ray():
    code = "import sys, workbench, workbench.rl.loop, workbench.training; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_shards_are_contiguous_and_balanced():
    assert shards(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shards([1], 3) == [[1]]
    assert [x for part in shards(list(range(10)), 4) for x in part] == list(range(10))


def test_a_cluster_needs_workers_and_a_cluster_for_trainers(tmp_path):
    for scheduler in ("async", "pipeline"):  # every scheduler runs on a cluster
        assert config(tmp_path, cluster="local", scheduler=scheduler).scheduler == scheduler
    with pytest.raises(ValueError, match="cluster_workers must be a positive integer"):
        config(tmp_path, cluster="local", cluster_workers=0)
    with pytest.raises(ValueError, match="cluster_trainers needs a cluster"):
        config(tmp_path, cluster_trainers=2)
    with pytest.raises(ValueError, match="cluster_trainers must be an integer >= 0"):
        config(tmp_path, cluster="local", cluster_trainers=-1)


@pytest.mark.slow
def test_a_cluster_run_stores_what_an_in_process_run_stores(ray_cluster, tmp_path):
    here = config(tmp_path / "here", steps=2)
    there = config(tmp_path / "there", steps=2, cluster="local")
    runs = {}
    for name, cfg in (("here", here), ("there", there)):
        run_dir = create(cfg)
        assert run_training(cfg, run_dir, log=lambda _: None) == "finished"
        runs[name] = wb.RunReader(run_dir)
    for reader in runs.values():
        assert_each_step_stores_every_episode_once(reader.run_dir, 2, 4 * 4)
    calls = {name: reader.calls() for name, reader in runs.items()}
    assert list(calls["here"].columns) == list(calls["there"].columns)
    for name in ("here", "there"):
        frame = calls[name]
        roles = set(frame["role"])
        assert "solver" in roles and roles <= {"solver", "verifier1", "corrector1", "verifier2", "corrector2"}
        assert frame.loc[frame["rewards"].notna(), "advantage"].notna().all(), name
        assert (frame.groupby("step")["policy_version"].max() == [0, 1]).all(), name
    metrics = {name: set(reader.metrics_wide().columns) for name, reader in runs.items()}
    assert metrics["there"] - metrics["here"] == {
        "cluster/workers",
        "cluster/workers_replaced",
        "cluster/tasks_retried",
    }
    assert metrics["here"] <= metrics["there"]
    assert runs["there"].metrics_wide()["cluster/workers"].tolist() == [2.0, 2.0]


@pytest.mark.slow
def test_a_worker_killed_mid_rollout_is_replaced_and_its_tasks_rolled_out_again(ray_cluster, tmp_path):
    cfg = config(tmp_path)
    pool = RolloutPool("local", to_dict(wb.load_topology("marsrl")), cfg.to_dict(), 2, log=print)
    try:
        tasks = wb.generate_tasks("arithmetic", n=8, seed=0, level=1)
        before = pool.pids()
        killer = {}
        thread = threading.Thread(target=lambda: killer.update(pid=kill_a_worker_mid_rollout()))
        thread.start()
        episodes, metrics = pool.rollout(tasks, 4)
        thread.join()
        assert killer["pid"] in before and killer["pid"] not in pool.pids()
        assert metrics["cluster/workers_replaced"] == 1.0 and metrics["cluster/tasks_retried"] == 4.0
        assert [(e.task_id, e.sample) for e in episodes] == [(t.id, s) for t in tasks for s in range(4)]
        assert all(e.calls and e.calls[0].role == "solver" for e in episodes)
    finally:
        pool.close()


@pytest.mark.slow
def test_a_step_fails_clearly_when_workers_keep_dying(ray_cluster, tmp_path):
    cfg = config(tmp_path)
    pool = RolloutPool("local", to_dict(wb.load_topology("marsrl")), cfg.to_dict(), 1, max_restarts=0)
    try:
        thread = threading.Thread(target=kill_a_worker_mid_rollout)
        thread.start()
        with pytest.raises(WorkerLostError, match="cluster_max_restarts is 0"):
            pool.rollout(wb.generate_tasks("arithmetic", n=4, seed=0, level=1), 4)
        thread.join()
    finally:
        pool.close()


@pytest.mark.slow
def test_a_training_run_survives_a_killed_worker_and_stores_nothing_twice(ray_cluster, tmp_path):
    cfg = config(tmp_path, cluster="local")
    run_dir = create(cfg)
    killed = {}

    def log(line: str) -> None:
        if line.startswith("step 0:"):  # stored; step 1's rollout starts next
            threading.Thread(target=lambda: killed.update(pid=kill_a_worker_mid_rollout())).start()

    assert run_training(cfg, run_dir, log=log) == "finished"
    assert "pid" in killed
    assert_each_step_stores_every_episode_once(run_dir, 3, 4 * 4)
    wide = wb.RunReader(run_dir).metrics_wide()
    assert wide["cluster/workers_replaced"].tolist() == [0.0, 1.0, 0.0]
    assert wide.loc[1, "cluster/tasks_retried"] == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("policies", ["shared", "lora"])
def test_a_group_of_two_trainer_ranks_applies_the_update_one_trainer_applies(ray_cluster, tmp_path, policies):
    """Two FSDP ranks as Ray actors: the driver's weights go into their shards, the update comes back whole."""
    cfg = config(
        tmp_path,
        policies=policies,
        policy_per_role=policies == "lora",
        learning_rate=1e-4,  # AdamW magnifies the summation order of gradients near eps (tests/test_fsdp.py)
        mini_batch_size=4,  # 10 samples: mini-batches of 4, 4 and 2, so the ranks' shares differ
        ppo_epochs=2,
    )
    topology = wb.load_topology("marsrl")
    if cfg.policy_per_role:
        topology = per_role_policies(topology)

    def policy_set() -> PolicySet:
        model, tokenizer = load_model("tiny")
        return PolicySet.from_config(topology, model, tokenizer, cfg)

    alone, driver = policy_set(), policy_set()
    driver.load_state(alone.state())
    before = {k: v.clone() for k, v in alone.state().items()}
    samples = some_samples(alone.tokenizer)
    if cfg.policy_per_role:
        for s in samples:
            s.policy = s.role
    group = TrainerGroup("local", to_dict(topology), cfg.to_dict(), driver, 2)
    try:
        assert len(set(group.pids())) == 2
        trainer = PolicyTrainer(alone.models, cfg.optim(), activate=alone.activate)
        expected = trainer.step(samples, step_index=3)
        got = group.step(samples, step_index=3)
        assert group.updates == trainer.updates == 6
        assert got["cluster/trainers"] == 2.0
        assert got["sync/bytes"] == sum(v.numel() * v.element_size() for v in driver.state().values())
        assert got["sync/seconds"] > 0
        for key in ("samples", "optimizer_steps", "trained_tokens", "clip_fraction"):
            assert got[key] == expected[key], key
        for key in ("loss", "grad_norm", "ratio/mean"):
            assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
        for role, values in expected["per_role"].items():
            assert got["per_role"][role]["grad_norm"] == pytest.approx(values["grad_norm"], rel=1e-4)
        after_alone, after_group = alone.state(), driver.state()
        moved = [k for k in after_alone if not torch.equal(after_alone[k], before[k])]
        assert moved, "the update changed nothing: the comparison below would be empty"
        for key in after_alone:
            assert torch.allclose(after_group[key], after_alone[key], rtol=1e-4, atol=1e-6), key
        # a checkpoint sees the group's optimizer as one: rank 0's AdamW state matches the lone trainer's
        state = group.optimizer.state_dict()
        lone = trainer.optimizer.state_dict()
        assert state["state"].keys() == lone["state"].keys()
        for k in lone["state"]:
            assert torch.allclose(state["state"][k]["exp_avg"], lone["state"][k]["exp_avg"], atol=1e-6)
    finally:
        group.close()


@pytest.mark.slow
def test_a_run_with_a_trainer_group_resumes_in_one_process_and_stores_each_step_once(ray_cluster, tmp_path):
    grouped = config(tmp_path, cluster="local", cluster_trainers=2, checkpoint_every=1, steps=2)
    run_dir = create(grouped)
    assert run_training(grouped, run_dir, log=lambda _: None) == "finished"
    wide = wb.RunReader(run_dir).metrics_wide()
    assert wide["cluster/trainers"].tolist() == [2.0, 2.0]
    assert (wide["optimizer_steps"] == 1.0).all() and (wide["trained_tokens"] > 0).all()
    # the same run, one step longer, resumed from the group's checkpoint with the update in this process
    alone = config(tmp_path, checkpoint_every=1, steps=3)
    assert run_training(alone, run_dir, log=lambda _: None) == "finished"
    assert_each_step_stores_every_episode_once(run_dir, 3, 4 * 4)
    calls = wb.RunReader(run_dir).calls()
    assert calls.groupby("step")["policy_version"].max().tolist() == [0, 1, 2]


@pytest.mark.slow
def test_a_killed_trainer_rank_fails_the_step_clearly_and_the_run_resumes(ray_cluster, tmp_path):
    cfg = config(tmp_path, cluster="local", cluster_trainers=2, checkpoint_every=1)
    run_dir = create(cfg)
    killed = {}

    def log(line: str) -> None:
        if line.startswith("step 0:"):  # step 0 is stored and checkpointed next; kill in step 1's update
            title = "ray::TrainerRank.step"
            threading.Thread(target=lambda: killed.update(pid=kill_a_worker_mid_rollout(title=title))).start()

    with pytest.raises(TrainerLostError, match="resume the run"):
        run_training(cfg, run_dir, log=log)
    assert "pid" in killed
    reader = wb.RunReader(run_dir)
    assert reader.steps()["step"].tolist() == [0]
    assert run_training(cfg, run_dir, log=lambda _: None) == "finished"
    assert_each_step_stores_every_episode_once(run_dir, 3, 4 * 4)


@pytest.mark.slow
@pytest.mark.vllm  # in make test's vLLM phase: one engine at a time
def test_a_rollout_worker_owns_a_vllm_engine_that_serves_each_steps_adapters(ray_cluster, tmp_path):
    cfg = config(
        tmp_path,
        cluster="local",
        cluster_workers=1,
        backend="vllm",
        policies="lora",
        steps=2,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        learning_rate=1e-3,
    )
    run_dir = create(cfg)
    engines_here = []

    def log(
        line: str,
    ) -> None:  # the worker's engine rolls out; the training process, evaluating nothing, has none
        if line.startswith("step 0:"):
            engines_here.extend(
                p.name() for p in psutil.Process().children() if p.name().startswith("VLLM::")
            )

    assert run_training(cfg, run_dir, log=log) == "finished"
    assert engines_here == []
    assert_each_step_stores_every_episode_once(run_dir, 2, 2 * 2)
    calls = wb.RunReader(run_dir).calls(columns=["step", "policy_version"])
    assert calls.groupby("step")["policy_version"].unique().map(list).to_dict() == {0: [0], 1: [1]}


def wait_for(done, process: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    """Until ``done()``; fails with the process's log if it ends first or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while not done():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["async", "pipeline"])
def test_an_overlapping_scheduler_survives_a_lost_worker_and_a_kill_9_storing_each_step_once(
    ray_cluster, tmp_path, scheduler
):
    """MarsRL (marsrl_cpu) on two rollout workers under ``async`` or ``pipeline``, rolling out beside the
    update (max_staleness 1): a worker SIGKILLed in a rollout call is replaced; the training process,
    SIGKILLed after step 2 (its checkpoint: step 1), resumes there, redoes step 2, stores each step once."""
    import ray

    fields = dict(topology="marsrl_cpu", scheduler=scheduler, max_staleness=1, steps=5, checkpoint_every=2)
    # the killed run joins this module's cluster as a second driver; its actors die with it
    first = config(tmp_path, cluster=ray.get_runtime_context().gcs_address, **fields)
    run_dir = create(first)
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "train", "--resume", str(run_dir)],
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "step 0:" in log.read_text(), driver, log)
        kill_a_worker_mid_rollout(
            title="ray::RolloutWorker." + ("level" if scheduler == "pipeline" else "rollout")
        )
        wait_for(lambda: re.search(r"^step 2:", log.read_text(), re.M) is not None, driver, log)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    text = log.read_text()
    # one replacement: a later batch queued on the lost worker goes to it, not to a second one
    assert text.count("died (ActorDiedError); replacing it") == 1, text
    stored = wb.RunReader(run_dir).steps()["step"].tolist()
    assert stored[:3] == [0, 1, 2] and 4 not in stored, text

    lines: list[str] = []
    resumed = config(tmp_path, cluster="local", **fields)  # this process's cluster
    assert run_training(resumed, run_dir, log=lines.append) == "finished"
    assert "resuming after step 1" in "\n".join(lines) and "discarded steps [2" in "\n".join(lines), lines
    reader = wb.RunReader(run_dir)
    if scheduler == "async":
        assert_each_step_stores_every_episode_once(run_dir, 5, 4 * 4)
    else:  # an episode is stored at the step its group finished: each problem of each step's batch, once
        assert reader.integrity_check() == "ok" and reader.steps()["step"].tolist() == list(range(5))
        tasks, _ = load_tasks_for(resumed)
        batches = [tasks[i].id for step in range(5) for i in task_order(16, step, 4, resumed.seed)]
        episodes = reader.episodes()
        assert Counter(episodes["task_id"]) == Counter({t: 4 * n for t, n in Counter(batches).items()})
    calls = reader.calls()
    versions = reader.steps().set_index("step")["policy_version"]
    solvers = calls[calls["role"] == "solver"]  # all trained (verdict balancing drops some Verifier calls)
    assert solvers["advantage"].notna().all(), "every Solver call stored with the advantage it trained with"
    trained = calls[calls["timings"].map(lambda t: "trained_step" in t)]
    assert trained["advantage"].notna().all() and len(trained) >= len(solvers)
    trained_at = trained["timings"].map(lambda t: t["trained_step"])
    lag = trained_at.map(versions) - trained["policy_version"]
    assert lag.between(0, 1).all() and lag.max() == 1, lag.value_counts().to_dict()  # beside the update
    wide = reader.metrics_wide()
    assert (wide["cluster/workers"] == 2.0).all()
    if scheduler == "pipeline":  # trained at the step its level ran, stored when its episode ended
        assert (trained_at < trained["step"]).any(), "a Solver trained before its Verifier had run"
        assert "cluster/groups_restarted" in wide.columns

"""Scale-out on Ray (issue 8): rollout workers as Ray actors, and what happens when one dies.

One local Ray cluster (2 CPUs) serves the module. Runs use the tiny local model and MarsRL's topology,
so a step is a second or two; the kill tests find the worker while it executes a rollout (Ray titles
the process ``ray::RolloutWorker.rollout``) and SIGKILL it there, mid-step.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import workbench as wb
from workbench.cluster import RolloutPool, WorkerLostError
from workbench.cluster.pool import shards
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training
from workbench.topology import to_dict
from workbench.training import create


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def kill_a_worker_mid_rollout(timeout: float = 120.0) -> int:
    """SIGKILL the first rollout worker seen executing a rollout; its pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            if "ray::RolloutWorker.rollout" in " ".join(process.info["cmdline"] or []):
                process.kill()
                return process.pid
        time.sleep(0.005)
    raise AssertionError("no rollout worker was seen executing a rollout")


def config(tmp_path: Path, **overrides) -> TrainConfig:
    fields = dict(
        model="tiny",
        topology="marsrl",
        tasks="arithmetic",
        n_tasks=16,
        steps=3,
        batch_size=4,
        group_size=4,
        max_tokens=48,
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


def test_a_cluster_needs_the_sync_scheduler_and_workers(tmp_path):
    with pytest.raises(ValueError, match="cluster runs use the sync scheduler"):
        config(tmp_path, cluster="local", scheduler="async")
    with pytest.raises(ValueError, match="cluster_workers must be a positive integer"):
        config(tmp_path, cluster="local", cluster_workers=0)


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

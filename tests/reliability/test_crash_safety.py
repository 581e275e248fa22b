"""Crash safety: ``kill -9`` of a training or rollout process at random points never damages the run store.

Training: a few runs of the tiny model, each killed several times at seeded random moments (during start-up,
a step's rollout or update, its write, a checkpoint) and resumed each time with ``workbench train --resume``.
After every kill the store passes SQLite's integrity check and holds whole steps only, numbered from 0
without a gap, each with exactly the episodes, calls, trained samples and metrics a step writes; every run
then finishes with every step stored once. Rollout: ``wb.rollout(..., background=True)`` killed at random
points leaves an intact store whose visible episodes are whole (all or none of the rollout's step).

The tiny model runs with one thread (``OMP_NUM_THREADS=1``): it gains nothing from more, and on a busy
machine OpenMP's waiting threads make a step many times slower.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import workbench as wb
from workbench.rl.config import TrainConfig
from workbench.store import RunStore, StoreError
from workbench.training import BackgroundRun, run_config

STEPS, BATCH, GROUP, CHECKPOINT_EVERY, KEEP = 8, 2, 2, 2, 2
RUNS, KILLS_PER_RUN = 3, 5  # 15 kills of a training process
ROLLOUT_KILLS = 5
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SETTINGS = {
    "model": "tiny",
    "steps": STEPS,
    "batch_size": BATCH,
    "group_size": GROUP,
    "max_tokens": 6,
    "checkpoint_every": CHECKPOINT_EVERY,
    "keep_checkpoints": KEEP,
    "learning_rate": 1e-4,
    "task_options": "{level: 1}",
}


def _train_cli(log: Path, *args: str) -> subprocess.Popen:
    """``workbench train ARGS`` in a child process, its output appended to ``log``."""
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "train", *args],
            env={**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _step_seconds(log: Path) -> float:
    """The median time of a step so far, from the ``step N: ..., 0.5 s`` lines of the log (0.5 s before any)."""
    times = [float(t) for t in re.findall(r"^step \d+: .*, ([\d.]+) s$", log.read_text(), flags=re.MULTILINE)]
    return statistics.median(times) if times else 0.5


@dataclass
class Kill:
    """Where one kill landed: seconds after the process started, steps it had stored, and what was under way."""

    seconds: float
    steps_stored: int
    during: str


def _steps_logged(log: Path, offset: int) -> int:
    """Steps a process reported (``step N: ...`` lines) in ``log`` after ``offset``."""
    with open(log) as file:
        file.seek(offset)
        return len(re.findall(r"^step \d+:", file.read(), flags=re.MULTILINE))


def _resume_point(run_dir: Path) -> int:
    """The step a (resumed) process starts from: the one after the newest complete checkpoint."""
    done = [int(p.parent.name.split("-")[1]) for p in run_dir.glob("checkpoints/step-*/trainer_state.json")]
    return max(done) + 1 if done else 0


def _kill_at_random_point(
    process: subprocess.Popen, run_dir: Path, rng: random.Random, log: Path, offset: int
) -> Kill:
    """SIGKILL ``process`` at a seeded random moment, never in its last two steps, so the kill lands mid-run:

    in its start-up (a random delay), a random fraction of a step after it stored a random number of steps
    (mostly a rollout or an update), or a few milliseconds into one of its step writes or checkpoint writes
    (short windows a random delay seldom hits).

    A random delay never decides alone: each is cut short by a step boundary the store shows (a step's write
    beginning) after which the run still has a step to go, so on a loaded machine, where a step may take
    less time than the test's own wake-up, the kill still lands before the run ends.
    """
    started, since = time.monotonic(), time.time()
    first = _resume_point(run_dir)
    remaining = STEPS - first
    mode = rng.choices(["start-up", "steps", "step write", "checkpoint"], weights=[2, 5, 2, 2])[0]
    if remaining < 4 or mode == "start-up":
        # imports, loading the model, opening the store, discarding steps after the checkpoint; at the latest
        # when the first step's write begins (a run resumed near its end may have only two steps to go)
        _wait(process, lambda: _step_started(run_dir, since) >= first, rng.uniform(0.0, 4.0), poll=0.005)
    elif mode == "steps":
        target = rng.randint(1, remaining - 2)
        _wait(process, lambda: _steps_logged(log, offset) >= target)
        # a random fraction of a step later, at the latest when the next step's write begins (it is at most
        # the run's last but one: one step is left)
        delay = rng.uniform(0.0, 1.0) * _step_seconds(log)
        _wait(process, lambda: _step_started(run_dir, since) >= first + target, delay, poll=0.005)
    else:
        seen = _step_writing if mode == "step write" else _checkpoint_writing

        def writing() -> bool:
            """A write of this process, and not of the run's last two steps (the run may end right after)."""
            step = seen(run_dir, since)
            return step is not None and _resume_point(run_dir) <= step <= STEPS - 3

        if _wait(process, writing, poll=0.002):
            time.sleep(rng.uniform(0.0, 0.01))
    assert process.poll() is None, f"the run should still be going when it is killed:\n{log.read_text()}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    stored = _steps_logged(log, offset)
    return Kill(time.monotonic() - started, stored, _under_way(run_dir, stored, since))


def _wait(
    process: subprocess.Popen, done: Callable[[], bool], timeout: float = 300, poll: float = 0.05
) -> bool:
    """Wait until ``done()`` (True) or ``timeout`` s pass or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if done():
            return True
        time.sleep(poll)
    return False


def _step_started(run_dir: Path, since: float) -> int:
    """The latest step whose write a process started at ``since`` began (complete or not); -1 before any."""
    try:
        with wb.RunReader(run_dir) as reader:
            found = reader.sql("SELECT MAX(step) AS step FROM steps WHERE started_at >= ?", [since])["step"]
    except Exception:  # noqa: BLE001 - the database may not be initialised yet
        return -1
    step = found.iloc[0] if len(found) else None
    return -1 if step is None or step != step else int(step)


def _step_writing(run_dir: Path, since: float) -> int | None:
    """The step being written (its row is in the store, not yet complete) by a process started at ``since``."""
    try:
        with wb.RunReader(run_dir) as reader:
            query = "SELECT step FROM steps WHERE status = 'running' AND started_at >= ?"
            running = reader.sql(query, [since])["step"].tolist()
    except Exception:  # noqa: BLE001 - the database may not be initialised yet
        return None
    return running[0] if running else None


def _checkpoint_writing(run_dir: Path, since: float) -> int | None:
    """The step whose checkpoint a process started at ``since`` is writing (its temporary directory), if any."""
    found = []
    for path in (run_dir / "checkpoints").glob(".tmp-step-*"):
        try:
            if path.stat().st_mtime >= since:  # not one a killed process left behind
                found.append(int(path.name.rsplit("-", 1)[1]))
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return found[0] if found else None


def _under_way(run_dir: Path, stored: int, since: float) -> str:
    """What the killed process (started at ``since``) was doing, as the run directory and its progress show."""
    if _checkpoint_writing(run_dir, since) is not None:
        return "checkpoint write"
    if _step_writing(run_dir, since) is not None:
        return "step write"
    return "a step's rollout or update" if stored else "start-up or first step"


def _was_made(run_dir: Path) -> bool:
    """Whether the killed process got as far as making the run (its store has the run's row)."""
    try:
        run_config(run_dir)
    except (FileNotFoundError, StoreError):
        return False
    return True


def _expected_tasks(run_dir: Path) -> dict[int, list[str]]:
    """Task ids of each step, as the loop draws them (a seeded shuffle per epoch), each GROUP times."""
    from workbench.rl.loop import load_tasks_for, task_order

    config = TrainConfig.from_yaml(run_dir / "train_config.yaml")
    tasks, _ = load_tasks_for(config)
    return {
        step: sorted(
            tasks[i].id for i in task_order(len(tasks), step, BATCH, config.seed) for _ in range(GROUP)
        )
        for step in range(STEPS)
    }


def _check_store(run_dir: Path, expected_tasks: dict[int, list[str]], finished: bool) -> list[int]:
    """The store is intact and holds whole steps 0..k only, each stored once; returns the complete steps."""
    with wb.RunReader(run_dir) as reader:
        assert reader.integrity_check() == "ok"
        steps = reader.steps()
        status = reader.info()["status"]
        episodes = reader.episodes()  # rows of complete steps only
        calls = reader.calls(columns=["step", "episode_id", "position", "parent_id", "advantage"])
        metrics = reader.metrics()
    complete = steps.query("status == 'complete'")["step"].tolist()
    assert complete == list(range(len(complete))), f"stored steps {complete} have a gap"
    assert len(steps) - len(complete) <= 1, "at most the step the kill interrupted is incomplete"
    if finished:
        assert complete == list(range(STEPS)) and status == "finished"
    for step in complete:
        got = sorted(episodes.query("step == @step")["task_id"])
        assert got == expected_tasks[step], f"step {step}: episodes lost, duplicated or from another step"
    assert set(calls["episode_id"]) == set(episodes["id"]), "every episode has its calls, no call is orphaned"
    for episode_id, rows in calls.groupby("episode_id"):
        assert sorted(rows["position"]) == list(range(len(rows))), (
            f"episode {episode_id} lost or repeated calls"
        )
        assert rows["parent_id"].dropna().isin(rows["id"]).all(), f"episode {episode_id} lost a parent call"
    assert not metrics.duplicated(["step", "role", "name"]).any(), "a metric stored twice for one step"
    run_wide = metrics[metrics["role"].isna()]
    samples = run_wide.query("name == 'samples'").set_index("step")["value"].to_dict()
    assert set(samples) == set(complete), "each stored step has its metrics, and only stored steps do"
    trained = calls.dropna(subset=["advantage"]).groupby("step").size().to_dict()
    assert {s: int(samples.get(s, 0)) for s in complete} == {s: trained.get(s, 0) for s in complete}, (
        "the stored trained samples of a step are exactly the samples its update used"
    )
    return complete


@pytest.mark.slow
@pytest.mark.parametrize("run", range(RUNS))
def test_a_training_run_killed_at_random_points_resumes_every_time_without_gaps_or_duplicates(run, tmp_path):
    rng = random.Random(f"crash-safety-{run}")
    runs, log = tmp_path / "runs", tmp_path / "train.log"
    run_dir = runs / "killed"
    settings = {**SETTINGS, "runs_dir": str(runs), "run_id": "killed", "seed": run}
    fresh = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    log.touch()
    offset, process = 0, _train_cli(log, *fresh)
    kills = []
    expected = None
    for _ in range(KILLS_PER_RUN):
        kill = _kill_at_random_point(process, run_dir, rng, log, offset)
        kills.append(kill)
        offset = log.stat().st_size
        if not _was_made(run_dir):  # killed before the run was made: make it again
            shutil.rmtree(run_dir, ignore_errors=True)
            process = _train_cli(log, *fresh)
            continue
        expected = expected or _expected_tasks(run_dir)
        _check_store(run_dir, expected, finished=False)
        process = _train_cli(log, "--resume", str(run_dir))
    assert process.wait(timeout=600) == 0, log.read_text()
    complete = _check_store(run_dir, expected or _expected_tasks(run_dir), finished=True)
    assert complete == list(range(STEPS))
    left = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert not [n for n in left if n.startswith(".tmp-")], f"a half-written checkpoint was left: {left}"
    assert len(left) <= KEEP
    for kill in kills:
        print(
            f"run {run}: killed {kill.seconds:.2f} s after its start, {kill.steps_stored} steps in, {kill.during}"
        )
    print(
        f"run {run}: {len(kills)} kills ({dict(Counter(k.during for k in kills))}), resumed, {STEPS} steps, no gap"
    )


def _whole_episodes(run_dir: Path, n_episodes: int) -> int:
    """The store is intact and shows whole episodes only; returns how many (0 or all of the rollout's)."""
    with wb.RunReader(run_dir) as reader:
        assert reader.integrity_check() == "ok"
        complete = reader.steps(complete_only=True)["step"].tolist()
        episodes = reader.episodes()
        calls = reader.calls(columns=["episode_id", "position", "parent_id"])
    assert complete in ([], [0]), complete
    assert len(episodes) == (n_episodes if complete else 0), "a rollout's episodes are stored all or none"
    assert set(calls["episode_id"]) == set(episodes["id"])
    assert not episodes["status"].isin(["running"]).any()
    for episode_id, rows in calls.groupby("episode_id"):
        assert sorted(rows["position"]) == list(range(len(rows))), f"episode {episode_id} is not whole"
        assert rows["parent_id"].dropna().isin(rows["id"]).all(), f"episode {episode_id} lost a parent call"
    return len(episodes)


def _wait_for_status(run: BackgroundRun, wanted: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.process.is_alive():
        try:
            if run.status == wanted:
                return
        except Exception:  # noqa: BLE001 - the store may not be readable yet
            pass
        time.sleep(0.02)


@pytest.mark.slow
def test_a_rollout_killed_at_random_points_leaves_an_intact_store_of_whole_episodes(tmp_path, monkeypatch):
    for name, value in ONE_THREAD.items():
        monkeypatch.setenv(name, value)  # the spawned rollout process inherits them
    tasks = wb.generate_tasks("arithmetic", n=4, seed=0, level=1)
    n_episodes = len(tasks) * GROUP

    def launch(run_id: str) -> BackgroundRun:
        return wb.rollout(
            "marsrl",
            tasks,
            model="tiny",
            max_tokens=6,
            group_size=GROUP,
            runs_dir=tmp_path,
            run_id=run_id,
            background=True,
        )

    reference = launch("uninterrupted")
    _wait_for_status(reference, "running")
    started = time.monotonic()
    assert reference.wait(300) == "finished"
    rollout_s = time.monotonic() - started  # from the model loaded to the episodes stored
    assert _whole_episodes(reference.run_dir, n_episodes) == n_episodes

    rng = random.Random("rollout-crash-safety")
    outcomes = Counter()
    for trial in range(ROLLOUT_KILLS):
        run = launch(f"killed-{trial}")
        if trial % 4 == 0:  # anywhere from the launch on: spawning, imports, loading the model
            time.sleep(rng.uniform(0.0, 4.0))
        else:
            _wait_for_status(run, "running")
            time.sleep(rng.uniform(0.0, 1.2 * rollout_s))
        killed = run.process.is_alive()
        if killed:
            os.kill(run.process.pid, signal.SIGKILL)
        run.process.join(60)
        if killed and run.status in ("created", "running", "interrupted"):
            with pytest.raises(RuntimeError, match="killed by signal 9"):
                run.wait()  # the handle says the process died; it does not report the run as going on
        stored = _whole_episodes(run.run_dir, n_episodes)
        RunStore.open(run.run_dir).close()  # a writer reopens it, discarding any half-written step
        assert _whole_episodes(run.run_dir, n_episodes) == stored, "reopening keeps every whole episode"
        outcomes[
            "not killed (done)" if not killed else "killed, all stored" if stored else "killed, none stored"
        ] += 1
    print(f"rollout kills: {dict(outcomes)}; reference rollout {rollout_s:.2f} s")


WRITER = """
import sys, time
from workbench.store import RunStore
store = RunStore.open(sys.argv[1])
store.set_status("running")
print("ready", flush=True)
time.sleep(600)
"""


def test_a_run_whose_writer_was_killed_reads_as_interrupted_until_a_writer_reopens_it(tmp_path):
    from workbench.store import RunReader
    from workbench.store.liveness import identity, writer_gone

    store = RunStore.create(tmp_path, config={"kind": "test"})
    run_dir = store.run_dir
    store.close()
    assert RunReader(run_dir).info()["status"] == "created"  # its creator (this process) is alive
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        assert RunReader(run_dir).info()["status"] == "running"
        assert RunReader(run_dir).writer()["pid"] == writer.pid
        writer.kill()
        deadline = time.monotonic() + 30  # SIGKILL takes effect soon, not at once
        while RunReader(run_dir).info()["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert RunReader(run_dir).info()["status"] == "interrupted"  # a zombie until reaped: gone
        writer.wait()
        assert RunReader(run_dir).info()["status"] == "interrupted"
        assert (wb.list_runs(tmp_path).set_index("id").loc[run_dir.name, "status"]) == "interrupted"
    finally:
        writer.kill()
        writer.wait()
    reopened = RunStore.open(run_dir)  # a resumed run: its writer is this process
    try:
        assert RunReader(run_dir).info()["status"] == "running"
    finally:
        reopened.close()
    me = identity()
    assert not writer_gone(me)
    assert writer_gone({**me, "pid_started": me["pid_started"] + 1}), "the pid now names another process"
    assert not writer_gone({**me, "host": "another-host", "pid": writer.pid}), "another host: not checked"
    assert not writer_gone(None) and not writer_gone({"discarded_steps": []}), "a store older than liveness"

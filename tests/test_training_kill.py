"""``kill -9`` of a training process at random points, then ``workbench train --resume``: every run
finishes with each step stored exactly once, and the store stays intact."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import workbench as wb

STEPS, BATCH, GROUP = 6, 2, 2
TRIALS = 5


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_run_killed_at_a_random_point_resumes_without_gaps_or_duplicates(trial, tmp_path):
    rng = random.Random(trial)
    settings = {
        "model": "tiny",
        "steps": STEPS,
        "batch_size": BATCH,
        "group_size": GROUP,
        "max_tokens": 6,
        "checkpoint_every": 2,
        "runs_dir": str(tmp_path),
        "run_id": "killed",
        "learning_rate": 1e-4,
        "task_options": "{level: 1}",
    }
    process = _cli(*[a for k, v in settings.items() for a in ("--set", f"{k}={v}")])
    run_dir = tmp_path / "killed"
    # kill somewhere between start-up and the last step: wait for a random number of finished steps,
    # then a random fraction of a step more
    target = rng.randint(0, STEPS - 2)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if (run_dir / "run.db").exists() and _complete_steps(run_dir) >= target:
            break
        time.sleep(0.2)
    time.sleep(rng.uniform(0.0, 1.5))
    assert process.poll() is None, "the run should still be going when it is killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    resumed = _cli("--resume", str(run_dir))
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    reader = wb.RunReader(run_dir)
    steps = reader.steps()
    assert list(steps["step"]) == list(range(STEPS)) and set(steps["status"]) == {"complete"}
    per_step = reader.episodes().groupby("step").size().to_dict()
    assert per_step == {s: BATCH * GROUP for s in range(STEPS)}, "no episode lost or duplicated"
    calls = reader.calls(columns=["step", "episode_id", "position"])
    assert not calls.duplicated(["episode_id", "position"]).any()
    assert reader.integrity_check() == "ok"
    assert reader.info()["status"] == "finished"


def _complete_steps(run_dir) -> int:
    try:
        with wb.RunReader(run_dir) as reader:
            return len(reader.steps(complete_only=True))
    except Exception:  # noqa: BLE001 - the database may not be initialised yet
        return 0

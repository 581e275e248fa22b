"""Run store under real concurrency: a writer subprocess, readers alongside it, and `kill -9` mid-write."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.store import RunReader, RunStore, WriterLockedError

REPO = Path(__file__).resolve().parents[1]

# Writes `steps` steps of `per_step` calls, `batch` calls per flush, pausing `pause` s after each flush,
# printing progress lines; with "wait" it waits for a line on stdin before writing.
# Call i of step s has prompt [s]*16 and completion arange(i, i + 32): contents are checkable.
WRITER = r"""
import sys, time
import numpy as np
from workbench.store import RunStore

runs_dir, steps, per_step, batch, pause = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
store = RunStore.create(runs_dir, {"writer": "subprocess"}, run_id="child")
print("ready", flush=True)
if sys.argv[6] == "wait":
    sys.stdin.readline()  # until the test's readers are ready
for s in range(steps):
    with store.step(s, policy_version=s) as step:
        episodes = [step.add_episode(task_id=f"{s}-{e}") for e in range(per_step // 4)]
        for start in range(0, per_step, batch):
            step.add_calls([
                {"episode_id": episodes[i // 4], "role": ("solver", "verifier")[i % 2],
                 "prompt_ids": np.full(16, s, np.int32), "completion_ids": np.arange(i, i + 32, dtype=np.int32),
                 "logprobs": np.full(32, -0.5, np.float32), "mask": np.ones(32, np.uint8), "rewards": {"i": i}}
                for i in range(start, min(start + batch, per_step))
            ])
            step.flush()
            print(f"flushed {s} {start + batch}", flush=True)
            if pause:
                time.sleep(pause)
        step.log_metrics({"calls": per_step}, role="solver")
    print(f"complete {s}", flush=True)
store.close()
print("done", flush=True)
"""


def _start_writer(
    runs_dir: Path, steps: int, per_step: int, batch: int, pause: float, wait: bool = False
) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [str(runs_dir), str(steps), str(per_step), str(batch), str(pause), "wait" if wait else "go"]
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, *args],
        stdin=subprocess.PIPE if wait else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _read_until(proc: subprocess.Popen, prefix: str, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith(prefix):
            return
    raise AssertionError(f"writer ended before printing {prefix!r}: {proc.stderr.read()[-2000:]}")


def _check_complete_steps(reader: RunReader, per_step: int) -> list[int]:
    """Every complete step holds exactly its calls, with the contents the writer wrote."""
    complete = reader.steps(complete_only=True)["step"].tolist()
    for s in complete:
        calls = reader.calls(step=s, columns=["prompt_ids", "completion_ids", "logprobs", "rewards"])
        assert len(calls) == per_step, f"step {s} has {len(calls)} calls"
        starts = [int(c[0]) for c in calls["completion_ids"]]
        assert starts == list(range(per_step))
        assert all((p == s).all() and len(p) == 16 for p in calls["prompt_ids"])
        assert [r["i"] for r in calls["rewards"]] == starts
        assert len(reader.episodes(step=s)) == per_step // 4
        assert reader.metrics(step=s)["value"].tolist() == [per_step]
    return complete


def test_reader_sees_10k_calls_while_they_are_written(tmp_path):
    total, per_step, batch = 10_000, 5_000, 100
    proc = _start_writer(tmp_path, 2, per_step, batch, pause=0.01, wait=True)
    try:
        _read_until(proc, "ready", [])
        run_dir = tmp_path / "child"
        # A second reader in a thread follows the same run at the same time.
        other: list[int] = []

        def follow() -> None:
            with RunReader(run_dir) as second:
                for frame in second.tail("calls", poll_interval=0.01, timeout=20, columns=["role"]):
                    other.extend(frame["id"].tolist())
                    if len(other) >= total:
                        return

        thread = threading.Thread(target=follow)
        thread.start()
        reader = RunReader(run_dir)
        assert reader.steps().empty  # (also loads pandas before the writer starts)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        seen: list[int] = []
        seen_while_running = 0
        for frame in reader.tail("calls", poll_interval=0.02, timeout=20, columns=["step", "completion_ids"]):
            statuses = reader.steps().set_index("step")["status"]
            if (statuses[frame["step"]] == "running").any():
                seen_while_running += len(frame)
            seen.extend(frame["id"].tolist())
            assert all(len(c) == 32 and (np.diff(c) == 1).all() for c in frame["completion_ids"])
            if len(seen) >= total:
                break
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        thread.join(10)
    finally:
        proc.kill()
    assert len(seen) == total and seen == sorted(seen) and len(set(seen)) == total
    assert seen_while_running > 0, "the reader saw no call before its step completed"
    assert sorted(other) == seen
    assert _check_complete_steps(reader, per_step) == [0, 1]


@pytest.mark.parametrize(
    ("marker", "delay", "pause"),
    [
        # The writer pauses 0.1 s after each flush: these kills land mid-step, with rows committed.
        ("flushed 0 400", 0.0, 0.1),
        ("flushed 1 200", 0.0, 0.1),
        # The writer runs flat out: these kills land anywhere, mid-insert and mid-commit included.
        ("ready", 0.0, 0.0),
        ("complete 1", 0.0, 0.0),
        ("flushed 0 200", 0.002, 0.0),
        ("flushed 2 600", 0.001, 0.0),
        ("complete 2", 0.003, 0.0),
    ],
)
def test_kill_9_mid_write_leaves_every_complete_step_and_no_partial_one(tmp_path, marker, delay, pause):
    per_step = 1000
    proc = _start_writer(tmp_path, 50, per_step, 200, pause=pause)
    lines: list[str] = []
    try:
        _read_until(proc, marker, lines)
        time.sleep(delay + random.random() * 0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    lines += [line.strip() for line in proc.stdout]  # whatever it printed before dying
    completed = [int(line.split()[1]) for line in lines if line.startswith("complete")]
    db = tmp_path / "child" / "run.db"

    check = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()

    with RunReader(tmp_path / "child") as reader:  # before any writer reopens it
        complete = _check_complete_steps(reader, per_step)
        assert complete[: len(completed)] == completed  # every step reported complete is there, in full
        partial = reader.steps().query("status == 'running'")["step"].tolist()
        last_id = reader.last_id("calls")
    if pause:
        assert partial == [int(marker.split()[1])]  # killed mid-step, with flushed rows

    store = RunStore.open(tmp_path / "child")
    reader = store.reader()
    steps = reader.steps()
    assert set(steps["status"]) <= {"complete"}
    assert steps["step"].tolist() == complete
    assert len(reader.calls(complete_only=False, columns=["step"])) == per_step * len(complete)
    assert len(reader.episodes(complete_only=False)) == per_step // 4 * len(complete)
    assert store.last_complete_step() == (complete[-1] if complete else None)
    discarded = reader.events(kind="partial_step_discarded")
    assert discarded["step"].tolist() == partial
    # The resumed writer carries on from the next step.
    next_step = 0 if not complete else complete[-1] + 1
    with store.step(next_step) as step:
        new_id = step.add_call(step.add_episode(), "solver", completion_ids=np.arange(3))
    assert new_id > last_id  # ids of discarded calls are never handed out again
    assert reader.steps()["step"].tolist() == [*complete, next_step]
    assert reader.integrity_check() == "ok"
    store.close()


WRITER_OPEN = r"""
import sys
from workbench.store import RunStore, WriterLockedError
try:
    RunStore.open(sys.argv[1])
except WriterLockedError as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def test_second_writer_in_another_process_is_refused(tmp_path):
    store = RunStore.create(tmp_path, {})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", WRITER_OPEN, str(store.run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert "already open for writing" in result.stdout
    store.close()
    result = subprocess.run(
        [sys.executable, "-c", WRITER_OPEN, str(store.run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with RunStore.open(store.run_dir), pytest.raises(WriterLockedError):  # in-process, too
        RunStore.open(store.run_dir)

"""Storage errors: a read-only runs directory and a full disk give one clear error naming the path and the
cause, at run creation or at the first write that fails, and lose nothing already stored.

The file systems are real: a small tmpfs mounted for the test (filled until the OS answers ENOSPC, or
remounted read-only, so the OS gives EROFS), and a file-size limit (``RLIMIT_FSIZE``) in a child process.
Mounting needs CAP_SYS_ADMIN (root in CI); where it is refused, the tmpfs tests are skipped and say why,
and a read-only directory falls back to permissions for a user other than root.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import workbench as wb
from workbench.store import RunReader, RunsDirError, RunStore, StorageError

CAUSE_READ_ONLY = re.compile(r"read-only file system|permission denied", re.IGNORECASE)
CAUSE_FULL = re.compile(r"disk is full|no space left on device", re.IGNORECASE)


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path``: a real file system this test may fill or make read-only."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no `mount` command here, so no small file system to fill or make read-only")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {' '.join(done.stderr.split())}")
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write a file until the OS refuses with ENOSPC: the disk is then full to the last page."""
        with open(self.filler, "ab", buffering=0) as file:
            chunk = b"\0" * (1 << 16)
            try:
                while True:
                    if file.write(chunk) < len(chunk):
                        chunk = b"\0" * max(1, len(chunk) // 16)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def remount(self, option: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{option}", str(self.path)], check=True, capture_output=True)

    def close(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)  # a file still open: detach


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "disk", "4m")
    yield disk
    disk.close()


def _write_steps(store: RunStore, first: int, n: int, tokens: int = 500) -> None:
    """Steps ``first`` .. ``first + n - 1``, each one episode of two calls with known token ids."""
    for index in range(first, first + n):
        with store.step(index, policy_version=index) as step:
            episode = step.add_episode(task_id=f"t{index}", reward=float(index))
            for role in ("solver", "verifier"):
                step.add_call(
                    episode,
                    role=role,
                    prompt_ids=list(range(tokens)),
                    completion_ids=[index] * tokens,
                    rewards={role: 1.0},
                )
            step.log_metrics({"reward/mean": float(index)})


def _assert_steps_intact(run_dir: Path, steps: list[int], tokens: int = 500) -> None:
    """Exactly ``steps`` are stored, each whole and as written, and SQLite finds nothing damaged."""
    with RunReader(run_dir) as reader:
        assert reader.integrity_check() == "ok"
        assert reader.steps(complete_only=True)["step"].tolist() == steps
        calls = reader.calls(arrays="list")
        metrics = reader.metrics(name="reward/mean")
        episodes = reader.episodes()
    assert episodes["task_id"].tolist() == [f"t{i}" for i in steps]
    assert len(calls) == 2 * len(steps)
    for row in calls.itertuples():
        assert row.completion_ids == [row.step] * tokens and row.prompt_ids == list(range(tokens))
    assert metrics.set_index("step")["value"].to_dict() == {i: float(i) for i in steps}


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    return message


def _bound_by_permissions() -> bool:
    """Whether this process obeys file permissions: not root, or root without CAP_DAC_OVERRIDE."""
    if os.geteuid() != 0:
        return True
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.MULTILINE).group(1), 16)
    return not effective & (1 << 1)  # bit 1: CAP_DAC_OVERRIDE


class ReadOnlyPlace:
    """Where a runs directory lives that can be made read-only: a tmpfs remounted read-only, or (no mount
    allowed) a plain directory whose write permission is removed, which binds a process without
    CAP_DAC_OVERRIDE."""

    def __init__(self, tmp_path: Path) -> None:
        self.disk: SmallDisk | None = None
        try:
            self.disk = SmallDisk(tmp_path / "disk", "16m")
        except pytest.skip.Exception as no_mount:
            if not _bound_by_permissions():
                raise pytest.skip.Exception(
                    f"{no_mount.msg}; and this root process writes through permissions"
                ) from None
        self.runs = (self.disk.path if self.disk else tmp_path) / "runs"

    def _chmod(self, add: bool) -> None:
        for path in [self.runs, *self.runs.rglob("*")]:
            mode = path.stat().st_mode
            path.chmod(mode | 0o200 if add else mode & ~0o222)

    def read_only(self) -> None:
        self.disk.remount("ro") if self.disk else self._chmod(add=False)

    def writable(self) -> None:
        self.disk.remount("rw") if self.disk else self._chmod(add=True)


@pytest.fixture
def read_only_place(tmp_path: Path) -> Iterator[ReadOnlyPlace]:
    place = ReadOnlyPlace(tmp_path)
    yield place
    if place.disk is not None:
        place.disk.close()
    elif place.runs.exists():
        place.writable()


def test_a_read_only_runs_directory_is_refused_at_creation_and_first_write_and_keeps_every_run(
    read_only_place,
):
    from workbench.rl.config import TrainConfig
    from workbench.training import create

    runs = read_only_place.runs
    with RunStore.create(runs, {"kind": "rollout"}, run_id="stored") as store:
        _write_steps(store, 0, 2)
        store.set_status("finished")
    config = TrainConfig(model="tiny", steps=2, runs_dir=str(runs), run_id="paused")
    paused = create(config)
    with RunStore.open(paused) as store:
        _write_steps(store, 0, 1)
    read_only_place.read_only()

    with pytest.raises(RunsDirError) as info:
        RunStore.create(runs, {"kind": "rollout"})
    assert str(runs) in _one_line(info.value) and CAUSE_READ_ONLY.search(str(info.value))
    # the notebook's wb.train and wb.rollout: refused in the cell, before a process starts or a model loads
    with pytest.raises(RunsDirError) as info:
        wb.train("marsrl", config=config.to_dict() | {"run_id": "new"})
    assert str(runs) in _one_line(info.value) and CAUSE_READ_ONLY.search(str(info.value))
    with pytest.raises(RunsDirError) as info:
        wb.rollout("marsrl", wb.generate_tasks("arithmetic", n=1), model="tiny", runs_dir=runs)
    assert str(runs) in _one_line(info.value) and CAUSE_READ_ONLY.search(str(info.value))
    with pytest.raises(RunsDirError) as info:  # writing to an existing run: refused when it is opened
        RunStore.open(runs / "stored")
    assert str(runs / "stored") in _one_line(info.value) and CAUSE_READ_ONLY.search(str(info.value))
    with pytest.raises(StorageError) as info:  # wb.resume writes the run's config first
        wb.resume(paused)
    assert str(paused / "train_config.yaml") in _one_line(info.value)
    assert CAUSE_READ_ONLY.search(str(info.value))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args in (
        ["--set", f"runs_dir={runs}", "--set", "model=tiny"],  # a new run from the command line
        ["--resume", str(paused)],  # resuming one: the first write is the store's
    ):
        done = subprocess.run(
            [sys.executable, "-m", "workbench.cli", "train", *args], capture_output=True, text=True, env=env
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and str(runs) in done.stderr, done.stderr
        assert CAUSE_READ_ONLY.search(done.stderr), done.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["paused", "stored"], "nothing half-made was left"

    if read_only_place.disk is not None:  # a closed run on a read-only mount (an archive) stays readable
        _assert_steps_intact(runs / "stored", [0, 1])
    read_only_place.writable()  # (a directory without write permission: SQLite needs it for its -shm file)
    _assert_steps_intact(runs / "stored", [0, 1])
    _assert_steps_intact(paused, [0])
    with RunStore.open(runs / "stored") as store:  # and the run continues where it was
        _write_steps(store, 2, 1)
    _assert_steps_intact(runs / "stored", [0, 1, 2])


def test_a_full_disk_fails_the_write_with_the_path_and_the_cause_and_keeps_every_stored_step(small_disk):
    runs = small_disk.path / "runs"
    store = RunStore.create(runs, {"kind": "rollout"}, run_id="full")
    _write_steps(store, 0, 2)
    small_disk.fill()
    written = 2
    with pytest.raises(StorageError) as info:
        for index in range(2, 1000):  # the WAL may reuse space it already holds for a few more steps
            _write_steps(store, index, 1)
            written += 1
    message = _one_line(info.value)
    assert str(store.db_path) in message and CAUSE_FULL.search(message), message
    assert "bytes free" in message and "kept" in message
    with pytest.raises(StorageError, match="disk is full"):
        store.set_status("failed")
    with pytest.raises(RunsDirError) as info:  # a new run on the full disk: refused, nothing left behind
        RunStore.create(runs, {"kind": "rollout"}, run_id="another")
    assert str(runs / "another") in _one_line(info.value) and CAUSE_FULL.search(str(info.value))
    assert not (runs / "another").exists()
    store.close()
    _assert_steps_intact(runs / "full", list(range(written)))

    small_disk.free()
    with RunStore.open(runs / "full") as store:  # reopened: the failed step is discarded, the run goes on
        _write_steps(store, written, 2)
    _assert_steps_intact(runs / "full", list(range(written + 2)))


def test_a_file_size_limit_fails_the_write_with_the_path_and_the_cause_and_keeps_every_stored_step(tmp_path):
    """RLIMIT_FSIZE makes the OS refuse writes beyond a size (EFBIG): needs no mount, runs anywhere on Linux."""
    pytest.importorskip("resource")
    script = textwrap.dedent(
        f"""
        import json, resource, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_storage_errors import _write_steps
        from workbench.store import RunStore, StorageError

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
        store = RunStore.create({str(tmp_path / "runs")!r}, {{"kind": "rollout"}}, run_id="limited")
        _write_steps(store, 0, 2)
        size = max(p.stat().st_size for p in store.run_dir.glob("run.db*"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 65536, resource.RLIM_INFINITY))
        written = 2
        try:
            for index in range(2, 1000):
                _write_steps(store, index, 1, tokens=2000)
                written += 1
            message = None
        except StorageError as error:
            message = str(error)
        store.close()
        print(json.dumps({{"written": written, "message": message}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    message = result["message"]
    assert message is not None, "the size limit should have stopped a write"
    assert str(tmp_path / "runs" / "limited" / "run.db") in message and "I/O error" in message, message
    assert "\n" not in message
    with RunReader(tmp_path / "runs" / "limited") as reader:
        assert reader.integrity_check() == "ok"
        assert reader.steps(complete_only=True)["step"].tolist() == list(range(result["written"]))


def test_a_checkpoint_on_a_full_disk_fails_with_its_path_and_the_cause_and_keeps_the_previous_one(small_disk):
    import torch

    from workbench.rl import checkpoint

    class Trainer:
        def __init__(self, model: torch.nn.Module) -> None:
            self.models = {"base": model}
            self.optimizer = torch.optim.AdamW(model.parameters())

    trainer = Trainer(torch.nn.Linear(256, 256))
    run_dir = small_disk.path / "run"
    first = checkpoint.save(run_dir, 1, trainer, {"policy_version": 2})
    small_disk.fill()
    with pytest.raises(StorageError) as info:
        checkpoint.save(run_dir, 3, trainer, {"policy_version": 4})
    message = _one_line(info.value)
    assert str(run_dir / "checkpoints" / "step-000003") in message and CAUSE_FULL.search(message), message
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000001"], "no half checkpoint left"
    assert checkpoint.latest(run_dir) == first
    restored = Trainer(torch.nn.Linear(256, 256))
    assert checkpoint.load(first, None, restored)["step"] == 1
    assert torch.equal(restored.models["base"].weight, trainer.models["base"].weight)


@pytest.mark.slow
def test_a_training_run_that_fills_the_disk_stops_with_a_clear_error_and_resumes_once_space_is_freed(
    tmp_path,
):
    disk = SmallDisk(tmp_path / "disk", "24m")
    try:
        steps, run_dir = 6, disk.path / "runs" / "filled"
        settings = {
            "model": "tiny", "steps": steps, "batch_size": 2, "group_size": 2, "max_tokens": 6,
            "checkpoint_every": 2, "runs_dir": str(disk.path / "runs"), "run_id": "filled",
            "task_options": "{level: 1}",
        }  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "workbench.cli", "train"]
        process = subprocess.Popen(
            command + [a for k, v in settings.items() for a in ("--set", f"{k}={v}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 300
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with RunReader(run_dir) as reader:
                    if len(reader.steps(complete_only=True)) >= 2:
                        break
            except Exception:  # noqa: BLE001 - the database may not be initialised yet
                pass
            time.sleep(0.05)
        disk.fill()  # the run's next write meets a full disk
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 2, output
        error = output[output.index("error: ") :]
        assert "Traceback" not in output and str(run_dir) in error and CAUSE_FULL.search(error), output
        with RunReader(run_dir) as reader:
            assert reader.integrity_check() == "ok"
            stored = reader.steps(complete_only=True)["step"].tolist()
        assert stored == list(range(len(stored))) and len(stored) >= 2, "the steps stored before are kept"

        disk.free()
        done = subprocess.run(command + ["--resume", str(run_dir)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        with RunReader(run_dir) as reader:
            assert reader.integrity_check() == "ok"
            assert reader.steps(complete_only=True)["step"].tolist() == list(range(steps))
            assert reader.episodes().groupby("step").size().to_dict() == {s: 4 for s in range(steps)}
            assert reader.info()["status"] == "finished"
    finally:
        disk.close()

"""Run-store schema versions and migrations, and the errors for bad paths and damaged files."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from workbench.store import (
    SCHEMA_VERSION,
    CorruptStoreError,
    InvalidRecordError,
    NotARunStoreError,
    RunExistsError,
    RunNotFoundError,
    RunReader,
    RunsDirError,
    RunStore,
    SchemaVersionError,
    StoreError,
    list_runs,
)
from workbench.store import schema as schema_module


def _make_run(runs_dir: Path, run_id: str = "r", calls: int = 3) -> Path:
    with RunStore.create(runs_dir, {"seed": 1}, run_id=run_id) as store, store.step(0) as step:
        episode = step.add_episode(task_id="t")
        for i in range(calls):
            step.add_call(episode, "solver", completion_ids=np.arange(i, i + 4), rewards={"correct": i % 2})
    return store.run_dir


def _version(run_dir: Path) -> int:
    conn = sqlite3.connect(run_dir / "run.db")
    try:
        return int(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])
    finally:
        conn.close()


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_new_store_is_at_the_latest_version():
    assert SCHEMA_VERSION == len(schema_module.MIGRATIONS) >= 1


def test_writer_applies_a_new_migration_and_keeps_the_data(tmp_path, monkeypatch):
    run_dir = _make_run(tmp_path)
    assert _version(run_dir) == SCHEMA_VERSION

    def add_judge_note(conn: sqlite3.Connection) -> None:  # a synthetic v(N) -> v(N+1)
        conn.execute("ALTER TABLE calls ADD COLUMN judge_note TEXT")
        conn.execute("UPDATE calls SET judge_note = 'reviewed ' || role")

    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, add_judge_note])
    with pytest.raises(
        SchemaVersionError, match=r"older than v\d+; migrate it with `workbench migrate"
    ) as info:
        RunReader(run_dir)  # readers never migrate
    assert str(run_dir) in _one_line(info)

    RunStore.open(run_dir).close()
    assert _version(run_dir) == SCHEMA_VERSION + 1
    with RunReader(run_dir) as reader:
        calls = reader.calls()
        assert calls["judge_note"].tolist() == ["reviewed solver"] * 3
        assert [c.tolist() for c in calls["completion_ids"]] == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
        assert reader.steps()["status"].tolist() == ["complete"]

    # Code that only knows the older schema refuses the newer database, readers and writers alike.
    monkeypatch.undo()
    with pytest.raises(SchemaVersionError, match="newer than this workbench knows") as info:
        RunReader(run_dir)
    assert "upgrade the workbench" in _one_line(info)
    with pytest.raises(SchemaVersionError, match="newer"):
        RunStore.open(run_dir)
    # The refused writer released its lock: code that knows the migration can still open the run.
    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, add_judge_note])
    RunStore.open(run_dir).close()


def test_workbench_migrate_upgrades_the_runs_no_writer_holds_and_keeps_their_partial_steps(
    tmp_path, monkeypatch, capsys
):
    from workbench.cli import main

    idle, running = _make_run(tmp_path, "idle"), _make_run(tmp_path, "running")
    store = RunStore.open(idle)  # a killed run: its step 1 was never completed
    step = store.step(1).__enter__()
    step.add_call(step.add_episode(task_id="t"), "solver", completion_ids=np.arange(3))
    step.flush()
    store._conn.close()  # its process dies without ending the step
    store._file_lock.release()
    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, lambda conn: None])
    writer = RunStore.open(running)  # a run being written: its writer has migrated it
    writer.close()
    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, lambda conn: None])
    writer = RunStore.open(running)
    try:
        assert main(["migrate", str(tmp_path)]) == 1, "a run open for writing is named, and fails the command"
    finally:
        writer.close()
    out = capsys.readouterr().out
    assert f"{idle}: v{SCHEMA_VERSION} -> v{SCHEMA_VERSION + 2}" in out
    assert f"{running}: left as it is" in out and "already open for writing" in out
    with RunReader(idle) as reader:
        assert reader.steps()["status"].tolist() == ["complete", "running"], "the partial step is kept"
    assert main(["migrate", str(idle)]) == 0 and f"v{SCHEMA_VERSION + 2}, current" in capsys.readouterr().out
    assert main(["migrate", str(tmp_path / "nowhere")]) == 1


def test_failed_migration_rolls_back_to_the_last_good_version(tmp_path, monkeypatch):
    run_dir = _make_run(tmp_path)

    def half_done(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE judgements (id INTEGER PRIMARY KEY)")
        conn.execute("UPDATE calls SET role = 'renamed'")
        raise RuntimeError("bug in migration")

    monkeypatch.setattr(schema_module, "MIGRATIONS", [*schema_module.MIGRATIONS, half_done])
    with pytest.raises(
        SchemaVersionError, match=rf"from v{SCHEMA_VERSION} to v{SCHEMA_VERSION + 1} failed"
    ) as info:
        RunStore.open(run_dir)
    assert "bug in migration" in _one_line(info)
    monkeypatch.undo()
    assert _version(run_dir) == SCHEMA_VERSION
    with RunReader(run_dir) as reader:
        assert set(reader.calls()["role"]) == {"solver"}
        assert reader.sql("SELECT name FROM sqlite_master WHERE name = 'judgements'").empty
    RunStore.open(run_dir).close()  # not left locked


def test_hand_written_newer_version_is_refused(tmp_path):
    run_dir = _make_run(tmp_path)
    conn = sqlite3.connect(run_dir / "run.db")
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    for opener in (RunReader, RunStore.open):
        with pytest.raises(SchemaVersionError, match="schema v99, newer"):
            opener(run_dir)


def test_missing_run_dir_and_missing_database(tmp_path):
    with pytest.raises(RunNotFoundError, match="does not exist") as info:
        RunReader(tmp_path / "nope")
    assert str(tmp_path / "nope") in _one_line(info)
    with pytest.raises(RunNotFoundError, match="does not exist"):
        RunStore.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunNotFoundError, match="no run.db inside"):
        RunStore.open(tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []  # opening did not create anything
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunNotFoundError, match="is a file"):
        RunReader(tmp_path / "file")
    with pytest.raises(RunsDirError, match="no runs directory"):
        list_runs(tmp_path / "nope")


def test_non_database_file_is_refused_and_left_untouched(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.db").write_text("these are my notes, not a database\n")
    for opener in (RunReader, RunStore.open):
        with pytest.raises(NotARunStoreError, match="is not a SQLite database") as info:
            opener(run_dir)
        assert str(run_dir / "run.db") in _one_line(info)
    assert (run_dir / "run.db").read_text() == "these are my notes, not a database\n"
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.db", "writer.lock"]


def test_other_sqlite_database_is_refused(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    conn = sqlite3.connect(run_dir / "run.db")
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    for opener in (RunReader, RunStore.open):
        with pytest.raises(NotARunStoreError, match="not a workbench run store"):
            opener(run_dir)


def test_corrupt_database_gives_a_clear_error(tmp_path):
    run_dir = _make_run(tmp_path, calls=60)
    db = run_dir / "run.db"
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[page:] = np.random.default_rng(0).integers(0, 256, len(data) - page, dtype=np.uint8).tobytes()
    db.write_bytes(bytes(data))
    for opener in (lambda d: RunReader(d).calls(), RunStore.open):
        with pytest.raises(CorruptStoreError, match="is damaged") as info:
            opener(run_dir)
        assert ".recover" in _one_line(info)
    runs = list_runs(tmp_path)
    assert runs["status"].tolist() == ["unreadable"] and "damaged" in runs["error"][0]


def test_unwritable_runs_dir(tmp_path):
    config = {"seed": 1}
    if os.geteuid() == 0:  # root writes through permission bits; /sys refuses even root
        target = Path("/sys/kernel")
        if not target.is_dir():
            pytest.skip("no directory here that root cannot write to")
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
    before = sorted(os.listdir(target))
    with pytest.raises(RunsDirError, match="not writable|cannot create") as info:
        RunStore.create(target, config, run_id="x")
    assert str(target) in _one_line(info)
    assert sorted(os.listdir(target)) == before
    with pytest.raises(RunsDirError, match="cannot create runs directory"):
        RunStore.create(Path("/sys/kernel/new-runs") if os.geteuid() == 0 else target / "sub", config)
    (tmp_path / "afile").write_text("")
    with pytest.raises(RunsDirError, match="is a file"):
        RunStore.create(tmp_path / "afile", config)


def test_bad_create_arguments_leave_nothing_behind(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(InvalidRecordError, match=r"config.model holds a object"):
        RunStore.create(runs, {"model": object()})
    with pytest.raises(InvalidRecordError, match="config must be a dict"):
        RunStore.create(runs, ["not", "a", "dict"])
    with pytest.raises(StoreError, match="not usable as a directory name"):
        RunStore.create(runs, {}, run_id="../escape")
    # A failure after the run directory was made removes it again.
    with pytest.raises(StoreError, match="synchronous"):
        RunStore.create(runs, {}, run_id="half", synchronous="OFF")
    assert not runs.exists() or list(runs.iterdir()) == []
    _make_run(runs, run_id="taken")
    with pytest.raises(RunExistsError, match="already exists") as info:
        RunStore.create(runs, {}, run_id="taken")
    assert "RunStore.open" in _one_line(info)
    assert sorted(p.name for p in runs.iterdir()) == ["taken"]

"""Run store: round trip of every field, step atomicity, readers, tail, and misuse of the writer API."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from workbench.store import (
    InvalidRecordError,
    ReadOnlyStoreError,
    RunReader,
    RunStore,
    StepError,
    StoreError,
    TokenOwner,
    WriterLockedError,
    list_runs,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    s = RunStore.create(tmp_path / "runs", {"topology": {"name": "debate"}, "lr": 1e-5, "roles": ("a", "b")})
    yield s
    s.close()


def _call(episode_id, role="solver", n=5, seed=0, **extra):
    rng = np.random.default_rng(seed)
    return {
        "episode_id": episode_id,
        "role": role,
        "prompt_ids": rng.integers(0, 50_000, 7, dtype=np.int64),  # converted to int32
        "completion_ids": rng.integers(0, 50_000, n).astype(np.int32),
        "logprobs": -rng.random(n),  # float64, stored as float32
        "mask": rng.integers(0, 4, n),
        **extra,
    }


def test_create_layout_and_config(tmp_path):
    config = {"topology": {"name": "mars", "roles": ["s2", "s1"]}, "lr": 2e-6, "seed": np.int64(3)}
    with RunStore.create(tmp_path, config, name="first") as store:
        run_dir = store.run_dir
        assert run_dir.parent == tmp_path.resolve()
        names = {p.name for p in run_dir.iterdir()} - {"run.db-wal", "run.db-shm"}  # WAL files while open
        assert names == {"checkpoints", "config.yaml", "run.db", "writer.lock"}
        assert yaml.safe_load((run_dir / "config.yaml").read_text()) == {**config, "seed": 3}
        assert store.config == {**config, "seed": 3}
        assert store.checkpoint_dir(12) == run_dir / "checkpoints" / "step-000012"
        assert (run_dir / "checkpoints" / "step-000012").is_dir()
        store.set_status("running")
    with RunReader(run_dir) as reader:
        info = reader.info()
        assert info["name"] == "first" and info["topology"] == "mars" and info["status"] == "running"
        assert info["config"]["seed"] == 3 and info["schema_version"] >= 1
        assert reader.checkpoints()["step"].tolist() == [12]
        mode = sqlite3.connect(reader.db_path).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def test_run_ids_sort_by_creation_and_can_be_given(tmp_path):
    a = RunStore.create(tmp_path, {})
    b = RunStore.create(tmp_path, {}, run_id="my-run.1")
    a.close()
    b.close()
    assert len(a.run_id) == len("20261122-045012-ab12cd") and a.run_id[8] == "-" and a.run_id[:8].isdigit()
    assert b.run_dir.name == "my-run.1"
    ids = list_runs(tmp_path)["id"].tolist()
    assert ids == sorted([a.run_id, "my-run.1"])


def test_round_trip_every_field(store):
    with store.step(0, policy_version=4) as step:
        episode = step.add_episode(task_id=17, group_key="q17", task_meta={"question": "2+2?", "hops": 2})
        parent = step.new_call_id()
        child = step.add_call(
            **_call(episode, role="worker", seed=1),
            parent_id=parent,
            policy="lora:worker",
            prompt_text="Find the capital",
            completion_text="<search>Paris</search>",
            action={"tool": "search", "query": "capital"},
            tool_calls=[{"name": "search", "arguments": {"q": "capital"}}],
            tool_results=[{"name": "search", "content": "Paris is ..."}],
            rewards={"f1": np.float32(0.5), "format": 1},
            advantage=0.25,
            token_advantages=np.linspace(0, 1, 5),
            timings={"queued": 1.0, "started": 1.5, "finished": 2.0, "tokens_per_s": 10.0},
            format_error="missing </answer>",
        )
        got_parent = step.add_call(
            **_call(episode, role="planner", n=3, seed=2), call_id=parent, policy_version=3
        )
        step.update_episode(episode, reward=1.0, status="complete")
    assert got_parent == parent and child > parent

    reader = store.reader()
    calls = reader.calls()
    assert calls["id"].tolist() == [parent, child]
    planner, worker = calls.iloc[0], calls.iloc[1]
    want = _call(episode, seed=1)
    np.testing.assert_array_equal(worker["prompt_ids"], want["prompt_ids"])
    np.testing.assert_array_equal(worker["completion_ids"], want["completion_ids"])
    np.testing.assert_array_equal(worker["logprobs"], want["logprobs"].astype(np.float32))
    np.testing.assert_array_equal(worker["mask"], want["mask"])
    np.testing.assert_array_equal(worker["token_advantages"], np.linspace(0, 1, 5, dtype=np.float32))
    assert worker["prompt_ids"].dtype == np.int32 and worker["logprobs"].dtype == np.float32
    assert worker["mask"].dtype == np.uint8
    assert worker["prompt_ids"].flags.writeable
    assert (worker["parent_id"], worker["policy"], worker["role"], worker["step"]) == (
        parent,
        "lora:worker",
        "worker",
        0,
    )
    assert (worker["position"], planner["position"]) == (0, 1)
    assert (worker["policy_version"], planner["policy_version"]) == (4, 3)
    assert (worker["n_prompt"], worker["n_completion"], planner["n_completion"]) == (7, 5, 3)
    assert (
        worker["prompt_text"] == "Find the capital" and worker["completion_text"] == "<search>Paris</search>"
    )
    assert worker["action"] == {"tool": "search", "query": "capital"}
    assert worker["tool_calls"] == [{"name": "search", "arguments": {"q": "capital"}}]
    assert worker["tool_results"] == [{"name": "search", "content": "Paris is ..."}]
    assert worker["rewards"] == {"f1": 0.5, "format": 1.0}
    assert worker["advantage"] == 0.25 and worker["format_error"] == "missing </answer>"
    assert worker["timings"]["tokens_per_s"] == 10.0
    assert planner["rewards"] is None and planner["token_advantages"] is None
    assert planner["parent_id"] is pd_na()

    as_lists = reader.calls(arrays="list", columns=["completion_ids", "mask"])
    assert list(as_lists.columns) == ["id", "completion_ids", "mask"]
    assert as_lists.iloc[1]["completion_ids"] == want["completion_ids"].tolist()
    assert reader.calls(arrays="bytes").iloc[1]["mask"] == want["mask"].astype(np.uint8).tobytes()

    episodes = reader.episodes()
    assert episodes.to_dict("records") == [
        {
            "id": episode,
            "step": 0,
            "task_id": "17",
            "group_key": "q17",
            "status": "complete",
            "reward": 1.0,
            "error": None,
            "task_meta": {"question": "2+2?", "hops": 2},
        }
    ]
    rewards = reader.rewards()
    assert sorted(zip(rewards["name"], rewards["value"], strict=True)) == [("f1", 0.5), ("format", 1.0)]
    assert set(rewards["call_id"]) == {child}


def pd_na():
    import pandas as pd

    return pd.NA


def test_import_is_light():
    code = "import sys, workbench.store; assert 'pandas' not in sys.modules, 'pandas imported eagerly'"
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def test_token_owner_codes_are_documented_values():
    assert [int(c) for c in TokenOwner] == [0, 1, 2, 3]
    assert TokenOwner.TRAINABLE == 1 and TokenOwner.TOOL == 2


def test_update_call_and_filters(store):
    with store.step(0) as step:
        e1, e2 = step.add_episode(), step.add_episode()
        ids = step.add_calls(
            [
                _call(e1, "solver"),
                _call(e1, "verifier", rewards={"judge": float("nan")}),
                _call(e2, "solver", n=2),
            ]
        )
        step.update_calls(
            [
                {"id": ids[0], "advantage": -1.0, "rewards": {"correct": 0}},
                {"id": ids[2], "token_advantages": [1, 2]},
            ]
        )
        step.update_call(ids[1], tool_results=["ok"])
    with store.step(1) as step:
        e3 = step.add_episode()
        step.add_call(**_call(e3, "solver"))
        with pytest.raises(StepError, match="not in step 1"):
            step.update_call(ids[0], advantage=2.0)
    reader = store.reader()
    by_id = reader.calls().set_index("id")
    assert by_id.loc[ids[0], "advantage"] == -1.0 and by_id.loc[ids[0], "rewards"] == {"correct": 0.0}
    assert by_id.loc[ids[2], "token_advantages"].tolist() == [1.0, 2.0]
    assert by_id.loc[ids[1], "tool_results"] == ["ok"]
    assert by_id.loc[ids[1], "rewards"] == {"judge": None}  # JSON has no NaN
    rewards = reader.rewards(role="verifier")
    assert rewards["name"].tolist() == ["judge"] and rewards["value"].isna().all()
    assert reader.calls(step=0, role="solver")["id"].tolist() == [ids[0], ids[2]]
    assert reader.calls(role=["verifier", "solver"], step=[1])["step"].tolist() == [1]
    assert reader.calls(episode=e1)["id"].tolist() == ids[:2]
    assert reader.calls(episode=np.int64(e1), step=np.array([0]))["id"].tolist() == ids[:2]
    assert reader.calls(role=[]).empty
    page = reader.calls(role="solver", columns=["role"], limit=2, offset=1)
    assert page["id"].tolist() == [ids[2], by_id.index[-1]]
    counts = reader.call_counts("role")
    assert dict(zip(counts["role"], counts["calls"], strict=True)) == {"solver": 3, "verifier": 1}
    per_step = reader.call_counts(["step", "role"])
    assert per_step[["step", "role", "calls"]].values.tolist() == [
        [0, "solver", 2],
        [0, "verifier", 1],
        [1, "solver", 1],
    ]
    steps = reader.steps()
    assert steps["calls"].tolist() == [3, 1] and steps["episodes"].tolist() == [2, 1]


def test_metrics_long_and_wide(store):
    for i in range(3):
        with store.step(i) as step:
            step.log_metrics({"reward_mean": i / 2, "kl": np.float64(0.1 * i)}, role="solver")
            step.log_metrics({"reward_mean": 1.0}, role="verifier")
            step.log_metrics({"loss": 2.0 - i})
    reader = store.reader()
    long = reader.metrics(role="solver", name="reward_mean")
    assert long["step"].tolist() == [0, 1, 2] and long["value"].tolist() == [0.0, 0.5, 1.0]
    assert len(reader.metrics()) == 12
    wide = reader.metrics_wide()
    assert list(wide.columns) == ["loss", "solver/kl", "solver/reward_mean", "verifier/reward_mean"]
    assert wide.index.tolist() == [0, 1, 2] and wide["loss"].tolist() == [2.0, 1.0, 0.0]


def test_exception_in_step_leaves_no_partial_step(store):
    with store.step(0) as step:
        step.add_call(**_call(step.add_episode()))
    with pytest.raises(RuntimeError, match="boom"), store.step(1) as step:
        episode = step.add_episode()
        flushed = step.add_calls([_call(episode, seed=i) for i in range(5)])
        step.log_metrics({"x": 1.0})
        step.flush()  # these rows were committed and must be deleted again
        step.add_call(**_call(episode))
        raise RuntimeError("boom")
    reader = store.reader()
    assert reader.steps()["step"].tolist() == [0]
    assert len(reader.calls(complete_only=False)) == 1
    assert len(reader.episodes(complete_only=False)) == 1
    assert len(reader.metrics(complete_only=False)) == 0
    aborted = reader.events(kind="step_aborted")
    assert aborted["step"].tolist() == [1]
    assert aborted["payload"][0]["calls"] == 5 and "boom" in aborted["payload"][0]["reason"]
    # The step index can be written again, and ids are never reused (a tail cursor stays valid).
    with store.step(1) as step:
        new_id = step.add_call(**_call(step.add_episode()))
    assert new_id > max(flushed)
    assert reader.steps()["status"].tolist() == ["complete", "complete"]


def test_keyboard_interrupt_in_step_is_discarded_too(store):
    with pytest.raises(KeyboardInterrupt), store.step(0) as step:
        step.add_call(**_call(step.add_episode()))
        step.flush()
        raise KeyboardInterrupt
    assert store.reader().steps(complete_only=False).empty
    assert store.last_complete_step() is None


def test_failed_batch_adds_nothing(store):
    with store.step(0) as step:
        episode = step.add_episode()
        good = _call(episode)
        with pytest.raises(InvalidRecordError, match=r"calls\[1\].*mask"):
            step.add_calls([good, {**good, "mask": [1, 1]}])
        with pytest.raises(InvalidRecordError, match=r"calls\[0\].*unknown field"):
            step.add_calls([{**good, "reward": 1.0}])
        ids = step.add_calls([good])
    calls = store.reader().calls()
    assert calls["id"].tolist() == ids and calls["position"].tolist() == [0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask": [0, 1, 9, 1, 1]}, "code 9"),
        ({"mask": [1, 1]}, "mask has 2 entries but the completion has 5"),
        ({"logprobs": [0.0]}, "logprobs has 1 entries"),
        ({"token_advantages": [[1.0]]}, "must be 1-D"),
        ({"prompt_ids": [1.5, 2.0]}, "integer token ids"),
        ({"prompt_ids": [-1]}, "outside 0..2"),
        ({"prompt_ids": "hello"}, "sequence of numbers"),
        ({"completion_ids": None}, "without completion_ids"),
        ({"role": ""}, "non-empty string"),
        ({"rewards": [1.0]}, "dict of name"),
        ({"rewards": {"f1": "high"}}, "must be a number"),
        ({"action": {"x": object()}}, "action is not JSON"),
        ({"parent_id": "7"}, "parent_id must be an int"),
        ({"call_id": 999}, "not reserved"),
        ({"prompt_text": 5}, "prompt_text must be a string"),
    ],
)
def test_bad_call_fields_are_refused_with_a_clear_error(store, change, message):
    with store.step(0) as step:
        episode = step.add_episode()
        with pytest.raises(InvalidRecordError, match=message) as info:
            step.add_call(**{**_call(episode), **change})
        assert "\n" not in str(info.value)
        step.add_call(**_call(episode))
    assert store.reader().calls()["position"].tolist() == [0]


def test_step_misuse(store):
    with store.step(3) as step:
        episode = step.add_episode()
        with pytest.raises(StepError, match="step 3 is still open"), store.step(4):
            pass
    with pytest.raises(StepError, match=r"continue with store.step\(4\)"), store.step(3):
        pass
    with pytest.raises(StepError, match="increasing order"), store.step(1):
        pass
    with pytest.raises(StepError, match="closed"):
        step.add_call(episode, "solver")
    unopened = store.step(4)
    with pytest.raises(StepError, match="with store.step"):
        unopened.add_episode()
    with store.step(4) as step, pytest.raises(StepError, match="not part of step 4"):
        step.add_call(episode, "solver")
    with store.step(5) as step, pytest.raises(InvalidRecordError, match="metric 'loss' must be a number"):
        step.log_metrics({"loss": "low"})
    with pytest.raises(StepError, match="non-negative int"):
        store.step(-1)
    with pytest.raises(InvalidRecordError, match="run status"):
        store.set_status("done")
    assert store.reader().steps()["step"].tolist() == [3, 4, 5]


def test_closed_store_refuses_writes_and_close_discards_open_step(tmp_path):
    store = RunStore.create(tmp_path, {})
    step = store.step(0).__enter__()
    step.add_call(**_call(step.add_episode()))
    step.flush()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.log_event("x")
    with RunReader(store.run_dir) as reader:
        assert reader.steps(complete_only=False).empty
        assert reader.calls(complete_only=False).empty


def test_store_context_marks_failed_run(tmp_path):
    with pytest.raises(ValueError), RunStore.create(tmp_path, {}) as store:
        raise ValueError("trainer crashed")
    with RunReader(store.run_dir) as reader:
        assert reader.info()["status"] == "failed"
    assert RunStore.open(store.run_dir).close() is None  # the lock was released


def test_reader_is_read_only(store):
    with store.step(0) as step:
        step.add_call(**_call(step.add_episode()))
    reader = store.reader()
    for statement in ("DELETE FROM calls", "UPDATE runs SET status = 'x'", "CREATE TABLE t (x)"):
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            reader.sql(statement)
    # Even the raw connection under query_only and mode=ro cannot write.
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._conn.execute("INSERT INTO events (ts, kind) VALUES (0, 'x')")
    assert len(reader.calls()) == 1 and reader.info()["status"] == "created"
    assert reader.sql("SELECT count(*) AS n FROM calls")["n"].tolist() == [1]


def test_second_writer_is_refused(store):
    with pytest.raises(WriterLockedError, match="already open for writing") as info:
        RunStore.open(store.run_dir)
    assert str(store.run_dir) in str(info.value)
    with store.step(0) as step:  # the first writer is unaffected
        step.add_episode()
    store.close()
    RunStore.open(store.run_dir).close()


def test_events_and_tail_of_steps_metrics_and_events(store):
    reader = store.reader()
    since = reader.last_id("events")
    store.log_event("weight_sync", {"seconds": 0.5}, step=None)
    with store.step(0) as step:
        step.log_metrics({"a": 1.0, "b": 2.0})
    with store.step(1) as step:
        step.log_metrics({"a": 3.0})
        running_steps = list(reader.tail("steps", timeout=0))
        assert [frame["step"].tolist() for frame in running_steps] == [[0]]  # step 1 not complete yet
    events = pd_concat(reader.tail("events", since_id=since, timeout=0))
    assert events["kind"].tolist() == ["weight_sync"] and events["payload"][0] == {"seconds": 0.5}
    metrics = pd_concat(reader.tail("metrics", timeout=0, batch_size=2))
    assert metrics["value"].tolist() == [1.0, 2.0, 3.0]
    assert [f["step"].tolist() for f in reader.tail("steps", since_id=0, timeout=0)] == [[1]]
    with pytest.raises(InvalidRecordError, match="cannot be tailed"):
        next(reader.tail("runs"))
    with pytest.raises(InvalidRecordError, match="unknown calls column"):
        reader.calls(columns=["nope"])
    with pytest.raises(InvalidRecordError, match="filter step='0' must be an int"):
        reader.calls(step="0")


def pd_concat(frames):
    import pandas as pd

    return pd.concat(list(frames), ignore_index=True)


def test_reader_thread_tails_calls_while_writer_writes(store):
    n_batches, batch = 20, 50
    seen: list[int] = []
    started = threading.Event()

    def follow():
        with RunReader(store.run_dir) as reader:
            started.set()
            for frame in reader.tail("calls", poll_interval=0.005, timeout=5, columns=["completion_ids"]):
                seen.extend(frame["id"].tolist())
                if len(seen) >= n_batches * batch:
                    return

    thread = threading.Thread(target=follow)
    thread.start()
    started.wait(5)
    with store.step(0) as step:
        episode = step.add_episode()
        for b in range(n_batches):
            step.add_calls([_call(episode, seed=b)] * batch)
            step.flush()
    thread.join(10)
    assert not thread.is_alive()
    assert seen == sorted(seen) and len(set(seen)) == n_batches * batch


def test_list_runs(tmp_path):
    with RunStore.create(tmp_path, {"topology": "debate"}, run_id="a") as store:
        with store.step(0) as step:
            step.add_call(**_call(step.add_episode()))
        store.set_status("finished")
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "run.db").write_text("not a database")
    (tmp_path / "not-a-run").mkdir()
    runs = list_runs(tmp_path)
    assert runs["id"].tolist() == ["a", "b"]
    a, b = runs.iloc[0], runs.iloc[1]
    assert (a["status"], a["topology"], a["steps"], a["last_step"], a["calls"]) == (
        "finished",
        "debate",
        1,
        0,
        1,
    )
    assert b["status"] == "unreadable" and "not a SQLite database" in b["error"]


def test_a_steps_events_are_committed_and_discarded_with_it(store):
    with store.step(0) as step:
        step.log_event("eval", {"tasks": {"q1": {"outcome": 1.0}}})
    with pytest.raises(RuntimeError), store.step(1) as step:
        step.log_event("eval", {"tasks": {}})
        step.flush()
        raise RuntimeError("killed")
    with store.step(1) as step:
        step.log_event("eval", {"tasks": {"q1": {"outcome": 0.0}}})
    reader = store.reader()
    evals = reader.events(kind="eval")
    assert evals["step"].tolist() == [0, 1]
    assert evals["payload"][1] == {"tasks": {"q1": {"outcome": 0.0}}}
    # a resumed run discards the steps after its checkpoint: their own events go, the history stays
    assert store.discard_steps_after(0) == [1]
    assert reader.events(kind="eval")["step"].tolist() == [0]
    assert reader.events(kind="step_aborted")["step"].tolist() == [1]
    with pytest.raises(InvalidRecordError, match="event kind"), store.step(1) as step:
        step.log_event("")


def test_text_after_a_nul_stays_searchable(store):
    """SQLite's LIKE stops at a NUL: stored text has U+FFFD there, the token ids stay exact."""
    with store.step(0) as step:
        episode = step.add_episode()
        step.add_call(**_call(episode, completion_text="noise\x00 then the bug report", prompt_text="a\x00b"))
    reader = store.reader()
    (text,) = reader.calls()["completion_text"]
    assert text == "noise\ufffd then the bug report"
    found = reader.sql("SELECT count(*) AS n FROM calls WHERE completion_text LIKE '%bug report%'")
    assert found["n"].tolist() == [1]
    assert reader.calls()["prompt_text"].tolist() == ["a\ufffdb"]


def test_an_engine_call_record_is_stored_as_its_row(store):
    from workbench.store.records import CallRecord

    def record(position, trainable, mask=None, **extra):
        return CallRecord(
            role="solver" if trainable else "judge",
            node="n",
            position=position,
            prompt_ids=[1, 2],
            completion_ids=[3, 4, 5],
            logprobs=[-0.5] * 3,
            prompt_text="p",
            completion_text="c",
            finish_reason="length",
            policy="base",
            policy_version=2,
            trainable=trainable,
            mask=mask,
            **extra,
        )

    owned = [TokenOwner.TRAINABLE, TokenOwner.TOOL, TokenOwner.TRAINABLE]
    with store.step(0, policy_version=5) as step:
        episode = step.add_episode(task_id="t")
        first = step.add_record(episode, record(0, True, rewards={"reward": 1.0}, timings={"queued": 1.0}))
        second = step.add_record(
            episode, record(1, False, owned, parsed={"verdict": "correct"}, parent=0, source=0), {0: first}
        )
    calls = store.reader().calls(arrays="list").set_index("id")
    a, b = calls.loc[first], calls.loc[second]
    # the owner rule: all the role's own when the engine gave no mask; a role that is not trained keeps
    # its tool tokens marked and its own masked
    assert a["mask"] == [1, 1, 1] and b["mask"] == [0, 2, 0]
    assert a["timings"] == {"queued": 1.0, "finish_reason": "length"} and a["rewards"] == {"reward": 1.0}
    assert b["action"] == {"verdict": "correct"} and b["rewards"] is None and b["tool_calls"] is None
    assert (b["parent_id"], b["source_id"], b["position"], b["policy_version"]) == (first, first, 1, 2)
    assert (a["role"], a["policy"], a["completion_ids"]) == ("solver", "base", [3, 4, 5])

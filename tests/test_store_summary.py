"""Run summaries: what a summary keeps and leaves out, a summary read back as a run, and its cache."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from workbench.store import RunReader, RunStore, SchemaVersionError
from workbench.store.summary import SUMMARY_DROPS, export_summary, is_summary, open_summary, read_summary


@pytest.fixture
def run_dir(tmp_path):
    """A finished two-step run with every column filled: prompts, token arrays, masks, metrics, events."""
    rng = np.random.default_rng(0)
    with RunStore.create(tmp_path / "runs", {"topology": "marsrl_cpu", "seed": 7}) as store:
        for step_no in range(2):
            with store.step(step_no, policy_version=step_no) as step:
                episode = step.add_episode(task_id=f"t{step_no}", group_key="g", task_meta={"hops": 2})
                step.add_call(
                    episode_id=episode,
                    role="solver",
                    prompt_ids=rng.integers(0, 1000, 50),
                    completion_ids=rng.integers(0, 1000, 6),
                    logprobs=-rng.random(6),
                    mask=np.array([1, 1, 2, 2, 1, 0]),
                    prompt_text="A long few-shot prompt. " * 40,
                    completion_text=f"<answer>{step_no}</answer>",
                    action={"answer": str(step_no)},
                    rewards={"reward": 1.0},
                    timings={"queued": 1.0},
                    token_advantages=np.linspace(0, 1, 6),
                    advantage=0.5,
                )
                step.update_episode(episode, reward=float(step_no), status="complete")
                step.log_metrics({"reward/mean": 0.25 * step_no}, role="solver")
                step.log_metrics({"eval/accuracy": 0.5 + step_no / 4})
            store.log_event("eval", {"tasks": {"t9": {"outcome": float(step_no)}}}, step=step_no)
        store.set_status("finished")
        return store.run_dir


def test_a_summary_reads_back_as_its_run_without_the_prompts_and_token_ids(run_dir, tmp_path):
    summary = export_summary(
        run_dir, tmp_path / "summaries" / "marsrl", command="workbench reproduce x", seed=7
    )
    assert is_summary(summary) and not is_summary(run_dir)
    about = read_summary(summary)
    assert (about["command"], about["seed"], about["run"]) == ("workbench reproduce x", 7, run_dir.name)
    assert about["tables"]["calls"]["rows"] == 2 and about["left_out"]["calls"] == list(
        SUMMARY_DROPS["calls"]
    )
    assert (summary / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
    with gzip.open(summary / "calls.jsonl.gz", "rt") as f:
        assert "few-shot" not in f.read()  # the prompts stay behind

    rebuilt = open_summary(summary, tmp_path / "cache")
    with RunReader(run_dir) as original, RunReader(rebuilt) as copy:
        assert copy.info()["status"] == "finished" and copy.run_id == original.run_id
        assert copy.config == original.config
        pd.testing.assert_frame_equal(copy.metrics(), original.metrics())
        pd.testing.assert_frame_equal(copy.episodes(), original.episodes())
        pd.testing.assert_frame_equal(copy.steps(), original.steps())
        pd.testing.assert_frame_equal(copy.events(kind="eval"), original.events(kind="eval"))
        kept = ["id", "role", "parent_id", "n_prompt", "n_completion", "advantage", "action", "rewards",
                "completion_text", "mask"]  # fmt: skip
        ours, theirs = copy.calls(columns=kept), original.calls(columns=kept)
        pd.testing.assert_frame_equal(ours.drop(columns="mask"), theirs.drop(columns="mask"))
        for a, b in zip(ours["mask"], theirs["mask"], strict=True):
            np.testing.assert_array_equal(a, b)
        dropped = copy.calls(columns=list(SUMMARY_DROPS["calls"]))
        assert dropped.drop(columns="id").isna().all().all()


def test_a_summary_is_built_once_and_again_when_it_changes(run_dir, tmp_path):
    summary = export_summary(run_dir, tmp_path / "s", command="c")
    first = open_summary(summary, tmp_path / "cache")
    assert open_summary(summary, tmp_path / "cache") == first
    same = export_summary(run_dir, tmp_path / "s", command="c")  # the same run: the same bytes
    assert open_summary(same, tmp_path / "cache") == first
    about = read_summary(summary)
    (summary / "summary.json").write_text(json.dumps({**about, "command": "d"}))
    assert open_summary(summary, tmp_path / "cache") != first


def test_a_summary_newer_than_the_workbench_is_refused_by_name(run_dir, tmp_path):
    summary = export_summary(run_dir, tmp_path / "s", command="c")
    about = read_summary(summary)
    (summary / "summary.json").write_text(json.dumps({**about, "schema_version": 99}))
    with pytest.raises(SchemaVersionError, match=r"s is a summary of format 1, schema v99, newer than"):
        open_summary(summary, tmp_path / "cache")

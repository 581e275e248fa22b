"""The training loop end to end on the tiny model: store contents, metrics, learning, resume, and wb.train."""

from __future__ import annotations

import re
import sqlite3
import threading
import time

import pytest

import workbench as wb
from workbench.rewards import register
from workbench.rl import checkpoint
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training, task_order
from workbench.store import NotARunStoreError
from workbench.tasks import generate
from workbench.topology import from_dict
from workbench.training import create, run_config, run_here


@register("has_digit")
def _has_digit(prediction: str, reference: str) -> float:
    return float(any(ch.isdigit() for ch in prediction))


@register("even_length")
def _even_length(prediction: str, reference: str) -> float:
    """About half of a random model's outputs: every group has a reward signal."""
    return float(len(prediction) % 2 == 0)


SOLO = from_dict(
    {
        "name": "solo",
        "roles": {
            "solver": {
                "messages": [{"role": "user", "content": "{{ question }}"}],
                "reward": {"kind": "answer", "verifier": "has_digit"},
                "sampling": {"max_tokens": 6},
            }
        },
        "flow": {"start": "solve", "nodes": {"solve": {"call": "solver"}}, "answer": "{{ text }}"},
    }
)


def _config(tmp_path, **kw) -> TrainConfig:
    base = dict(
        model="tiny",
        steps=2,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        runs_dir=str(tmp_path),
        checkpoint_every=1,
        learning_rate=1e-4,
        task_options={"level": 1},
        n_tasks=16,
    )
    return TrainConfig(**{**base, **kw})


def test_task_order_is_a_seeded_shuffle_per_epoch_and_covers_every_task():
    seen = [i for step in range(4) for i in task_order(10, step, 5, seed=3)]
    assert sorted(seen[:10]) == list(range(10)) == sorted(seen[10:])
    assert seen[:10] != seen[10:], "each epoch has its own order"
    assert task_order(10, 1, 5, seed=3) == task_order(10, 1, 5, seed=3)
    assert task_order(10, 1, 5, seed=4) != task_order(10, 1, 5, seed=3)


def test_config_round_trips_through_yaml_and_names_bad_fields(tmp_path):
    config = _config(tmp_path, train_roles=["solver"], dual_clip=3.0)
    assert TrainConfig.from_yaml(config.to_yaml(tmp_path / "c.yaml")) == config
    with pytest.raises(ValueError, match=r"unknown training config field\(s\) \['stpes'\]"):
        TrainConfig.from_dict({"stpes": 3})
    with pytest.raises(ValueError, match="group_size must be a positive integer"):
        TrainConfig(group_size=0)
    assert "clip_high = 0.2" in TrainConfig.help()


def test_a_marsrl_run_stores_every_step_with_advantages_metrics_and_checkpoints(tmp_path):
    config = _config(tmp_path, eval_tasks=4, eval_every=0)
    run_dir = create(config)
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    steps = reader.steps()
    # steps 0 and 1 train; step 2 holds only the final held-out evaluation
    assert list(steps["step"]) == [0, 1, 2] and set(steps["status"]) == {"complete"}
    calls = reader.calls()
    assert calls["advantage"].notna().all(), "every call of marsrl is rewarded and gets an advantage"
    assert set(calls["role"]) >= {"solver", "verifier1"}
    wide = reader.metrics_wide()
    for name in ("reward/mean", "loss", "groups/zero_std_fraction", "time/rollout_s", "time/weight_sync_s"):
        assert name in wide.columns, name
    # every phase of a step is timed (record and checkpoint end after the step's row is written)
    for name in ("time/score_s", "time/advantages_s", "time/train_s", "time/step_s"):
        assert (wide[name].iloc[:2] >= 0).all(), name
    assert wide["time/evaluation_s"].iloc[:2].notna().tolist() == [True, False], "evaluated at step 0 only"
    for column in ("solver/grad_share", "verifier1/verifier/verdict_accuracy", "solver/length/max"):
        assert column in wide.columns, column
    assert [p.name for p in sorted((run_dir / "checkpoints").glob("step-*"))] == [
        "step-000000",
        "step-000001",
    ]
    # held-out scores per task, before the first update and after the last, beside their metrics
    evals = reader.events(kind="eval")
    assert evals["step"].tolist() == [0, 2]
    for step, payload in zip(evals["step"], evals["payload"], strict=True):
        scores = payload["tasks"]
        assert len(scores) == 4 and all("solver" in s and "outcome" in s for s in scores.values())
        row = wide.loc[step]
        assert row["eval/accuracy"] == sum(s["outcome"] >= 1 for s in scores.values()) / 4
        assert row["eval/solver/reward"] == pytest.approx(sum(s["solver"] for s in scores.values()) / 4)


def test_the_policy_learns_a_reward_it_can_reach(tmp_path):
    """A tiny random model, rewarded for writing a digit, writes digits more often within a few steps."""
    config = _config(tmp_path, steps=15, batch_size=4, group_size=8, learning_rate=1e-2, checkpoint_every=100)
    run_dir = create(config)
    run_training(
        config,
        run_dir,
        topology=SOLO,
        tasks=generate("arithmetic", n=16, seed=0, level=1),
        log=lambda m: None,
    )
    reward = wb.RunReader(run_dir).metrics_wide()["solver/reward/mean"]
    assert reward.iloc[-3:].mean() > reward.iloc[:3].mean() + 0.2, reward.tolist()


def test_resume_continues_after_the_checkpoint_and_redoes_later_steps(tmp_path):
    config = _config(tmp_path, steps=2, checkpoint_every=1)
    run_dir = create(config)
    run_here(run_dir)
    # the newest checkpoint incomplete, as if the process died while saving it: step 1 is after the last
    # complete checkpoint, so it is discarded and redone
    (run_dir / "checkpoints" / "step-000001" / "trainer_state.json").unlink()  # newest checkpoint incomplete
    config.steps = 3
    (run_dir / "train_config.yaml").write_text(config.to_yaml())
    assert run_here(run_dir) == "finished"
    reader = wb.RunReader(run_dir)
    assert list(reader.steps()["step"]) == [0, 1, 2]
    assert reader.events(kind="steps_discarded").iloc[-1]["payload"]["steps"] == [1]
    episodes = reader.episodes()
    assert episodes.groupby("step").size().to_dict() == {0: 4, 1: 4, 2: 4}, "no step lost or duplicated"
    assert reader.integrity_check() == "ok"


def test_a_run_killed_before_its_config_file_was_written_still_trains_from_its_store(tmp_path):
    config = _config(tmp_path, steps=1)
    run_dir = create(config)
    (run_dir / "train_config.yaml").unlink()  # the kill came between the store and the config file
    assert run_config(run_dir) == config
    assert (run_dir / "train_config.yaml").exists(), "the file is written back for the next resume"
    (run_dir / "train_config.yaml").unlink()
    assert run_here(run_dir) == "finished"
    assert list(wb.RunReader(run_dir).steps()["step"]) == [0]


def test_a_run_killed_while_its_store_was_made_says_so(tmp_path):
    run_dir = create(_config(tmp_path, steps=1))
    (run_dir / "train_config.yaml").unlink()
    with sqlite3.connect(
        run_dir / "run.db"
    ) as connection:  # the kill came before the run's row was committed
        connection.execute("DELETE FROM runs")
    with pytest.raises(NotARunStoreError, match="no run row"):
        run_config(run_dir)


class RecordingHandle:
    """Stands in for IPython's DisplayHandle (a kernel's), keeping what it was updated with."""

    def __init__(self):
        self.updates = []

    def update(self, obj):
        self.updates.append(obj)


def test_wb_train_returns_at_once_and_the_handle_stops_waits_and_reads_metrics(tmp_path):
    started = time.monotonic()
    run = wb.train("marsrl", config=_config(tmp_path, steps=30, checkpoint_every=2))
    launched_in = time.monotonic() - started
    assert run.process.is_alive() and launched_in < 10, "the call returns while training runs"
    deadline = time.monotonic() + 300
    while run.metrics().empty and time.monotonic() < deadline:
        time.sleep(1)
    assert not run.metrics().empty, run.log()
    # the notebook display redraws itself while the run is active, and stops once it has ended
    handle = RecordingHandle()
    redraw = threading.Thread(target=run.refresh, args=(handle, 0.2), daemon=True)
    redraw.start()
    time.sleep(1.5)
    assert redraw.is_alive() and len(handle.updates) >= 3
    assert run.stop() == "stopped"
    redraw.join(10)
    assert not redraw.is_alive() and "stopped" in handle.updates[-1].data
    done = len(run.metrics())
    assert 1 <= done < 30
    assert "<svg" in run._repr_html_()
    resumed = wb.resume(run.run_dir, steps=done + 1)
    assert resumed.wait(600) == "finished", resumed.log()
    assert list(wb.RunReader(run.run_dir).steps()["step"]) == list(range(done + 1))


DUO = from_dict(
    {
        "name": "duo",
        "roles": {
            "first": {
                "messages": [{"role": "user", "content": "{{ question }}"}],
                "reward": {"kind": "answer", "verifier": "even_length"},
            },
            "second": {
                "messages": [{"role": "user", "content": "Check: {{ question }} {{ draft }}"}],
                "reward": {"kind": "answer", "verifier": "even_length"},
            },
        },
        "flow": {
            "start": "a",
            "nodes": {
                "a": {"call": "first", "bind": {"draft": "text"}, "next": [{"goto": "b"}]},
                "b": {"call": "second"},
            },
            "answer": "{{ text }}",
        },
    }
)


@pytest.mark.parametrize("layout", ["lora", "separate"])
def test_each_role_trains_its_own_weights(layout, tmp_path):
    import torch

    from workbench.models import load

    config = _config(
        tmp_path,
        steps=2,
        batch_size=4,
        group_size=4,
        policies=layout,
        policy_per_role=True,
        learning_rate=1e-2,
    )
    run_dir = create(config)
    lines: list[str] = []
    run_training(
        config, run_dir, topology=DUO, tasks=generate("arithmetic", n=8, seed=0, level=1), log=lines.append
    )
    progress = [line for line in lines if re.match(r"step \d: reward", line)]
    assert len(progress) == 2, lines
    for line in progress:  # the numbers that move: the loss in scientific notation, the gradient norm
        assert re.match(r"step \d: reward [\d.]+, loss -?\d\.\d\de[+-]\d\d, grad norm ([\d.e+-]+), ", line), (
            line
        )
    assert any(float(re.search(r"grad norm ([\d.e+-]+)", line).group(1)) > 0 for line in progress), progress
    weights = checkpoint.trained_weights(run_dir / "checkpoints" / "step-000001")
    base, _ = load("tiny")
    base_state = base.state_dict()
    if layout == "lora":
        assert weights and all("lora_" in k for k in weights), "only the adapters are trained and saved"
        for role in ("first", "second"):
            trained = [v for k, v in weights.items() if f".{role}." in k and "lora_B" in k]
            assert trained and any(v.abs().sum() > 0 for v in trained), f"{role}'s adapter moved"
    else:
        for role in ("first", "second"):
            mine = {k.split("/", 1)[1]: v for k, v in weights.items() if k.startswith(f"{role}/")}
            moved = [k for k, v in mine.items() if k in base_state and not torch.equal(v, base_state[k])]
            assert moved, f"{role}'s own model moved"
    calls = wb.RunReader(run_dir).calls()
    assert set(calls["policy"]) == {"first", "second"}


def test_the_cli_lists_every_config_field_and_rejects_a_bad_override(capsys):
    from workbench.cli import main

    assert main(["train", "--help-config"]) == 0
    listed = capsys.readouterr().out
    from workbench.rl.config import FIELDS

    assert all(f"{name} = " in listed for name in FIELDS)
    assert main(["train", "--set", "group_size=0"]) == 2
    assert "group_size must be a positive integer" in capsys.readouterr().err


def _fails_before_its_first_step(run_dir) -> None:
    """A background run's work that fails the way a bad plugin would: before the loop opens the store."""
    raise ValueError("tools.calculator.kind: unknown tool kind 'calculator'")


def test_a_background_run_that_fails_early_says_why_in_its_log_error_and_status(tmp_path):
    from workbench.training import launch

    run = launch(create(_config(tmp_path)), _fails_before_its_first_step)
    with pytest.raises(RuntimeError, match="unknown tool kind 'calculator'"):
        run.wait(120)
    assert run.process.exitcode == 1 and run.status == "failed"
    assert run.error() == "ValueError: tools.calculator.kind: unknown tool kind 'calculator'"
    log = run.log()
    assert "Traceback" in log and "_fails_before_its_first_step" in log
    assert "closed file" not in log and "lost sys.stderr" not in log


def test_sigterm_stops_a_run_after_its_step_as_stopped(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "workbench.cli", "train", "--set", "model=tiny", "--set", "steps=200"]
    command += ["--set", "batch_size=2", "--set", "group_size=2", "--set", "max_tokens=4"]
    command += [
        "--set",
        f"runs_dir={tmp_path}",
        "--set",
        "checkpoint_every=50",
        "--set",
        "topology=marsrl_cpu",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        if runs and not wb.RunReader(runs[0]).steps().empty:
            run_dir = runs[0]
            break
        time.sleep(0.5)
    assert run_dir is not None, process.communicate(timeout=30)[0]
    os.kill(process.pid, signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "stopping after the current step" in output and "run stopped" in output
    reader = wb.RunReader(run_dir)
    steps = list(reader.steps()["step"])
    assert reader.info()["status"] == "stopped" and steps == list(range(len(steps))) and len(steps) < 200
    # the last step was checkpointed on the way out (checkpoint_every is 50): a resume redoes nothing
    assert checkpoint.latest(run_dir).name == f"step-{steps[-1]:06d}"


def test_tasks_given_to_train_are_the_runs_task_source_in_its_config_and_give_its_held_out_set(tmp_path):
    """wb.train(tasks=...): the stored config names the run's own copy of them, not the generator it would
    otherwise use, and held-out tasks come out of them as out of any task file."""
    tasks = generate("arithmetic", n=6, seed=5, level=1)
    config = _config(tmp_path, steps=1, eval_tasks=2, eval_every=0, checkpoint_every=100)
    run = wb.train(SOLO, tasks=tasks, config=config)
    assert run.wait(timeout=300) == "finished", run.log()
    stored = TrainConfig.from_yaml(run.run_dir / "train_config.yaml")
    assert (stored.tasks, stored.n_tasks, stored.task_options) == ("tasks.jsonl", 6, {})
    reader = wb.RunReader(run.run_dir)
    held_out = set(reader.events(kind="eval").iloc[0]["payload"]["tasks"])
    assert held_out == {t.id for t in tasks[:2]}
    assert set(reader.episodes()["task_id"]) <= {t.id for t in tasks[2:]}

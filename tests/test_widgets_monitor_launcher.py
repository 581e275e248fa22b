"""RewardMonitor reads a run incrementally; RunLauncher starts and stops real background runs, for operators only."""

from __future__ import annotations

import panel as pn
import pytest

import workbench as wb
from widgets.reward_monitor import QUANTITIES, RewardMonitor
from widgets.run_launcher import PermissionDenied, RunLauncher
from workbench.store import RunStore


def _step(store: RunStore, index: int) -> None:
    with store.step(index) as step:
        step.log_metrics({"reward/mean": 0.5, "eval/accuracy": 0.25 * index})
        step.log_metrics({"reward/mean": 0.1 * index, "length/mean": 7.0, "grad_share": 0.6}, role="solver")
        step.log_metrics(
            {"reward/mean": 0.3, "grad_share": 0.4, "verifier/verdict_accuracy": 0.7}, role="verifier1"
        )


def test_the_monitor_reads_only_new_complete_steps_per_role(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    _step(store, 0)
    monitor = RewardMonitor(store.run_dir, live=False)
    assert 'data-step="0"' in monitor._header.object
    reward = monitor.feed.series(QUANTITIES[0])
    assert set(reward["label"]) == {"run", "solver", "verifier1"}
    _step(store, 1)
    with store.step(2) as step:  # a step being written is not shown until it completes
        step.log_metrics({"reward/mean": 99.0}, role="solver")
        step.flush()
        assert monitor.poll() == 8, "only the rows of step 1"
        assert 99.0 not in set(monitor.feed.series(QUANTITIES[0])["value"])
    assert monitor.poll() == 1 and 'data-step="2"' in monitor._header.object
    assert monitor.poll() == 0, "nothing new, nothing read"
    solver = monitor.feed.series(QUANTITIES[0]).query("label == 'solver'")
    assert solver["step"].tolist() == [0, 1, 2] and solver["value"].tolist() == pytest.approx(
        [0.0, 0.1, 99.0]
    )
    shares = monitor.feed.series(next(q for q in QUANTITIES if q.title == "gradient share"))
    assert set(shares["label"]) == {"solver", "verifier1"}
    accuracy = monitor.feed.series(next(q for q in QUANTITIES if q.title == "accuracy"))
    assert set(accuracy["label"]) == {"run · eval/accuracy", "verifier1 · verifier/verdict_accuracy"}
    assert pn.panel(monitor).get_root() is not None
    monitor.close()
    store.close()


def test_the_monitor_shows_the_bubble_gauge_beside_the_rewards(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    for index, (rollout, trainer) in enumerate([(0.2, 0.8), (0.1, 0.3)]):
        with store.step(index) as step:
            step.log_metrics({"reward/mean": 0.5, "bubble/rollout": rollout, "bubble/trainer": trainer})
    monitor = RewardMonitor(store.run_dir, live=False)
    idle = monitor.feed.series(next(q for q in QUANTITIES if q.title == "idle share of a step"))
    trainer = idle.query("label == 'run · bubble/trainer'")
    assert set(idle["label"]) == {"run · bubble/rollout", "run · bubble/trainer"}
    assert trainer["value"].tolist() == pytest.approx([0.8, 0.3])
    monitor.close()
    store.close()


def test_a_viewer_cannot_launch_or_stop(tmp_path):
    launcher = RunLauncher(tmp_path / "runs", can_operate=lambda: False, mode="rollout", model="tiny")
    with pytest.raises(PermissionDenied):
        launcher.launch()
    assert launcher.status.startswith("refused") and not (tmp_path / "runs").exists()
    with pytest.raises(PermissionDenied):
        launcher.stop(tmp_path)
    assert not (tmp_path / "STOP").exists()
    launcher._press(launcher.launch)(None)  # a click: refused, reported, nothing raised into the server
    assert "only operators" in launcher.status


def test_the_launcher_starts_a_background_rollout_and_a_training_run(tmp_path):
    runs = tmp_path / "runs"
    launcher = RunLauncher(
        runs, mode="rollout", model="tiny", topology="marsrl", n_tasks=2, group_size=1, max_tokens=4
    )
    rollout = launcher.launch()
    assert rollout.wait(timeout=300) == "finished"
    assert len(wb.RunReader(rollout.run_dir).episodes()) == 2
    launcher.mode, launcher.steps, launcher.batch_size, launcher.group_size = "train", 1, 1, 2
    training = launcher.launch()
    assert "started train run" in launcher.status
    assert training.wait(timeout=300) == "finished"
    assert wb.RunReader(training.run_dir).steps()["step"].tolist() == [0]


def test_a_background_rollout_stops_when_asked(tmp_path):
    tasks = wb.generate_tasks("arithmetic", n=50, seed=0)
    run = wb.rollout("marsrl", tasks, model="tiny", max_tokens=8, runs_dir=tmp_path, background=True)
    run.request_stop()  # before the engine starts: every episode is cancelled
    assert run.wait(timeout=300) == "stopped"
    episodes = wb.RunReader(run.run_dir).episodes()
    assert len(episodes) == 50 and set(episodes["status"]) == {"cancelled"}
    with pytest.raises(ValueError, match="takes its backend and judge by name"):
        wb.rollout("marsrl", tasks, backend=object(), runs_dir=tmp_path, background=True)

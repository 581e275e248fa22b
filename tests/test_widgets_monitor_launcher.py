"""RewardMonitor reads a run incrementally; RunLauncher starts and stops real background runs, for operators only."""

from __future__ import annotations

import panel as pn
import pytest
from bokeh.models import DataRange1d

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
    assert 'data-step="0"' in monitor.header
    reward = monitor.feed.series(QUANTITIES[0])
    assert set(reward["label"]) == {"run", "solver", "verifier1"}
    _step(store, 1)
    with store.step(2) as step:  # a step being written is not shown until it completes
        step.log_metrics({"reward/mean": 99.0}, role="solver")
        step.flush()
        assert monitor.poll() == 8, "only the rows of step 1"
        assert 99.0 not in set(monitor.feed.series(QUANTITIES[0])["value"])
    assert monitor.poll() == 1 and 'data-step="2"' in monitor.header
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


def test_each_monitor_panel_has_its_own_y_axis_and_one_without_signal_is_left_out(tmp_path):
    from workbench.topology import load, to_dict

    store = RunStore.create(tmp_path, config={"kind": "rollout", "topology": to_dict(load("marsrl_cpu"))})
    _step(store, 0)
    with store.step(1) as step:
        step.log_metrics({"reward/mean": 0.2, "length/mean": 40.0, "grad_share": 0.5}, role="solver")
    monitor = RewardMonitor(store.run_dir, live=False)
    figures = monitor.figures()
    by_title = {f.title.text: f for f in figures}
    tools = "tool calls per call"
    assert len(figures) == len(QUANTITIES) - 1 and tools not in by_title, "marsrl_cpu has no tools"
    assert len({id(f.y_range) for f in figures}) == len(figures), "no two panels share a y range"
    # each y axis fits the lines of its own plot only (the browser fits a DataRange1d as points stream in):
    # reward is not drawn on the token lengths' scale; the step axes are one range, linked
    assert all(isinstance(f.y_range, DataRange1d) and f.y_range.renderers in ("auto", []) for f in figures)
    assert len({id(f.x_range) for f in figures}) == 1
    lengths = by_title["response length (tokens)"].renderers[0].data_source.data["value"]
    assert max(by_title["reward"].renderers[0].data_source.data["value"]) < 1.5 < 30 < max(lengths)
    for title in by_title:  # what a page draws: the same plots, from the run's template
        assert f'"text": "{title}"' in monitor.template().item
    monitor.close()
    store.close()
    from widgets import reward_monitor
    from workbench.rl.run_files import TOPOLOGY_FILE

    assert reward_monitor.TOPOLOGY_FILE == TOPOLOGY_FILE, "the monitor looks for the file training writes"
    for name, config in (("tools", {"topology": "mars_cpu"}), ("unknown", {"topology": "no-such-spec"})):
        other = RunStore.create(tmp_path, config={"kind": "train", **config}, run_id=name)
        _step(other, 0)
        shown = RewardMonitor(other.run_dir, live=False)
        assert tools in [q.title for q in shown.quantities], f"{name}: the tool calls are plotted"
        shown.close()
        other.close()


def test_the_accuracy_panel_shows_each_roles_accuracy_without_held_out_evaluation(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    for index in range(2):
        with store.step(index) as step:
            step.log_metrics({"reward/mean": 0.5, "accuracy": 0.5})
            step.log_metrics({"reward/mean": 0.4, "accuracy": 0.25 * index}, role="solver")
            step.log_metrics({"reward/mean": 0.3, "accuracy": 1.0}, role="verifier1")
    monitor = RewardMonitor(store.run_dir, live=False)
    accuracy = monitor.feed.series(next(q for q in QUANTITIES if q.title == "accuracy"))
    assert {"solver · accuracy", "verifier1 · accuracy"} <= set(accuracy["label"])
    assert accuracy.query("label == 'solver · accuracy'")["value"].tolist() == pytest.approx([0.0, 0.25])
    monitor.close()
    store.close()


def _texts(view) -> str:
    """The HTML/Markdown text and button names of a Panel layout, joined."""
    parts = []
    for obj in view.select(lambda o: isinstance(o, pn.pane.HTML | pn.pane.Markdown | pn.widgets.Button)):
        parts.append(str(obj.object) if hasattr(obj, "object") else obj.name)
    return "\n".join(parts)


def test_the_dashboard_offers_stop_only_on_active_runs_and_shows_a_failed_runs_error(tmp_path):
    from widgets.dashboard import Dashboard

    runs = tmp_path / "runs"
    live = RunStore.create(runs, config={"kind": "train"}, run_id="live")
    live.set_status("running")
    done = RunStore.create(runs, config={"kind": "train"}, run_id="done")
    done.set_status("finished")
    failed = RunStore.create(runs, config={"kind": "train"}, run_id="failed")
    failed.log_event("error", {"error": "first try"})
    failed.log_event("error", {"error": "CUDA out of memory on step 3"})
    failed.set_status("failed")
    dashboard = Dashboard(runs, role="operator", refresh_ms=100)

    def stops() -> list:
        return dashboard.run_view.select(lambda o: "wb-stop-run" in getattr(o, "css_classes", []))

    dashboard.open_run("live")
    assert len(stops()) == 1 and "running" in _texts(dashboard.run_view)
    live.set_status("finished")
    dashboard.refresh()  # the run ended while shown: its stop button goes
    assert stops() == [] and "finished" in _texts(dashboard.run_view)
    dashboard.open_run("done")
    assert stops() == []
    dashboard.open_run("failed")
    text = _texts(dashboard.run_view)
    assert stops() == [] and "CUDA out of memory on step 3" in text and "first try" not in text
    monitor = RewardMonitor(failed.run_dir, live=False)  # the run's own status view says it too
    assert "(failed)" in monitor.header and "CUDA out of memory on step 3" in monitor.header
    monitor.close()
    for view in dashboard._views:
        view.close()
    for store in (live, done, failed):
        store.close()

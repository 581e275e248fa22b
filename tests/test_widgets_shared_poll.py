"""Shared polling: every session showing a run costs one store read per change, not one each."""

from __future__ import annotations

import panel as pn
import pytest

from widgets import shared_poll
from widgets.reward_monitor import QUANTITIES, RewardMonitor
from workbench.store import RunStore


@pytest.fixture(autouse=True)
def _fresh():
    shared_poll.forget_runs()
    yield
    shared_poll.forget_runs()


def _step(store: RunStore, index: int) -> None:
    with store.step(index) as step:
        step.log_metrics({"reward/mean": 0.1 * index})
        step.log_metrics({"reward/mean": 0.2 * index, "length/mean": 5.0 + index}, role="solver")


def test_twenty_monitors_of_a_run_read_the_store_once_per_change(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    store.set_status("running")
    _step(store, 0)
    monitors = [RewardMonitor(store.run_dir, live=False) for _ in range(20)]
    shared = monitors[0].feed.shared
    assert all(m.feed.shared is shared for m in monitors), "one shared state per run"
    reads = shared.queries
    assert [m.poll() for m in monitors] == [0] * 20 and shared.queries == reads, "nothing new, nothing read"
    _step(store, 1)
    assert [m.poll() for m in monitors] == [3] * 20, "each monitor gets the new rows"
    assert shared.queries == reads + 1, "one read for all twenty"
    assert all('data-step="1"' in m._header.object for m in monitors)
    solver = monitors[-1].feed.series(QUANTITIES[0]).query("label == 'solver'")
    assert solver["value"].tolist() == pytest.approx([0.0, 0.2])
    assert monitors[0].feed.series(QUANTITIES[0]) is monitors[1].feed.series(QUANTITIES[0]), "computed once"
    _step(store, 2)
    monitors[0].poll()
    assert shared.queries == reads + 2
    monitors[1].poll(min_interval=60)  # a tick just after another session's read reuses it
    assert shared.queries == reads + 2 and monitors[1].feed.last_id == monitors[0].feed.last_id
    for monitor in monitors:
        monitor.close()
    store.close()


def test_a_poll_sends_only_the_plots_that_changed(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    _step(store, 0)
    monitor = RewardMonitor(store.run_dir, live=False)
    sent: list[str] = []
    for title, pipe in monitor._pipes.items():
        pipe.add_subscriber(lambda title=title, **_: sent.append(title))
    header = monitor._header.object
    assert monitor.poll() == 0 and sent == [] and monitor._header.object == header
    with store.step(1) as step:
        step.log_metrics({"length/mean": 9.0}, role="solver")
    assert monitor.poll() == 1 and sent == ["response length (tokens)"]
    monitor.close()
    store.close()


def test_the_runs_list_is_read_again_only_when_a_run_changed(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    first = RunStore.create(runs, config={"kind": "train"}, run_id="first")
    second = RunStore.create(runs, config={"kind": "train"}, run_id="second")
    second.set_status("finished")
    read: list[str] = []
    original = shared_poll._run_row
    monkeypatch.setattr(shared_poll, "_run_row", lambda d: read.append(d.name) or original(d))
    table = shared_poll.runs_table(runs)
    assert table["id"].tolist() == ["second", "first"] and sorted(read) == ["first", "second"]
    version = shared_poll.runs_version(runs)
    read.clear()
    assert shared_poll.runs_version(runs) == version and read == [], "nothing changed, nothing read"
    _step(first, 0)
    assert shared_poll.runs_version(runs) == version + 1 and read == ["first"]
    assert shared_poll.runs_table(runs).loc[1, "last_step"] == 0
    for store in (first, second):
        store.close()


def test_the_dashboard_builds_the_trajectory_browser_when_its_tab_is_opened(tmp_path):
    from widgets.dashboard import Dashboard

    runs = tmp_path / "runs"
    store = RunStore.create(runs, config={"kind": "train"}, run_id="live")
    _step(store, 0)
    dashboard = Dashboard(runs, role="viewer")
    dashboard.open_run("live")
    assert len(dashboard._views) == 1, "only the monitor, the first tab, is built"
    tabs = dashboard.run_view.objects[1]
    assert isinstance(tabs, pn.Tabs)
    tabs.active = 1
    assert len(dashboard._views) == 2 and type(dashboard._views[1]).__name__ == "TrajectoryBrowser"
    assert "wb-browser" in tabs[1].objects[0].css_classes
    for view in dashboard._views:
        view.close()
    store.close()


def test_the_dashboard_patches_only_the_runs_table_cells_that_changed(tmp_path):
    from widgets.dashboard import Dashboard

    runs = tmp_path / "runs"
    store = RunStore.create(runs, config={"kind": "train"}, run_id="live")
    other = RunStore.create(runs, config={"kind": "train"}, run_id="other")
    dashboard = Dashboard(runs, role="viewer")
    patches: list[dict] = []
    original = dashboard.table.patch
    dashboard.table.patch = lambda changes, **kw: patches.append(changes) or original(changes, **kw)
    _step(store, 0)
    dashboard.refresh()
    assert [sorted(p) for p in patches] == [["last_step"]], "calls stay 0: the steps stored no calls"
    row = dashboard.table.value.set_index("id").loc["live"]
    assert row["last_step"] == 0
    dashboard.refresh()
    assert len(patches) == 1, "nothing changed, nothing sent"
    for s in (store, other):
        s.close()

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
    assert all('data-step="1"' in m.header for m in monitors)
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


def test_plots_are_drawn_once_per_run_and_a_poll_sends_each_view_only_the_new_points(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    _step(store, 0)
    monitors = [RewardMonitor(store.run_dir, live=False) for _ in range(2)]
    for monitor in monitors:
        pn.panel(monitor).get_root()
    first, second = (monitor.views[0] for monitor in monitors)
    assert first.template is second.template, "the plots are drawn once for every view of the run"
    assert first.plots.item == first.template.item and '"0:solver"' in first.template.item
    assert first.sent == {"0:run": 1, "0:solver": 1, "2:solver": 1}, "what the drawn layout holds"
    sent: list[dict] = []  # the messages to the first view's page
    first.plots._send_msg = sent.append
    header = monitors[0].header
    assert monitors[0].poll() == 0 and sent == [] and monitors[0].header == header
    with store.step(1) as step:
        step.log_metrics({"length/mean": 9.0}, role="solver")
    assert monitors[0].poll() == 1 and 'data-step="1"' in monitors[0].header
    assert first.header.text == monitors[0].header, "the page's header follows"
    assert sent == [{"tails": {"2:solver": [1, [1], [9.0]]}}], "only the new point, after the one it has"
    assert monitors[0].poll() == 0 and len(sent) == 1
    with store.step(2) as step:  # a label seen for the first time: the plots are drawn again, once
        step.log_metrics({"length/mean": 3.0}, role="verifier1")
    monitors[0].poll()
    assert [list(m) for m in sent[1:]] == [["item"]] and '"2:verifier1"' in sent[1]["item"]
    monitors[1].poll()
    assert second.template is first.template and second.sent == first.sent
    first.plots._asked({"resync": True})  # a page that missed a message asks to be drawn again
    monitors[0].poll()
    assert [list(m) for m in sent[2:]] == [["item"]] and not first.plots.resync
    for monitor in monitors:
        monitor.close()
    store.close()


def test_served_plots_are_drawn_on_a_worker_not_on_the_event_loop(tmp_path):
    from widgets import reward_monitor

    store = RunStore.create(tmp_path, config={"kind": "train"})
    _step(store, 0)
    monitor = RewardMonitor(store.run_dir, live=False)
    assert monitor.template(wait=False) is None, "the first is being drawn, not waited for"
    reward_monitor._DRAWER.submit(lambda: None).result(timeout=60)  # one worker: it has drawn it by now
    drawn = monitor.template(wait=False)
    assert drawn is not None and '"0:solver"' in drawn.item and monitor.template(wait=False) is drawn
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


def test_the_dashboard_patches_only_the_runs_table_cells_that_changed(tmp_path, monkeypatch):
    from widgets import dashboard as module
    from widgets.dashboard import Dashboard

    runs = tmp_path / "runs"
    store = RunStore.create(runs, config={"kind": "train"}, run_id="live")
    other = RunStore.create(runs, config={"kind": "train"}, run_id="other")
    monkeypatch.setattr(module, "PROGRESS_S", 3600.0)  # a run's progress waits for the next hour
    dashboards = [Dashboard(runs, role="viewer") for _ in range(2)]
    patches: list[dict] = []
    for dashboard in dashboards:
        original = dashboard.table.patch
        dashboard.table.patch = lambda changes, _o=original, **kw: (
            patches.append(changes) or _o(changes, **kw)
        )
    _step(store, 0)
    dashboards[0].refresh()
    assert patches == [], "progress alone waits for PROGRESS_S"
    store.set_status("running")
    for dashboard in dashboards:
        dashboard.refresh()
    assert [sorted(p) for p in patches] == [["last_step", "status"]] * 2, "calls stay 0: no calls stored"
    assert patches[0] is patches[1], "found once for both sessions"
    row = dashboards[0].table.value.set_index("id").loc["live"]
    assert row["last_step"] == 0 and row["status"] == "running"
    monkeypatch.setattr(module, "PROGRESS_S", 1e-9)
    _step(store, 1)
    dashboards[0].refresh()
    assert patches[-1] == {"last_step": [(1, 1)]}, "row 1 (newest first), step 1"
    dashboards[0].refresh()
    assert len(patches) == 3, "nothing changed, nothing sent"
    for s in (store, other):
        s.close()

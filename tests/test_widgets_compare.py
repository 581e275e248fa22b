"""The Compare component and the dashboard's comparison: groups drawn as bands, live runs, links, summaries."""

from __future__ import annotations

import json

import pytest

from tests.compare_runs import BASE_LR, OTHER_LR, reward, seeded_runs, write_run, write_step
from widgets import shared_poll
from widgets.compare import Compare
from widgets.compare_link import MAX_COMPARED, compare_query, compared_runs
from widgets.dashboard import Dashboard


@pytest.fixture(autouse=True)
def _fresh():
    shared_poll.forget_runs()
    yield
    shared_poll.forget_runs()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list:
    return seeded_runs(tmp_path_factory.mktemp("widgets-compare") / "runs")


def _renderers(view: Compare) -> dict[str, bool]:
    """The view's drawn renderers by name (``kind:owner:series``): visible or not."""
    return {r.name: r.visible for f in view.figures() for r in f.renderers if r.name}


def test_a_group_of_seeds_is_a_band_and_a_lone_run_a_line(runs):
    view = Compare(runs, live=False)
    view.__panel__().get_root()
    kinds = {(kind, owner) for kind, owner, _, _ in view.lines()}
    assert kinds == {("band", "learning_rate=1e-05"), ("line", "learning_rate=1e-05"),
                     ("line", "learning_rate=0.0001")} | {("seed", run.name) for run in runs[:3]}  # fmt: skip
    assert 'data-kind="band" data-runs="3"' in view._header.object
    assert 'data-kind="line" data-runs="1"' in view._header.object
    assert (
        'data-field="learning_rate"' in view._header.object and "seed: not a group key" in view._header.object
    )
    band = view.lines()["band", "learning_rate=1e-05", "reward", "solver"]
    values = [reward(BASE_LR, seed, 1) for seed in range(3)]
    assert (
        band["value"][1] == pytest.approx(sum(values) / 3)
        and band["lower"][1] < band["value"][1] < band["upper"][1]
    )
    assert "band:learning_rate=1e-05:solver" in view._plots.item, "the page draws the shared drawing"
    assert not view._plots.data, "drawn at the state it shows: no data to follow"
    assert not any(v for name, v in _renderers(view).items() if name.startswith("seed:"))
    view.show_seeds = True
    assert all(v for name, v in _renderers(view).items() if name.startswith("seed:"))
    view.x = "samples seen"
    assert view.lines()["line", "learning_rate=0.0001", "reward", "solver"]["x"] == [16.0, 32.0, 48.0]
    assert 'data-score="system"' in view._outcomes.object and "±" in view._outcomes.object
    assert (
        view._csv().getvalue().startswith("name,kind,runs,score,tasks,before,after,rise,se,z,vs,diff,diff_se")
    )


def test_views_of_the_same_runs_share_one_comparison_and_one_drawing(runs):
    by_label = {run.name: run for run in runs}
    one, two = Compare(by_label, live=False), Compare(by_label, live=False)
    assert one.shared is two.shared and one.comparison is two.comparison, "the runs read once"
    assert one.lines() is two.lines(), "their lines computed once"
    assert one._plots.item is two._plots.item, "and drawn once"


def test_a_running_run_keeps_updating_and_gets_its_outcomes_when_it_ends(runs, tmp_path):
    store = write_run(tmp_path, OTHER_LR, 1, steps=1, finished=False)
    try:
        view = Compare({"base": runs[0], "live": store.run_dir}, interval_ms=200)
        late = Compare({"base": runs[0], "live": store.run_dir}, interval_ms=200)
        sent = []
        view._plots.send = lambda item=None, data="": sent.append((item, data))
        assert view.active and not view.refresh(), "nothing new, nothing sent"
        write_step(store, OTHER_LR, 1, 1, final=True)
        store.set_status("finished")
        assert view.refresh() and len(sent) == 1
        item, data = sent[0]
        assert item is None, "the same lines: their new data only, not another drawing"
        line = json.loads(data)['["line", "learning_rate=0.0001", "reward", "solver"]']
        assert line["at"] == 1 and line["x"] == [1], "the new step only: the page keeps the first point"
        assert line["value"] == pytest.approx([reward(OTHER_LR, 1, 1)])
        assert '["line", "learning_rate=1e-05", "reward", "solver"]' not in data, (
            "a finished run's: unchanged"
        )
        assert 'data-name="live"' in view._outcomes.object and not view.active
        newer = Compare({"base": runs[0], "live": store.run_dir}, live=False)
        assert newer._plots.item == late._plots.item, "a new view gets the drawing the first had"
        assert json.loads(newer._plots.data) == json.loads(data), "and the data since"
    finally:
        store.close()


def test_a_group_mean_is_sent_from_the_first_step_a_late_seed_changed(runs, tmp_path):
    store = write_run(tmp_path, BASE_LR, 2, steps=1, finished=False)  # seed 2 behind seeds 0 and 1
    try:
        view = Compare({"s0": runs[0], "s1": runs[1], "s2": store.run_dir}, live=False)
        sent = []
        view._plots.send = lambda item=None, data="": sent.append((item, data))
        write_step(store, BASE_LR, 2, 1)
        assert view.refresh() and sent[0][0] is None
        changed = json.loads(sent[0][1])
        band = changed['["band", "all runs", "reward", "solver"]']  # one config: one group
        assert band["at"] == 1 and band["x"] == [1, 2], "step 0 kept, step 1's mean changed, step 2 as it was"
        assert band["value"][0] == pytest.approx(sum(reward(BASE_LR, seed, 1) for seed in range(3)) / 3)
        seed = changed['["seed", "s2", "reward", "solver"]']
        assert seed == {"at": 1, "x": [1], "value": [reward(BASE_LR, 2, 1)]}
        assert '["seed", "s0", "reward", "solver"]' not in changed
    finally:
        store.close()


def test_the_dashboard_compares_the_selected_runs_and_a_link_names_only_runs_and_summaries(runs, tmp_path):
    runs_dir = runs[0].parent
    ids = [run.name for run in runs]
    assert list(compared_runs(runs_dir, f"{ids[0]},../{ids[1]},nope,summary:nope,summary:marsrl,{ids[0]}")) == [
        ids[0], "summary:marsrl"]  # fmt: skip
    assert len(compared_runs(runs_dir, ",".join(ids * 5 + [f"x{i}" for i in range(20)]))) <= MAX_COMPARED
    assert compare_query([ids[0], "summary:marsrl"]) == f"?compare={ids[0]},summary:marsrl"
    dashboard = Dashboard(runs_dir, role="viewer")
    dashboard.__panel__()
    table_ids = list(dashboard.table.value["id"])
    dashboard.table.selection = [table_ids.index(i) for i in ids]
    assert dashboard.selected is None and not dashboard.compare_button.disabled
    dashboard.compare_selected()
    assert dashboard.compared == ids and isinstance(dashboard._views[0], Compare)
    write_run(runs_dir, OTHER_LR, 7)  # a new run: the table is sent anew
    dashboard.refresh()
    table_ids = list(dashboard.table.value["id"])
    assert len(table_ids) == 5 and dashboard.compared == ids
    assert sorted(dashboard.table.selection) == sorted(table_ids.index(i) for i in ids), "kept selected"
    dashboard.table.selection = [table_ids.index(ids[2])]
    assert dashboard.selected == runs[2] and dashboard.compared == [], "a click on one run opens it"
    dashboard.close()

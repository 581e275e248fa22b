"""The comparison's shared curves (``widgets.compare_plots``): a live run's curves kept up to date from its new
rows are what ``run_curves`` and ``group_curves`` give for all its rows, point for point."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from tests.compare_runs import seeded_runs
from widgets import compare as compare_module
from widgets import compare_plots, shared_poll
from widgets.compare import Compare
from widgets.compare_plots import X_LABELS, RunCurves, _kept, run_lines
from workbench.analysis.compare import group_curves, run_curves


def _rows() -> pd.DataFrame:
    """Metric rows in id order as a live run's shared poll holds them: per role and run-wide, a summed axis that
    starts late and one with a NaN, NaN values, held-out (prefixed) rows, a step's value logged twice, a late
    row of an earlier step."""
    rows = []
    for s in range(60):
        for role in ("solver", "verifier1", "run"):
            rows.append((s, role, "reward/mean", float(s) + (0.5 if role != "run" else 0.0)))
            if role != "run":
                rows.append((s, role, "accuracy", math.nan if s % 7 == 0 else s / 100))
        if s >= 20:
            rows.append((s, "run", "time/step_s", 0.1 * s))
        if s % 9 == 0:
            rows.append((s, "run", "samples", math.nan if s == 18 else 4.0))
        if s % 10 == 0:
            rows += [(s, "solver", "eval/accuracy", s / 60), (s, "run", "eval/accuracy", s / 61)]
        if s % 13 == 5:
            rows.append((s - 4, "solver", "reward/mean", -1.0))
        if s % 11 == 3:
            rows.append((s, "solver", "reward/mean", 99.0))
    frame = pd.DataFrame(rows, columns=["step", "role", "name", "value"])
    frame.insert(0, "id", np.arange(1, len(frame) + 1))
    return frame


def _expected_lines(curves: pd.DataFrame, x: str) -> dict:
    """A group of one run's lines the way the comparison drew them first: from ``group_curves``."""
    means = group_curves(curves.assign(run="r"), {"g": ["r"]})
    found = {}
    for (panel, series), rows in means.groupby(["panel", "series"], sort=False):
        found["line", "g", panel, series] = {
            "x": rows[X_LABELS[x]].tolist(),
            "value": rows["mean"].tolist(),
            "lower": (rows["mean"] - rows["se"]).tolist(),
            "upper": (rows["mean"] + rows["se"]).tolist(),
            "n": rows["n"].tolist(),
        }
    return found


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (u == v and type(u) is type(v)) or (u != u and v != v) for u, v in zip(a, b, strict=True)
    )


@pytest.mark.parametrize(
    "cuts", [list(range(1, 400, 7)) + [10_000], [200, 5, 10_000]], ids=["forward", "back"]
)
def test_a_runs_curves_kept_from_its_new_rows_are_those_of_all_its_rows(cuts):
    frame = _rows()
    kept = RunCurves()
    for cut in [*cuts, len(frame)]:
        cut = min(cut, len(frame))
        kept.update(frame, cut)
        whole = run_curves(frame[frame["id"] <= cut])
        assert_frame_equal(kept.frame(), whole, check_exact=True)
        for x in X_LABELS:
            expected, found = _expected_lines(whole, x), run_lines("g", kept, x)
            assert list(found) == list(expected)
            for key, data in expected.items():
                assert all(_same(found[key][c], data[c]) for c in data), (key, x)


def test_the_points_two_lines_share_are_found_with_nans_among_them():
    was = {"x": [0, 1, 2], "value": [0.5, math.nan, 1.0]}
    assert _kept(was, {"x": [0, 1, 2, 3], "value": [0.5, float("nan"), 1.0, 2.0]}) == 3
    assert _kept(was, {"x": [0, 1, 2], "value": [0.5, 0.7, 1.0]}) == 1
    assert _kept(was, {"x": [0, 1], "value": [0.5, math.nan]}) == 2
    assert _kept({}, {"x": [0], "value": [0.5]}) == 0


def test_a_served_view_comes_at_once_and_gets_its_plots_drawn_off_the_event_loop_on_a_tick(
    tmp_path, monkeypatch
):
    shared_poll.forget_runs()
    runs = {run.name: run for run in seeded_runs(tmp_path / "runs")}
    monkeypatch.setattr(compare_module, "_served", lambda: True)
    first, second = Compare(runs), Compare(runs)
    assert first._plots.item == second._plots.item == "" and first._shape is None, "the page does not wait"
    compare_plots._DRAWER.submit(lambda: None).result()  # the one worker drew it meanwhile
    sent = []
    first._plots.send = lambda item=None, data="": sent.append((item, data))
    first._tick()  # the runs are finished: the tick sends the drawing, then stops following them
    assert len(sent) == 1 and "band:learning_rate=1e-05:solver" in sent[0][0] and first._shape is not None
    drawn = first.shared.drawn(first.state, first.x, first.show_seeds, wait=False)
    assert sent[0][0] is drawn.item, "drawn once, for every view"
    assert Compare(runs)._plots.item is drawn.item, "a later view gets it at once"
    shared_poll.forget_runs()

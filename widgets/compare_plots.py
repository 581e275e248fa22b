"""A comparison's data and plots, computed and drawn once for every view of the same runs.

``shared_comparison(runs)`` is the process-wide ``SharedComparison`` of a set of runs (label -> run folder):
its ``Comparison`` (configs, diff, groups, outcomes; built once), and, per state of the runs (each run's last
metric row id, read through its ``widgets.shared_poll.SharedRun``), its curves and the lines to draw. A run's
curves are kept as lists its new rows are added to (``RunCurves``: a live run's new steps cost their own
points, not the whole run's, and equal ``run_curves`` of all its rows); a group's lines are computed once per
state of its own runs (a finished run's group's once), a group of one run's straight from its points. Its plots
are drawn once per x axis, seeds shown or not, and set of lines, as a Bokeh layout's ``json_item`` (``Drawn``;
the lines' data as binary arrays); served, on a worker thread, so that the event loop answering every session
never waits for a drawing (the views come without plots and get them on a later tick). A view (a
``ComparePlots`` in the page, drawn by BokehJS) gets that JSON text and then what changed in its lines since
it, as one JSON text per pair of states shared by every view at the same state. So a comparison page costs the
server no Bokeh figure of its own, as the Curves tab's ``StreamedPlots`` does (``widgets.reward_monitor``). A
changed line is sent from its first changed point on: a run's new steps only, as a rule; more where a group's
mean changed at earlier steps (a seed that reached them later).

Sources are named by their line's key as JSON; renderers ``band:<group>:<series>``, ``line:<group>:<series>``
and ``seed:<run>:<series>`` (what a browser test reads).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import param
from bokeh.embed import json_item
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, Legend, LegendItem
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from panel.custom import JSComponent

from widgets.reward_monitor import EMBEDDED_LAYOUT_JS
from widgets.shared_poll import shared_run
from workbench.analysis.compare import PANELS, RUN_WIDE, Comparison, Panel, group_curves, run_curves

__all__ = [
    "X_LABELS", "ComparePlots", "Drawn", "RunCurves", "SharedComparison", "draw_figures", "shared_comparison",
]  # fmt: skip

#: The x axes on offer: label -> the curves' column.
X_LABELS = {"step": "step", "wall time (s)": "wall_s", "samples seen": "samples"}
#: A drawn line or band: (kind, owner, panel, series).
Line = tuple[str, str, str, str]
Lines = dict[Line, dict[str, list]]
DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")
#: What a shared comparison keeps per kind of result (curves, lines, updates), the oldest going first.
KEPT = 16
#: The shared comparisons of the process, by their runs; the oldest go first.
_COMPARISONS: dict[tuple, SharedComparison] = {}
_LOCK = threading.Lock()
COMPARISONS = 32
#: Draws the plots of served comparisons off the event loop, one at a time.
_DRAWER = ThreadPoolExecutor(1, thread_name_prefix="wb-compare-plots")
log = logging.getLogger("workbench.dashboard")


def _shared_metrics(run_dir: Path) -> pd.DataFrame:
    """A run's metric rows as the run's shared poll holds them (read once per change for every view, by
    ``SharedComparison.state``)."""
    return shared_run(run_dir).frame


def _source_name(key: Line) -> str:
    return json.dumps(list(key))


def _jsonable(values: list) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _kept(was: dict[str, list], now: dict[str, list]) -> int:
    """How many first points of a line are the same in ``was`` and ``now`` (its columns; NaN the same as NaN)."""
    if was.keys() != now.keys() or not now:
        return 0
    n = min(len(next(iter(was.values()))), len(next(iter(now.values()))))
    if all(now[c][:n] == was[c][:n] for c in was):  # compared in C (fails on a NaN: then point by point)
        return n
    old, new = list(zip(*was.values(), strict=True)), list(zip(*(now[c] for c in was), strict=True))
    return next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if not all(map(_same, a, b))), n)


#: The x axes that are running sums of a run-wide metric (``run_curves``): column -> the metric.
SUMMED_AXES = {"wall_s": "time/step_s", "samples": "samples"}
CURVE_COLUMNS = ["panel", "series", "step", "wall_s", "samples", "value"]
#: Past this many new rows, a run's curves are computed again whole (``run_curves``) rather than added to.
ADDED_ROWS = 20_000


class RunCurves:
    """One run's curves, what ``run_curves`` gives for its metric rows, kept as lists that its new rows are
    added to: per (panel, series) its steps and values in step order (a step's last row wins, as in
    ``run_curves``), and per summed x axis (wall time, samples seen) each step's value, whose running sums give
    the axis. A live run's new rows cost their own points, not the whole run's; ``frame()`` is the
    ``run_curves`` frame, ``line(x)`` a series' points along an x axis. Rows are taken in id order."""

    def __init__(self, panels: tuple[Panel, ...] = PANELS) -> None:
        self.panels = panels
        self.last_id: int | None = None
        #: (panel, series) -> (steps, values), steps increasing
        self.points: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        #: per summed axis: step -> the step's value (its last non-null one), and whether any row had it
        self._values: dict[str, dict[int, float]] = {c: {} for c in SUMMED_AXES}
        self._seen = dict.fromkeys(SUMMED_AXES, False)
        self._frame: pd.DataFrame | None = None
        self._sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def update(self, metrics: pd.DataFrame, last_id: int) -> None:
        """Take ``metrics``' rows (id order) with an id up to ``last_id``: the new ones where the curves hold
        earlier rows of the same run, else all of them."""
        ids = metrics["id"].to_numpy()
        end = int(np.searchsorted(ids, last_id, side="right"))
        if self.last_id is not None and last_id == self.last_id:
            return
        start = 0 if self.last_id is None else int(np.searchsorted(ids, self.last_id, side="right"))
        if self.last_id is None or last_id < self.last_id or end - start > ADDED_ROWS:
            self._whole(metrics.iloc[:end])
        else:
            self._add(metrics.iloc[start:end])
        self.last_id, self._frame, self._sums = last_id, None, {}

    def _whole(self, rows: pd.DataFrame) -> None:
        self.points, self._values, self._seen = (
            {},
            {c: {} for c in SUMMED_AXES},
            dict.fromkeys(SUMMED_AXES, False),
        )
        self._axes(rows)
        curves = run_curves(rows, self.panels)
        for (panel, series), part in curves.groupby(["panel", "series"], sort=False):
            self.points[panel, series] = (part["step"].tolist(), part["value"].tolist())

    def _axes(self, rows: pd.DataFrame) -> None:
        """Take the summed axes' values of ``rows`` (run-wide rows; a step's last non-null one wins)."""
        role = rows["role"].fillna(RUN_WIDE)
        for column, name in SUMMED_AXES.items():
            chosen = rows[(rows["name"] == name) & (role == RUN_WIDE)]
            if chosen.empty:
                continue
            self._seen[column] = True
            values = self._values[column]
            for step, value in zip(chosen["step"].tolist(), chosen["value"].tolist(), strict=True):
                if value is not None and not math.isnan(value):
                    values[int(step)] = float(value)

    def _add(self, rows: pd.DataFrame) -> None:
        """Add ``rows`` (the run's rows past those taken) to the points, as ``run_curves`` reads rows."""
        if rows.empty:
            return
        self._axes(rows)
        for step, role, name, value in zip(
            rows["step"].tolist(),
            rows["role"].tolist(),
            rows["name"].tolist(),
            rows["value"].tolist(),
            strict=True,
        ):
            role = RUN_WIDE if role is None or (isinstance(role, float) and math.isnan(role)) else role
            for panel in self.panels:
                if panel.prefix is not None:
                    if not name.startswith(panel.prefix):
                        continue
                    series = name[len(panel.prefix) :]
                elif name in panel.names:
                    series = f"{role} · {name}" if len(panel.names) > 1 else role
                else:
                    continue
                steps, values = self.points.setdefault((panel.title, series), ([], []))
                value = math.nan if value is None else float(value)
                if not steps or step > steps[-1]:
                    steps.append(int(step))
                    values.append(value)
                    continue
                at = bisect.bisect_left(steps, step)
                if at < len(steps) and steps[at] == step:
                    values[at] = value  # the step's later row wins
                else:
                    steps.insert(at, int(step))
                    values.insert(at, value)

    def axis(self, column: str, steps: list[int]) -> list:
        """The x values of ``steps`` along ``column`` (``step``, or a summed axis: NaN where the run has none)."""
        if column == "step":
            return list(steps)
        if not self._seen[column]:
            return [math.nan] * len(steps)
        if column not in self._sums:
            values = self._values[column]
            keys = np.array(sorted(values), dtype=np.int64)
            sums = np.concatenate([[0.0], np.cumsum([values[k] for k in keys.tolist()], dtype=np.float64)])
            self._sums[column] = (keys, sums)
        keys, sums = self._sums[column]
        return sums[np.searchsorted(keys, np.asarray(steps, dtype=np.int64), side="right")].tolist()

    def series(self) -> list[tuple[str, str]]:
        """The (panel, series) pairs with points, in ``run_curves``' order."""
        return sorted(key for key, (steps, _) in self.points.items() if steps)

    def frame(self) -> pd.DataFrame:
        """The curves as ``run_curves`` gives them (panel, series, step, wall_s, samples, value)."""
        if self._frame is None:
            keys = self.series()
            if not keys:
                self._frame = pd.DataFrame(columns=CURVE_COLUMNS)
                return self._frame
            steps = [s for key in keys for s in self.points[key][0]]
            self._frame = pd.DataFrame(
                {
                    "panel": [key[0] for key in keys for _ in self.points[key][0]],
                    "series": [key[1] for key in keys for _ in self.points[key][0]],
                    "step": pd.Series(steps, dtype=int),
                    "wall_s": pd.Series(self.axis("wall_s", steps), dtype=float),
                    "samples": pd.Series(self.axis("samples", steps), dtype=float),
                    "value": pd.Series([v for key in keys for v in self.points[key][1]], dtype=float),
                }
            )
        return self._frame


@dataclass(frozen=True)
class Drawn:
    """Plots drawn once for every view: the layout's ``json_item`` (JSON text), the state of the runs it was
    drawn at (``SharedComparison.state``) and the lines it holds."""

    item: str
    state: tuple
    lines: Lines

    @property
    def shape(self) -> frozenset:
        return frozenset(self.lines)


class SharedComparison:
    """One set of runs compared, for every view of it in the process (see the module's docstring)."""

    def __init__(self, comparison: Comparison) -> None:
        self.comparison = comparison
        self._memo: dict[str, dict[Hashable, Any]] = {}
        self._lock = threading.RLock()
        self._statuses = dict(comparison.statuses)
        #: grows by one each time the outcomes were read again (a view shows them anew)
        self.outcomes_version = 0
        self._state: tuple = ()
        self._read_at = -math.inf
        #: each run's curves, brought up to date from its new rows
        self._runs: dict[str, RunCurves] = {}
        #: the drawings being made on the worker thread: (x, seeds, shape)
        self._drawing: set[tuple[str, bool, frozenset]] = set()

    def state(self, min_interval: float = 0.0) -> tuple:
        """The runs' state: each run's last metric row id (rows are only appended; a shared run's version starts
        again when made anew). Read again unless a view read it less than ``min_interval`` s ago, so that the
        views polling within one interval share one state (one computation of the lines, one update). A run
        whose status changed has its outcomes read again, once for every view."""
        with self._lock:
            if time.monotonic() - self._read_at < min_interval:
                return self._state
            runs = [shared_run(path) for path in self.comparison.runs.values()]
            for run in runs:
                run.refresh(min_interval)
            statuses = {label: run.status for label, run in zip(self.comparison.runs, runs, strict=True)}
            if statuses != self._statuses:  # a run that finished has its last evaluation
                self._statuses = statuses
                self.comparison.refresh_outcomes()
                self.outcomes_version += 1
            self._state, self._read_at = tuple(run.last_id for run in runs), time.monotonic()
            return self._state

    def _once(self, kind: str, key: Hashable, compute: Callable[[], Any], kept: int = KEPT) -> Any:
        with self._lock:
            memo = self._memo.setdefault(kind, {})
            if key not in memo:
                while len(memo) >= kept:
                    memo.pop(next(iter(memo)))
                memo[key] = compute()
            return memo[key]

    def once(self, kind: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per reading of the runs' evaluations and statuses, for every view (what the views
        show of them: the groups' header, the outcomes table)."""
        return self._once(kind, self.outcomes_version, compute)

    def outcomes(self) -> pd.DataFrame:
        """The outcomes table (``Comparison.outcomes``), once per reading of the runs' evaluations."""
        return self.once("outcomes", self.comparison.outcomes)

    def run_curves(self, label: str, last_id: int) -> pd.DataFrame:
        """Run ``label``'s curves up to its metric row ``last_id`` (``run_curves``' frame)."""
        with self._lock:
            return self.run_points(label, last_id).frame()

    def run_points(self, label: str, last_id: int) -> RunCurves:
        """Run ``label``'s ``RunCurves`` brought up to its metric row ``last_id`` (a live run's new rows cost their
        own points; held while the lock is)."""
        with self._lock:
            kept = self._runs.setdefault(label, RunCurves())
            kept.update(_shared_metrics(self.comparison.runs[label]), last_id)
            return kept

    def curves(self, state: tuple) -> pd.DataFrame:
        """Every run's curves at ``state`` (``Comparison.curves``), each run's computed once per its last row."""

        def compute() -> pd.DataFrame:
            parts = []
            for label, last_id in zip(self.comparison.runs, state, strict=True):
                found = self.run_curves(label, last_id)
                parts.append(found.assign(run=label)[["run", *found.columns]])
            return pd.concat(parts, ignore_index=True)

        return self._once("curves", state, compute)

    def lines(self, state: tuple, x: str) -> Lines:
        """Every line and band to draw at ``state`` along ``x`` (a ``X_LABELS`` label): (kind, owner, panel,
        series) -> its data; kind ``band`` / ``line`` (an owner group's) or ``seed`` (an owner run's). A group's
        lines are computed once per state of its own runs (a finished run's group's, once), a group of one run's
        without averaging; the lines of a group whose runs did not change are the same objects as before."""
        groups, last = self.comparison.groups, dict(zip(self.comparison.runs, state, strict=True))
        kept = KEPT * len(self.comparison.runs) * len(X_LABELS)

        def of_group(group: str, runs: list[str]) -> tuple[Lines, Lines]:
            if len(runs) == 1:  # its run's points as they are, with no frame made
                return run_lines(group, self.run_points(runs[0], last[runs[0]]), x), {}
            curves = [self.run_curves(run, last[run]).assign(run=run) for run in runs]
            return group_lines(group, runs, curves, x)

        def compute() -> Lines:
            found: Lines = {}
            seeds: Lines = {}
            for group, runs in groups.items():
                key = (group, tuple(last[run] for run in runs), x)
                means, of_seeds = self._once("group", key, lambda g=group, r=runs: of_group(g, r), kept=kept)
                found.update(means)
                seeds.update(of_seeds)
            for run in self.comparison.runs:  # the seeds' lines after the groups', in the runs' order
                found.update({key: data for key, data in seeds.items() if key[1] == run})
            return found

        return self._once("lines", (state, x), compute)

    def drawn(self, state: tuple, x: str, seeds: bool, wait: bool = True) -> Drawn | None:
        """The plots along ``x`` (seeds shown or not) drawn for the lines at ``state``: the last drawing of these
        lines where one is (a view then gets the lines' new data), else drawn now. ``wait=False`` (served): a
        drawing to make is made on a worker thread (a second or so, which the server's event loop does not
        wait for) and None returned until it is there."""
        lines = self.lines(state, x)
        shape = frozenset(lines)
        with self._lock:
            found = self._memo.setdefault("drawn", {}).get((x, seeds))
            if found is not None and found.shape == shape:
                return found
            if not wait:
                if (x, seeds, shape) not in self._drawing:
                    self._drawing.add((x, seeds, shape))
                    future = _DRAWER.submit(self._draw, state, lines, x, seeds)
                    future.add_done_callback(
                        lambda f: (
                            f.exception() and log.error("drawing a comparison failed: %r", f.exception())
                        )
                    )
                return None
        return self._draw(state, lines, x, seeds)

    def _draw(self, state: tuple, lines: Lines, x: str, seeds: bool) -> Drawn:
        try:
            layout = gridplot(draw_figures(lines, self.comparison.groups, x, seeds), ncols=2,
                              sizing_mode="stretch_width", merge_tools=False, toolbar_location=None)  # fmt: skip
            item = json_item(layout)
            item["doc"].pop("defs", None)  # the process's custom models (Panel's): none is drawn here
            drawn = Drawn(json.dumps(item), state, lines)
            with self._lock:
                self._memo.setdefault("drawn", {})[x, seeds] = drawn
            return drawn
        finally:
            with self._lock:
                self._drawing.discard((x, seeds, frozenset(lines)))

    def update(self, old: tuple, before: Lines, new: tuple, x: str) -> str:
        """What changed in the lines along ``x`` from ``before`` (the lines at state ``old``) to those at state
        ``new``, as the JSON text a ``ComparePlots`` takes: {source name: {"at": the points kept, column: the
        values from there on}} (NaN as null); "" where nothing did. Computed once for every view at the same two
        states."""

        def compute() -> str:
            changed = {}
            for key, data in self.lines(new, x).items():
                was = before.get(key, {})
                if was is data:  # a group whose runs did not change: the same lines
                    continue
                at, length = _kept(was, data), len(next(iter(data.values()), []))
                if at < length or length != len(next(iter(was.values()), [])):
                    changed[_source_name(key)] = {"at": at} | {c: _jsonable(v[at:]) for c, v in data.items()}
            return json.dumps(changed) if changed else ""

        return "" if old == new else self._once("updates", (old, new, x), compute)


def shared_comparison(runs: Mapping[str, Path]) -> SharedComparison:
    """The process's shared comparison of ``runs`` (label -> run folder), built on first use."""
    key = tuple((label, str(path)) for label, path in runs.items())
    with _LOCK:
        found = _COMPARISONS.get(key)
    if found is None:
        found = SharedComparison(Comparison(runs, metrics=_shared_metrics))
        with _LOCK:
            while len(_COMPARISONS) >= COMPARISONS:
                _COMPARISONS.pop(next(iter(_COMPARISONS)))
            found = _COMPARISONS.setdefault(key, found)
    return found


def compute_lines(curves: pd.DataFrame, groups: Mapping[str, list[str]], x: str) -> Lines:
    """The lines and bands of ``curves`` (per run) for ``groups`` along ``x`` (see ``SharedComparison.lines``)."""
    found: Lines = {}
    seeds: Lines = {}
    for group, runs in groups.items():
        means, of_seeds = group_lines(group, runs, [curves[curves["run"] == run] for run in runs], x)
        found.update(means)
        seeds.update(of_seeds)
    for run in dict.fromkeys(curves["run"]):
        found.update({key: data for key, data in seeds.items() if key[1] == run})
    return found


def run_lines(group: str, run: RunCurves, x: str) -> Lines:
    """The lines of ``group``, a group of one run (``run``'s points now), along ``x``: what ``group_lines``
    gives for it."""
    column = X_LABELS[x]
    found: Lines = {}
    for panel, series in run.series():
        steps, values = run.points[panel, series]
        values = list(values)
        found["line", group, panel, series] = {
            "x": run.axis(column, steps),
            "value": values,
            "lower": list(values),
            "upper": list(values),
            "n": [0 if math.isnan(v) else 1 for v in values],
        }
    return found


def group_lines(group: str, runs: list[str], curves: list[pd.DataFrame], x: str) -> tuple[Lines, Lines]:
    """The lines of ``group`` of ``runs`` (``curves``: each run's, with a ``run`` column) along ``x``: its mean
    line (and band, for several runs) per panel and series, and its runs' own lines (for several runs). A group
    of one run is its curves as they are (what ``group_curves`` gives for it: each point its own mean, with an
    SE of 0, of 1 run where it has a value)."""
    column = X_LABELS[x]
    means: Lines = {}
    seeds: Lines = {}
    if len(runs) == 1:
        rows = curves[0]
        for (panel, series), part in rows.groupby(["panel", "series"], sort=True):
            values = part["value"]
            means["line", group, panel, series] = {
                "x": part[column].tolist(),
                "value": values.tolist(),
                "lower": (values - 0.0).tolist(),
                "upper": (values + 0.0).tolist(),
                "n": values.notna().astype(int).tolist(),
            }
        return means, seeds
    frame = pd.concat(curves, ignore_index=True)
    for (panel, series), rows in group_curves(frame, {group: runs}).groupby(["panel", "series"], sort=False):
        data = {
            "x": rows[column].tolist(),
            "value": rows["mean"].tolist(),
            "lower": (rows["mean"] - rows["se"]).tolist(),
            "upper": (rows["mean"] + rows["se"]).tolist(),
            "n": rows["n"].tolist(),
        }
        means["band", group, panel, series] = data
        means["line", group, panel, series] = data
    for (run, panel, series), rows in frame.groupby(["run", "panel", "series"], sort=False):
        seeds["seed", run, panel, series] = {"x": rows[column].tolist(), "value": rows["value"].tolist()}
    return means, seeds


def draw_figures(lines: Lines, groups: Mapping[str, list[str]], x: str, seeds: bool) -> list[Any]:
    """One Bokeh figure per panel with lines: a colour per group, a series' dash, bands under their line (hidden
    with it from the legend), seeds as thin lines (visible with ``seeds``); the x axes linked."""
    colours = {group: Category10_10[i % 10] for i, group in enumerate(groups)}
    group_of = {run: group for group, runs in groups.items() for run in runs}
    x_range = DataRange1d()
    figures = []
    for panel in PANELS:
        mine = {key: data for key, data in lines.items() if key[2] == panel.title}
        if not mine:
            continue
        plot = figure(title=panel.title, height=240, sizing_mode="stretch_width", x_range=x_range,
                      x_axis_label=x, tools="pan,wheel_zoom,box_zoom,reset")  # fmt: skip
        plot.toolbar.logo = None
        plot.add_tools(HoverTool(tooltips=[("", "$name"), (x, "@x"), ("value", "@value")]))
        legend = Legend(
            location="top_left", click_policy="hide", label_text_font_size="8pt", spacing=0, padding=4
        )
        plot.add_layout(legend, "right")  # beside the plot: inside, it covered the lines' start
        series = sorted({key[3] for key in mine})
        bands: dict[tuple[str, str], Any] = {}
        for key, data in mine.items():
            kind, owner, _, label = key
            colour = colours[owner if kind != "seed" else group_of[owner]]
            dash = DASHES[series.index(label) % len(DASHES)]
            # as arrays: sent as binary (a list is serialized and checked point by point, several times slower)
            source = ColumnDataSource(
                {c: np.asarray(v, dtype=float) for c, v in data.items()}, name=_source_name(key)
            )
            if kind == "band":
                drawn = plot.varea("x", "lower", "upper", source=source, fill_color=colour, fill_alpha=0.2)
                bands[owner, label] = drawn
            elif kind == "line":
                drawn = plot.line(
                    "x", "value", source=source, line_color=colour, line_width=2, line_dash=dash
                )
                shown = [drawn] + ([bands[owner, label]] if (owner, label) in bands else [])
                legend.items.append(LegendItem(label=f"{owner} · {label}", renderers=shown))
            else:
                drawn = plot.line("x", "value", source=source, line_color=colour, line_width=1, line_alpha=0.5,
                                  line_dash=dash, visible=seeds)  # fmt: skip
            drawn.name = f"{kind}:{owner}:{label}"
        figures.append(plot)
    return figures


class ComparePlots(JSComponent):
    """A Bokeh layout drawn in the browser from its ``json_item`` (``item``), whose sources then take the data
    of ``data`` and of each message: ``{"item": JSON}`` draws another layout, ``{"data": JSON}`` changes the
    data of the named sources ({name: {"at": n, column: values}}: keep the first n points, then the values; null
    for NaN). The server builds no Bokeh model for it."""

    item = param.String(doc="The layout's json_item, as JSON text (the view's first drawing).")
    data = param.String(doc="The lines' data since that drawing, as JSON text ('' for none).")

    _esm = (
        EMBEDDED_LAYOUT_JS
        + """
export function render({ model, el }) {
  function update(doc, text) {
    if (doc == null || !text) { return }
    for (const [name, {at, ...columns}] of Object.entries(JSON.parse(text))) {
      const source = doc.get_model_by_name(name)
      if (source == null) { continue }
      const data = {}
      for (const [column, values] of Object.entries(columns)) {
        const kept = Array.from(source.data[column] ?? []).slice(0, at)
        data[column] = kept.concat(values.map((v) => (v === null ? NaN : v)))
      }
      source.data = data
    }
  }

  embedded(model, el, {item: model.item, data: model.data}, (msg, doc) => update(doc, msg.data))
}
"""
    )

    def send(self, item: str | None = None, data: str = "") -> None:
        """Draw ``item`` (when given), then give the sources ``data``."""
        message: dict[str, str] = {"data": data}
        if item is not None:
            message["item"] = item
        self._send_msg(message)

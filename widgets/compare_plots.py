"""A comparison's data and plots, computed and drawn once for every view of the same runs.

``shared_comparison(runs)`` is the process-wide ``SharedComparison`` of a set of runs (label -> run folder):
its ``Comparison`` (configs, diff, groups, outcomes; built once), and, per state of the runs (each run's last
metric row id, read through its ``widgets.shared_poll.SharedRun``), its curves and the lines to draw. Its plots
are drawn once per x axis, seeds shown or not, and set of lines, as a Bokeh layout's ``json_item`` (``Drawn``);
a view (a ``ComparePlots`` in the page, drawn by BokehJS) gets that JSON text and then what changed in its
lines since it, as one JSON text per pair of states shared by every view at the same state. So a comparison page
costs the server no Bokeh figure of its own, as the Curves tab's ``StreamedPlots`` does
(``widgets.reward_monitor``). A changed line is sent from its first changed point on: a run's new steps only,
as a rule; more where a group's mean changed at earlier steps (a seed that reached them later).

Sources are named by their line's key as JSON; renderers ``band:<group>:<series>``, ``line:<group>:<series>``
and ``seed:<run>:<series>`` (what a browser test reads).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import param
from bokeh.embed import json_item
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, Legend, LegendItem
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from panel.custom import JSComponent

from widgets.shared_poll import shared_run
from workbench.analysis.compare import PANELS, Comparison, group_curves, run_curves

__all__ = ["X_LABELS", "ComparePlots", "Drawn", "SharedComparison", "draw_figures", "shared_comparison"]

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


def _shared_metrics(run_dir: Path) -> pd.DataFrame:
    """A run's metric rows as the run's shared poll holds them (read once per change for every view, by
    ``SharedComparison.state``)."""
    return shared_run(run_dir).frame


def _source_name(key: Line) -> str:
    return json.dumps(list(key))


def _jsonable(values: list) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def _kept(was: dict[str, list], now: dict[str, list]) -> int:
    """How many first points of a line are the same in ``was`` and ``now`` (its columns, NaN as None)."""
    if was.keys() != now.keys():
        return 0
    old, new = list(zip(*was.values(), strict=True)), list(zip(*(now[c] for c in was), strict=True))
    return next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new))
    )


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

    def _once(self, kind: str, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            memo = self._memo.setdefault(kind, {})
            if key not in memo:
                while len(memo) >= KEPT:
                    memo.pop(next(iter(memo)))
                memo[key] = compute()
            return memo[key]

    def outcomes(self) -> pd.DataFrame:
        """The outcomes table (``Comparison.outcomes``), once per reading of the runs' evaluations."""
        return self._once("outcomes", self.outcomes_version, self.comparison.outcomes)

    def curves(self, state: tuple) -> pd.DataFrame:
        """Every run's curves at ``state`` (``Comparison.curves``), each run's computed once per its last row."""

        def compute() -> pd.DataFrame:
            parts = []
            for (label, run_dir), last_id in zip(self.comparison.runs.items(), state, strict=True):
                found = self._once("run", (label, last_id), lambda d=run_dir: run_curves(_shared_metrics(d)))
                parts.append(found.assign(run=label)[["run", *found.columns]])
            return pd.concat(parts, ignore_index=True)

        return self._once("curves", state, compute)

    def lines(self, state: tuple, x: str) -> Lines:
        """Every line and band to draw at ``state`` along ``x`` (a ``X_LABELS`` label): (kind, owner, panel,
        series) -> its data; kind ``band`` / ``line`` (an owner group's) or ``seed`` (an owner run's)."""
        return self._once(
            "lines", (state, x), lambda: compute_lines(self.curves(state), self.comparison.groups, x)
        )

    def drawn(self, state: tuple, x: str, seeds: bool) -> Drawn:
        """The plots along ``x`` (seeds shown or not) drawn for the lines at ``state``: the last drawing of these
        lines where one is (a view then gets the lines' new data), else drawn now."""
        lines = self.lines(state, x)
        shape = frozenset(lines)
        with self._lock:
            found = self._memo.setdefault("drawn", {}).get((x, seeds))
        if found is not None and found.shape == shape:
            return found
        layout = gridplot(draw_figures(lines, self.comparison.groups, x, seeds), ncols=2,
                          sizing_mode="stretch_width", merge_tools=False, toolbar_location=None)  # fmt: skip
        item = json_item(layout)
        item["doc"].pop("defs", None)  # the process's custom models (Panel's): none is drawn here
        drawn = Drawn(json.dumps(item), state, lines)
        with self._lock:
            self._memo["drawn"][x, seeds] = drawn
        return drawn

    def update(self, old: tuple, before: Lines, new: tuple, x: str) -> str:
        """What changed in the lines along ``x`` from ``before`` (the lines at state ``old``) to those at state
        ``new``, as the JSON text a ``ComparePlots`` takes: {source name: {"at": the points kept, column: the
        values from there on}} (NaN as null); "" where nothing did. Computed once for every view at the same two
        states."""

        def compute() -> str:
            changed = {}
            for key, data in self.lines(new, x).items():
                now = {column: _jsonable(values) for column, values in data.items()}
                was = {column: _jsonable(values) for column, values in before.get(key, {}).items()}
                if now != was:
                    at = _kept(was, now)
                    changed[_source_name(key)] = {"at": at} | {column: v[at:] for column, v in now.items()}
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
    column = X_LABELS[x]
    found: Lines = {}
    means = group_curves(curves, groups)
    for (group, panel, series), rows in means.groupby(["group", "panel", "series"], sort=False):
        data = {
            "x": rows[column].tolist(),
            "value": rows["mean"].tolist(),
            "lower": (rows["mean"] - rows["se"]).tolist(),
            "upper": (rows["mean"] + rows["se"]).tolist(),
            "n": rows["n"].tolist(),
        }
        if len(groups[group]) > 1:
            found["band", group, panel, series] = data
        found["line", group, panel, series] = data
    seeded = {run for runs in groups.values() if len(runs) > 1 for run in runs}
    for (run, panel, series), rows in curves.groupby(["run", "panel", "series"], sort=False):
        if run in seeded:
            found["seed", run, panel, series] = {"x": rows[column].tolist(), "value": rows["value"].tolist()}
    return found


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
            source = ColumnDataSource(data, name=_source_name(key))
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

    _esm = """
export function render({ model, el }) {
  let views = null
  let doc = null
  let busy = false
  const queue = [{item: model.item, data: model.data}]

  async function draw(item) {
    if (views != null) { views.clear() }
    views = doc = null
    el.replaceChildren()
    if (!item) { return }
    views = await Bokeh.embed.embed_item(JSON.parse(item), el)
    doc = views.roots[0].model.document
  }

  function update(text) {
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

  async function run() {
    if (busy) { return }
    busy = true
    try {
      while (queue.length > 0) {
        const msg = queue.shift()
        if (msg.item != null) { await draw(msg.item) }
        if (msg.data) { update(msg.data) }
      }
    } finally {
      busy = false
    }
  }

  model.on("msg:custom", (msg) => { queue.push(msg); run() })
  model.on("remove", () => { if (views != null) { views.clear() } })
  run()
}
"""

    def send(self, item: str | None = None, data: str = "") -> None:
        """Draw ``item`` (when given), then give the sources ``data``."""
        message: dict[str, str] = {"data": data}
        if item is not None:
            message["item"] = item
        self._send_msg(message)

"""Compare: several runs side by side, in a notebook cell or on the dashboard's Compare view.

``Compare(["runs/a", "runs/b", "reports/runs/marsrl"])`` (run folders, ``run.db`` files, summaries, a mapping
label -> one of them, or a ``workbench.analysis.compare.Comparison``) shows, top to bottom: the runs and their
groups, the config diff (only the fields that differ; seed-like fields marked, and left out of the groups),
one plot per quantity (reward, accuracy, response length, entropy, gradient share, held-out scores) with one
colour per group, a group of several seeds drawn as its mean with a band of ± one standard error (each seed's
own line on "show seeds"), a group of one run as its line, the roles of a plot told apart by dashes; the x
axis by step, wall time or samples seen; then the outcomes table (held-out scores before and after per role,
paired SEs, each run or group against the first) with a CSV download.

Live: while a compared run is active, its rows come from the run's process-wide ``SharedRun``
(``widgets.shared_poll``: one read per change for every view of it, the dashboard's monitors included), and the
plots' data sources are replaced in place at most every ``interval_ms`` (drawn again only when a line appears).
A finished comparison polls nothing. Summaries are read-only copies built in the workbench cache.

CSS classes a browser test can find: ``wb-compare`` (the whole view), ``wb-compare-groups`` (one
``wb-compare-group`` per group with ``data-group``, ``data-runs`` and ``data-kind``: ``band`` or ``line``),
``wb-compare-diff`` (the diff table, a ``tr`` per field with ``data-field``), ``wb-compare-plots``,
``wb-compare-outcomes`` (a ``tr`` per row with ``data-name`` and ``data-score``), ``wb-compare-csv`` (the
download). The plots' renderers are named ``band:<group>:<series>``, ``line:<group>:<series>`` and
``seed:<run>:<series>``.
"""

from __future__ import annotations

import html
import io
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import panel as pn
import param
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, Legend, LegendItem
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from widgets.live import PeriodicRefresh
from widgets.run_status import ACTIVE_STATUSES
from widgets.shared_poll import shared_run
from workbench.analysis.compare import PANELS, Comparison, group_curves, is_seed_field

__all__ = ["X_LABELS", "Compare"]

#: The x axes on offer: label -> the curves' column.
X_LABELS = {"step": "step", "wall time (s)": "wall_s", "samples seen": "samples"}
#: What the views of one comparison computed (curves, lines), by the runs and their versions: sessions that
#: show the same runs compute them once per change. Bounded; the oldest go first.
_SHARED: dict[tuple, Any] = {}
_SHARED_LOCK = threading.Lock()
SHARED_RESULTS = 64
#: A drawn line or band: (kind, owner, panel, series).
Line = tuple[str, str, str, str]
DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")


def _shared_metrics(run_dir: Path) -> pd.DataFrame:
    """A run's metric rows as the run's shared poll holds them (read once per change for every view)."""
    shared = shared_run(run_dir)
    shared.refresh()
    return shared.frame


class Compare(PeriodicRefresh, pn.viewable.Viewer):
    """Several runs side by side; display it in a notebook or serve it with Panel."""

    x = param.Selector(default="step", objects=list(X_LABELS), doc="The curves' x axis.")
    show_seeds = param.Boolean(default=False, doc="Draw each seed of a group as its own thin line.")
    interval_ms = param.Integer(
        default=2000, bounds=(200, None), doc="How often an active run is read again."
    )
    live = param.Boolean(default=True, doc="Follow active runs while displayed.")

    def __init__(
        self,
        runs: Comparison | Mapping[str, str | Path] | Sequence[str | Path],
        cache_dir: str | Path | None = None,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.comparison = (
            runs
            if isinstance(runs, Comparison)
            else Comparison(runs, metrics=_shared_metrics, cache_dir=cache_dir)
        )
        self._versions = self._read_versions()
        self.curves = self._shared("curves", self.comparison.curves)
        self._sources: dict[Line, ColumnDataSource] = {}
        self._seed_renderers: list[Any] = []
        self._plots = pn.pane.Bokeh(sizing_mode="stretch_width", css_classes=["wb-compare-plots"])
        self._outcomes = pn.pane.HTML(sizing_mode="stretch_width")
        self._header = pn.pane.HTML(sizing_mode="stretch_width")
        self._draw()
        self._show_outcomes()
        self.param.watch(lambda _e: self._draw(), "x")
        self.param.watch(lambda _e: self._toggle_seeds(), "show_seeds")

    # ------------------------------------------------------------------ reading
    @property
    def active(self) -> bool:
        """Whether a compared run is still going (the view then follows it)."""
        return any(status in ACTIVE_STATUSES for status in self.comparison.statuses.values())

    def _read_versions(self, min_interval: float = 0.0) -> dict[str, int]:
        return {label: shared_run(path).refresh(min_interval) for label, path in self.comparison.runs.items()}

    def refresh(self, min_interval: float = 0.0) -> bool:
        """Read what the compared runs wrote since the last time; redraw what changed. Whether anything did.

        ``min_interval``: reuse a run's shared state if any view read it less than that many seconds ago."""
        versions = self._read_versions(min_interval)
        if versions == self._versions:
            return False
        self._versions = versions
        statuses = {label: shared_run(path).status for label, path in self.comparison.runs.items()}
        self.curves = self._shared("curves", self.comparison.curves)
        self._update_plots()
        if statuses != self.comparison.statuses:  # a run that finished has its last evaluation
            self.comparison.refresh_outcomes()
            self._show_outcomes()
        return True

    def _tick(self) -> None:
        if self.active:  # a tick reuses what another session read in the last half interval
            self.refresh(self.interval_ms / 2000)
        else:
            self.stop()

    # ------------------------------------------------------------------ drawing
    def _shared(self, what: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once for every view of the same runs at the same versions (``what``: which result)."""
        # a run's metric rows are told by the last id read (they are only appended), not the version (which
        # starts again when a shared run is made anew)
        held = tuple((path, shared_run(path).last_id) for path in self.comparison.runs.values())
        key = (what, self.x, tuple(self.comparison.runs), held)
        with _SHARED_LOCK:
            found = _SHARED.get(key)
        if found is None:
            found = compute()
            with _SHARED_LOCK:
                while len(_SHARED) >= SHARED_RESULTS:
                    _SHARED.pop(next(iter(_SHARED)))
                _SHARED[key] = found
        return found

    def _lines(self) -> dict[Line, dict[str, list]]:
        """The lines and bands to draw, computed once for every view of the same runs at the same versions
        (``_compute_lines``)."""
        return self._shared("lines", self._compute_lines)

    def _compute_lines(self) -> dict[Line, dict[str, list]]:
        """Every line and band to draw: (kind, owner, panel, series) -> its data; kind ``band`` / ``line`` (an
        owner group's) or ``seed`` (an owner run's)."""
        column = X_LABELS[self.x]
        found: dict[Line, dict[str, list]] = {}
        groups = self.comparison.groups
        means = group_curves(self.curves, groups)
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
        for (run, panel, series), rows in self.curves.groupby(["run", "panel", "series"], sort=False):
            if any(run in runs and len(runs) > 1 for runs in groups.values()):
                found["seed", run, panel, series] = {
                    "x": rows[column].tolist(),
                    "value": rows["value"].tolist(),
                }
        return found

    def _draw(self) -> None:
        """Draw every plot anew (on first show, another x axis, or a line that was not there)."""
        lines = self._lines()
        colours = {group: Category10_10[i % 10] for i, group in enumerate(self.comparison.groups)}
        group_of = {run: group for group, runs in self.comparison.groups.items() for run in runs}
        x_range = DataRange1d()
        figures, self._sources, self._seed_renderers = [], {}, []
        for panel in PANELS:
            mine = {key: data for key, data in lines.items() if key[2] == panel.title}
            if not mine:
                continue
            plot = figure(title=panel.title, height=240, sizing_mode="stretch_width", x_range=x_range,
                          x_axis_label=self.x, tools="pan,wheel_zoom,box_zoom,reset")  # fmt: skip
            plot.toolbar.logo = None
            plot.add_tools(HoverTool(tooltips=[("", "$name"), (self.x, "@x"), ("value", "@value")]))
            legend = Legend(location="top_left", click_policy="hide", label_text_font_size="8pt",
                            spacing=0, padding=4)  # fmt: skip
            plot.add_layout(legend, "right")  # beside the plot: inside, it covered the lines' start
            series = sorted({key[3] for key in mine})
            bands: dict[tuple[str, str], Any] = {}  # hidden with their line from the legend
            for key, data in mine.items():
                kind, owner, _, label = key
                name = f"{kind}:{owner}:{label}"
                colour = colours[owner if kind != "seed" else group_of[owner]]
                dash = DASHES[series.index(label) % len(DASHES)]
                source = self._sources[key] = ColumnDataSource(data)
                if kind == "band":
                    band = plot.varea("x", "lower", "upper", source=source, fill_color=colour, fill_alpha=0.2)
                    band.name = name
                    bands[owner, label] = band
                elif kind == "line":
                    line = plot.line(
                        "x", "value", source=source, line_color=colour, line_width=2, line_dash=dash
                    )
                    line.name = name
                    drawn = [line] + ([bands[owner, label]] if (owner, label) in bands else [])
                    legend.items.append(LegendItem(label=f"{owner} · {label}", renderers=drawn))
                else:
                    seed = plot.line("x", "value", source=source, line_color=colour, line_width=1, line_alpha=0.5,
                                     line_dash=dash, visible=self.show_seeds)  # fmt: skip
                    seed.name = name
                    self._seed_renderers.append(seed)
            figures.append(plot)
        layout = gridplot(
            figures, ncols=2, sizing_mode="stretch_width", merge_tools=False, toolbar_location=None
        )
        self._plots.object = layout if figures else None
        self._header.object = self._header_html()

    def _update_plots(self) -> None:
        """Give each line its new points in place; draw again where a line appeared or went."""
        lines = self._lines()
        if set(lines) != set(self._sources):
            self._draw()
            return
        for key, data in lines.items():
            source = self._sources[key]
            if {k: list(v) for k, v in source.data.items()} != data:
                source.data = data
        if not _served():
            pn.io.push_notebook(self._plots)

    def _toggle_seeds(self) -> None:
        for renderer in self._seed_renderers:
            renderer.visible = self.show_seeds
        if not _served():
            pn.io.push_notebook(self._plots)

    def _header_html(self) -> str:
        comparison = self.comparison
        items = []
        for group, runs in comparison.groups.items():
            kind = "band" if len(runs) > 1 else "line"
            names = ", ".join(
                html.escape(run)
                + (" (summary, read-only)" if run in comparison.summaries else "")
                + f" <small>({html.escape(comparison.statuses[run])})</small>"
                for run in runs
            )
            what = f"mean ± SE of {len(runs)} seeds" if kind == "band" else "one run"
            items.append(
                f'<li class="wb-compare-group" data-group="{html.escape(group)}" data-kind="{kind}" '
                f'data-runs="{len(runs)}"><b>{html.escape(group)}</b>: {what}: {names}</li>'
            )
        return f'<ul class="wb-compare-groups">{"".join(items)}</ul>' + self._diff_html()

    def _diff_html(self) -> str:
        diff = self.comparison.diff
        if diff.empty:
            return '<p class="wb-compare-diff">The runs\' configs are the same.</p>'
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in diff.columns)
        rows = []
        for field, values in diff.iterrows():
            seed = " <small>(seed: not a group key)</small>" if is_seed_field(str(field)) else ""
            cells = "".join(f"<td>{html.escape(_cell(v))}</td>" for v in values)
            rows.append(
                f'<tr data-field="{html.escape(str(field))}"><th>{html.escape(str(field))}{seed}</th>{cells}</tr>'
            )
        return (
            '<table class="wb-compare-diff"><caption>Config diff (only the fields that differ)</caption>'
            f"<tr><th>field</th>{head}</tr>{''.join(rows)}</table>"
        )

    def _show_outcomes(self) -> None:
        table = self.comparison.outcomes()
        if table.empty:
            self._outcomes.object = (
                '<p class="wb-compare-outcomes">No run has a held-out evaluation before and after yet.</p>'
            )
            return
        rows = []
        for row in table.itertuples():
            vs = f"{_pm(row.diff, row.diff_se)} vs {html.escape(row.vs)}" if row.vs else ""
            z = "" if math.isnan(row.z) else f" ({row.z:+.1f} SE)"
            rows.append(
                f'<tr data-name="{html.escape(row.name)}" data-score="{html.escape(row.score)}" data-kind="{row.kind}">'
                f"<td>{html.escape(row.name)}</td><td>{row.kind}</td><td>{row.runs}</td><td>{html.escape(row.score)}</td>"
                f"<td>{row.tasks}</td><td>{row.before:.3f} → {row.after:.3f}</td><td>{_pm(row.rise, row.se)}{z}</td>"
                f"<td>{vs}</td></tr>"
            )
        self._outcomes.object = (
            '<table class="wb-compare-outcomes"><caption>Held-out scores: before → after training, the rise ± its paired '
            "standard error, and the difference after from the first run (group) ± its paired SE on the same tasks"
            "</caption><tr><th>run / group</th><th>kind</th><th>runs</th><th>score</th><th>tasks</th>"
            f"<th>before → after</th><th>rise ± paired SE</th><th>vs first</th></tr>{''.join(rows)}</table>"
        )

    def _csv(self) -> io.StringIO:
        return io.StringIO(self.comparison.outcomes_csv())

    # ------------------------------------------------------------------ view
    def close(self) -> None:
        self.stop()

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live and self.active:
            pn.state.onload(self.start)  # served: once the page is drawn; in a notebook: now
        download = pn.widgets.FileDownload(callback=self._csv, filename="comparison.csv", label="Download the outcomes (CSV)",
                                           css_classes=["wb-compare-csv"], embed=False)  # fmt: skip
        controls = pn.Row(
            pn.widgets.RadioButtonGroup.from_param(self.param.x, name="x axis"),
            pn.widgets.Checkbox.from_param(self.param.show_seeds, name="show seeds"),
        )
        return pn.Column(
            self._header, controls, self._plots, self._outcomes, download,
            css_classes=["wb-compare"], sizing_mode="stretch_width",
        )  # fmt: skip


def _cell(value: Any) -> str:
    return value if len(value) <= 80 else value[:79] + "…"


def _pm(value: float, se: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value:+.3f} ± {se:.3f}"


def _served() -> bool:
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None

"""Compare: several runs side by side, in a notebook cell or on the dashboard's Compare view.

``Compare(["runs/a", "runs/b", "reports/runs/marsrl"])`` (run folders, ``run.db`` files, summaries, a mapping
label -> one of them, or a ``workbench.analysis.compare.Comparison``) shows, top to bottom: the runs and their
groups, the config diff (only the fields that differ; seed-like fields marked, and left out of the groups),
one plot per quantity (reward, accuracy, response length, entropy, gradient share, held-out scores) with one
colour per group, a group of several seeds drawn as its mean with a band of ± one standard error (each seed's
own line on "show seeds"), a group of one run as its line, the roles of a plot told apart by dashes; the x
axis by step, wall time or samples seen; then the outcomes table (held-out scores before and after per role,
paired SEs, each run or group against the first) with a CSV download.

Many views cost about one (``widgets.compare_plots``): the views of the same runs in a process share one
``Comparison``, one reading of the runs per half interval (views opened together share the state they show),
and per state one computation of the new points, lines and page updates, and of the groups' and outcomes'
HTML; the plots are drawn once (again only for another x axis, "show seeds", or a line that appears; served, off
the event loop, the page getting them on its next tick) and sent to each view as their ``json_item``, then as
the data of the lines that changed. While a compared run is active, its rows come from the run's process-wide
``SharedRun`` (``widgets.shared_poll``: one read per change for every view of it, the dashboard's monitors
included), at most every ``interval_ms``. A finished comparison polls nothing once drawn. Summaries are
read-only copies built in the workbench cache.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import panel as pn
import param

from widgets.compare_plots import (
    X_LABELS,
    ComparePlots,
    Lines,
    SharedComparison,
    _shared_metrics,
    draw_figures,
    shared_comparison,
)
from widgets.live import PeriodicRefresh
from widgets.run_status import ACTIVE_STATUSES
from workbench.analysis.compare import Comparison, is_seed_field

__all__ = ["X_LABELS", "Compare"]


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
        if isinstance(runs, Comparison):
            self.shared = SharedComparison(runs)
        elif isinstance(runs, Mapping) and cache_dir is None:  # run folders by label: the dashboard's
            self.shared = shared_comparison({str(k): Path(v) for k, v in runs.items()})
        else:
            self.shared = SharedComparison(Comparison(runs, metrics=_shared_metrics, cache_dir=cache_dir))
        self.comparison = self.shared.comparison
        # the state another view read in the last half interval: views opened together share one
        self.state = self.shared.state(self.interval_ms / 2000)
        # served, the page does not wait for its plots to be drawn (the first view of these runs, or of a new
        # set of lines): they come with a later tick
        self._wait = not (self.live and _served())
        drawn = self.shared.drawn(self.state, self.x, self.show_seeds, wait=self._wait)
        #: the lines the page holds now (and the state of the runs they are of)
        self._held: tuple[tuple, Lines] = (self.state, self.shared.lines(self.state, self.x))
        self._plots = ComparePlots(
            item="" if drawn is None else drawn.item,
            data="" if drawn is None else self.shared.update(drawn.state, drawn.lines, self.state, self.x),
            css_classes=["wb-compare-plots"],
            sizing_mode="stretch_width",
        )
        #: the lines the page's drawing has (None while it waits for one)
        self._shape: frozenset | None = None if drawn is None else drawn.shape
        self._outcomes = pn.pane.HTML(sizing_mode="stretch_width")
        self._header = pn.pane.HTML(sizing_mode="stretch_width")
        self._outcomes_version = -1
        self._show_outcomes()
        self.param.watch(lambda _e: self._redraw(), ["x", "show_seeds"])

    # ------------------------------------------------------------------ reading
    @property
    def active(self) -> bool:
        """Whether a compared run is still going (the view then follows it)."""
        return any(status in ACTIVE_STATUSES for status in self.comparison.statuses.values())

    @property
    def curves(self) -> Any:
        """Every compared run's curves as they are now (``Comparison.curves``)."""
        return self.shared.curves(self.state)

    def lines(self) -> Lines:
        """The lines and bands drawn now, computed once for every view of the same runs at the same state."""
        return self.shared.lines(self.state, self.x)

    def figures(self) -> list[Any]:
        """The plots as Bokeh figures, drawn now (what the view shows)."""
        return draw_figures(self.lines(), self.comparison.groups, self.x, self.show_seeds)

    def refresh(self, min_interval: float = 0.0) -> bool:
        """Read what the compared runs wrote since the last time; send the page what changed. Whether anything did.

        ``min_interval``: reuse a run's shared state if any view read it less than that many seconds ago."""
        state = self.shared.state(min_interval)
        self._show_outcomes()
        changed = state != self.state
        if not changed and self._shape is not None:
            return False
        self.state = state
        lines = self.lines()
        if frozenset(lines) != self._shape:  # a line appeared or went (or the page awaits its plots): drawn
            self._redraw()
        else:
            self._plots.send(data=self.shared.update(*self._held, state, self.x))
            self._held = (state, lines)
        return changed

    def _tick(self) -> None:
        # a tick reuses what another session read in the last half interval; a page awaiting its plots ticks on
        if self.active or self._shape is None:
            self.refresh(self.interval_ms / 2000)
        else:
            self.stop()

    # ------------------------------------------------------------------ drawing
    def _redraw(self) -> None:
        """Draw the plots again (another x axis, seeds shown or hidden, or another set of lines)."""
        drawn = self.shared.drawn(self.state, self.x, self.show_seeds, wait=self._wait)
        if drawn is None:  # being drawn on the worker thread: a later tick sends it
            self._shape = None
            if self._callback is None and pn.state.curdoc is not None:
                self.start()
            return
        self._shape = drawn.shape
        self._plots.send(drawn.item, self.shared.update(drawn.state, drawn.lines, self.state, self.x))
        self._held = (self.state, self.lines())

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
        """Show the outcomes table where it was read again since this view last did."""
        if self._outcomes_version == self.shared.outcomes_version:
            return
        self._outcomes_version = self.shared.outcomes_version
        # written once per reading of the runs' statuses and evaluations for every view
        self._header.object = self.shared.once("header_html", self._header_html)  # the runs' statuses
        self._outcomes.object = self.shared.once("outcomes_html", self._outcomes_html)

    def _outcomes_html(self) -> str:
        table = self.shared.outcomes()
        if table.empty:
            return '<p class="wb-compare-outcomes">No run has a held-out evaluation before and after yet.</p>'
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
        return (
            '<table class="wb-compare-outcomes"><caption>Held-out scores: before → after training, the rise ± its paired '
            "standard error, and the difference after from the first run (group) ± its paired SE on the same tasks"
            "</caption><tr><th>run / group</th><th>kind</th><th>runs</th><th>score</th><th>tasks</th>"
            f"<th>before → after</th><th>rise ± paired SE</th><th>vs first</th></tr>{''.join(rows)}</table>"
        )

    def _csv(self) -> io.StringIO:
        return io.StringIO(self.shared.outcomes().to_csv(index=False, float_format="%.4g"))

    # ------------------------------------------------------------------ view
    def close(self) -> None:
        self.stop()

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live and (self.active or self._shape is None):
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


def _served() -> bool:
    """Whether the current document is a served session's (else a notebook's, or none)."""
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None


def _cell(value: Any) -> str:
    return value if len(value) <= 80 else value[:79] + "…"


def _pm(value: float, se: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value:+.3f} ± {se:.3f}"

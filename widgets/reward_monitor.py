"""RewardMonitor: live per-role curves of a run, streamed from its store while the run writes.

``RewardMonitor(run_dir)`` shows one HoloViews panel per quantity (reward; accuracy: each role's, the
held-out evaluation's and the verifiers' verdict accuracy; response length; tool calls; gradient share;
format rate; the rollout's and the trainer's idle shares of a step), one curve per role. Each panel has
its own y axis, fitted to its data as it streams in (the step axes stay linked). The header shows the
last complete step and the run's status, with the error of a failed run. ``poll()`` takes only the
metric rows written since the last poll (by id), so a long run costs the same per poll as a short one;
served or in JupyterLab, a periodic callback polls every ``interval_ms``. The store is read through the
run's process-wide ``SharedRun`` (``widgets.shared_poll``): once per change for all the monitors (all
the dashboard sessions) of a run, not once per monitor. Curves stream through ``hv.streams.Pipe``, and
a poll sends only the plots whose rows changed and the header only when its text changed. Served, the
header follows every poll while the plots are redrawn only so often that all monitors' redraws together
take a bounded share of the server (``PLOT_BUDGET``); with ``defer_plots`` (the dashboard's) a new
session's page goes out without its plots, which follow once a burst of new sessions has its pages.

CSS classes a browser test can find: ``wb-monitor`` (the whole view), ``wb-last-step`` (the header,
whose text is ``step N`` with a ``data-step`` attribute, then ``wb-run-status`` and ``wb-run-error``, see
``widgets.run_status``), ``wb-monitor-plot`` (each plot).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import holoviews as hv
import pandas as pd
import panel as pn
import param
from panel.io.state import set_curdoc

from widgets.live import PeriodicRefresh
from widgets.run_status import status_html
from widgets.shared_poll import RUN_WIDE, shared_run
from workbench.store import RunReader

__all__ = ["QUANTITIES", "RUN_WIDE", "MetricFeed", "Quantity", "RewardMonitor"]

#: A monitor's plots are redrawn at most every this many seconds times the monitors polling in the process,
#: and so that all monitors' redraws take at most PLOT_BUDGET of the process's time (the header is not
#: held back: it shows each new step at the next tick).
PLOT_SECONDS_PER_MONITOR, PLOT_BUDGET = 0.15, 0.25
#: Served with ``defer_plots``: a session's plots are sent once no session opened for FILL_QUIET_S, and
#: the plots of different sessions at least FILL_SPACING_S apart.
FILL_QUIET_S, FILL_SPACING_S = 1.0, 0.6


@dataclass(frozen=True)
class Quantity:
    """One plot: a title and the metric names it draws (per role where stored per role, else run-wide)."""

    title: str
    names: tuple[str, ...]


QUANTITIES = (
    Quantity("reward", ("reward/mean",)),
    # each role's training accuracy beside the held-out score and the verifiers' verdict accuracy
    Quantity("accuracy", ("accuracy", "eval/accuracy", "verifier/verdict_accuracy")),
    Quantity("response length (tokens)", ("length/mean",)),
    Quantity("tool calls per call", ("tool_calls/mean", "tool_calls/per_question")),
    Quantity("gradient share", ("grad_share",)),
    Quantity("format rate", ("format/rate",)),
    # the bubble gauge: shares of each step the rollout backends and the trainer sat idle
    Quantity("idle share of a step", ("bubble/rollout", "bubble/trainer")),
)


class MetricFeed:
    """The metric rows of one run as one session sees them: each ``poll`` takes the rows with a larger id.

    The rows come from the run's process-wide ``SharedRun`` (``widgets.shared_poll``), which reads the
    store once per change for every feed of the run; ``frame`` is its (shared, never changed) frame.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.shared = shared_run(run_dir)
        self.last_id = 0
        self.frame = pd.DataFrame(columns=["id", "step", "role", "name", "value"])
        self._reader: RunReader | None = None

    @property
    def reader(self) -> RunReader:
        """This feed's own reader of the run (opened on first use), for what the shared state does not hold."""
        if self._reader is None:
            self._reader = RunReader(self.run_dir)
        return self._reader

    def poll(self, min_interval: float = 0.0) -> int:
        """Take the rows written since the last poll; returns how many arrived.

        ``min_interval``: reuse the shared state if any session read the store less than that many s ago.
        """
        self.shared.refresh(min_interval)
        frame, last_id = self.shared.frame, self.shared.last_id
        if last_id == self.last_id:
            return 0
        arrived = len(frame) - len(self.frame)
        self.frame, self.last_id = frame, last_id
        return arrived

    def last_step(self) -> int | None:
        return self.shared.last_step

    def series(self, quantity: Quantity) -> pd.DataFrame:
        """Rows of ``quantity``: step, label (role, or role and metric where the plot draws several metrics).

        The label depends on the quantity, not on the rows so far, so a curve keeps its label as a run goes on.
        """
        return self.shared.series(quantity.names, self.frame, self.last_id)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _overlay(data: pd.DataFrame, title: str) -> hv.Overlay:
    """One plot. Its value dimension is labelled by ``title``, so no other plot shares (links) its y axis:
    reward, shares and rates are not drawn on the token lengths' scale; the step axes stay linked.
    ``framewise``: the axes follow the data as each poll streams new rows in."""
    value = hv.Dimension("value", label=title)
    curves = [
        hv.Curve(group, "step", value, label=str(label)).opts(tools=["hover"], framewise=True)
        for label, group in data.groupby("label", sort=True)
    ]
    if not curves:
        curves = [hv.Curve([], "step", value).opts(framewise=True)]
    return hv.Overlay(curves).opts(
        title=title, responsive=True, height=220, legend_position="bottom_left", show_grid=True
    )


def warm_up() -> None:
    """Render one empty plot, off any page: the first session of a server then does not pay for importing
    and setting up HoloViews' Bokeh plotting (seconds, during which no other session is answered)."""
    pipe = hv.streams.Pipe(data=pd.DataFrame(columns=["step", "label", "value"]))
    pn.pane.HoloViews(hv.DynamicMap(lambda data: _overlay(data, "warm-up"), streams=[pipe])).get_root()
    with contextlib.suppress(ImportError):  # Panel imports it the first time it types a Viewer's pane
        import matplotlib.figure  # noqa: F401


class RewardMonitor(PeriodicRefresh, pn.viewable.Viewer):
    """Live per-role curves of one run; display it in a notebook or serve it with Panel."""

    run_dir = param.String(doc="The run directory to follow.")
    interval_ms = param.Integer(default=1000, bounds=(100, None), doc="How often to poll the store.")
    live = param.Boolean(default=True, doc="Poll periodically while displayed.")
    show_error = param.Boolean(default=True, doc="Show a failed run's error in the header.")
    defer_plots = param.Boolean(
        default=False,
        doc="Served: send the page with the header first and add the plots a moment later (staggered "
        "across sessions), so that many tabs opening at once each get their page quickly.",
    )

    #: Monitors polling now (in this process), which share the plot redraws' time between them.
    _polling: ClassVar[weakref.WeakSet] = weakref.WeakSet()
    #: When (``time.monotonic()``) the last session with deferred plots opened, and the last plots were sent.
    _last_opened: ClassVar[float] = float("-inf")
    _last_fill: ClassVar[float] = float("-inf")

    def __init__(self, run_dir: str | Path, **params) -> None:
        super().__init__(run_dir=str(run_dir), **params)
        self.feed = MetricFeed(run_dir)
        self.feed.poll()
        self._pipes = {q.title: hv.streams.Pipe(data=self.feed.series(q)) for q in QUANTITIES}
        self._header = pn.pane.HTML("", css_classes=["wb-last-step"], sizing_mode="stretch_width")
        self._sent = {q.title: self._pipes[q.title].data for q in QUANTITIES}
        self._callback = None
        self._stale = False
        self._next_plots = 0.0
        self.poll()

    @functools.cached_property
    def _plots(self) -> list[pn.pane.HoloViews]:
        """The plots, made when first shown (a served page with deferred plots gets its first document
        without paying for them)."""
        return [
            pn.pane.HoloViews(
                hv.DynamicMap(
                    lambda data, title=q.title: _overlay(data, title), streams=[self._pipes[q.title]]
                ),
                css_classes=["wb-monitor-plot"],
                sizing_mode="stretch_width",
            )
            for q in QUANTITIES
        ]

    def poll(self, min_interval: float = 0.0, plots: bool = True) -> int:
        """Take new metric rows and push each curve whose rows changed; returns how many rows arrived.

        Only what changed is sent to the page: the plots whose metrics got rows, the header when its text
        changed (``min_interval``: see ``MetricFeed.poll``; ``plots=False``: the header only, the plots
        wait for a later poll).
        """
        arrived = self.feed.poll(min_interval)
        self._stale = self._stale or arrived > 0
        if plots and self._stale:
            self._stale = False
            for quantity in QUANTITIES:
                series = self.feed.series(quantity)
                sent = self._sent.get(quantity.title)
                if sent is not series and (sent is None or not series.equals(sent)):
                    self._sent[quantity.title] = series
                    self._pipes[quantity.title].send(series)
        shared = self.feed.shared
        step, status = shared.last_step, shared.status
        error = shared.error if status == "failed" and self.show_error else None
        text = "no step yet" if step is None else f"step {step}"
        header = (
            f'<span class="wb-step" data-step="{-1 if step is None else step}">{text}</span> '
            + status_html(status, error)
        )
        if header != self._header.object:
            self._header.object = header
        return arrived

    def _tick(self) -> None:
        # A tick reuses what another session read in the last half interval (20 tabs, one read) and
        # updates the header every time, but redraws the plots (the costly part) only so often that all
        # the monitors' redraws together take at most PLOT_BUDGET of the server's time.
        now = time.monotonic()
        plots = now >= self._next_plots
        self.poll(min_interval=self.interval_ms / 2000, plots=plots)
        if plots:
            cost = time.monotonic() - now
            self._next_plots = now + max(
                PLOT_SECONDS_PER_MONITOR * len(RewardMonitor._polling),
                cost * len(RewardMonitor._polling) / PLOT_BUDGET,
            )

    def start(self) -> None:
        super().start()
        RewardMonitor._polling.add(self)

    def stop(self) -> None:
        super().stop()
        RewardMonitor._polling.discard(self)

    def close(self) -> None:
        self.stop()
        self.feed.close()

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live:
            self.start()
        grid = pn.GridBox(ncols=2, sizing_mode="stretch_width")
        doc = pn.state.curdoc
        if self.defer_plots and doc is not None and doc.session_context is not None:
            # the plots (most of a page's cost) wait until no session opened for FILL_QUIET_S, then go
            # one session at a time: a burst of new tabs gets all its first documents before any plots
            RewardMonitor._last_opened = time.monotonic()

            def fill() -> None:
                now = time.monotonic()
                wait = max(
                    RewardMonitor._last_opened + FILL_QUIET_S - now,
                    RewardMonitor._last_fill + FILL_SPACING_S - now,
                )
                if wait > 0:
                    doc.add_timeout_callback(fill, int(wait * 1000) + 1)
                    return
                RewardMonitor._last_fill = now
                with set_curdoc(doc):
                    grid.objects = list(self._plots)

            doc.add_timeout_callback(fill, int(FILL_QUIET_S * 1000))
        else:
            grid.objects = list(self._plots)
        return pn.Column(self._header, grid, css_classes=["wb-monitor"], sizing_mode="stretch_width")

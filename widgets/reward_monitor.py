"""RewardMonitor: live per-role curves of a run, streamed from its store while the run writes.

``RewardMonitor(run_dir)`` shows one plot per quantity (reward; accuracy: each role's, the held-out
evaluation's and the verifiers' verdict accuracy; response length; tool calls; gradient share; format rate;
the rollout's and the trainer's idle shares of a step), one curve per role; a plot with no signal for the
run's topology is left out (tool calls, for a topology without tools). Each plot has its own y axis,
fitted to its data as it streams in (the step axes stay linked). The header shows the last complete step
and the run's status, with the error of a failed run. ``poll()`` takes only the metric rows written since
the last poll (by id), so a long run costs the same per poll as a short one; served or in JupyterLab, a
periodic callback polls every ``interval_ms`` (served: from the moment the page is drawn, BokehJS's
``document_ready``; a session that never draws its page polls nothing).

Many views cost about one. The store is read through the run's process-wide ``SharedRun``
(``widgets.shared_poll``): once per change for all the monitors (all the dashboard sessions) of a run. Its
``Curves`` hold each plot's points, shared by every monitor of the run. The plots are Bokeh figures
(``CurvePlot``) drawn once per run (``template``: again only when a label appears, a row arrives out of
order, or the points past it outnumber those it holds; served, on a worker thread, so the event loop never
waits for one) and sent as their ``json_item`` to each view, a ``StreamedPlots`` component that BokehJS
draws in the browser; the server then sends each view only the points past those it has, streamed into the
drawn figures' sources by name. So a view costs the server no Bokeh figure of its own, a new session's
first document carries its plots (the first page of a run, drawn before its template, gets them a moment
later), and each poll sends the new points of the curves that got any. The header is a Bokeh ``Div`` whose
text is set only when it changed (a fraction of a Panel pane's update). Served, the header follows every
poll while the plots' points go only so often that all monitors' updates together take a bounded share of
the server (``PLOT_BUDGET``).

CSS classes a browser test can find: ``wb-monitor`` (the whole view), ``wb-last-step`` (the header,
whose text is ``step N`` with a ``data-step`` attribute, then ``wb-run-status`` and ``wb-run-error``, see
``widgets.run_status``), ``wb-monitor-plots`` (the plots' component), ``wb-monitor-plot`` (each plot, in
the drawn layout).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.embed import json_item
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, DataRange1d, Div, HoverTool, Legend, LegendItem, Line
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from panel.custom import JSComponent

from widgets.live import PeriodicRefresh
from widgets.run_status import status_html
from widgets.shared_poll import RUN_WIDE, Curves, shared_run
from workbench.store import RunReader

__all__ = ["QUANTITIES", "RUN_WIDE", "CurvePlot", "MetricFeed", "Quantity", "RewardMonitor", "StreamedPlots"]

#: A monitor's plots are updated at most every this many seconds times the monitors polling in the process,
#: and so that all monitors' updates take at most PLOT_BUDGET of the process's time (the header is not
#: held back: it shows each new step at the next tick).
PLOT_SECONDS_PER_MONITOR, PLOT_BUDGET = 0.05, 0.25


@dataclass(frozen=True)
class Quantity:
    """One plot: a title and the metric names it draws (per role where stored per role, else run-wide).

    ``needs_tools``: the plot has no signal for a topology without tools (it is left out of such a run's
    monitor)."""

    title: str
    names: tuple[str, ...]
    needs_tools: bool = False


QUANTITIES = (
    Quantity("reward", ("reward/mean",)),
    # each role's training accuracy beside the held-out score and the verifiers' verdict accuracy
    Quantity("accuracy", ("accuracy", "eval/accuracy", "verifier/verdict_accuracy")),
    Quantity("response length (tokens)", ("length/mean",)),
    Quantity("tool calls per call", ("tool_calls/mean", "tool_calls/per_question"), needs_tools=True),
    Quantity("gradient share", ("grad_share",)),
    Quantity("format rate", ("format/rate",)),
    # the bubble gauge: shares of each step the rollout backends and the trainer sat idle
    Quantity("idle share of a step", ("bubble/rollout", "bubble/trainer")),
)


class MetricFeed:
    """The metric rows of one run as one session sees them: each ``poll`` takes the rows with a larger id.

    The rows come from the run's process-wide ``SharedRun`` (``widgets.shared_poll``), which reads the
    store once per change for every feed of the run.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.shared = shared_run(run_dir)
        self.last_id = 0
        self.rows = 0
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
        if self.shared.last_id == self.last_id:
            return 0
        arrived = self.shared.rows - self.rows
        self.last_id, self.rows = self.shared.last_id, self.shared.rows
        return arrived

    def last_step(self) -> int | None:
        return self.shared.last_step

    def curves(self, quantity: Quantity) -> Curves:
        """The run's shared curves of ``quantity`` (all sessions' plots of it draw from them)."""
        return self.shared.curves(quantity.names)

    def series(self, quantity: Quantity) -> pd.DataFrame:
        """Rows of ``quantity``: step, label (role, or role and metric where the plot draws several metrics).

        The label depends on the quantity, not on the rows so far, so a curve keeps its label as a run goes on.
        """
        return self.shared.series(quantity.names)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


#: Whether a run's topology has tools, by run directory (a run's topology does not change once read).
_HAS_TOOLS: dict[str, bool] = {}
#: A training run's topology beside its store: ``workbench.rl.run_files.TOPOLOGY_FILE``, named here because
#: importing that module imports torch (seconds in which a served dashboard answers nobody; a test keeps
#: the two names equal).
TOPOLOGY_FILE = "topology.yaml"


def has_tools(feed: MetricFeed) -> bool | None:
    """Whether the topology of ``feed``'s run has tools; None where it cannot be told (no topology
    recorded yet, or one that cannot be read). Read as plain data (no plugin needs to be loaded), once
    per run and process."""
    from workbench import topology

    key = str(feed.run_dir.resolve())
    if key not in _HAS_TOOLS:
        reader = feed.reader
        spec = reader.config.get("topology") or reader.info().get("topology")
        stored = feed.run_dir / TOPOLOGY_FILE
        try:
            if isinstance(spec, dict):  # a rollout's own spec
                found = topology.from_dict(spec)
            elif stored.exists():  # a training run's spec, beside it
                found = topology.load(stored)
            elif spec:  # a library topology, by name
                found = topology.load(str(spec))
            else:
                return None
        except Exception:  # noqa: BLE001 - a spec this code cannot read: every plot is shown
            return None
        _HAS_TOOLS[key] = bool(found.tools)
    return _HAS_TOOLS[key]


#: A plot's points: label -> (steps, values), as ``Curves.points`` holds them.
Points = dict[str, tuple[list[int], list[float]]]


class CurvePlot:
    """One plot as a Bokeh figure, drawn from a plot's points (``Curves.points``): a line per label, each
    with a data source named ``"<index>:<label>"`` (what a ``StreamedPlots`` view streams into). The y
    axis fits the plot's own lines (its own ``DataRange1d``); ``x_range`` is shared by the plots of one
    layout (linked steps)."""

    def __init__(self, quantity: Quantity, points: Points, x_range: DataRange1d, index: int = 0) -> None:
        self.quantity = quantity
        self.figure = figure(
            title=quantity.title,
            height=220,
            sizing_mode="stretch_width",
            x_range=x_range,
            y_range=DataRange1d(),
            x_axis_label="step",
            tools="pan,wheel_zoom,box_zoom,reset",
            css_classes=["wb-monitor-plot"],
        )
        self.figure.add_tools(HoverTool(tooltips=[("", "$name"), ("step", "@step"), ("value", "@value")]))
        self.figure.toolbar.logo = None
        # beside the plot, not in it: a legend inside covered the start of the lines
        self.legend = Legend(location="top_left", click_policy="hide", label_text_font_size="8pt")
        self.figure.add_layout(self.legend, "right")
        #: source name -> points it holds
        self.counts: dict[str, int] = {}
        for n, (label, (steps, values)) in enumerate(points.items()):
            name = f"{index}:{label}"
            data = {"step": np.asarray(steps, dtype=np.int32), "value": np.asarray(values, dtype=np.float64)}
            source = ColumnDataSource(data, name=name)  # arrays: serialized as bytes, not number by number
            colour = Category10_10[n % len(Category10_10)]
            line = self.figure.add_glyph(source, Line(x="step", y="value", line_color=colour, line_width=2))
            line.name = label
            self.legend.items.append(LegendItem(label=label, renderers=[line]))
            self.counts[name] = len(steps)


def _shape(curves: list[Curves]) -> tuple:
    """What a drawn layout cannot follow by streaming: the labels of each plot and their out-of-order resets."""
    return tuple((tuple(c.points), c.resets) for c in curves)


@dataclass(frozen=True)
class Template:
    """The plots of one run drawn once, for every view of it: the layout's ``json_item`` (JSON text), the
    shape it was drawn for and the points each of its sources holds."""

    item: str
    shape: tuple
    counts: dict[str, int]

    @property
    def points(self) -> int:
        return sum(self.counts.values())


#: The latest template of each (run, plots), and those being drawn; a view streams on from whichever
#: template it was drawn from.
_TEMPLATES: dict[tuple[str, tuple[str, ...]], Template] = {}
_DRAWING: set[tuple[str, tuple[str, ...]]] = set()
_TEMPLATES_LOCK = threading.Lock()
#: Draws templates off the served event loop (a second or so each: the models and their serialization).
_DRAWER = ThreadPoolExecutor(1, thread_name_prefix="wb-plots")
#: A template is drawn again once the points past it outnumber this and the points it holds: a new view
#: streams at most that many points after its template, and drawing happens a few times over a long run.
TEMPLATE_REDRAW_POINTS = 20_000
log = logging.getLogger("workbench.dashboard")


def draw(feed: MetricFeed, quantities: tuple[Quantity, ...]) -> list[CurvePlot]:
    """The plots of ``quantities`` drawn from ``feed``'s shared curves as they are now (step axes linked)."""
    x_range = DataRange1d()
    return [CurvePlot(q, feed.curves(q).points, x_range, i) for i, q in enumerate(quantities)]


def _draw_template(key: tuple[str, tuple[str, ...]], quantities: tuple[Quantity, ...], points: list[Points],
                   shape: tuple) -> Template:  # fmt: skip
    try:
        x_range = DataRange1d()
        plots = [CurvePlot(q, p, x_range, i) for i, (q, p) in enumerate(zip(quantities, points, strict=True))]
        layout = gridplot(
            [p.figure for p in plots],
            ncols=2,
            sizing_mode="stretch_width",
            merge_tools=False,
            toolbar_location=None,
        )
        item = json_item(layout)
        item["doc"].pop("defs", None)  # the process's custom models (Panel's): none is drawn here
        counts = {name: n for plot in plots for name, n in plot.counts.items()}
        drawn = Template(json.dumps(item), shape, counts)
        with _TEMPLATES_LOCK:
            _TEMPLATES[key] = drawn
        return drawn
    finally:
        with _TEMPLATES_LOCK:
            _DRAWING.discard(key)


def template(feed: MetricFeed, quantities: tuple[Quantity, ...], wait: bool = True) -> Template | None:
    """The plots of ``feed``'s run drawn from its shared curves (shared by every monitor of the run), drawn
    again only when a label appeared, a row arrived out of order, or many points arrived since.

    ``wait=False`` (served): a template that must be drawn is drawn on a worker thread, and the latest one
    (None before the first) is returned meanwhile; the server's event loop never waits for one."""
    curves = [feed.curves(q) for q in quantities]
    key = (str(feed.run_dir), tuple(q.title for q in quantities))
    with _TEMPLATES_LOCK:
        found, drawing = _TEMPLATES.get(key), key in _DRAWING
    held = sum(len(steps) for c in curves for steps, _ in c.points.values())
    shape = _shape(curves)
    if (
        found is not None
        and found.shape == shape
        and held - found.points <= max(TEMPLATE_REDRAW_POINTS, found.points)
    ):
        return found
    if drawing and not wait:
        return found
    # the points as they are now, copied here: the curves only change on this thread
    points = [{label: (list(s), list(v)) for label, (s, v) in c.points.items()} for c in curves]
    if wait:
        return _draw_template(key, quantities, points, shape)
    with _TEMPLATES_LOCK:
        _DRAWING.add(key)
    future = _DRAWER.submit(_draw_template, key, quantities, points, shape)
    future.add_done_callback(lambda f: f.exception() and log.error("drawing plots failed: %r", f.exception()))
    return found


#: The start of the scripts of the components that draw a Bokeh layout from its ``json_item`` in the browser
#: (``StreamedPlots``, ``widgets.compare_plots.ComparePlots``): ``embedded(model, el, first, handle)`` takes
#: ``first`` and then each message of the component in order: a message's ``item`` draws another layout in ``el``
#: (none for an empty one: the plots come later), then ``handle(msg, doc)`` gives the rest of it to the drawn
#: document (null before one).
EMBEDDED_LAYOUT_JS = """
function embedded(model, el, first, handle) {
  let views = null
  let doc = null
  let busy = false
  const queue = [first]

  async function draw(item) {
    if (views != null) { views.clear() }
    views = doc = null
    el.replaceChildren()
    if (!item) { return }
    views = await Bokeh.embed.embed_item(JSON.parse(item), el)
    doc = views.roots[0].model.document
  }

  async function run() {
    if (busy) { return }
    busy = true
    try {
      while (queue.length > 0) {
        const msg = queue.shift()
        if (msg.item != null) { await draw(msg.item) }
        handle(msg, doc)
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


class StreamedPlots(JSComponent):
    """A Bokeh layout drawn in the browser from its ``json_item``, whose data sources the server then
    streams by name: the server builds no Bokeh model for it, only sends the (shared) JSON and new points.

    Messages (in order): ``{"item": JSON}`` draws another layout; ``{"tails": {name: [have, steps,
    values]}}`` appends to source ``name`` the points past the ``have`` it already holds. A view that finds
    a source missing or short of ``have`` (it missed a message) asks for ``{"resync": true}``."""

    item = param.String(doc="The layout's json_item, as JSON text (the view's first drawing).")

    _esm = (
        EMBEDDED_LAYOUT_JS
        + """
export function render({ model, el }) {
  function stream(doc, tails) {
    for (const [name, [have, step, value]] of Object.entries(tails)) {
      const source = doc == null ? null : doc.get_model_by_name(name)
      const length = source == null ? -1 : source.get_length()
      if (length < have) { model.send_msg({resync: true}); return }
      const skip = length - have
      if (skip < step.length) { source.stream({step: step.slice(skip), value: value.slice(skip)}) }
    }
  }

  embedded(model, el, {item: model.item}, (msg, doc) => { if (msg.tails != null) { stream(doc, msg.tails) } })
}
"""
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.resync = False
        self.on_msg(self._asked)

    def _asked(self, data: Any) -> None:
        if isinstance(data, dict) and data.get("resync"):
            self.resync = True

    def draw(self, item: str) -> None:
        """Draw another layout in the page (after what was sent before)."""
        self._send_msg({"item": item})

    def stream(self, tails: dict[str, list]) -> None:
        """Append the points of ``tails`` (name -> [have, steps, values]) to the sources of the drawn layout."""
        self._send_msg({"tails": tails})


@dataclass
class _View:
    """One display of a monitor: its header (a Bokeh ``Div``: setting its text costs a fraction of a Panel
    pane's update), its plots' component, the template they were drawn from, the points each source got."""

    header: Div
    header_pane: pn.pane.Bokeh
    plots: StreamedPlots
    template: Template | None  # None: drawn before the run's first template (its plots come with it)
    sent: dict[str, int]


def warm_up() -> None:
    """Draw one plot and import what a run's first page reads, off any page: the first session of a server
    then does not pay for importing and setting up Bokeh's plotting and serialization or the topology
    specs (seconds, during which no other session is answered)."""
    from workbench import topology  # noqa: F401 - has_tools reads a run's topology with it

    plot = CurvePlot(QUANTITIES[0], {"run": ([0], [0.0])}, DataRange1d())
    json_item(gridplot([plot.figure], ncols=2))
    StreamedPlots(item="{}").get_root()


class RewardMonitor(PeriodicRefresh, pn.viewable.Viewer):
    """Live per-role curves of one run; display it in a notebook or serve it with Panel."""

    run_dir = param.String(doc="The run directory to follow.")
    interval_ms = param.Integer(default=1000, bounds=(100, None), doc="How often to poll the store.")
    live = param.Boolean(default=True, doc="Poll periodically while displayed.")
    show_error = param.Boolean(default=True, doc="Show a failed run's error in the header.")

    #: Monitors polling now (in this process), which share the plot updates' time between them.
    _polling: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    def __init__(self, run_dir: str | Path, **params: Any) -> None:
        super().__init__(run_dir=str(run_dir), **params)
        self.feed = MetricFeed(run_dir)
        tools = has_tools(self.feed)
        #: The plots of this run: QUANTITIES but those with no signal for its topology.
        self.quantities = tuple(q for q in QUANTITIES if not (q.needs_tools and tools is False))
        #: The header's HTML: ``step N`` (with ``data-step``), the status, a failed run's error.
        self.header = ""
        #: Each display's header and plots (a served session's monitor has one).
        self.views: list[_View] = []
        self._callback = None
        self._next_plots = 0.0
        self.poll()

    def template(self, wait: bool = True) -> Template | None:
        """The run's plots as they are drawn for a new view (shared by every monitor of the run); see
        ``template``."""
        return template(self.feed, self.quantities, wait=wait)

    def figures(self) -> list[Any]:
        """The run's plots as Bokeh figures, drawn now (what a view's layout shows)."""
        return [plot.figure for plot in draw(self.feed, self.quantities)]

    def _draw(self) -> _View:
        """A new view: the header as it is now, the run's template, then the points that arrive."""
        drawn = self.template(wait=not _served())  # served, the first page of a run may come before its plots
        header = Div(text=self.header, css_classes=["wb-last-step"], sizing_mode="stretch_width")
        item = drawn.item if drawn is not None else ""
        plots = StreamedPlots(item=item, css_classes=["wb-monitor-plots"], sizing_mode="stretch_width")
        pane = pn.pane.Bokeh(header, sizing_mode="stretch_width")
        view = _View(header, pane, plots, drawn, dict(drawn.counts) if drawn is not None else {})
        self.views.append(view)
        return view

    def _stream(self) -> None:
        """Send each view the points it does not have; a view is drawn again from the latest template when its
        plots changed shape (a new label's line comes with the template that has it) or it asked to be."""
        current = self.template(wait=not _served())
        curves = [self.feed.curves(q) for q in self.quantities]
        for view in self.views:
            if current is not None and (
                view.plots.resync or view.template is None or view.template.shape != current.shape
            ):
                view.plots.resync = False
                view.template, view.sent = current, dict(current.counts)
                view.plots.draw(current.item)
            tails: dict[str, list] = {}
            for index, curve in enumerate(curves):
                for label, (steps, values) in curve.points.items():
                    name = f"{index}:{label}"
                    have = view.sent.get(name)
                    if have is not None and len(steps) > have:  # a line the drawn layout has
                        tails[name] = [have, steps[have:], values[have:]]
                        view.sent[name] = len(steps)
            if tails:
                view.plots.stream(tails)

    def poll(self, min_interval: float = 0.0, plots: bool = True) -> int:
        """Take new metric rows and stream each curve its new points; returns how many rows arrived.

        Only what changed is sent to the page: the new points of the curves that got any, the header when
        its text changed (``min_interval``: see ``MetricFeed.poll``; ``plots=False``: the header only, the
        plots wait for a later poll).
        """
        arrived = self.feed.poll(min_interval)
        if plots and self.views:
            self._stream()
        shared = self.feed.shared
        step, status = shared.last_step, shared.status
        error = shared.error if status == "failed" and self.show_error else None
        text = "no step yet" if step is None else f"step {step}"
        header = (
            f'<span class="wb-step" data-step="{-1 if step is None else step}">{text}</span> '
            + status_html(status, error)
        )
        if header != self.header:
            self.header = header
            for view in self.views:
                view.header.text = header
            if self.views and not _served():  # a notebook's Bokeh models go out through its comm
                pn.io.push_notebook(*(view.header_pane for view in self.views))
        return arrived

    def _tick(self) -> None:
        # A tick reuses what another session read in the last half interval (20 tabs, one read) and
        # updates the header every time, but sends the plots' points only so often that all the monitors'
        # updates together take at most PLOT_BUDGET of the server's time.
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
        view = self._draw()
        if self.live:
            pn.state.onload(self.start)  # served: once the page is drawn; in a notebook: now
        return pn.Column(
            view.header_pane, view.plots, css_classes=["wb-monitor"], sizing_mode="stretch_width"
        )


def _served() -> bool:
    """Whether the current document is a served session's (else a notebook's, or none)."""
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None

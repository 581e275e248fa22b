"""RewardMonitor: live per-role curves of a run, streamed from its store while the run writes.

``RewardMonitor(run_dir)`` shows one HoloViews panel per quantity (reward; accuracy: each role's, the
held-out evaluation's and the verifiers' verdict accuracy; response length; tool calls; gradient share;
format rate; the rollout's and the trainer's idle shares of a step), one curve per role. Each panel has
its own y axis, fitted to its data as it streams in (the step axes stay linked). The header shows the
last complete step and the run's status, with the error of a failed run. ``poll()`` reads only the
metric rows written since the last poll (by id), so a long run costs the same per poll as a short one;
served or in JupyterLab, a periodic callback polls every ``interval_ms``. Curves stream through
``hv.streams.Pipe``, so a poll redraws only new data.

CSS classes a browser test can find: ``wb-monitor`` (the whole view), ``wb-last-step`` (the header,
whose text is ``step N`` with a ``data-step`` attribute, then ``wb-run-status`` and ``wb-run-error``, see
``widgets.run_status``), ``wb-monitor-plot`` (each plot).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import holoviews as hv
import pandas as pd
import panel as pn
import param

from widgets.live import PeriodicRefresh
from widgets.run_status import run_error, status_html
from workbench.store import RunReader

#: Run-wide rows are stored with no role; their curve is labelled this.
RUN_WIDE = "run"


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
    """The metric rows of one run, read incrementally: each ``poll`` adds the rows with a larger id."""

    def __init__(self, run_dir: str | Path) -> None:
        self.reader = RunReader(run_dir)
        self.last_id = 0
        self.frame = pd.DataFrame(columns=["step", "role", "name", "value"])

    def poll(self) -> int:
        """Read the rows written since the last poll; returns how many arrived."""
        new = self.reader.sql(
            "SELECT m.id, m.step, m.role, m.name, m.value FROM metrics m "
            "JOIN steps s ON s.step = m.step WHERE m.id > ? AND s.status = 'complete' ORDER BY m.id",
            (self.last_id,),
        )
        if new.empty:
            return 0
        self.last_id = int(new["id"].max())
        new["role"] = new["role"].fillna(RUN_WIDE)
        rows = new[["step", "role", "name", "value"]]
        self.frame = rows if self.frame.empty else pd.concat([self.frame, rows], ignore_index=True)
        return len(new)

    def last_step(self) -> int | None:
        return self.reader.last_complete_step()

    def series(self, quantity: Quantity) -> pd.DataFrame:
        """Rows of ``quantity``: step, label (role, or role and metric where the plot draws several metrics).

        The label depends on the quantity, not on the rows so far, so a curve keeps its label as a run goes on.
        """
        rows = self.frame[self.frame["name"].isin(quantity.names)]
        if rows.empty:
            return pd.DataFrame(columns=["step", "label", "value"])
        label = rows["role"] + (" · " + rows["name"] if len(quantity.names) > 1 else "")
        out = pd.DataFrame({"step": rows["step"].astype(int), "label": label, "value": rows["value"]})
        return out.sort_values(["label", "step"]).drop_duplicates(["label", "step"], keep="last")

    def close(self) -> None:
        self.reader.close()


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


class RewardMonitor(PeriodicRefresh, pn.viewable.Viewer):
    """Live per-role curves of one run; display it in a notebook or serve it with Panel."""

    run_dir = param.String(doc="The run directory to follow.")
    interval_ms = param.Integer(default=1000, bounds=(100, None), doc="How often to poll the store.")
    live = param.Boolean(default=True, doc="Poll periodically while displayed.")
    show_error = param.Boolean(default=True, doc="Show a failed run's error in the header.")

    def __init__(self, run_dir: str | Path, **params) -> None:
        super().__init__(run_dir=str(run_dir), **params)
        self.feed = MetricFeed(run_dir)
        self._pipes = {q.title: hv.streams.Pipe(data=self.feed.series(q)) for q in QUANTITIES}
        self._header = pn.pane.HTML("", css_classes=["wb-last-step"], sizing_mode="stretch_width")
        self._plots = [
            pn.pane.HoloViews(
                hv.DynamicMap(
                    lambda data, title=q.title: _overlay(data, title), streams=[self._pipes[q.title]]
                ),
                css_classes=["wb-monitor-plot"],
                sizing_mode="stretch_width",
            )
            for q in QUANTITIES
        ]
        self._callback = None
        self._error: str | None = None
        self.poll()

    def poll(self) -> int:
        """Read new metric rows and push them to the curves; returns how many arrived."""
        arrived = self.feed.poll()
        if arrived:
            for quantity in QUANTITIES:
                self._pipes[quantity.title].send(self.feed.series(quantity))
        step = self.feed.last_step()
        status = self.feed.reader.info()["status"]
        if status == "failed" and self.show_error and self._error is None:  # read once: a failed run stays so
            self._error = run_error(self.feed.reader) or ""
        text = "no step yet" if step is None else f"step {step}"
        self._header.object = (
            f'<span class="wb-step" data-step="{-1 if step is None else step}">{text}</span> '
            + status_html(status, self._error if status == "failed" else None)
        )
        return arrived

    def _tick(self) -> None:
        self.poll()

    def close(self) -> None:
        self.stop()
        self.feed.close()

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live:
            self.start()
        return pn.Column(
            self._header,
            pn.GridBox(*self._plots, ncols=2, sizing_mode="stretch_width"),
            css_classes=["wb-monitor"],
            sizing_mode="stretch_width",
        )

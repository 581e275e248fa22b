"""A run's topology coloured by its signals at a step: a step slider, a measure menu and the diagram (Panel).

    RunGraph(run_dir)                              # in a notebook: the last complete step, by reward/mean
    RunGraph(run_dir, colour_by="accuracy")

Moving the slider over the steps replays the run's signals on the graph; hovering a node lists its role's
numbers (``workbench.analysis.signals``). The dashboard shows one on each run's "Graph" tab.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import panel as pn

from workbench.analysis.signals import (
    ROLE_MEASURES,
    complete_steps,
    graph_signals,
    replay_advantages,
    run_topology_of,
)
from workbench.store import RunReader
from workbench.store.errors import StoreError
from workbench.topology.diagram import to_html

MEASURES = [*ROLE_MEASURES, "replay/advantage"]


class RunGraph(pn.viewable.Viewer):
    """The topology of the run in ``run_dir`` drawn with its signals; ``step`` and ``colour_by`` are widgets."""

    def __init__(self, run_dir: str | Path, colour_by: str = "reward/mean", **params: Any):
        super().__init__(**params)
        self.run_dir = Path(run_dir)
        with RunReader(self.run_dir) as reader:  # read once: the replays beside it do not change by step
            steps, self._advantages = complete_steps(reader), replay_advantages(reader)
        self.step = pn.widgets.DiscreteSlider(name="step", options=steps or [0], value=(steps or [0])[-1])
        self.step.disabled = not steps
        self.colour_by = pn.widgets.Select(name="colour by", options=MEASURES, value=colour_by, width=180)
        self.diagram = pn.pane.HTML(sizing_mode="stretch_width", css_classes=["wb-run-graph"])
        self._topology = None
        self.step.param.watch(lambda _: self.draw(), "value")
        self.colour_by.param.watch(lambda _: self.draw(), "value")
        self.draw()

    def draw(self) -> None:
        """Redraw the diagram for the chosen step and measure (a message where it cannot be drawn)."""
        try:
            self._topology = self._topology or run_topology_of(self.run_dir)
            signals = graph_signals(
                self.run_dir, self.step.value, self.colour_by.value, self._topology, self._advantages
            )
            self.diagram.object = to_html(self._topology, standalone=False, signals=signals)
        except (ValueError, OSError, StoreError) as error:
            self.diagram.object = f'<p class="wb-run-graph-error">No graph: {escape(str(error))}</p>'

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.Row(self.step, self.colour_by), self.diagram, sizing_mode="stretch_width")

"""The TopologyEditor's view of a run's signals: the canvas coloured by what a run measured, for display only.

``show_signals(run_dir, step=None, colour_by="reward/mean")`` colours each role node, and each step running
that role, on the diagram's red-to-green scale with its value in the label and every measure on hover; flow
branches carry the shares of calls that took them, fixed and broke an answer (``workbench.analysis.signals``,
drawn by ``widgets.topology_canvas.with_signals``). A step slider and a measure menu appear while a run is
shown; ``clear_signals()`` takes them off. The spec never changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import panel as pn

from widgets.run_graph import MEASURES  # what the signals can colour the canvas by
from widgets.topology_notices import reported
from workbench.analysis.signals import (
    complete_steps,
    graph_signals,
    replay_advantages,
    run_topology_of,
)
from workbench.store import RunReader
from workbench.topology import Topology
from workbench.topology.diagram import Signals


class RunSignals:
    """A run's signals over a ``TopologyEditor``'s canvas (a mixin: it redraws with the editor's ``_draw``)."""

    signals: Signals | None
    _run: tuple[Path, Topology, dict[str, float]] | None
    _syncing_signals: bool

    def show_signals(
        self, run_dir: str | Path, step: int | None = None, colour_by: str = "reward/mean"
    ) -> None:
        """Colour the canvas by the signals of the run in ``run_dir`` at ``step`` (default: its last complete
        step); a ValueError where the run has no such step or ``colour_by`` is not one of ``MEASURES``."""
        if colour_by not in MEASURES:
            raise ValueError(f"colour_by {colour_by!r}: choose one of {', '.join(MEASURES)}")
        run_dir = Path(run_dir)
        with RunReader(run_dir) as reader:  # the replays beside it do not change by step: read them once
            steps, advantages = complete_steps(reader), replay_advantages(reader)
        topology = run_topology_of(run_dir)
        self.signals = graph_signals(run_dir, step, colour_by, topology, advantages)
        self._run = (run_dir, topology, advantages)
        self._syncing_signals = True
        try:
            self._signal_step.param.update(options=steps, value=steps[-1] if step is None else step)
            self._colour_by.value = colour_by
        finally:
            self._syncing_signals = False
        self._signals_bar.visible = True
        self._draw()

    def _signal_widgets(self, colour_by: str) -> pn.Row:
        """The step slider, measure menu and hide button, shown while a run's signals are."""
        self._signal_step = pn.widgets.DiscreteSlider(label="step", options=[0], value=0, width=240)
        self._colour_by = pn.widgets.Select(label="colour by", options=MEASURES, value=colour_by, width=180)
        self._signal_step.param.watch(self._signal_picked, "value")
        self._colour_by.param.watch(self._signal_picked, "value")
        clear = pn.widgets.Button(label="Hide signals", css_classes=["wb-clear-signals"])
        clear.on_click(lambda _e: self.clear_signals())
        return pn.Row(
            self._signal_step, self._colour_by, clear, visible=False, css_classes=["wb-editor-signals"]
        )

    def clear_signals(self) -> None:
        """Take the run's signals off the canvas."""
        self.signals, self._run = None, None
        self._signals_bar.visible = False
        self._draw()

    @reported
    def _signal_picked(self, _event: Any) -> None:
        if self._syncing_signals or self._run is None:
            return
        run_dir, topology, advantages = self._run
        self.signals = graph_signals(
            run_dir, self._signal_step.value, self._colour_by.value, topology, advantages
        )
        self._draw()

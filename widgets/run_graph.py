"""A run's topology coloured by its signals at a step: a step slider, a measure menu and the diagram (Panel).

    RunGraph(run_dir)                              # in a notebook: the last complete step, by reward/mean
    RunGraph(run_dir, colour_by="accuracy")
    RunGraph(run_dir, on_role=print)               # a click on a node calls on_role(its role)
    RunGraph(run_dir, live=True)                   # the slider follows the steps a running run completes
    graph.play.value = True                        # the "play" toggle: the steps one after another

Moving the slider over the steps replays the run's signals on the graph; hovering a node lists its role's
numbers (``workbench.analysis.signals``); the "play" toggle moves the slider through the steps every
``play_ms`` (from the first when it stands on the last) and lets go at the last; clicking a node sets
``role`` and calls ``on_role(role)`` (the dashboard's "Graph" tab then opens that role's calls on the
"Trajectories" tab). ``refresh()`` adds the
steps completed since (the dashboard calls it on its own poll; ``live=True`` polls every ``interval_ms``):
it reads the run's step through its process-wide ``SharedRun`` (``widgets.shared_poll``), so the store is
asked again only when the run changed. A slider left on the last step moves on to each new one.

The diagram is ``to_html``'s SVG as it is, inside a small ``JSComponent`` (``RoleDiagram``) whose script
reports a click on a ``g.node[data-role]`` to Python (a plain HTML pane sends nothing back).
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import panel as pn
import param
from panel.custom import JSComponent

from widgets.live import PeriodicRefresh
from widgets.shared_poll import shared_run
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


class RoleDiagram(JSComponent):
    """HTML (the diagram) whose nodes are clickable: a click on a node calls each ``on_click(role)``.

    The page sets ``clicked`` and counts ``clicks`` (a property change reaches the server wherever the
    component sits; a custom message sent from a component added to a live page did not)."""

    object = param.String(default="", doc="The diagram's HTML.")
    clicked = param.String(default="", doc="The role of the node last clicked (set by the page).")
    clicks = param.Integer(default=0, doc="How many nodes were clicked (set by the page).")

    _esm = """
    export function render({ model, el }) {
      const show = () => { el.innerHTML = model.object }
      show()
      model.on("object", show)
      el.addEventListener("click", (event) => {
        const node = event.target.closest("g.node[data-role]")
        const role = node ? node.getAttribute("data-role") : ""
        if (role) { model.clicked = role; model.clicks = model.clicks + 1 }
      })
    }
    """
    _stylesheets = [":host g.node[data-role] { cursor: pointer; }"]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.on_click: list[Callable[[str], Any]] = []
        self.param.watch(self._clicked, "clicks")

    def _clicked(self, _event: Any) -> None:
        if self.clicked:  # a role from the page: RunGraph checks that it is one of the topology's
            for callback in list(self.on_click):
                callback(self.clicked)


class RunGraph(PeriodicRefresh, pn.viewable.Viewer):
    """The topology of the run in ``run_dir`` drawn with its signals; ``step`` and ``colour_by`` are widgets."""

    role = param.String(default="", doc="The role of the node last clicked.")
    live = param.Boolean(default=False, doc="Follow the run's new steps every interval_ms while displayed.")
    interval_ms = param.Integer(default=2000, bounds=(200, None), doc="How often a live graph polls.")
    play_ms = param.Integer(default=800, bounds=(100, None), doc="How long play shows each step.")

    def __init__(
        self,
        run_dir: str | Path,
        colour_by: str = "reward/mean",
        on_role: Callable[[str], Any] | None = None,
        **params: Any,
    ):
        super().__init__(**params)
        self.run_dir = Path(run_dir)
        self.on_role = on_role
        with RunReader(self.run_dir) as reader:  # read once: the replays beside it do not change by step
            steps, self._advantages = complete_steps(reader), replay_advantages(reader)
        self._last_step = shared_run(self.run_dir).last_step
        self.step = pn.widgets.DiscreteSlider(name="step", options=steps or [0], value=(steps or [0])[-1])
        self.step.disabled = not steps
        self.colour_by = pn.widgets.Select(name="colour by", options=MEASURES, value=colour_by, width=180)
        self.play = pn.widgets.Toggle(label="▶ play", width=80, align="end", css_classes=["wb-graph-play"])
        self.play.disabled = len(steps) < 2
        self.play.param.watch(self._play, "value")
        self._player: Any = None
        self.diagram = RoleDiagram(sizing_mode="stretch_width", css_classes=["wb-run-graph"])
        self.diagram.on_click.append(self._clicked)
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

    def refresh(self, min_interval: float = 0.0) -> bool:
        """Add the steps the run completed since the last look (a slider on the last step moves to the new
        last); the store is read only when the run's last complete step moved. Returns whether it did."""
        shared = shared_run(self.run_dir)
        shared.refresh(min_interval)
        last = shared.last_step
        if last == self._last_step:
            return False
        self._last_step = last
        with RunReader(self.run_dir) as reader:
            steps = complete_steps(reader)
        if not steps or steps == list(self.step.options):
            return False
        following = self.step.disabled or self.step.value == self.step.options[-1]
        value = steps[-1] if following else self.step.value
        self.step.param.update(options=steps, value=value, disabled=False)
        self.play.disabled = len(steps) < 2
        return True

    def _clicked(self, role: str) -> None:
        roles = set(self._topology.roles) if self._topology is not None else set()
        if role not in roles:  # only the roles drawn: the message comes from the page
            return
        self.role = role
        if self.on_role is not None:
            self.on_role(role)

    def _play(self, event: Any) -> None:
        if not event.new:
            if self._player is not None:
                self._player.stop()
                self._player = None
            return
        options = list(self.step.options)
        if self.step.value == options[-1]:
            self.step.value = options[0]
        self._player = pn.state.add_periodic_callback(self.next_step, period=self.play_ms)

    def next_step(self) -> bool:
        """Show the step after the slider's (what play does each ``play_ms``); at the last, play stops.
        Returns whether the slider moved."""
        options = list(self.step.options)
        at = options.index(self.step.value)
        if at + 1 < len(options):
            self.step.value = options[at + 1]
        if at + 2 >= len(options):
            self.play.value = False
        return at + 1 < len(options)

    def _tick(self) -> None:
        self.refresh(self.interval_ms / 2000)

    def close(self) -> None:
        self.stop()
        self.play.value = False

    def __panel__(self) -> pn.viewable.Viewable:
        if self.live:
            self.start()
        return pn.Column(
            pn.Row(self.step, self.play, self.colour_by), self.diagram, sizing_mode="stretch_width"
        )

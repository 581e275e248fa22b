"""The team dashboard: every run in a directory, with its live curves, trajectories, graph and config.

``Dashboard(runs_dir, role)`` is one person's view (one per browser session when served by
``workbench serve``; displayable in a notebook too). The runs table refreshes every second; selecting
a run opens its status (with a failed run's error), RewardMonitor, TrajectoryBrowser, RunGraph and
config; the status follows the runs table, and the graph's step slider the run's new complete steps. A
click on a node of the graph opens the Trajectories tab on that role's calls at the graph's step
(``show_role``). Operators also get the RunLauncher, while the selected run is active (created or
running) a Stop button for it, and under an open episode the trajectory browser's "Replay from this
call" form (a background ``wb.replay``; the replay run appears in the runs table like any run, and the
form links to it); a viewer's page holds none of them (and the server refuses a viewer's launch, stop
or replay request however it is sent, see ``widgets.operator_api`` and ``RunLauncher.can_operate``).
Apart from those operator actions, the dashboard only reads the run store.

Many sessions cost about one: the runs list and each run's metrics, step and status are read once per
change for all sessions of the process (``widgets.shared_poll``), a session sends its page only what
changed, and a new session's page is cheap: the runs list, the selected run's header and monitor header
come first; a run opened by the page's link (``/?run=``) sends its monitor's plots a moment later (after
any burst of other new sessions got their pages),
and the trajectory browser is built, and reads the store, when its tab is first opened.

CSS classes a browser test can find: ``wb-dashboard``, ``wb-runs`` (the runs table), ``wb-run-view``
(the selected run's tabs), ``wb-role`` (the signed-in role), ``wb-stop-run`` (operators only, active
runs only), ``wb-run-status`` and ``wb-run-error`` (the selected run's status and error).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import panel as pn

from widgets.reward_monitor import RewardMonitor
from widgets.run_launcher import RunLauncher
from widgets.run_status import is_active, status_html
from widgets.shared_poll import RUN_COLUMNS, runs_version
from widgets.shared_poll import runs_table as shared_runs_table

__all__ = ["RUN_COLUMNS", "Dashboard", "runs_table"]

#: The run view's tabs that are built when first shown.
TRAJECTORIES, GRAPH = 1, 2


def runs_table(runs_dir: Path) -> pd.DataFrame:
    """The runs under ``runs_dir``, newest first, with the columns the dashboard shows (``RUN_COLUMNS``).

    Shared by every session (``widgets.shared_poll``): a run's row is read again only when it changed."""
    return shared_runs_table(runs_dir).copy()


def _differs(new: pd.DataFrame, old: pd.DataFrame, column: str, row: int) -> bool:
    """Whether a cell of the runs table changed (missing values equal each other)."""
    a, b = new[column].iloc[row], old[column].iloc[row]
    if pd.isna(a) or pd.isna(b):
        return not (pd.isna(a) and pd.isna(b))
    return bool(a != b)


class Dashboard(pn.viewable.Viewer):
    """One session's view of a runs directory."""

    def __init__(
        self,
        runs_dir: str | Path,
        role: str = "operator",
        user: str = "local",
        can_operate: Callable[[], bool] | None = None,
        refresh_ms: int = 1000,
    ) -> None:
        super().__init__()
        self.runs_dir = Path(runs_dir)
        self.role, self.user = role, user
        self.operator = role == "operator"
        self.can_operate = can_operate or (lambda: self.operator)
        self.refresh_ms = refresh_ms
        self._runs_version = runs_version(self.runs_dir)
        self.table = pn.widgets.Tabulator(
            runs_table(self.runs_dir),
            selectable=1,
            disabled=True,
            show_index=False,
            pagination="local",
            page_size=20,
            sizing_mode="stretch_width",
            css_classes=["wb-runs"],
        )
        self.table.param.watch(self._select, "selection")
        self.run_view = pn.Column(
            pn.pane.Markdown("Select a run."), css_classes=["wb-run-view"], sizing_mode="stretch_width"
        )
        self.selected: Path | None = None
        self._status: str | None = None
        self._run_header = pn.Row(sizing_mode="stretch_width")
        self._views: list[Any] = []
        self._tabs: pn.Tabs | None = None
        self._browser: Any = None
        self._graph: Any = None
        self._trajectories = self._graph_view = pn.Column()
        self._callback = None
        self._shown = False

    # ------------------------------------------------------------------ behaviour
    def refresh(self, min_interval: float = 0.0) -> None:
        """Re-read the runs list, keeping the selected run selected (``min_interval``: reuse the shared
        list if any session read it less than that many seconds ago). Nothing is sent if nothing changed."""
        version = runs_version(self.runs_dir, min_interval)
        if version == self._runs_version:
            return
        self._runs_version = version
        if self._graph is not None:  # a graph opened on a running run follows its new steps
            self._graph.refresh(min_interval)
        frame = runs_table(self.runs_dir)
        current = self.table.value
        if frame.equals(current):
            return
        selected = self.selected.name if self.selected else None
        if list(frame["id"]) == list(current["id"]) and list(frame.columns) == list(current.columns):
            # the same runs: send only the cells that changed (a run's last step, calls, status)
            changes = {
                column: [
                    (i, frame[column].iloc[i])
                    for i in range(len(frame))
                    if _differs(frame, current, column, i)
                ]
                for column in frame.columns
            }
            changed = {c: v for c, v in changes.items() if v}
            if any(pd.isna(value) for cells in changed.values() for _, value in cells):
                self.table.value = frame  # a cell emptied (a run became unreadable): send the table
            else:
                self.table.patch(changed)
        else:
            self.table.value = frame
        if selected in set(frame["id"]):
            self.table.selection = [int(frame.index[frame["id"] == selected][0])]
            if frame.loc[frame["id"] == selected, "status"].iloc[0] != self._status:
                self._show_status()

    def open_run(self, run_id: str) -> None:
        """Show run ``run_id``: its monitor, trajectories and config.

        Only the monitor (the tab shown first) is built now; the trajectory browser is built, and reads
        the store, when its tab is first opened."""
        run_dir = self.runs_dir / run_id
        if self.selected == run_dir:
            return
        for view in self._views:
            getattr(view, "close", lambda: None)()
        self.selected = run_dir
        ids = list(self.table.value["id"])
        if run_id in ids:  # opened by a link or a button: the runs table shows it selected
            self.table.selection = [ids.index(run_id)]
        # a run opened by the page's link (before the page is first shown) sends its plots after the
        # page; a run opened by a click in a shown page, at once
        monitor = RewardMonitor(
            run_dir, interval_ms=max(self.refresh_ms // 2, 100), show_error=False, defer_plots=not self._shown
        )
        self._views = [monitor]
        self._browser = self._graph = None
        self._trajectories = pn.Column(pn.pane.Markdown("Loading…"), sizing_mode="stretch_width")
        self._graph_view = pn.Column(pn.pane.Markdown("Loading…"), sizing_mode="stretch_width")
        self._tabs = pn.Tabs(
            ("Curves", monitor),
            ("Trajectories", self._trajectories),
            ("Graph", self._graph_view),
            ("Config", pn.pane.JSON(monitor.feed.reader.config, depth=2, sizing_mode="stretch_width")),
            dynamic=True,
            sizing_mode="stretch_width",
        )
        self._tabs.param.watch(lambda event: self._open_tab(run_dir, event.new), "active")
        self._show_status()
        self.run_view.objects = [self._run_header, self._tabs]

    def _open_tab(self, run_dir: Path, tab: int) -> None:
        """Build the trajectory browser or the graph (each reads the store) when its tab is first shown."""
        if self.selected != run_dir:
            return
        if tab == TRAJECTORIES:
            self._trajectory_browser()
        elif tab == GRAPH and self._graph is None:
            from widgets.run_graph import RunGraph

            self._graph = RunGraph(run_dir, on_role=self.show_role)
            self._views.append(self._graph)
            self._graph_view.objects = [self._graph]

    def _trajectory_browser(self) -> Any:
        """The selected run's trajectory browser, built on first use."""
        if self._browser is None and self.selected is not None:
            self._browser = self._make_browser(self.selected)
            self._views.append(self._browser)
            self._trajectories.objects = [self._browser]
        return self._browser

    def show_role(self, role: str) -> None:
        """Switch the selected run's view to its Trajectories tab, showing the calls of ``role`` (at the
        graph's step): what a click on a node of the Graph tab does."""
        if self.selected is None:
            return
        step = self._graph.step.value if self._graph is not None and not self._graph.step.disabled else None
        self._tabs.active = TRAJECTORIES
        self._trajectory_browser().show_role(role, step)

    def _make_browser(self, run_dir: Path) -> Any:
        from widgets.replay_form import ReplayForm
        from widgets.trajectory_browser import TrajectoryBrowser

        replay = None
        if self.operator:  # a viewer's page holds no replay form (and the server refuses its requests)
            from widgets.operator_api import MAX_REPLAY_N, checkpoint_steps

            replay = ReplayForm(
                lambda call_id, n, policy: self._replay(run_dir, call_id, n, policy),
                policies=checkpoint_steps(run_dir),
                open_run=self.open_run,
                max_n=MAX_REPLAY_N,
                interval_ms=self.refresh_ms,
            )
        return TrajectoryBrowser(run_dir, replay=replay)

    def _replay(self, run_dir: Path, call_id: int, n: int, policy: str | None) -> Any:
        from widgets.operator_api import start_replay

        # the role is checked again on the server at the moment of the click
        if not self.can_operate():
            raise PermissionError(f"user {self.user!r} may no longer replay calls (only operators may)")
        return start_replay(run_dir, call_id, n, policy)

    def _show_status(self) -> None:
        """Redraw the selected run's header: its status, a failed run's error, Stop while it is active."""
        shared = self._views[0].feed.shared
        shared.refresh()
        run_dir = shared.run_dir if self.selected is None else self.selected
        self._status = shared.status
        error = shared.error if self._status == "failed" else None
        header: list[Any] = [
            pn.pane.Markdown(f"### {run_dir.name}"),
            pn.pane.HTML(status_html(self._status, error), sizing_mode="stretch_width"),
        ]
        if self.operator and is_active(self._status):
            stop = pn.widgets.Button(name="Stop this run", button_type="danger", css_classes=["wb-stop-run"])
            stop.on_click(lambda _e: self._stop(run_dir))
            header.insert(1, stop)
        self._run_header.objects = header

    def _stop(self, run_dir: Path) -> None:
        from workbench.training import BackgroundRun

        # the role is checked again on the server at the moment of the click, and the run must still be going
        if self.can_operate() and is_active(self._status):
            BackgroundRun(run_dir).request_stop()

    def _select(self, event: Any) -> None:
        if event.new:
            self.open_run(str(self.table.value.iloc[event.new[0]]["id"]))

    def start(self) -> None:
        if self._callback is None:
            # a tick reuses the runs list another session read in the last half period
            min_interval = self.refresh_ms / 2000
            self._callback = pn.state.add_periodic_callback(
                lambda: self.refresh(min_interval), period=self.refresh_ms
            )

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        self._shown = True
        self.start()
        who = pn.pane.HTML(
            f'<span data-role="{self.role}">{self.user} · {self.role}</span>', css_classes=["wb-role"]
        )
        runs = pn.Column(pn.Row(pn.pane.Markdown("## Runs"), who), self.table, self.run_view)
        tabs = [("Runs", runs)]
        if self.operator:
            tabs.append(("Launch", RunLauncher(self.runs_dir, can_operate=self.can_operate)))
        tabs.append(("Topology editor", pn.panel(_editor, defer_load=True)))
        return pn.Column(
            pn.Tabs(*tabs, dynamic=True, sizing_mode="stretch_width"),
            css_classes=["wb-dashboard"],
            sizing_mode="stretch_width",
        )


def _editor() -> Any:
    from widgets.topology_editor import TopologyEditor

    return TopologyEditor()

"""The team dashboard: every run in a directory, with its live curves, trajectories and config.

``Dashboard(runs_dir, role)`` is one person's view (one per browser session when served by
``workbench serve``; displayable in a notebook too). The runs table refreshes every second; selecting
a run opens its status (with a failed run's error), RewardMonitor, TrajectoryBrowser and config; the
status follows the runs table. Operators also get the RunLauncher and, while the selected run is active
(created or running), a Stop button for it; a viewer's page holds neither (and the server refuses a
viewer's launch or stop request however it is sent, see ``widgets.operator_api`` and
``RunLauncher.can_operate``). The dashboard only reads the run store.

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
from widgets.run_status import is_active, run_error, status_html

RUN_COLUMNS = ["id", "name", "status", "topology", "last_step", "calls", "created_at"]


def runs_table(runs_dir: Path) -> pd.DataFrame:
    """The runs under ``runs_dir``, newest first, with the columns the dashboard shows."""
    from workbench.store import list_runs

    if not runs_dir.is_dir():
        return pd.DataFrame(columns=RUN_COLUMNS)
    frame = list_runs(runs_dir)
    if frame.empty:
        return pd.DataFrame(columns=RUN_COLUMNS)
    frame = frame[RUN_COLUMNS].iloc[::-1].reset_index(drop=True)
    frame["created_at"] = pd.to_datetime(frame["created_at"], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
    return frame


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
        self._callback = None

    # ------------------------------------------------------------------ behaviour
    def refresh(self) -> None:
        """Re-read the runs list, keeping the selected run selected."""
        frame = runs_table(self.runs_dir)
        if frame.equals(self.table.value):
            return
        selected = self.selected.name if self.selected else None
        self.table.value = frame
        if selected in set(frame["id"]):
            self.table.selection = [int(frame.index[frame["id"] == selected][0])]
            if frame.loc[frame["id"] == selected, "status"].iloc[0] != self._status:
                self._show_status()

    def open_run(self, run_id: str) -> None:
        """Show run ``run_id``: its monitor, trajectories and config."""
        from widgets.trajectory_browser import TrajectoryBrowser

        run_dir = self.runs_dir / run_id
        if self.selected == run_dir:
            return
        for view in self._views:
            getattr(view, "close", lambda: None)()
        self.selected = run_dir
        monitor = RewardMonitor(run_dir, interval_ms=max(self.refresh_ms // 2, 100), show_error=False)
        browser = TrajectoryBrowser(run_dir)
        self._views = [monitor, browser]
        tabs = pn.Tabs(
            ("Curves", monitor),
            ("Trajectories", browser),
            ("Config", pn.pane.JSON(monitor.feed.reader.config, depth=2, sizing_mode="stretch_width")),
            dynamic=True,
            sizing_mode="stretch_width",
        )
        self._show_status()
        self.run_view.objects = [self._run_header, tabs]

    def _show_status(self) -> None:
        """Redraw the selected run's header: its status, a failed run's error, Stop while it is active."""
        reader = self._views[0].feed.reader
        run_dir = reader.run_dir
        self._status = reader.info()["status"]
        error = run_error(reader) if self._status == "failed" else None
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
            self._callback = pn.state.add_periodic_callback(self.refresh, period=self.refresh_ms)

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
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

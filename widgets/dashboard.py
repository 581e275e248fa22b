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
or replay request however it is sent, see ``widgets.server.operator_api`` and ``RunLauncher.can_operate``).
Apart from those operator actions, the dashboard only reads the run store.

Selecting several runs (ctrl- or shift-click in the runs table), with or without committed summaries of the
gallery (``reports/runs/*``, read-only), and pressing "Compare" opens them side by side (``widgets.compare``);
the address bar then holds ``?compare=<run_id>,...,summary:<name>`` (``widgets.compare_link``), and that link
reopens the same comparison.

Many sessions cost about one: the runs list and each run's metrics, step and status are read once per
change for all sessions of the process (``widgets.shared_poll``), a session sends its page only what
changed, and a new session's page is cheap: the runs list, the selected run's header and its Curves tab,
whose plots are drawn once per run and sent as data (``widgets.reward_monitor``); the trajectory browser,
the graph and the config are built, and read the store, when their tab is first opened. Served, a session
polls nothing until its page is drawn (BokehJS's ``document_ready``: the periodic callbacks start then),
and its views are closed (their readers too) when the session ends.

CSS classes a browser test can find: ``wb-dashboard``, ``wb-runs`` (the runs table), ``wb-run-view``
(the selected run's tabs), ``wb-role`` (the signed-in role), ``wb-stop-run`` (operators only, active
runs only), ``wb-run-status`` and ``wb-run-error`` (the selected run's status and error),
``wb-compare-button`` and ``wb-compare-summaries`` (the committed summaries to add), ``wb-compare`` (the
comparison, see ``widgets.compare``).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import panel as pn

from widgets.compare_link import COMPARE_ARG, compare_query, compared_runs
from widgets.live import periodic
from widgets.reward_monitor import RewardMonitor
from widgets.run_launcher import RunLauncher
from widgets.run_status import is_active, status_html
from widgets.shared_poll import RUN_COLUMNS, runs_versions, table_changes
from widgets.shared_poll import runs_table as shared_runs_table

__all__ = ["RUN_COLUMNS", "Dashboard", "runs_table"]

#: The run view's tabs that are built when first shown.
TRAJECTORIES, GRAPH, CONFIG = 1, 2, 3
#: The runs table's columns that move with every step of a running run: sent at most every PROGRESS_S
#: (new runs and status changes at the next tick; the selected run's header shows each step as it comes).
PROGRESS, PROGRESS_S = frozenset({"last_step", "calls"}), 5.0


def runs_table(runs_dir: Path) -> pd.DataFrame:
    """The runs under ``runs_dir``, newest first, with the columns the dashboard shows (``RUN_COLUMNS``).

    Shared by every session (``widgets.shared_poll``): a run's row is read again only when it changed."""
    return shared_runs_table(runs_dir).copy()


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
        self._runs_version, self._structure = runs_versions(self.runs_dir)
        self._graph_version = self._runs_version
        self._runs_frame = shared_runs_table(self.runs_dir)  # the shared list the table shows (never changed)
        self._progress_bucket = int(time.monotonic() // PROGRESS_S)
        self.table = pn.widgets.Tabulator(
            self._runs_frame.copy(),  # the table changes its own frame when patched
            selectable=True,  # a click selects a run, ctrl- or shift-click several (to compare them)
            disabled=True,
            show_index=False,
            pagination="local",
            page_size=20,
            sizing_mode="stretch_width",
            css_classes=["wb-runs"],
        )
        self.table.param.watch(self._select, "selection")
        #: the ids of the runs selected in the table (kept selected as the table changes)
        self._chosen: list[str] = []
        self._restoring = False
        self.compare_button = pn.widgets.Button(
            label="Compare (select several runs)",
            disabled=True,
            css_classes=["wb-compare-button"],
            color="primary",
        )
        self.compare_button.on_click(lambda _e: self.compare_selected())
        self.summaries = pn.widgets.MultiChoice(
            placeholder="add committed summaries (read-only)", options=_summary_options(),
            css_classes=["wb-compare-summaries"], width=360,
        )  # fmt: skip
        self.summaries.param.watch(lambda _e: self._show_compare_button(), "value")
        #: the labels of the runs compared now (run ids, ``summary:<name>``), empty when none is
        self.compared: list[str] = []
        self.run_view = pn.Column(
            pn.pane.HTML("<p>Select a run.</p>"), css_classes=["wb-run-view"], sizing_mode="stretch_width"
        )
        self.selected: Path | None = None
        self._status: str | None = None
        self._run_header = pn.Row(sizing_mode="stretch_width")
        self._views: list[Any] = []
        self._tabs: pn.Tabs | None = None
        self._browser: Any = None
        self._graph: Any = None
        self._trajectories = self._graph_view = self._config_view = pn.Column()
        self._callback = None

    # ------------------------------------------------------------------ behaviour
    def refresh(self, min_interval: float = 0.0) -> None:
        """Re-read the runs list, keeping the selected run selected (``min_interval``: reuse the shared
        list if any session read it less than that many seconds ago). Nothing is sent if nothing changed;
        otherwise only the cells that changed, found once for all the sessions that showed the same lists: a
        run appearing, going or changing status at once, a run's progress at most every PROGRESS_S."""
        version, structure = runs_versions(self.runs_dir, min_interval)
        if version != self._graph_version and self._graph is not None:
            self._graph_version = version
            self._graph.refresh(min_interval)  # a graph opened on a running run follows its new steps
        bucket = int(time.monotonic() // PROGRESS_S)
        if version == self._runs_version or (
            structure == self._structure and bucket == self._progress_bucket
        ):
            return
        self._runs_version, self._structure, self._progress_bucket = version, structure, bucket
        frame = shared_runs_table(self.runs_dir)
        chosen = list(self._chosen)  # a new table value may clear the selection (and so _chosen)
        changes = table_changes(self._runs_frame, frame)
        self._runs_frame = frame
        if changes is None:  # other runs, or a cell emptied (a run became unreadable): the whole table
            self.table.value = frame.copy()
        elif changes:
            self.table.patch(changes)  # a run's last step, calls, status
        else:
            return
        selected = self.selected.name if self.selected else None
        ids = list(frame["id"])
        rows = [ids.index(run) for run in chosen if run in ids]
        if rows:
            self._set_selection(rows)
        if selected in ids and frame["status"].iloc[ids.index(selected)] != self._status:
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
        if self.compared:  # the address bar held the comparison's link: now this run's
            self.compared = []
            _set_query(f"?run={run_id}")
        ids = list(self.table.value["id"])
        if run_id in ids:  # opened by a link or a button: the runs table shows it selected
            self._chosen = [run_id]
            self.table.selection = [ids.index(run_id)]
        monitor = RewardMonitor(run_dir, interval_ms=self.refresh_ms, show_error=False)
        self._views = [monitor]
        self._browser = self._graph = None
        # empty until their tab is first opened (each Panel object a page holds costs the server to build)
        self._trajectories = pn.Column(sizing_mode="stretch_width")
        self._graph_view = pn.Column(sizing_mode="stretch_width")
        self._config_view = pn.Column(sizing_mode="stretch_width")
        self._tabs = pn.Tabs(
            ("Curves", monitor),
            ("Trajectories", self._trajectories),
            ("Graph", self._graph_view),
            ("Config", self._config_view),
            dynamic=True,
            sizing_mode="stretch_width",
        )
        self._tabs.param.watch(lambda event: self._open_tab(run_dir, event.new), "active")
        self._show_status()
        self.run_view.objects = [self._run_header, self._tabs]

    def _open_tab(self, run_dir: Path, tab: int) -> None:
        """Build the trajectory browser, the graph or the config (each reads the store) when its tab is first
        shown."""
        if self.selected != run_dir:
            return
        if tab == TRAJECTORIES:
            self._trajectory_browser()
        elif tab == CONFIG and not self._config_view.objects:
            config = self._views[0].feed.reader.config
            self._config_view.objects = [pn.pane.JSON(config, depth=2, sizing_mode="stretch_width")]
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
            from widgets.replays import MAX_REPLAY_N, checkpoint_steps

            replay = ReplayForm(
                lambda call_id, n, policy: self._replay(run_dir, call_id, n, policy),
                policies=checkpoint_steps(run_dir),
                open_run=self.open_run,
                max_n=MAX_REPLAY_N,
                interval_ms=self.refresh_ms,
            )
        return TrajectoryBrowser(run_dir, replay=replay)

    def _replay(self, run_dir: Path, call_id: int, n: int, policy: str | None) -> Any:
        from widgets.replays import start_replay

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
        name = (
            f'<h3 style="display: inline-block; margin: 0.4em 1em 0.4em 0">{html.escape(run_dir.name)}</h3>'
        )
        header: list[Any] = [
            pn.pane.HTML(name + status_html(self._status, error), sizing_mode="stretch_width")
        ]
        if self.operator and is_active(self._status):
            stop = pn.widgets.Button(label="Stop this run", color="danger", css_classes=["wb-stop-run"])
            stop.on_click(lambda _e: self._stop(run_dir))
            header.append(stop)
        self._run_header.objects = header

    def _stop(self, run_dir: Path) -> None:
        from workbench.training import BackgroundRun

        # the role is checked again on the server at the moment of the click, and the run must still be going
        if self.can_operate() and is_active(self._status):
            BackgroundRun(run_dir).request_stop()

    def _select(self, event: Any) -> None:
        ids = [str(self.table.value.iloc[row]["id"]) for row in event.new]
        self._chosen = ids
        if len(ids) == 1 and not self._restoring:  # a click on one run (not the table kept as it was)
            self.open_run(ids[0])
        self._show_compare_button()

    def _set_selection(self, rows: list[int]) -> None:
        """Select ``rows`` of the table without opening anything (the selection kept as the table changes)."""
        self._restoring = True
        try:
            self.table.selection = rows
        finally:
            self._restoring = False

    def _show_compare_button(self) -> None:
        n = len(self._chosen) + len(self.summaries.value)
        self.compare_button.disabled = n < 2
        self.compare_button.label = f"Compare {n} runs" if n >= 2 else "Compare (select several runs)"

    def compare_selected(self) -> None:
        """Compare the runs selected in the table and the committed summaries chosen beside it."""
        self.compare(self._chosen + [f"summary:{name}" for name in self.summaries.value])

    def compare(self, labels: list[str]) -> None:
        """Show the runs ``labels`` name (run ids of the directory, ``summary:<name>``) side by side, and put
        them in the address bar; names that are neither are ignored (see ``widgets.compare_link``)."""
        from widgets.compare import Compare

        runs = compared_runs(self.runs_dir, ",".join(labels))
        if not runs or list(runs) == self.compared:
            return
        for view in self._views:
            getattr(view, "close", lambda: None)()
        self.selected, self._browser, self._graph, self._tabs = None, None, None, None
        self.compared = list(runs)
        # as often as the run's page: its reads and lines are shared by every view, a tick with nothing new is free
        view = Compare(runs, interval_ms=self.refresh_ms)
        self._views = [view]
        ids = list(self.table.value["id"])
        self._chosen = [label for label in runs if label in ids]
        self._set_selection([ids.index(label) for label in self._chosen])
        self.run_view.objects = [view]
        _set_query(compare_query(self.compared))

    def close(self) -> None:
        """Stop polling and close the selected run's views (what the end of a served session does)."""
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        for view in self._views:
            getattr(view, "close", lambda: None)()
        self._views = []

    def start(self) -> None:
        if self._callback is None:
            # a tick reuses the runs list another session read in the last period
            min_interval = self.refresh_ms / 1000
            self._callback = periodic(lambda: self.refresh(min_interval), self.refresh_ms)

    def _launcher(self) -> RunLauncher:
        return RunLauncher(self.runs_dir, can_operate=self.can_operate)

    # ------------------------------------------------------------------ view
    def __panel__(self) -> pn.viewable.Viewable:
        link = (pn.state.session_args.get(COMPARE_ARG) or [b""])[0]
        if link:  # a link to a comparison: /?compare=<run_id>,...,summary:<name>
            self.compare([link.decode(errors="replace")])
        pn.state.onload(self.start)  # served: once the page is drawn; in a notebook: now
        doc = pn.state.curdoc
        if doc is not None and doc.session_context is not None:
            doc.on_session_destroyed(lambda _context: self.close())
        role, user = html.escape(self.role), html.escape(self.user)
        heading = pn.pane.HTML(
            '<h2 style="display: inline-block; margin: 0.3em 1em 0.3em 0">Runs</h2>'
            f'<span data-role="{role}">{user} · {role}</span>',
            css_classes=["wb-role"],
        )
        hint = pn.pane.HTML("<small>ctrl- or shift-click to select several runs</small>")
        runs = pn.Column(
            heading, self.table, pn.Row(self.compare_button, self.summaries, hint), self.run_view
        )
        tabs = [("Runs", runs)]
        if self.operator:  # built when first opened, as the editor
            tabs.append(("Launch", pn.panel(self._launcher, defer_load=True)))
        tabs.append(("Topology editor", pn.panel(_editor, defer_load=True)))
        return pn.Column(
            pn.Tabs(*tabs, dynamic=True, sizing_mode="stretch_width"),
            css_classes=["wb-dashboard"],
            sizing_mode="stretch_width",
        )


def _summary_options() -> list[str]:
    from workbench.analysis.compare import committed_summaries

    return list(committed_summaries())


def _set_query(query: str) -> None:
    """Put ``query`` in the address bar of a served page (no reload); nothing in a notebook."""
    doc = pn.state.curdoc
    if doc is not None and doc.session_context is not None and pn.state.location is not None:
        pn.state.location.search = query


def _editor() -> Any:
    from widgets.topology_editor import TopologyEditor

    return TopologyEditor()

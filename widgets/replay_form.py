"""Operators' "Replay from this call" under an open episode of the trajectory browser (the dashboard's).

Which of the episode's calls, how many continuations, what plays the call's policy (the run's model or one of
its checkpoints), a button; it launches a background counterfactual replay (``wb.replay``) through the
``launch`` it is given (the dashboard's: ``widgets.replays.start_replay``, after checking the role) and
then shows the replay run's id, its status (re-read while the replay is active) and a link that opens it.
What cannot be replayed is shown with its reason, never raised. A form follows one replay at a time: its
button stays disabled while that replay is active, and a click that reaches the server anyway (a double
click) is refused in the form.

CSS classes a browser test can find: ``wb-replay`` the form, ``wb-replay-call`` ["Call"], ``wb-replay-n``
["Continuations (n)"], ``wb-replay-policy`` ["Plays the call's policy"], ``wb-replay-button``,
``wb-replay-result`` (holding ``wb-replay-run`` with ``data-run`` and ``data-status``, or
``wb-replay-error``) and ``wb-replay-open``.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from typing import Any

import panel as pn

from workbench.store import queries as q
from workbench.training import ACTIVE

_esc = html.escape
log = logging.getLogger("workbench.dashboard")
#: The form's choice that plays the call's policy with the run's own model.
RUN_MODEL = "the run's model"


class ReplayForm(pn.viewable.Viewer):
    """Operators' "Replay from this call" under an open episode: which of its calls, how many
    continuations, what plays the call's policy, a button; then the replay run's id, status and link.

    ``launch(call_id, n, policy)`` starts the replay (``policy`` None: the run's model, else ``"step:K"``,
    one of ``policies``) and returns its ``BackgroundRun``; what it raises is shown in the form, never
    raised. The status is re-read every ``interval_ms`` while the replay is active. ``open_run(run_id)``
    (the dashboard's) opens the replay run in the page; the link opens it in a new tab (``?run=``)."""

    def __init__(
        self,
        launch: Callable[[int, int, str | None], Any],
        policies: list[str] | tuple[str, ...] = (),
        open_run: Callable[[str], Any] | None = None,
        max_n: int = 64,
        interval_ms: int = 1000,
    ) -> None:
        super().__init__()
        self._launch, self._open_run, self.interval_ms = launch, open_run, interval_ms
        self.handle: Any = None
        self._status: str | None = None
        self._callback: Any = None
        self.call = pn.widgets.Select(label="Call", options={}, css_classes=["wb-replay-call"], width=230)
        self.n = pn.widgets.IntInput(
            label="Continuations (n)", value=8, start=1, end=max_n, css_classes=["wb-replay-n"], width=130
        )
        self.policy = pn.widgets.Select(
            label="Plays the call's policy", options=[RUN_MODEL, *policies], css_classes=["wb-replay-policy"],
            width=190,
        )  # fmt: skip
        self.button = pn.widgets.Button(
            label="Replay from this call",
            button_type="primary",
            css_classes=["wb-replay-button"],
            align="end",
        )
        self.button.on_click(lambda _e: self.submit())
        self.result = pn.pane.HTML("", css_classes=["wb-replay-result"], align="center")
        self.open_button = pn.widgets.Button(
            label="Open the replay run", visible=False, css_classes=["wb-replay-open"]
        )
        self.open_button.on_click(lambda _e: self._open())
        self._layout = pn.Column(
            pn.Row(self.call, self.n, self.policy, self.button),
            pn.Row(self.result, self.open_button),
            css_classes=["wb-replay"],
            sizing_mode="stretch_width",
        )

    def set_calls(self, calls: list[q.StoredCall]) -> None:
        """The calls to choose from (an episode's, in tree order), the first chosen."""
        inside = {c.id: f" (in call {c.parent_id})" if c.parent_id is not None else "" for c in calls}
        self.call.options = {f"call {c.id} · {c.role}{inside[c.id]}": c.id for c in calls}
        self.call.value = calls[0].id if calls else None

    def select(self, call_id: int) -> None:
        """Choose call ``call_id`` where it is one of the calls offered (else nothing changes)."""
        if call_id in self.call.options.values():
            self.call.value = call_id

    def submit(self) -> None:
        """Launch the replay of the chosen call; show its run, or what went wrong."""
        if self.handle is not None and self.status in ACTIVE:
            self.follow()
            if self.status in ACTIVE:  # a second click sent before the button was disabled
                log.info("replay of call %s not launched: %s is %s", self.call.value, self.handle.run_dir.name,
                         self.status)  # fmt: skip
                return
        if self.call.value is None:
            self._error("open an episode and choose one of its calls")
            return
        policy = None if self.policy.value == RUN_MODEL else self.policy.value
        self.button.disabled = True
        try:
            handle = self._launch(int(self.call.value), int(self.n.value or 0), policy)
        except Exception as error:  # shown in the page: a request that cannot be replayed is no crash
            expected = isinstance(error, ValueError | LookupError | PermissionError | OSError)
            log.warning("replay of call %s refused: %s", self.call.value, error, exc_info=not expected)
            self._error(f"{type(error).__name__}: {error}")
            self.button.disabled = False
            return
        self.stop()
        self.handle = handle
        self.follow()
        if self.status in ACTIVE:
            self._callback = pn.state.add_periodic_callback(self.follow, period=self.interval_ms)

    @property
    def status(self) -> str | None:
        """The launched replay run's status when last read (None before a launch)."""
        return self._status

    def follow(self) -> None:
        """Show the launched replay's run and its current status (stops following once it ended)."""
        if self.handle is None:
            return
        try:
            self._status = str(self.handle.status)
        except Exception:  # a store being created: shown as it was
            self._status = self._status or "created"
        run_id = self.handle.run_dir.name
        self.result.object = (
            f'<div class="wb-replay-run" data-run="{_esc(run_id)}" data-status="{_esc(self._status)}">'
            f'replay run <a href="?run={_esc(run_id)}" target="_blank">{_esc(run_id)}</a> · '
            f"<b>{_esc(self._status)}</b></div>"
        )
        self.open_button.visible = self._open_run is not None
        self.button.disabled = self._status in ACTIVE
        if self._status not in ACTIVE:
            self.stop()

    def _error(self, message: str) -> None:
        self.result.object = f'<div class="wb-replay-error" style="color:#b00020">{_esc(message)}</div>'
        self.open_button.visible = False

    def _open(self) -> None:
        if self.handle is not None and self._open_run is not None:
            self._open_run(self.handle.run_dir.name)

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None

    close = stop

    def __panel__(self) -> pn.viewable.Viewable:
        return self._layout

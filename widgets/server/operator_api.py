"""The dashboard's operator requests over HTTP: launch, stop, replay; refused to anyone but an operator.

``POST /api/runs`` (a JSON body of RunLauncher fields) starts a rollout or training run; ``POST
/api/runs/<run_id>/stop`` asks a run to stop; ``POST /api/runs/<run_id>/replay`` (``{"call_id": ID,
"n": N, "policy": null | "step:K"}``) starts a background counterfactual replay (``wb.replay``) of one
of the run's calls, stored as a new run in the same runs directory, and answers its id. All
look the session of the signed cookie up on the server (``widgets.server.sessions``) and answer 401 without a
live one and 403 for a viewer, whatever the request says; a malformed request, or a call that cannot
be replayed, gets 400 saying what is wrong, and a replay past ``MAX_ACTIVE_REPLAYS`` running ones gets
429. Bodies must be ``application/json``, which a cross-site form cannot send (no CSRF through a
signed-in browser), and at most ``JSON_BODY_BYTES`` long: a longer one gets 413 before it is read. Without a users file (a dashboard bound to localhost only) the local
user is the operator.

``widgets.replays.start_replay`` (the checks and the launch) is shared with the in-page "Replay from this
call" form of the dashboard's trajectory browser, which also checks the role at the moment of the click.
Each replay is a process of its own with the model loaded, so the server runs at most
``widgets.replays.MAX_ACTIVE_REPLAYS`` at once, whoever asks; the HTTP request's checks run off the server's
event loop.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop

from widgets.replays import REPLAY_ERRORS, TooManyReplays, start_replay
from widgets.server.gate import JSON_BODY_BYTES, SmallBodyHandler
from widgets.server.sessions import Sessions
from workbench.store.errors import StoreError

log = logging.getLogger("workbench.dashboard")


class OperatorHandler(SmallBodyHandler):
    runs_dir: Path
    sessions: Sessions | None
    max_body_bytes = JSON_BODY_BYTES

    def _operator(self) -> str | None:
        """The signed-in operator's name, or None after answering 401/403/413/415."""
        if self.refused:  # the body was too large: answered 413
            return None
        if self.sessions is None:
            user, role = "local", "operator"
        else:
            session = self.sessions.of_request(self.request)
            user, role = (session.user, session.role) if session is not None else (None, None)
        if user is None:
            self._error(401, "sign in first")
            return None
        if role != "operator":
            log.warning("refused %s %s to %s (%s)", self.request.method, self.request.path, user, role)
            self._error(403, f"user {user!r} is a {role}; only operators may launch or stop runs")
            return None
        if not self.request.headers.get("Content-Type", "").startswith("application/json"):
            self._error(415, "send the request as application/json")
            return None
        return user

    def _error(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish({"error": message})

    def _run_dir(self, run_id: str) -> Path | None:
        """The directory of run ``run_id``, or None after answering 400 (a malformed id) or 404."""
        from workbench.store.layout import check_run_id

        try:
            check_run_id(run_id)
        except StoreError as error:
            self._error(400, str(error))
            return None
        run_dir = self.runs_dir / run_id
        if not run_dir.is_dir():
            self._error(404, f"no run {run_id!r} in {self.runs_dir}")
            return None
        return run_dir


class StopHandler(OperatorHandler):
    def post(self, run_id: str) -> None:
        from workbench.training import BackgroundRun

        if self._operator() is None or (run_dir := self._run_dir(run_id)) is None:
            return
        BackgroundRun(run_dir).request_stop()
        self.finish({"run": run_id, "stop": "requested"})


class ReplayHandler(OperatorHandler):
    FIELDS = frozenset({"call_id", "n", "policy"})

    async def post(self, run_id: str) -> None:
        if (user := self._operator()) is None or (run_dir := self._run_dir(run_id)) is None:
            return
        try:
            fields = json.loads(self.body or b"{}")
            if not isinstance(fields, dict) or "call_id" not in fields or set(fields) - self.FIELDS:
                raise ValueError('send {"call_id": ID, "n": N, "policy": null or "step:K"}')
            args = (run_dir, fields["call_id"], fields.get("n", 8), fields.get("policy"))
            handle = await IOLoop.current().run_in_executor(None, start_replay, *args)  # reads the store
        except TooManyReplays as error:
            self._error(429, str(error))
            return
        except REPLAY_ERRORS as error:
            self._error(400, f"{type(error).__name__}: {error}")
            return
        log.info("%s replays call %s of %s as %s", user, fields["call_id"], run_id, handle.run_dir.name)
        self.finish({"run": handle.run_dir.name, "status": handle.status, "source": run_id})


class LaunchHandler(OperatorHandler):
    def post(self) -> None:
        from widgets.run_launcher import RunLauncher

        if self._operator() is None:
            return
        try:
            fields: dict[str, Any] = json.loads(self.body or b"{}")
            launcher = RunLauncher(runs_dir=self.runs_dir, **fields)
            handle = launcher.launch()
        except (ValueError, TypeError) as error:
            self._error(400, f"{type(error).__name__}: {error}")
            return
        self.finish({"run": handle.run_dir.name, "status": launcher.status})


def operator_routes(runs_dir: Path, sessions: Sessions | None) -> list[tuple[str, type, dict]]:
    """Tornado routes for ``pn.serve(extra_patterns=...)``."""
    bound = {"runs_dir": Path(runs_dir), "sessions": sessions}
    return [
        (r"/api/runs/([^/]+)/stop", type("BoundStop", (StopHandler,), bound), {}),
        (r"/api/runs/([^/]+)/replay", type("BoundReplay", (ReplayHandler,), bound), {}),
        (r"/api/runs", type("BoundLaunch", (LaunchHandler,), bound), {}),
    ]

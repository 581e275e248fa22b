"""``workbench serve RUNS_DIR``: the team dashboard on a Panel server, with sign-in off localhost.

Bound to localhost (the default) without a users file, the one local user is an operator. Bound to
any other address, a users file is required (``--users``, see ``widgets.server.access``) and every page,
websocket and operator request needs a live server-side session (``widgets.server.sessions``); viewers read,
operators may also launch and stop runs. The cookie secret comes from ``WORKBENCH_COOKIE_SECRET`` or a
file, else a random one per server start; it is never taken from a URL or written to a log.

In front of Panel and Bokeh stands ``widgets.server.gate``: before sign-in only the login page answers, no URL
makes the server import a module or read a file it names, malformed paths get 400, and no request body
over 64 KB is read (the login form and the JSON API: a few KB). Once a second the server also reads the
users file again if it changed and closes the websockets of sessions that ended (logout, a removed user,
a changed role), so an open tab stops too.

Bokeh copies a page request's cookies and headers into the session token it embeds in the page, where
scripts can read it; the ``HttpOnly`` session cookie would be readable there too. So the cookie and the
``Cookie`` header are kept out of that token, and the token carries the session id instead, signed
under another name (``wb_session``) so that it can never be replayed as the cookie.

Sessions: a Bokeh session whose websocket closed (a tab closed, a client that left, whether or not its page
was ever drawn) asks to be discarded, and the server looks for such sessions every ``SESSION_CHECK_S``
seconds, so it is gone, with its periodic callbacks, within a few seconds (Bokeh's own rule keeps an unused
session 15 s, checked every 17 s). A page whose websocket never opened is discarded after Bokeh's 15 s.
New sessions' pages are built one at a time, in the order asked, each followed by as long again with the
event loop left to the sessions before it (``PacedPages``).

Logs: a viewer who leaves while the server writes to their websocket is no error (``quiet_closed_sockets``:
no traceback), and no cookie value reaches a log (``CookieValuesLeftOut``: tornado's "Invalid cookie
signature" and like warnings name the cookie's value, a tampered one included).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import pandas as pd
import panel as pn
from bokeh.application.handlers.handler import Handler
from bokeh.util.token import get_token_payload
from panel.io.application import build_applications
from tornado.ioloop import PeriodicCallback
from tornado.iostream import StreamClosedError
from tornado.web import create_signed_value, decode_signed_value
from tornado.websocket import WebSocketClosedError

from widgets.server.access import AccessError, PasswordChecks
from widgets.server.gate import MAX_BODY_BYTES, component_route, gate_rule
from widgets.server.login import LoginProvider
from widgets.server.operator_api import operator_routes
from widgets.server.sessions import COOKIE, SESSION_DAYS, Sessions

COOKIE_SECRET_ENV = "WORKBENCH_COOKIE_SECRET"
#: The session id in a Bokeh session's token (signed under this name, so never valid as the cookie).
SESSION_KEY = "wb_session"
#: How often ended sessions lose their open websockets (and the users file is checked for changes).
SWEEP_S = 1.0
#: How often Bokeh discards the sessions whose websocket closed.
SESSION_CHECK_S = 2.0
#: After a page is built, the next waits as long as that took, at most this many seconds.
PAGE_GAP_MAX_S = 0.3
#: Password checks (PBKDF2, off the event loop) that run at once. One: on 2 cores, two checks at once took
#: both cores from the event loop and from a training run beside the server (20 viewers signing in during
#: `workbench train`: trainer watched/unwatched 0.56 and first document p95 4.7-18 s with two, 0.98 and
#: 2.5 s with one, sign-ins queueing a little longer instead; tests/perf/bench_dashboard_load.py).
SIGN_IN_CHECKS = 1
log = logging.getLogger("workbench.dashboard")


class CookieValuesLeftOut(logging.Filter):
    """Tornado's warnings about a signed value it could not verify ("Invalid cookie signature %r", "Expired
    cookie %r", ...) without the value: a cookie, whoever sent it, is not written to a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "cookie" in str(record.msg).lower() and record.args:
            record.args = tuple("(value not logged)" for _ in record.args)
        return True


def quiet_closed_sockets(loop: asyncio.AbstractEventLoop) -> None:
    """Let a write to a websocket that closed end without a traceback: Panel leaves some of its writes'
    futures unawaited, and asyncio logs each one that failed because its viewer left ("Task exception was
    never retrieved ... WebSocketClosedError") when it is collected. Every other error is reported as before."""
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), WebSocketClosedError | StreamClosedError):
            log.debug("a write to a closed websocket was dropped (its viewer left)")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def cookie_secret(path: str | Path | None = None) -> str:
    """The secret that signs session cookies: the environment, a file, or a fresh random one."""
    secret = Path(path).read_text().strip() if path is not None else os.environ.get(COOKIE_SECRET_ENV, "")
    if (secret or path is not None) and len(secret) < 32:
        where = path if path is not None else f"${COOKIE_SECRET_ENV}"
        raise AccessError(f"the cookie secret in {where} is shorter than 32 characters")
    return secret or secrets.token_hex(32)


class SessionUser(Handler):
    """Puts the page request's session id into the new Bokeh session's token (see the module docstring)."""

    def __init__(self, sessions: Sessions) -> None:
        super().__init__()
        self._sessions = sessions

    def modify_document(self, doc: Any) -> None:
        pass  # the dashboard itself is built by Panel's handler

    def process_request(self, request: Any) -> dict[str, Any]:
        session_id = self._sessions.id_in_cookie(request)
        if self._sessions.get(session_id) is None:
            return {}
        return {SESSION_KEY: create_signed_value(self._sessions.secret, SESSION_KEY, session_id).decode()}


class PacedPages(Handler):
    """Builds the pages of new sessions one at a time, in the order they were asked for, each followed by
    as long again (at most ``PAGE_GAP_MAX_S``) with the event loop left to the sessions before it: a page is
    built synchronously on the server's one loop, while a session's websocket, its ``ACK`` and its document
    each need a few turns of that loop. Unpaced, 20 viewers arriving at once all got their documents only
    after the last page was built."""

    def __init__(self) -> None:
        super().__init__()
        self._turn = asyncio.Lock()  # wakes its waiters in the order they came
        self._free_at = 0.0  # loop time from which the next page may be built
        self._since: float | None = None

    def modify_document(self, doc: Any) -> None:  # runs after the dashboard's handler: the page is built
        if self._since is not None:
            now = asyncio.get_running_loop().time()
            self._free_at = now + min(now - self._since, PAGE_GAP_MAX_S)
            self._since = None

    async def on_session_created(self, session_context: Any) -> None:
        loop = asyncio.get_running_loop()
        async with self._turn:
            wait = self._free_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._since = loop.time()  # the page is built right after this returns, with no turn between


def token_session_id(payload: dict[str, Any], secret: str) -> str | None:
    """The session id a Bokeh session token's payload carries, if its signature holds."""
    raw = payload.get(SESSION_KEY)
    value = decode_signed_value(secret, SESSION_KEY, raw, max_age_days=SESSION_DAYS) if raw else None
    return value.decode(errors="replace") if value else None


def session_user(sessions: Sessions | None) -> tuple[str | None, str | None]:
    """(user, role) of the current Panel session, from the live server-side session its token names."""
    if sessions is None:
        return "local", "operator"
    context = pn.state.curdoc.session_context if pn.state.curdoc is not None else None
    payload = context.token_payload if context is not None else {}
    session = sessions.get(token_session_id(payload, sessions.secret))
    return (session.user, session.role) if session is not None else (None, None)


def close_ended(tornado_app: Any, sessions: Sessions) -> int:
    """Close the websockets whose server-side session ended; returns how many were closed."""
    sessions.refresh()
    closed = 0
    for connection in list(getattr(tornado_app, "_clients", ())):  # Bokeh's open websocket connections
        try:
            session_id = token_session_id(get_token_payload(connection.session.token), sessions.secret)
        except Exception:  # a connection being torn down: nothing left to close
            continue
        if sessions.get(session_id) is None:
            connection._socket.close(4001, "signed out")  # Bokeh has no public way to close a connection
            closed += 1
    return closed


def make_app(runs_dir: Path, sessions: Sessions | None) -> Any:
    """The function Panel calls for every new browser session."""
    from widgets.dashboard import Dashboard

    def app() -> Any:
        discard_when_closed(pn.state.curdoc)
        user, role = session_user(sessions)
        if role is None:  # the auth provider lets no such session in; refuse rather than guess
            return pn.pane.Markdown("Not signed in.")
        pn.extension("tabulator")
        dashboard = Dashboard(
            runs_dir,
            role=role,
            user=user or "?",
            can_operate=lambda: session_user(sessions)[1] == "operator",
        )
        run = (pn.state.session_args.get("run") or [b""])[0].decode(errors="replace")
        if _is_run(runs_dir, run):
            dashboard.open_run(run)  # a link to one run: /?run=<run_id>
        return dashboard.__panel__()

    return app


def discard_when_closed(doc: Any) -> None:
    """Have the Bokeh session of ``doc`` discarded at the server's next check once its websocket closes,
    rather than kept for Bokeh's 15 s (Bokeh announces the close to the document as ``connection_lost``)."""
    context = doc.session_context if doc is not None else None
    if context is None:
        return

    def lost(_event: Any) -> None:
        session = getattr(context, "session", None)  # Bokeh's ServerSession
        if session is not None:
            session.request_expiration()  # discarded once it has no connection left

    doc.on_event("connection_lost", lost)


def _is_run(runs_dir: Path, run: str) -> bool:
    """Whether ``run`` (from a URL) names a run directory of ``runs_dir``; anything else is ignored."""
    from workbench.store.errors import StoreError
    from workbench.store.layout import check_run_id

    try:
        check_run_id(run)
    except StoreError:
        return False
    return (runs_dir / run).is_dir() and (runs_dir / run).resolve().parent == runs_dir


def serve(
    runs_dir: str | Path,
    address: str = "127.0.0.1",
    port: int = 5006,
    users_file: str | Path | None = None,
    cookie_secret_file: str | Path | None = None,
    allow_origin: list[str] | None = None,
    show: bool = False,
    start: bool = True,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
) -> Any:
    """Serve the dashboard over ``runs_dir``; returns the server (``start=False``: not yet started).

    ``ssl_certfile`` (PEM, with ``ssl_keyfile`` unless it holds the key) serves HTTPS; the session cookie
    is then ``Secure``.
    """
    runs_dir = Path(runs_dir).resolve()
    if not runs_dir.is_dir():
        raise AccessError(f"no runs directory at {runs_dir}")
    if users_file is None and not is_loopback(address):
        raise AccessError(
            f"serving on {address} (beyond localhost) requires sign-in: pass --users FILE "
            "(create one with `workbench users add FILE NAME --role viewer|operator`)"
        )
    secret = cookie_secret(cookie_secret_file)
    sessions = Sessions(users_file, secret) if users_file is not None else None
    origins = allow_origin or sorted(
        {f"localhost:{port}", f"127.0.0.1:{port}", f"{address}:{port}", f"{socket.gethostname()}:{port}"}
    )
    kwargs: dict[str, Any] = {}
    if ssl_certfile is not None:
        kwargs.update(ssl_certfile=str(ssl_certfile), ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None)
    elif ssl_keyfile is not None:
        raise AccessError("an SSL key file needs its certificate: pass --ssl-certfile too")
    apps = build_applications({"/": make_app(runs_dir, sessions)}, title="Workbench dashboard")
    from widgets.reward_monitor import warm_up

    warm_up()  # before the first session, not during it
    pn.extension("tabulator")
    pn.widgets.Tabulator(pd.DataFrame({"id": ["warm-up"]})).get_root()  # the runs table's first build, too
    apps["/"].add(PacedPages())
    if sessions is not None:
        kwargs["auth_provider"] = LoginProvider(sessions, checks=PasswordChecks(workers=SIGN_IN_CHECKS))
        apps["/"].add(SessionUser(sessions))
    mode = "sign-in required" if sessions else "local only, no sign-in"
    scheme = "https" if ssl_certfile is not None else "http"
    print(f"dashboard for {runs_dir} on {scheme}://{address}:{port}/ ({mode})", flush=True)
    server = pn.serve(
        apps,
        address=address,
        port=port,
        websocket_origin=origins,
        cookie_secret=secret,
        extra_patterns=[component_route(), *operator_routes(runs_dir, sessions)],
        exclude_cookies=[COOKIE],  # kept out of the session token embedded in the page
        exclude_headers=["Cookie"],
        http_server_kwargs={"max_body_size": MAX_BODY_BYTES},
        check_unused_sessions_milliseconds=int(SESSION_CHECK_S * 1000),
        show=show,
        start=False,
        title="Workbench dashboard",
        **kwargs,
    )
    tornado_app = server._tornado  # Bokeh's tornado Application: the gate goes in front of all its routes
    tornado_app.add_handlers(r".*", [gate_rule(sessions)])
    quiet_closed_sockets(server.io_loop.asyncio_loop)
    cookie_warnings = logging.getLogger("tornado.general")
    if not any(isinstance(f, CookieValuesLeftOut) for f in cookie_warnings.filters):
        cookie_warnings.addFilter(CookieValuesLeftOut())
    if sessions is not None:
        sweep = PeriodicCallback(lambda: close_ended(tornado_app, sessions), SWEEP_S * 1000)
        server.io_loop.add_callback(sweep.start)
    if start:
        server.start()
        server.io_loop.start()
    return server

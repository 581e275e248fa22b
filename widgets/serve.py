"""``workbench serve RUNS_DIR``: the team dashboard on a Panel server, with sign-in off localhost.

Bound to localhost (the default) without a users file, the one local user is an operator. Bound to
any other address, a users file is required (``--users``, see ``widgets.access``) and every page,
websocket and operator request needs a signed-in user; viewers read, operators may also launch and
stop runs. The cookie secret comes from ``WORKBENCH_COOKIE_SECRET`` or a file, else a random one per
server start (sessions then end with the server); it is never taken from a URL or written to a log.

Bokeh copies a page request's cookies and headers into the session token it embeds in the page, where
scripts can read it; the ``HttpOnly`` session cookie would be readable there too. So the cookie and the
``Cookie`` header are kept out of that token, and the token carries the signed-in user instead, signed
under another name (``wb_session``) so that it can never be replayed as the cookie.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import panel as pn
from bokeh.application.handlers.handler import Handler
from panel.io.application import build_applications
from tornado.web import create_signed_value, decode_signed_value

from widgets.access import AccessError, Users
from widgets.login import COOKIE, SESSION_DAYS, LoginProvider
from widgets.operator_api import operator_routes

COOKIE_SECRET_ENV = "WORKBENCH_COOKIE_SECRET"
#: The signed-in user in a session's token (signed under this name, so never valid as the cookie).
SESSION_KEY = "wb_session"
log = logging.getLogger("workbench.dashboard")


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
    """Puts the page request's signed-in user into the new session's token (see the module docstring)."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret

    def modify_document(self, doc: Any) -> None:
        pass  # the dashboard itself is built by Panel's handler

    def process_request(self, request: Any) -> dict[str, Any]:
        morsel = request.cookies.get(COOKIE)
        value = (
            decode_signed_value(self._secret, COOKIE, morsel.value, max_age_days=SESSION_DAYS)
            if morsel is not None
            else None
        )
        if not value:
            return {}
        return {SESSION_KEY: create_signed_value(self._secret, SESSION_KEY, value).decode()}


def session_user(users: Users | None, secret: str) -> tuple[str | None, str | None]:
    """(user, role) of the current Panel session, read on the server from the user its token carries."""
    if users is None:
        return "local", "operator"
    context = pn.state.curdoc.session_context if pn.state.curdoc is not None else None
    raw = (context.token_payload if context is not None else {}).get(SESSION_KEY)
    value = decode_signed_value(secret, SESSION_KEY, raw, max_age_days=SESSION_DAYS) if raw else None
    name = value.decode() if value else None
    return name, users.role(name)


def make_app(runs_dir: Path, users: Users | None, secret: str) -> Any:
    """The function Panel calls for every new browser session."""
    from widgets.dashboard import Dashboard

    def app() -> Any:
        user, role = session_user(users, secret)
        if role is None:  # the auth provider lets no such session in; refuse rather than guess
            return pn.pane.Markdown("Not signed in.")
        pn.extension("tabulator")
        dashboard = Dashboard(
            runs_dir,
            role=role,
            user=user or "?",
            can_operate=lambda: session_user(users, secret)[1] == "operator",
        )
        run = (pn.state.session_args.get("run") or [b""])[0].decode()
        if run and (runs_dir / run).is_dir() and (runs_dir / run).resolve().parent == runs_dir:
            dashboard.open_run(run)  # a link to one run: /?run=<run_id>
        return dashboard.__panel__()

    return app


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
    users = Users.load(users_file) if users_file is not None else None
    secret = cookie_secret(cookie_secret_file)
    origins = allow_origin or sorted(
        {f"localhost:{port}", f"127.0.0.1:{port}", f"{address}:{port}", f"{socket.gethostname()}:{port}"}
    )
    kwargs: dict[str, Any] = {}
    if ssl_certfile is not None:
        kwargs.update(ssl_certfile=str(ssl_certfile), ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None)
    elif ssl_keyfile is not None:
        raise AccessError("an SSL key file needs its certificate: pass --ssl-certfile too")
    apps = build_applications({"/": make_app(runs_dir, users, secret)}, title="Workbench dashboard")
    if users is not None:
        kwargs["auth_provider"] = LoginProvider(users)
        apps["/"].add(SessionUser(secret))
    mode = "sign-in required" if users else "local only, no sign-in"
    scheme = "https" if ssl_certfile is not None else "http"
    print(f"dashboard for {runs_dir} on {scheme}://{address}:{port}/ ({mode})", flush=True)
    return pn.serve(
        apps,
        address=address,
        port=port,
        websocket_origin=origins,
        cookie_secret=secret,
        extra_patterns=operator_routes(runs_dir, users),
        exclude_cookies=[COOKIE],  # kept out of the session token embedded in the page
        exclude_headers=["Cookie"],
        show=show,
        start=start,
        title="Workbench dashboard",
        **kwargs,
    )

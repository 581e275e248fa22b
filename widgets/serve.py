"""``workbench serve RUNS_DIR``: the team dashboard on a Panel server, with sign-in off localhost.

Bound to localhost (the default) without a users file, the one local user is an operator. Bound to
any other address, a users file is required (``--users``, see ``widgets.access``) and every page,
websocket and operator request needs a signed-in user; viewers read, operators may also launch and
stop runs. The cookie secret comes from ``WORKBENCH_COOKIE_SECRET`` or a file, else a random one per
server start (sessions then end with the server); it is never taken from a URL or written to a log.
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
from tornado.web import decode_signed_value

from widgets.access import AccessError, Users
from widgets.login import COOKIE, SESSION_DAYS, LoginProvider
from widgets.operator_api import operator_routes

COOKIE_SECRET_ENV = "WORKBENCH_COOKIE_SECRET"
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


def session_user(users: Users | None, secret: str) -> tuple[str | None, str | None]:
    """(user, role) of the current Panel session, read from its signed cookie on the server."""
    if users is None:
        return "local", "operator"
    raw = (pn.state.cookies or {}).get(COOKIE)
    value = decode_signed_value(secret, COOKIE, raw, max_age_days=SESSION_DAYS) if raw else None
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
) -> Any:
    """Serve the dashboard over ``runs_dir``; returns the server (``start=False``: not yet started)."""
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
    if users is not None:
        kwargs["auth_provider"] = LoginProvider(users)
    mode = "sign-in required" if users else "local only, no sign-in"
    print(f"dashboard for {runs_dir} on http://{address}:{port}/ ({mode})", flush=True)
    return pn.serve(
        {"/": make_app(runs_dir, users, secret)},
        address=address,
        port=port,
        websocket_origin=origins,
        cookie_secret=secret,
        extra_patterns=operator_routes(runs_dir, users),
        show=show,
        start=start,
        title="Workbench dashboard",
        **kwargs,
    )

"""The dashboard's login: a Bokeh auth provider with a login page, server-side sessions and lockouts.

Every page and websocket of the server asks ``get_user``, which looks the signed ``wb_user`` cookie's
session id up in ``widgets.server.sessions`` (the gate in ``widgets.server.gate`` has already sent a request without a
live session to ``/login``). The password is checked on a worker thread (``PasswordChecks``), never on
the event loop; failed logins are counted per address and per account, and either one that fails too
often is refused for a while (HTTP 429); a sign-in never fails for others' sign-ins under way (it waits
for them, ``LoginThrottle.begin``). ``/logout`` ends the session on the server, not only in the
browser. After a sign-in the browser goes to ``next`` (kept in a hidden field of the form, so a link to
``/?run=<id>`` survives the login) only if it is a path on this server; anything else goes to ``/``.
Passwords never appear in a URL or a log: the form posts them, and only the user name is logged.
"""

from __future__ import annotations

import html
import logging
from typing import Any
from urllib.parse import unquote, urlsplit

from bokeh.server.auth_provider import AuthProvider
from tornado import httputil
from tornado.web import RequestHandler

from widgets.server.access import ChecksBusy, LoginThrottle, PasswordChecks
from widgets.server.gate import LOGIN_URL, LOGOUT_URL, SmallBodyHandler
from widgets.server.sessions import COOKIE, SESSION_DAYS, Sessions

log = logging.getLogger("workbench.dashboard")

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Workbench dashboard: sign in</title></head>
<body style="font-family: sans-serif; max-width: 22rem; margin: 4rem auto">
<h2>Workbench dashboard</h2>
<p class="wb-login-error" style="color: #b00">{error}</p>
<form method="post" action="{action}" class="wb-login">
<input type="hidden" name="next" value="{next}">
<p><label>User <input name="username" autocomplete="username" required></label></p>
<p><label>Password <input name="password" type="password" autocomplete="current-password" required></label></p>
<p><button type="submit">Sign in</button></p>
</form></body></html>
"""


def safe_next(url: str | None) -> str:
    """``url`` if it is a path on this server (no scheme, no host, however a browser reads it), else ``/``."""
    if not url or len(url) > 2048 or not url.isascii():
        return "/"
    if any(ord(c) <= 0x20 or c in "\x7f\\" for c in url):  # browsers drop tabs and read \ as /
        return "/"
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or not url.startswith("/") or url.startswith("//"):
        return "/"
    if path.startswith("//") or "\\" in path:  # the same, percent-encoded
        return "/"
    return url


class LoginHandler(SmallBodyHandler):
    sessions: Sessions
    throttle: LoginThrottle
    checks: PasswordChecks

    def get(self) -> None:
        self._page("", safe_next(self.get_query_argument("next", "/")))

    def _page(self, error: str, next_url: str, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.write(_PAGE.format(error=html.escape(error), action=LOGIN_URL, next=html.escape(next_url)))

    def _form(self) -> dict[str, str]:
        fields: dict[str, list[bytes]] = {}
        httputil.parse_body_arguments(self.request.headers.get("Content-Type", ""), self.body, fields, {})
        return {name: values[0].decode(errors="replace") for name, values in fields.items() if values}

    async def post(self) -> None:
        if self.refused:  # the body was too large: answered 413
            return
        address = self.request.remote_ip or "?"
        form = self._form()
        name, password = form.get("username", ""), form.get("password", "")
        next_url = safe_next(form.get("next") or self.get_query_argument("next", "/"))
        if self.throttle.locked(address, name):
            log.warning("login refused: %s or user %r is locked out after repeated failures", address, name)
            self._page("Too many failed sign-ins. Try again later.", next_url, status=429)
            return
        if self.checks.busy:
            self.set_header("Retry-After", "5")
            self._page("The server is busy. Try again in a few seconds.", next_url, status=503)
            return
        if not await self.throttle.begin(address, name):  # waits while checks under way could pass the limit
            self._page("Too many failed sign-ins. Try again later.", next_url, status=429)
            return
        user, busy = None, False
        try:
            user = await self.checks.authenticate(self.sessions.users, name, password)
        except ChecksBusy:
            busy = True
        finally:
            self.throttle.end(address, name, failed=user is None and not busy)
        if busy:
            self.set_header("Retry-After", "5")
            self._page("The server is busy. Try again in a few seconds.", next_url, status=503)
            return
        if user is None:
            log.warning("login failed for user %r from %s", name, address)
            self._page("Unknown user or wrong password.", next_url, status=401)
            return
        log.info("login: %s (%s) from %s", user.name, user.role, address)
        self.set_signed_cookie(
            COOKIE,
            self.sessions.create(user),
            expires_days=SESSION_DAYS,
            httponly=True,
            samesite="Strict",
            secure=self.request.protocol == "https",
        )
        self.redirect(next_url)


class LogoutHandler(RequestHandler):
    sessions: Sessions

    def get(self) -> None:
        session = self.sessions.of_request(self.request)
        self.sessions.revoke(self.sessions.id_in_cookie(self.request))
        if session is not None:
            log.info("logout: %s", session.user)
        self.clear_cookie(COOKIE)
        self.redirect(LOGIN_URL)


class LoginProvider(AuthProvider):
    """Panel/Bokeh auth: every request needs a live session of a user in the users file."""

    def __init__(
        self, sessions: Sessions, throttle: LoginThrottle | None = None, checks: PasswordChecks | None = None
    ) -> None:
        self.sessions = sessions
        bound = {
            "sessions": sessions,
            "throttle": throttle or LoginThrottle(),
            "checks": checks or PasswordChecks(),
        }
        self._login = type("BoundLoginHandler", (LoginHandler,), bound)
        self._logout = type("BoundLogoutHandler", (LogoutHandler,), {"sessions": sessions})
        super().__init__()

    def _user(self, handler: RequestHandler) -> str | None:
        session = self.sessions.of_request(handler.request)
        return session.user if session is not None else None

    @property
    def get_user(self) -> Any:
        return self._user

    @property
    def login_url(self) -> str:
        return LOGIN_URL

    @property
    def login_handler(self) -> type[RequestHandler]:
        return self._login

    @property
    def logout_url(self) -> str:
        return LOGOUT_URL

    @property
    def logout_handler(self) -> type[RequestHandler]:
        return self._logout

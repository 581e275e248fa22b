"""The dashboard's login: a Bokeh auth provider with a login page, signed session cookies and lockouts.

Every page and websocket of the server asks ``get_user``; without a valid signed ``wb_user`` cookie
the browser is sent to ``/login``. Failed logins are counted per client address and an address that
fails too often is refused for a while (HTTP 429). Passwords never appear in a URL or a log: the form
posts them, and only the user name is logged.
"""

from __future__ import annotations

import html
import logging
from typing import Any
from urllib.parse import urlparse

from bokeh.server.auth_provider import AuthProvider
from tornado.web import RequestHandler

from widgets.access import LoginThrottle, Users

COOKIE = "wb_user"
LOGIN_URL = "/login"
LOGOUT_URL = "/logout"
SESSION_DAYS = 1

log = logging.getLogger("workbench.dashboard")

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Workbench dashboard: sign in</title></head>
<body style="font-family: sans-serif; max-width: 22rem; margin: 4rem auto">
<h2>Workbench dashboard</h2>
<p class="wb-login-error" style="color: #b00">{error}</p>
<form method="post" action="{action}" class="wb-login">
<p><label>User <input name="username" autocomplete="username" required></label></p>
<p><label>Password <input name="password" type="password" autocomplete="current-password" required></label></p>
<p><button type="submit">Sign in</button></p>
</form></body></html>
"""


def _safe_next(url: str | None) -> str:
    """Only a local path may follow a login (no open redirect)."""
    if not url:
        return "/"
    parsed = urlparse(url)
    if parsed.scheme or parsed.netloc or not url.startswith("/") or url.startswith("//"):
        return "/"
    return url


class LoginHandler(RequestHandler):
    users: Users
    throttle: LoginThrottle

    def get(self) -> None:
        self._page("")

    def _page(self, error: str, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.write(_PAGE.format(error=html.escape(error), action=LOGIN_URL))

    def post(self) -> None:
        address = self.request.remote_ip or "?"
        if self.throttle.locked(address):
            log.warning("login refused: %s is locked out after repeated failures", address)
            self._page("Too many failed sign-ins. Try again later.", status=429)
            return
        name = self.get_body_argument("username", "")
        user = self.users.authenticate(name, self.get_body_argument("password", ""))
        if user is None:
            self.throttle.failed(address)
            log.warning("login failed for user %r from %s", name, address)
            self._page("Unknown user or wrong password.", status=401)
            return
        self.throttle.succeeded(address)
        log.info("login: %s (%s) from %s", user.name, user.role, address)
        self.set_signed_cookie(
            COOKIE,
            user.name,
            expires_days=SESSION_DAYS,
            httponly=True,
            samesite="Strict",
            secure=self.request.protocol == "https",
        )
        self.redirect(_safe_next(self.get_query_argument("next", "/")))


class LogoutHandler(RequestHandler):
    def get(self) -> None:
        self.clear_cookie(COOKIE)
        self.redirect(LOGIN_URL)


def signed_in_user(handler: RequestHandler, users: Users) -> str | None:
    """The user of a request: its signed cookie names a user who is still in the users file."""
    raw = handler.get_signed_cookie(COOKIE, max_age_days=SESSION_DAYS)
    name = raw.decode() if raw else None
    return name if users.role(name) is not None else None


class LoginProvider(AuthProvider):
    """Panel/Bokeh auth: every request needs a signed-in user from ``users``."""

    def __init__(self, users: Users, throttle: LoginThrottle | None = None) -> None:
        self.users = users
        self.throttle = throttle or LoginThrottle()
        self._login = type("BoundLoginHandler", (LoginHandler,), {"users": users, "throttle": self.throttle})
        super().__init__()

    @property
    def get_user(self) -> Any:
        return lambda handler: signed_in_user(handler, self.users)

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
        return LogoutHandler

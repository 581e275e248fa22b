"""The dashboard's sessions, kept on the server: a signed cookie carries only a random session id.

A sign-in creates a session (a random id, the user, the role they signed in with, an expiry a day later)
and sets the id in the signed ``wb_user`` cookie; every page, websocket and operator request looks the
id up here, so a session ends for real: at logout (``revoke``), at its expiry, or when the users file
changes. The file is read again whenever its modification time, size or inode changes (checked on every
lookup): a session whose user was removed or given another role is dropped. While the file cannot be
read, nobody is signed in (the sessions wait, and are checked against the file once it reads again). A
user holds at most ``MAX_SESSIONS_PER_USER`` sessions; a further sign-in ends their oldest.

Sessions are stored under a SHA-256 of their id, so looking one up compares no secret byte by byte and the
table holds no usable id.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tornado.web import decode_signed_value

from widgets.server.access import AccessError, User, Users

COOKIE = "wb_user"
SESSION_DAYS = 1
#: Sessions one user may hold at once; a further sign-in ends their oldest.
MAX_SESSIONS_PER_USER = 50

log = logging.getLogger("workbench.dashboard")


@dataclass(frozen=True)
class Session:
    user: str
    role: str
    expires: float  # time.time()


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """The live sessions of one dashboard, and the users file they are checked against."""

    def __init__(self, users_file: str | Path, secret: str, days: float = SESSION_DAYS) -> None:
        self.path, self.secret, self.lifetime_s = Path(users_file), secret, days * 86400
        self._stamp = self._file_stamp()
        self._users: Users = Users.load(self.path)  # unreadable at start: the server does not start
        self._readable = True
        self._sessions: dict[str, Session] = {}

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    @property
    def users(self) -> Users:
        """The users as the file says now (read again if it changed)."""
        self.refresh()
        return self._users

    def refresh(self) -> None:
        """Read the users file again if it changed, and drop the sessions it no longer allows."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            users = Users.load(self.path)
        except AccessError as error:
            log.error("nobody is signed in until the users file reads again: %s", error)
            self._users, self._readable = Users({}), False
            return
        self._users, self._readable = users, True
        ended = [key for key, session in self._sessions.items() if users.role(session.user) != session.role]
        for key in ended:
            del self._sessions[key]
        log.info("users file %s read again: %d session(s) ended", self.path, len(ended))

    def create(self, user: User) -> str:
        """A new session for ``user``; returns its id (for the signed cookie)."""
        now = time.time()
        for key in [key for key, session in self._sessions.items() if session.expires <= now]:
            del self._sessions[key]
        theirs = sorted((s.expires, key) for key, s in self._sessions.items() if s.user == user.name)
        for _, key in theirs[: max(0, len(theirs) - MAX_SESSIONS_PER_USER + 1)]:
            del self._sessions[key]
        session_id = secrets.token_urlsafe(36)  # 48 characters: no base64 padding, so no quotes in the cookie
        self._sessions[_key(session_id)] = Session(user.name, user.role, now + self.lifetime_s)
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this id, or None (unknown, ended, expired, or its user changed)."""
        if not session_id:
            return None
        self.refresh()
        key = _key(session_id)
        session = self._sessions.get(key)
        if session is None or not self._readable:
            return None
        if session.expires <= time.time() or self._users.role(session.user) != session.role:
            del self._sessions[key]
            return None
        return session

    def revoke(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_key(session_id), None)

    def id_in_cookie(self, request: Any) -> str | None:
        """The session id in a request's signed cookie (tornado's ``HTTPServerRequest``), if the signature holds."""
        morsel = request.cookies.get(COOKIE)
        raw = morsel.value if morsel is not None else None
        value = decode_signed_value(self.secret, COOKIE, raw, max_age_days=SESSION_DAYS) if raw else None
        return value.decode(errors="replace") if value else None

    def of_request(self, request: Any) -> Session | None:
        """The live session a request's cookie names, or None."""
        return self.get(self.id_in_cookie(request))

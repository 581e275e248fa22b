"""Who may use the team dashboard: users with a role, hashed passwords, login with rate limiting.

A users file (JSON) maps each user name to a role and a PBKDF2 password hash, never a password:

    {"users": {"ada": {"role": "operator", "password": "pbkdf2_sha256$600000$<salt>$<hash>"}}}

``workbench users add FILE NAME --role viewer`` writes an entry (the password is read from the
``WORKBENCH_PASSWORD`` environment variable or prompted for). Viewers read; operators may also launch and
stop runs. ``LoginProvider`` plugs into Panel's server (a Bokeh auth provider): a login form, a signed
``HttpOnly``, ``SameSite=Strict`` session cookie (``Secure`` over HTTPS), and a lockout after repeated
failed logins from one address.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import secrets
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("viewer", "operator")
HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 600_000
#: Failed logins from one address within LOCKOUT_WINDOW_S before it is locked out for that long.
MAX_FAILED_LOGINS = 5
LOCKOUT_WINDOW_S = 60.0


class AccessError(ValueError):
    """A users file or user entry that cannot be used, with the reason."""


def hash_password(password: str, iterations: int = HASH_ITERATIONS) -> str:
    if not password:
        raise AccessError("the password is empty")
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the stored hash (constant-time comparison)."""
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != HASH_SCHEME:
            return False
        actual = hashlib.pbkdf2_hmac("sha256", password.encode(), _unb64(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, _unb64(digest))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


class Users:
    """The users of one dashboard, read from a users file."""

    def __init__(self, users: dict[str, User]) -> None:
        self.users = users

    @classmethod
    def load(cls, path: str | Path) -> Users:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise AccessError(
                f"users file {path} does not exist; create it with `workbench users add`"
            ) from None
        except json.JSONDecodeError as error:
            raise AccessError(f"users file {path} is not valid JSON: {error}") from None
        entries = data.get("users") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not entries:
            raise AccessError(f"users file {path} needs a non-empty object 'users'")
        users = {}
        for name, entry in entries.items():
            where = f"users file {path}, user {name!r}"
            if not isinstance(entry, dict):
                raise AccessError(f"{where}: expected an object with 'role' and 'password'")
            role, password = entry.get("role"), entry.get("password")
            if role not in ROLES:
                raise AccessError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
            if not isinstance(password, str) or not password.startswith(HASH_SCHEME + "$"):
                raise AccessError(f"{where}: 'password' must be a {HASH_SCHEME} hash, never a plain password")
            users[name] = User(name, role, password)
        return cls(users)

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None:
            check_password(password, _dummy_hash())  # same work whether or not the name exists
            return None
        return user if check_password(password, user.password_hash) else None

    def role(self, name: str | None) -> str | None:
        user = self.users.get(name or "")
        return None if user is None else user.role


@functools.cache
def _dummy_hash() -> str:
    return hash_password("not-a-password")


def add_user(path: str | Path, name: str, password: str, role: str) -> None:
    """Add or replace ``name`` in the users file at ``path`` (created if missing)."""
    if role not in ROLES:
        raise AccessError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not name or any(c.isspace() for c in name) or name in ("guest", "local"):
        raise AccessError(
            f"user name {name!r} must be non-empty, contain no spaces, and not be guest or local"
        )
    path = Path(path)
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"users": {}}
    data.setdefault("users", {})[name] = {"role": role, "password": hash_password(password)}
    path.write_text(json.dumps(data, indent=2) + "\n")
    path.chmod(0o600)


class LoginThrottle:
    """Counts failed logins per address; an address with too many recent failures is locked out."""

    def __init__(self, limit: int = MAX_FAILED_LOGINS, window_s: float = LOCKOUT_WINDOW_S) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = defaultdict(deque)

    def _recent(self, address: str, now: float) -> deque[float]:
        failures = self._failures[address]
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        return failures

    def locked(self, address: str, now: float | None = None) -> bool:
        return len(self._recent(address, time.monotonic() if now is None else now)) >= self.limit

    def failed(self, address: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._recent(address, now).append(now)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

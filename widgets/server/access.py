"""Who may use the team dashboard: users with a role, hashed passwords, login with rate limiting.

A users file (JSON) maps each user name to a role and a PBKDF2 password hash, never a password:

    {"users": {"ada": {"role": "operator", "password": "pbkdf2_sha256$600000$<salt>$<hash>"}}}

``workbench users add FILE NAME --role viewer`` writes an entry (the password is read from the
``WORKBENCH_PASSWORD`` environment variable or prompted for; the file is replaced in one move, so a
running server never reads half of it). Viewers read; operators may also launch and stop runs.

Hashes are compared in constant time, and an unknown name costs the same hash as a known one.
``PasswordChecks`` runs those hashes (0.2-1 s each) on two worker threads, never on the server's event
loop, and refuses new ones while too many wait. ``LoginThrottle`` locks out, for a minute, both an address
and an account after five failed sign-ins within a minute; a success forgets only the failures of that
account from that address, so signing in to one's own account does not reset the count of guesses at
another. It counts failures only: a sign-in whose check could, failing, pass the limit (its address's or
account's failures plus the checks under way reach it) waits for those checks to end instead of being
refused, so parallel guesses never pass the limit and correct passwords are never refused for anyone's
concurrency, a team behind one address included.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("viewer", "operator")
HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 600_000
#: Failed logins from one address, or for one account, within LOCKOUT_WINDOW_S before it is locked out.
MAX_FAILED_LOGINS = 5
LOCKOUT_WINDOW_S = 60.0
#: Password checks that run at once (on threads: hashlib releases the GIL), and that may wait for one
#: (enough for a team of 20 signing in at once from 20 addresses).
CHECK_WORKERS = 2
MAX_WAITING_CHECKS = 30


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
        if not hmac.compare_digest(scheme, HASH_SCHEME):
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
        """The user if ``password`` is theirs; slow on purpose (one PBKDF2): call it off the event loop."""
        user = self.users.get(name)
        if user is None:
            check_password(password, _UNKNOWN_USER)  # same work whether or not the name exists
            return None
        return user if check_password(password, user.password_hash) else None

    def role(self, name: str | None) -> str | None:
        user = self.users.get(name or "")
        return None if user is None else user.role


#: What an unknown name's password is checked against: a full PBKDF2 that matches no password.
_UNKNOWN_USER = f"{HASH_SCHEME}${HASH_ITERATIONS}${_b64(bytes(16))}${_b64(bytes(32))}"


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
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fresh.touch(mode=0o600)
    fresh.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(fresh, path)  # a running dashboard reloads the file: it sees the old one or the new one


class LoginThrottle:
    """Counts failed logins per address and per account; either with too many recent failures is locked out.

    One failure is one record (time, address, account), kept for ``window_s``: the record count is bounded
    by how fast passwords can be checked, whatever names and addresses a guesser makes up. ``begin`` and
    ``end`` bracket a password check (on the server's event loop): checks under way count against the
    limit only by making the next sign-in wait, never by refusing it.
    """

    def __init__(self, limit: int = MAX_FAILED_LOGINS, window_s: float = LOCKOUT_WINDOW_S) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: deque[tuple[float, str, str | None]] = deque()
        self._checking: Counter[tuple[str, str | None]] = Counter()  # checks under way, by (address, account)
        self._ended: asyncio.Event | None = None  # set when a check ends (waiting sign-ins look again)

    async def begin(self, address: str, account: str | None = None) -> bool:
        """Wait until a failure of this check could not pass the limit, then count it as under way; False
        (nothing counted) when the address or account is locked out."""
        while not self.locked(address, account):
            under_way = [(0.0, *key) for key in self._checking.elements()]  # each as if it failed
            if self._worst(address, account, under_way) < self.limit:
                self._checking[address, account] += 1
                return True
            self._ended = self._ended or asyncio.Event()
            await self._ended.wait()
        return False

    def end(self, address: str, account: str | None, failed: bool) -> None:
        """The check ``begin`` counted has ended: record its failure, or forget that account's failures from
        that address; the sign-ins waiting look again."""
        self._checking[address, account] -= 1
        if not self._checking[address, account]:
            del self._checking[address, account]
        if failed:
            self.failed(address, account)
        else:
            self.succeeded(address, account)
        if self._ended is not None:
            self._ended.set()
            self._ended = None

    def _worst(
        self, address: str, account: str | None, more: list | None = None, now: float | None = None
    ) -> int:
        """The larger of the address's and the account's recent failures (with ``more`` records counted too)."""
        records = [*self._recent(now), *(more or [])]
        from_address = sum(1 for _, where, _ in records if where == address)
        for_account = sum(1 for _, _, name in records if account is not None and name == account)
        return max(from_address, for_account)

    def _recent(self, now: float | None) -> deque[tuple[float, str, str | None]]:
        now = time.monotonic() if now is None else now
        while self._failures and now - self._failures[0][0] > self.window_s:
            self._failures.popleft()
        return self._failures

    def locked(self, address: str, account: str | None = None, now: float | None = None) -> bool:
        """Whether sign-ins from ``address``, or to ``account``, are refused for now."""
        return self._worst(address, account, now=now) >= self.limit

    def failed(self, address: str, account: str | None = None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._recent(now).append((now, address, account))

    def succeeded(self, address: str, account: str | None = None) -> None:
        """Forget the failures of ``account`` from ``address`` (a typo put right), and nothing else."""
        kept = [f for f in self._failures if (f[1], f[2]) != (address, account)]
        self._failures = deque(kept)


class ChecksBusy(RuntimeError):
    """Too many password checks are waiting; the caller should answer 503 and let the client retry."""


class PasswordChecks:
    """Checks passwords on ``workers`` threads, off the event loop, with at most ``waiting`` queued."""

    def __init__(self, workers: int = CHECK_WORKERS, waiting: int = MAX_WAITING_CHECKS) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="wb-password")
        self.limit = workers + waiting
        self.pending = 0

    @property
    def busy(self) -> bool:
        return self.pending >= self.limit

    async def authenticate(self, users: Users, name: str, password: str) -> User | None:
        """``users.authenticate`` on a worker thread; raises ChecksBusy when too many are pending."""
        if self.busy:
            raise ChecksBusy("too many sign-ins at once")
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, users.authenticate, name, password
            )
        finally:
            self.pending -= 1

"""Dashboard access: password hashes, the users file, login throttling, sessions, and when sign-in is required."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time

import pytest
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from widgets.server.access import (
    AccessError,
    LoginThrottle,
    PasswordChecks,
    Users,
    add_user,
    check_password,
    hash_password,
)
from widgets.server.gate import bad_request
from widgets.server.login import safe_next
from widgets.server.serve import cookie_secret, is_loopback, quiet_closed_sockets, serve
from widgets.server.sessions import MAX_SESSIONS_PER_USER, Sessions


def test_hashes_verify_only_the_right_password_and_never_hold_it():
    stored = hash_password("correct horse", iterations=1000)
    assert "correct horse" not in stored and stored.startswith("pbkdf2_sha256$1000$")
    assert check_password("correct horse", stored)
    assert not check_password("correct hors", stored)
    assert hash_password("correct horse", iterations=1000) != stored, "each hash has its own salt"
    assert not check_password("x", "garbage") and not check_password("x", "md5$1$a$b")


def test_users_file_round_trip_and_clear_errors(tmp_path):
    path = tmp_path / "users.json"
    add_user(path, "ada", "s3cret-pass", "operator")
    add_user(path, "bob", "another-pass", "viewer")
    assert "s3cret-pass" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    users = Users.load(path)
    assert users.role("ada") == "operator" and users.role("bob") == "viewer" and users.role("eve") is None
    assert users.authenticate("ada", "s3cret-pass").is_operator
    assert users.authenticate("ada", "wrong") is None and users.authenticate("eve", "s3cret-pass") is None
    with pytest.raises(AccessError, match="role 'admin' is not one of viewer, operator"):
        add_user(path, "carl", "pw", "admin")
    with pytest.raises(AccessError, match="not be guest or local"):
        add_user(path, "guest", "pw", "viewer")
    path.write_text(json.dumps({"users": {"ada": {"role": "operator", "password": "plain"}}}))
    with pytest.raises(AccessError, match="user 'ada': 'password' must be a pbkdf2_sha256 hash"):
        Users.load(path)
    path.write_text("{not json")
    with pytest.raises(AccessError, match="is not valid JSON"):
        Users.load(path)
    with pytest.raises(AccessError, match="does not exist"):
        Users.load(tmp_path / "missing.json")


def test_throttle_locks_an_address_after_repeated_failures_then_forgets():
    throttle = LoginThrottle(limit=3, window_s=60)
    for t in (0, 1, 2):
        assert not throttle.locked("10.0.0.1", f"user{t}", now=t)
        throttle.failed("10.0.0.1", f"user{t}", now=t)
    assert throttle.locked("10.0.0.1", "anyone", now=3)
    assert not throttle.locked("10.0.0.2", "anyone", now=3), "other addresses are not affected"
    assert not throttle.locked("10.0.0.1", "anyone", now=70), "failures older than the window are forgotten"


def test_throttle_locks_an_account_and_a_success_forgets_only_its_own_failures():
    throttle = LoginThrottle(limit=5, window_s=60)
    statuses = []
    for _ in range(
        5
    ):  # the tester's attack: 4 guesses at the operator, then the attacker's own viewer sign-in
        for _ in range(4):
            statuses.append(429 if throttle.locked("10.0.0.9", "ops", now=1) else 401)
            throttle.failed("10.0.0.9", "ops", now=1)
        statuses.append(429 if throttle.locked("10.0.0.9", "vic", now=1) else 302)
        throttle.succeeded("10.0.0.9", "vic")
    assert statuses[:5] == [401] * 4 + [302] and set(statuses[6:]) == {429}, statuses
    assert throttle.locked("10.0.0.7", "ops", now=2), "the guessed account is locked from everywhere"
    assert not throttle.locked("10.0.0.7", "vic", now=2), "other accounts from other addresses are not"
    throttle = LoginThrottle(limit=5, window_s=60)
    for _ in range(4):
        throttle.failed("10.0.0.3", "ada", now=0)
    throttle.succeeded("10.0.0.3", "ada")  # a typo put right
    assert not throttle.locked("10.0.0.3", "ada", now=1) and len(throttle._recent(1)) == 0


def test_throttle_makes_sign_ins_wait_for_checks_under_way_and_refuses_none_for_them():
    """Checks under way hold the next sign-in back (so parallel guesses never pass the limit), never refuse it."""

    async def burst(throttle: LoginThrottle, attempts: list[tuple[str, bool]]) -> list[str]:
        async def sign_in(account: str, correct: bool) -> str:
            if not await throttle.begin("10.0.0.5", account):
                return "429"
            await asyncio.sleep(0.005)  # the password check
            throttle.end("10.0.0.5", account, failed=not correct)
            return "302" if correct else "401"

        return list(await asyncio.gather(*(sign_in(*attempt) for attempt in attempts)))

    throttle = LoginThrottle(limit=3)
    team = [(f"user{i}", True) for i in range(20)] + [("ada", True)] * 6  # a team behind one address
    assert asyncio.run(burst(throttle, team)) == ["302"] * 26
    guesses = asyncio.run(burst(throttle, [(f"guess{i}", False) for i in range(10)]))
    assert sorted(guesses) == ["401"] * 3 + ["429"] * 7, "three guesses checked, then locked out"
    assert throttle.locked("10.0.0.5", "user0") and not throttle._checking


def test_password_checks_run_off_the_event_loop_and_refuse_when_too_many_wait(tmp_path):
    add_user(tmp_path / "users.json", "ada", "s3cret-pass", "operator")
    users, checks = Users.load(tmp_path / "users.json"), PasswordChecks(workers=2, waiting=0)

    async def burst() -> tuple[list, float]:
        attempts = [
            asyncio.ensure_future(checks.authenticate(users, "ada", password))
            for password in ("s3cret-pass", "x", "y")
        ]
        await asyncio.sleep(0)  # all three have started: two run, the third found no room
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        lag = time.perf_counter() - started - 0.01
        return await asyncio.gather(*attempts, return_exceptions=True), lag

    started = time.perf_counter()
    check_password("s3cret-pass", users.users["ada"].password_hash)
    one_check = time.perf_counter() - started
    results, lag = asyncio.run(burst())
    assert results[0].name == "ada" and results[1] is None
    assert type(results[2]).__name__ == "ChecksBusy", "a third check would have to wait: refused"
    assert lag < one_check / 2, f"the event loop stalled {lag:.3f} s (one check takes {one_check:.3f} s)"
    assert checks.pending == 0


def test_only_a_same_origin_path_follows_a_sign_in():
    for kept in ("/", "/?run=20260101-abc", "/a/b?x=1#f"):
        assert safe_next(kept) == kept
    for hostile in (
        "/\\evil.example/",
        "//evil.example/",
        "///evil.example",
        "/%5Cevil.example",
        "/%2F%2Fevil.example",
        "https://evil.example/",
        "javascript:alert(1)",
        "/\t/evil.example",
        "/\n/evil.example",
        " /x",
        "/ü",
        None,
        "",
    ):
        assert safe_next(hostile) == "/", hostile
    for malformed in ("/components/..%2f..%2fetc/x", "/static/a.js%00.txt", "/a%5Cb", "/a/../b"):
        assert bad_request(malformed), malformed
    for arguments in ({"run": [b"\x00"]}, {"bokeh-session-id": [b""]}, {"bokeh-session-id": [b" "]}):
        assert bad_request("/", arguments), arguments
    for script_breaking in (  # Bokeh writes these unescaped into the script /autoload.js serves
        {"bokeh-autoload-element": [b'x");alert(1)//']},
        {"bokeh-autoload-element": [b"x'</script><script>alert(1)</script>"]},
        {"bokeh-app-path": [b'/"+alert(1)+"']},
        {"bokeh-absolute-url": [b'http://h/"-alert(1)-"']},
        {"bokeh-absolute-url": [b"javascript:alert(1)"]},
    ):
        assert bad_request("/autoload.js", script_breaking), script_breaking
    assert not bad_request(
        "/autoload.js",
        {"bokeh-autoload-element": [b"p1002"], "bokeh-app-path": [b"/"],
         "bokeh-absolute-url": [b"http://127.0.0.1:5006/"]},
    )  # fmt: skip
    assert not bad_request("/static/js/bokeh.min.js") and not bad_request("/api/runs/x.y/stop")
    assert not bad_request("/", {"run": [b"a b"], "bokeh-session-id": [b"AbC123-x_y"]})


def test_sessions_end_at_revoke_and_when_the_users_file_drops_or_changes_the_user(tmp_path):
    path = tmp_path / "users.json"
    add_user(path, "ada", "s3cret-pass", "operator")
    add_user(path, "bob", "another-pass", "viewer")
    sessions = Sessions(path, "k" * 40)
    users = sessions.users
    ada, bob = sessions.create(users.users["ada"]), sessions.create(users.users["bob"])
    assert sessions.get(ada).role == "operator" and sessions.get(bob).user == "bob"
    assert len(ada) == 48 and ada != bob and sessions.get("x" * 48) is None
    sessions.revoke(ada)
    assert sessions.get(ada) is None, "a revoked session is gone"
    data = json.loads(path.read_text())
    data["users"]["bob"]["role"] = "operator"
    path.write_text(json.dumps(data))
    assert sessions.get(bob) is None, "a changed role ends the session"
    bob = sessions.create(sessions.users.users["bob"])
    path.write_text("{not json")
    assert sessions.get(bob) is None and sessions.users.users == {}, "an unreadable file lets nobody in"
    path.write_text(json.dumps(data))
    os.utime(path, ns=(1, 1))  # a new stamp even within the file system's time resolution
    assert sessions.get(bob).role == "operator", "and the sessions it still allows come back"
    data["users"].pop("bob")
    path.write_text(json.dumps(data))
    assert sessions.get(bob) is None, "a removed user's session ends"
    many = [sessions.create(sessions.users.users["ada"]) for _ in range(MAX_SESSIONS_PER_USER + 1)]
    assert sessions.get(many[0]) is None and sessions.get(many[-1]) is not None, "the oldest ends first"
    expired = Sessions(path, "k" * 40, days=-1)
    assert expired.get(expired.create(expired.users.users["ada"])) is None, "an expired session ends"


def test_a_write_to_a_closed_websocket_leaves_no_traceback_and_other_errors_still_do(caplog):
    """What the server's event loop reports of a write future nobody awaited (Panel leaves some) once the
    viewer left: nothing for a closed socket, the error with its traceback for anything else."""

    async def fails(error: Exception) -> None:
        raise error

    loop = asyncio.new_event_loop()
    quiet_closed_sockets(loop)
    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            for error in (WebSocketClosedError(), StreamClosedError(), KeyError("a real bug")):
                task = loop.create_task(fails(error))
                loop.run_until_complete(asyncio.wait([task]))
                del task  # collected unretrieved: asyncio reports it to the loop's handler
                gc.collect()
    finally:
        loop.close()
    assert "Task exception was never retrieved" in caplog.text and "KeyError: 'a real bug'" in caplog.text
    assert "WebSocketClosedError" not in caplog.text and "StreamClosedError" not in caplog.text


def test_sign_in_is_required_beyond_localhost(tmp_path, monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")
    with pytest.raises(AccessError, match="requires sign-in: pass --users FILE"):
        serve(tmp_path, address="0.0.0.0", start=False)
    with pytest.raises(AccessError, match="no runs directory"):
        serve(tmp_path / "nope", start=False)
    short = tmp_path / "secret"
    short.write_text("abc")
    with pytest.raises(AccessError, match="shorter than 32 characters"):
        cookie_secret(short)
    monkeypatch.setenv("WORKBENCH_COOKIE_SECRET", "k" * 31)
    with pytest.raises(AccessError, match=r"WORKBENCH_COOKIE_SECRET is shorter than 32"):
        cookie_secret()  # a short secret is refused, not silently replaced
    monkeypatch.setenv("WORKBENCH_COOKIE_SECRET", "k" * 40)
    assert cookie_secret() == "k" * 40
    monkeypatch.delenv("WORKBENCH_COOKIE_SECRET")
    assert len(cookie_secret()) == 64 and cookie_secret() != cookie_secret(), "random per start"

"""Dashboard access: password hashes, the users file, login throttling, and when sign-in is required."""

from __future__ import annotations

import json

import pytest

from widgets.access import AccessError, LoginThrottle, Users, add_user, check_password, hash_password
from widgets.serve import cookie_secret, is_loopback, serve


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
        assert not throttle.locked("10.0.0.1", now=t)
        throttle.failed("10.0.0.1", now=t)
    assert throttle.locked("10.0.0.1", now=3)
    assert not throttle.locked("10.0.0.2", now=3), "other addresses are not affected"
    assert not throttle.locked("10.0.0.1", now=70), "failures older than the window are forgotten"
    throttle.failed("10.0.0.3", now=0)
    throttle.succeeded("10.0.0.3")
    assert len(throttle._recent("10.0.0.3", 1)) == 0


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

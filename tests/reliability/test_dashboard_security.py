"""Dashboard security over HTTP, against a real ``workbench serve`` bound beyond localhost.

What the browser tests (``tests/browser/test_dashboard.py``) already check is not repeated here: a page and
the websocket without a session are refused, an unsigned cookie is refused, a viewer's direct stop and launch
requests answer 403, a form post is refused (415), and the passwords are not in the server's output. This
module adds: the other application routes; the lockout after repeated failed sign-ins (HTTP 429, per
address, not undone by a forwarded-for header); the cookie's flags, including ``Secure`` over real HTTPS;
tampered, foreign, expired and replayed cookies; a viewer's hand-crafted operator requests in other shapes;
and that no password, hash, cookie secret or session cookie appears in the served HTML (the session token
Bokeh embeds in the page included) or in the log.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tornado.web import create_signed_value

from tests.browser.conftest import free_port
from widgets.access import MAX_FAILED_LOGINS, add_user
from workbench.store import RunStore

OPERATOR, VIEWER = ("ops", "operator-password-31"), ("vic", "viewer-password-47")
SECRET = "c" * 24 + "0123456789abcdef"  # the cookie secret the server is given
COOKIE = "wb_user"


@dataclass
class Dashboard:
    """A served dashboard: where it answers, its runs, its log file and the secrets it must keep."""

    port: int
    runs: Path
    run_id: str
    log: Path
    users_file: Path
    process: subprocess.Popen
    scheme: str = "http"
    cafile: Path | None = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict | None = None,
        source: str = "127.0.0.1",
    ) -> tuple[int, http.client.HTTPMessage, str]:
        """One request, redirects not followed, from the loopback address ``source``."""
        if self.scheme == "https":
            context = ssl.create_default_context(cafile=str(self.cafile))
            connection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=30, context=context, source_address=(source, 0)
            )
        else:
            connection = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=30, source_address=(source, 0)
            )
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.headers, response.read().decode(errors="replace")
        finally:
            connection.close()

    def sign_in(self, user: tuple[str, str], source: str = "127.0.0.1") -> tuple[int, str | None]:
        """POST the login form; returns the status and the Set-Cookie header (None if none was set)."""
        form = urllib.parse.urlencode({"username": user[0], "password": user[1]})
        status, headers, _ = self.request(
            "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"}, source
        )
        return status, headers.get("Set-Cookie")

    def cookie(self, user: tuple[str, str]) -> str:
        status, set_cookie = self.sign_in(user)
        assert status == 302 and set_cookie, (status, set_cookie)
        return set_cookie.split(";")[0]  # "wb_user=<signed value>"

    def post_json(self, path: str, cookie: str | None, body: dict | None = None, **headers: str) -> int:
        sent = {"Content-Type": "application/json", **({"Cookie": cookie} if cookie else {}), **headers}
        return self.request("POST", path, json.dumps(body or {}), sent)[0]


def _start(root: Path, *extra: str, scheme: str = "http", cafile: Path | None = None) -> Dashboard:
    runs, users = root / "runs", root / "users.json"
    if not users.exists():
        add_user(users, *OPERATOR, role="operator")
        add_user(users, *VIEWER, role="viewer")
    if not runs.exists():
        with RunStore.create(
            runs, {"kind": "train", "model": "tiny"}, run_id="live", name="live run"
        ) as store:
            store.set_status("running")
    port, log = free_port(), root / f"server-{scheme}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "serve", str(runs), "--port", str(port)]
            + ["--address", "0.0.0.0", "--users", str(users), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "WORKBENCH_COOKIE_SECRET": SECRET},
        )
    dashboard = Dashboard(port, runs, "live", log, users, process, scheme, cafile)
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"the server exited: {log.read_text()}"
        try:
            dashboard.request("GET", "/login")
            return dashboard
        except OSError:
            assert time.monotonic() < deadline, f"the server did not answer within 60 s: {log.read_text()}"
            time.sleep(0.3)


def _stop(dashboard: Dashboard) -> None:
    dashboard.process.terminate()
    try:
        dashboard.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        dashboard.process.kill()
        dashboard.process.wait()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory) -> Iterator[Dashboard]:
    served = _start(tmp_path_factory.mktemp("dashboard"))
    yield served
    _stop(served)


def _secrets(dashboard: Dashboard) -> dict[str, str]:
    """What must never be served or logged: passwords, their hashes, the cookie secret."""
    users = json.loads(dashboard.users_file.read_text())["users"]
    return {
        "operator password": OPERATOR[1],
        "viewer password": VIEWER[1],
        "cookie secret": SECRET,
        **{f"{name}'s password hash": entry["password"] for name, entry in users.items()},
        **{f"{name}'s hash digest": entry["password"].rsplit("$", 1)[1] for name, entry in users.items()},
    }


def _decoded_tokens(page: str) -> list[str]:
    """The payloads of the Bokeh session tokens a page embeds (base64 JSON, part of it zlib-compressed)."""
    decoded = []
    for token in re.findall(r"eyJ[A-Za-z0-9_\-]+", page):  # base64 of '{"' opens every token
        try:
            raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        except ValueError:
            continue  # base64 of something else
        if not isinstance(raw, dict) or "session_id" not in raw:
            continue
        packed = raw.pop("__bk__zlib_", None)
        decoded.append(json.dumps(raw))
        if packed:
            decoded.append(
                zlib.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))).decode()
            )
    return decoded


def test_every_application_route_needs_a_signed_in_user(dashboard):
    for path in ("/", f"/?run={dashboard.run_id}", "/metadata", "/autoload.js?bokeh-autoload-element=x"):
        status, headers, _ = dashboard.request("GET", path)
        assert status in (302, 401, 403), f"{path} answered {status} without a session"
        if status == 302:
            assert "/login" in headers["Location"], headers["Location"]
    status, _, body = dashboard.request("GET", "/login")
    assert status == 200 and 'name="password"' in body, "only the login page answers"


def test_failed_sign_ins_from_one_address_are_locked_out_with_429(dashboard):
    attacker, bystander = "127.0.0.2", "127.0.0.3"
    for address in (attacker, bystander):
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                pytest.skip(f"cannot send from {address} here (Linux routes all of 127.0.0.0/8 to loopback)")
    for attempt in range(MAX_FAILED_LOGINS):
        status, cookie = dashboard.sign_in((OPERATOR[0], f"guess-{attempt}"), source=attacker)
        assert status == 401 and cookie is None, f"attempt {attempt}: {status}"
    status, cookie = dashboard.sign_in(OPERATOR, source=attacker)
    assert status == 429 and cookie is None, "locked out: even the right password is refused for now"
    forwarded = {"X-Forwarded-For": "10.1.2.3", "X-Real-Ip": "10.1.2.3"}
    form = urllib.parse.urlencode({"username": OPERATOR[0], "password": OPERATOR[1]})
    status, _, _ = dashboard.request(
        "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded", **forwarded}, attacker
    )
    assert status == 429, "a forwarded-for header does not give the locked address a fresh count"
    status, cookie = dashboard.sign_in(OPERATOR, source=bystander)
    assert status == 302 and cookie, "another address signs in as usual"


def test_the_session_cookie_is_httponly_samesite_strict_signed_and_not_secure_over_plain_http(dashboard):
    status, set_cookie = dashboard.sign_in(VIEWER)
    assert status == 302
    name, _, value = set_cookie.split(";")[0].partition("=")
    flags = {part.strip().split("=")[0].lower(): part.strip() for part in set_cookie.split(";")[1:]}
    assert name == COOKIE and "httponly" in flags and flags["samesite"].lower() == "samesite=strict"
    assert flags["path"].lower() == "path=/"
    assert "secure" not in flags, "Secure only over HTTPS (a browser would drop it over plain HTTP)"
    assert value.startswith("2|") and value.split("|")[-1] != VIEWER[0], (
        "tornado's signed format, not the name"
    )
    assert VIEWER[1] not in set_cookie


def test_tampered_foreign_expired_and_replayed_cookies_are_refused(dashboard):
    viewer = dashboard.cookie(VIEWER).split("=", 1)[1]
    fields = viewer.split("|")
    name_field = next(
        i for i, f in enumerate(fields) if f.endswith(base64.b64encode(VIEWER[0].encode()).decode())
    )
    as_operator = list(fields)
    as_operator[name_field] = f"4:{base64.b64encode(OPERATOR[0].encode()).decode()}"
    forged = {
        "signature changed": viewer[:-1] + ("0" if viewer[-1] != "0" else "1"),
        "name changed to the operator's": "|".join(as_operator),
        "signed with another secret": create_signed_value("x" * 40, COOKIE, OPERATOR[0]).decode(),
        "older than a session": create_signed_value(
            SECRET, COOKIE, OPERATOR[0], clock=lambda: time.time() - 2 * 86400
        ).decode(),
        "the session token's value replayed": create_signed_value(SECRET, "wb_session", OPERATOR[0]).decode(),
        "unsigned": OPERATOR[0],
    }
    for what, value in forged.items():
        cookie = f"{COOKIE}={value}"
        status, headers, _ = dashboard.request("GET", "/", headers={"Cookie": cookie})
        assert status == 302 and "/login" in headers["Location"], f"{what}: page answered {status}"
        assert dashboard.post_json(f"/api/runs/{dashboard.run_id}/stop", cookie) == 401, what
    assert not (dashboard.runs / dashboard.run_id / "STOP").exists()
    fresh = f"{COOKIE}={create_signed_value(SECRET, COOKIE, VIEWER[0]).decode()}"
    assert dashboard.request("GET", "/", headers={"Cookie": fresh})[0] == 200, (
        "the same recipe, done right, works"
    )


def test_a_viewer_cannot_reach_an_operator_action_with_hand_crafted_requests(dashboard):
    viewer = dashboard.cookie(VIEWER)
    before = sorted(p.name for p in dashboard.runs.iterdir())
    stop = f"/api/runs/{dashboard.run_id}/stop"
    launch = {"mode": "train", "model": "tiny", "topology": "marsrl", "steps": 1, "batch_size": 1}
    assert dashboard.post_json("/api/runs", viewer, launch) == 403
    assert dashboard.post_json(stop, viewer) == 403
    tricks = {
        "charset in the content type": {"Content-Type": "application/json; charset=utf-8"},
        "method override": {"X-HTTP-Method-Override": "POST"},
        "claimed user": {"X-Forwarded-User": OPERATOR[0], "X-Remote-User": OPERATOR[0]},
        "basic auth of the operator, wrong password": {
            "Authorization": "Basic " + base64.b64encode(f"{OPERATOR[0]}:guess".encode()).decode()
        },
        "a second, unsigned cookie": {"Cookie": f"{viewer}; {COOKIE}={OPERATOR[0]}"},
    }
    for what, headers in tricks.items():
        cookie = headers.get("Cookie", viewer)
        others = {k: v for k, v in headers.items() if k != "Cookie"}
        for path, body in ((stop, {}), ("/api/runs", launch), (f"{stop}?user=ops&role=operator", {})):
            status = dashboard.post_json(path, cookie, body, **others)
            assert status in (401, 403), f"{what}: POST {path} answered {status}"
    for method in ("GET", "PUT", "PATCH", "DELETE"):
        for path in (stop, "/api/runs"):
            status = dashboard.request(method, path, json.dumps(launch), {"Cookie": viewer})[0]
            assert status in (403, 405), f"{method} {path} answered {status}"
    for path in (f"{stop}/", "/api/runs/", "//api/runs", "/API/runs", f"/api/runs/{dashboard.run_id}/STOP"):
        assert dashboard.post_json(path, viewer, launch) in (401, 403, 404), path
    assert sorted(p.name for p in dashboard.runs.iterdir()) == before, "no run was launched"
    assert not (dashboard.runs / dashboard.run_id / "STOP").exists(), "no run was stopped"
    operator = dashboard.cookie(OPERATOR)  # the same request from an operator does reach the action
    assert dashboard.post_json(stop, operator) == 200
    (dashboard.runs / dashboard.run_id / "STOP").unlink()


def test_no_password_hash_secret_or_session_cookie_is_served_in_a_page_or_written_to_the_log(dashboard):
    secrets = _secrets(dashboard)
    cookies = {"viewer": dashboard.cookie(VIEWER), "operator": dashboard.cookie(OPERATOR)}
    # a failed sign-in with a real password (the operator's, typed for the viewer) from an address of its own
    assert dashboard.sign_in((VIEWER[0], OPERATOR[1]), source="127.0.0.4")[0] == 401
    pages = {"login page": dashboard.request("GET", "/login")[2]}
    for role, cookie in cookies.items():
        status, _, page = dashboard.request("GET", f"/?run={dashboard.run_id}", headers={"Cookie": cookie})
        assert status == 200
        tokens = _decoded_tokens(page)
        assert tokens, "the page embeds its session token"
        pages[f"{role}'s page"] = page
        pages[f"{role}'s session token"] = "\n".join(tokens)
        secrets[f"{role}'s session cookie"] = cookie.split("=", 1)[1]
    time.sleep(0.5)  # let the server flush its log
    texts = {**pages, "server log": dashboard.log.read_text()}
    assert "login failed" in texts["server log"], "the log does record the failed sign-in (by name)"
    for where, text in texts.items():
        for what, secret in secrets.items():
            assert secret not in text, f"the {what} appears in the {where}"


def test_the_session_cookie_is_secure_over_https(tmp_path):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    served = _start(
        tmp_path, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), scheme="https", cafile=cert
    )
    try:
        status, set_cookie = served.sign_in(OPERATOR)
        assert status == 302 and set_cookie
        flags = [part.strip().lower() for part in set_cookie.split(";")[1:]]
        assert "secure" in flags and "httponly" in flags and "samesite=strict" in flags
        cookie = set_cookie.split(";")[0]
        assert served.request("GET", "/", headers={"Cookie": cookie})[0] == 200
    finally:
        _stop(served)

"""Dashboard security over HTTP, against a real ``workbench serve`` bound beyond localhost.

What the browser tests (``tests/browser/test_dashboard.py``) already check is not repeated here: a page and
the websocket without a session are refused, an unsigned cookie is refused, a viewer's direct stop and launch
requests answer 403, a form post is refused (415), and the passwords are not in the server's output. This
module adds: the other application routes; the lockout after repeated failed sign-ins (HTTP 429, per
address and per account, not undone by a forwarded-for header); the cookie's flags, including ``Secure``
over real HTTPS; tampered, foreign, expired and replayed cookies; a viewer's hand-crafted operator requests
in other shapes; and that no password, hash, cookie secret or session cookie appears in the served HTML
(the session token Bokeh embeds in the page included) or in the log.

And the promises a tester's attacks once broke: no URL makes the server import a module, read a file it
names or answer 500 (Panel's ``/components/<module>/...`` route imported whatever a URL named, before any
sign-in check); before sign-in only the login page answers; the lockout counts per account and per address
and another account's success resets neither; password checks run off the event loop; ``next`` after a
sign-in is only ever a same-origin path, and a deep link survives the login form; large bodies are refused
before they are read; sessions live on the server, so a logout, a removed user or a changed role ends them
(an open websocket included).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from tornado.httpclient import HTTPRequest
from tornado.web import create_signed_value, decode_signed_value
from tornado.websocket import websocket_connect

from tests.browser.conftest import free_port
from widgets.server.access import HASH_ITERATIONS, MAX_FAILED_LOGINS, add_user, hash_password
from workbench.store import RunStore

OPERATOR, VIEWER = ("ops", "operator-password-31"), ("vic", "viewer-password-47")
TARGET = ("tia", "target-password-59")  # the account the per-account lockout test locks
LEAVER = ("rex", "leaver-password-61")  # the user whose role changes and who is then removed
PROBE = "wb_import_probe"  # a module on the server's path that leaves a mark when imported
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

    def log_since(self, offset: int) -> str:
        time.sleep(0.5)  # let the server flush its log
        return self.log.read_text()[offset:]


def _start(root: Path, *extra: str, scheme: str = "http", cafile: Path | None = None) -> Dashboard:
    runs, users = root / "runs", root / "users.json"
    if not users.exists():
        add_user(users, *OPERATOR, role="operator")
        for user in (VIEWER, TARGET, LEAVER):
            add_user(users, *user, role="viewer")
    probe = root / "probe"
    probe.mkdir(exist_ok=True)
    (probe / f"{PROBE}.py").write_text(f"open({str(probe / 'imported')!r}, 'w').close()\n")
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
            env={
                **os.environ,
                "WORKBENCH_COOKIE_SECRET": SECRET,
                "PYTHONPATH": os.pathsep.join([str(probe), os.environ.get("PYTHONPATH", "")]),
            },
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


def _need_addresses(*addresses: str) -> None:
    for address in addresses:
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                pytest.skip(f"cannot send from {address} here (Linux routes all of 127.0.0.0/8 to loopback)")


def test_before_sign_in_only_the_login_page_answers(dashboard):
    for path in ("/", f"/?run={dashboard.run_id}", "/metadata", "/autoload.js?bokeh-autoload-element=x"):
        status, headers, _ = dashboard.request("GET", path)
        assert status in (302, 401, 403), f"{path} answered {status} without a session"
        if status == 302:
            assert "/login" in headers["Location"], headers["Location"]
    for path in (
        "/static/js/bokeh.min.js",
        "/static/extensions/panel/panel.min.js",
        "/components/panel_reactflow.base/ReactFlow/_stylesheets/dist/css/reactflow.css",
        "/ws",
        "/api/runs",
        "/api/runs/x/replay",
        "/no-such-page",
    ):
        for method in ("GET", "POST"):
            status = dashboard.request(method, path)[0]
            assert status in (302, 401), f"{method} {path} answered {status} without a session"
    status, _, body = dashboard.request("GET", "/login")
    assert status == 200 and 'name="password"' in body, "only the login page answers"


def test_no_url_imports_a_module_reads_a_named_file_or_answers_500(dashboard):
    probe = dashboard.log.parent / "probe" / "imported"
    offset = len(dashboard.log.read_text())
    hostile = [
        f"/components/{PROBE}/x/_css/y",
        f"/components/{PROBE}/Thing/_stylesheets/x.css",
        "/components/this/x/_css/y",
        "/components/..%2f..%2fetc/x/_css/passwd",
        "/components/os/path/_css/x",
        "/components/panel/x/_resources/",
        "/components/x",
        "/static/extensions/panel/panel.min.js%00.txt",
        "/static/..%2f..%2fetc/passwd",
        "/%00",
        "/%5c..%5c..%5cetc/passwd",
        "/?bokeh-session-id=%20",
        "/?bokeh-token=x",
        "/?bokeh-absolute-url=%ff",
        "/?run=%ff",
        "/autoload.js?bokeh-autoload-element=x&bokeh-session-id=",
        "/components/venv.__main__/x/_css/y",  # importing it ended the server process
    ]
    viewer = dashboard.cookie(VIEWER)
    assert dashboard.request("GET", "/", headers={"Cookie": viewer})[0] == 200  # the app's modules are loaded
    for path in hostile:
        status = dashboard.request("GET", path)[0]
        assert status in (302, 400, 401, 404), f"GET {path} without a session answered {status}"
        status = dashboard.request("GET", path, headers={"Cookie": viewer})[0]
        assert status in (400, 403, 404), f"GET {path} signed in answered {status}"
    status = dashboard.request("GET", "/autoload.js?bokeh-autoload-element=x")[0]
    assert status in (302, 401), status
    long_link = f"/?run={'a' * 300}"  # no such run: the page opens without it
    assert dashboard.request("GET", long_link, headers={"Cookie": viewer})[0] == 200
    assert dashboard.process.poll() is None, "the server is still up"
    log = dashboard.log_since(offset)
    assert not probe.exists(), "a URL made the server import a module"
    assert "Zen of Python" not in log, "a URL made the server import `this`"
    assert "Traceback" not in log and not re.search(r"^500 ", log, re.M), log


def test_arguments_bokeh_writes_into_a_script_cannot_break_it(dashboard):
    """``/autoload.js`` writes ``bokeh-autoload-element`` (and the app path and absolute URL) unescaped into the
    script it serves a signed-in session: a value that could end the string or the script is refused."""
    viewer = {"Cookie": dashboard.cookie(VIEWER)}
    payload = 'x"); alert(document.cookie); //</script><script>alert(1)</script>'
    for argument in ("bokeh-autoload-element", "bokeh-app-path", "bokeh-absolute-url"):
        query = urllib.parse.urlencode({"bokeh-autoload-element": "wb1", argument: payload})
        status, _, body = dashboard.request("GET", f"/autoload.js?{query}", headers=viewer)
        assert status == 400 and "alert" not in body, f"{argument}: {status} {body[:200]}"
    status, headers, script = dashboard.request(
        "GET", "/autoload.js?bokeh-autoload-element=wb1", headers=viewer
    )
    assert status == 200 and "javascript" in headers["Content-Type"], status
    assert 'getElementById("wb1")' in script, "a plain element id still gets its script"


def test_failed_sign_ins_from_one_address_lock_it_out_and_another_accounts_success_resets_nothing(dashboard):
    attacker, bystander = "127.0.0.2", "127.0.0.3"
    _need_addresses(attacker, bystander)
    for attempt in range(MAX_FAILED_LOGINS - 1):  # one wrong guess per account: only the address adds up
        status, cookie = dashboard.sign_in((f"nobody-{attempt}", "guess"), source=attacker)
        assert status == 401 and cookie is None, f"attempt {attempt}: {status}"
    status, cookie = dashboard.sign_in(VIEWER, source=attacker)
    assert status == 302 and cookie, "the attacker's own account signs in..."
    status, _ = dashboard.sign_in(("nobody-last", "guess"), source=attacker)
    assert status == 401, "...but that does not reset the address's count"
    for user in (VIEWER, OPERATOR, ("nobody-0", "guess")):
        status, cookie = dashboard.sign_in(user, source=attacker)
        assert status == 429 and cookie is None, f"{user[0]} from the locked address: {status}"
    forwarded = {"X-Forwarded-For": "10.1.2.3", "X-Real-Ip": "10.1.2.3"}
    form = urllib.parse.urlencode({"username": OPERATOR[0], "password": OPERATOR[1]})
    status, _, _ = dashboard.request(
        "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded", **forwarded}, attacker
    )
    assert status == 429, "a forwarded-for header does not give the locked address a fresh count"
    status, cookie = dashboard.sign_in(VIEWER, source=bystander)
    assert status == 302 and cookie, "another address signs in as usual"


def test_failed_sign_ins_for_one_account_from_many_addresses_lock_that_account(dashboard):
    guessers = [f"127.0.0.{5 + i}" for i in range(MAX_FAILED_LOGINS)]
    elsewhere = "127.0.0.10"
    _need_addresses(*guessers, elsewhere)
    for address in guessers:  # one wrong guess per address: only the account adds up
        assert dashboard.sign_in((TARGET[0], f"guess-from-{address}"), source=address)[0] == 401
    status, cookie = dashboard.sign_in(TARGET, source=elsewhere)
    assert status == 429 and cookie is None, "the account is locked, even from a fresh address"
    status, cookie = dashboard.sign_in(VIEWER, source=elsewhere)
    assert status == 302 and cookie, "other accounts sign in as usual from there"


def test_twenty_simultaneous_correct_sign_ins_from_one_address_all_succeed(dashboard):
    """A team behind one NAT signs in at once: every correct password gets in, none is refused for the others'."""
    office = "127.0.0.20"
    _need_addresses(office)
    team = [(f"team{i}", "team-password-73") for i in range(20)]
    stored = hash_password(team[0][1], iterations=100_000)  # a check long enough for all 20 to overlap
    _rewrite_users(
        dashboard, lambda users: users.update({n: {"role": "viewer", "password": stored} for n, _ in team})
    )
    start = threading.Barrier(len(team))

    def sign_in(user: tuple[str, str]) -> int:
        start.wait()
        return dashboard.sign_in(user, source=office)[0]

    with ThreadPoolExecutor(len(team)) as pool:
        statuses = list(pool.map(sign_in, team))
    assert statuses == [302] * len(team), statuses
    assert dashboard.sign_in(("team0", "a wrong guess"), source=office)[0] == 401, (
        "a wrong one still does not"
    )


def test_password_checks_do_not_hold_up_other_requests(dashboard):
    senders = [f"127.0.0.{11 + i}" for i in range(4)]
    _need_addresses(*senders)
    started = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"a guess", b"0123456789abcdef", HASH_ITERATIONS)
    one_check = time.perf_counter() - started
    statuses: list[int] = []
    guessers = [
        threading.Thread(target=lambda a=a: statuses.append(dashboard.sign_in((f"slow-{a}", "guess"), a)[0]))
        for a in senders
    ]
    for thread in guessers:
        thread.start()
    time.sleep(0.02)
    waits = []
    while any(thread.is_alive() for thread in guessers):
        sent = time.perf_counter()
        assert dashboard.request("GET", "/login")[0] == 200
        waits.append(time.perf_counter() - sent)
    for thread in guessers:
        thread.join()
    assert statuses == [401] * len(senders)
    # checks run on the event loop would make some request wait out a whole check (four queued ones: several);
    # off the loop, a request waits for nothing but the 2 shared cores (one wait of 0.7 checks seen under load)
    typical = sorted(waits)[len(waits) // 2]
    assert waits and max(waits) < one_check and typical < 0.25 * one_check, (
        f"cheap requests waited {typical:.3f} s (median) and {max(waits):.3f} s (longest) behind sign-ins "
        f"(one PBKDF2 takes {one_check:.3f} s)"
    )


def test_sign_in_redirects_only_to_a_same_origin_path_and_keeps_a_deep_link(dashboard):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    credentials = {"username": VIEWER[0], "password": VIEWER[1]}
    for hostile in (
        "/\\evil.example/",
        "//evil.example/",
        "https://evil.example/",
        "/\t/evil.example",
        "///evil",
    ):
        query = urllib.parse.urlencode({"next": hostile})
        status, headers, _ = dashboard.request(
            "POST", f"/login?{query}", urllib.parse.urlencode(credentials), form
        )
        refused = status == 400  # a control character in the URL: a malformed request
        assert refused or (status == 302 and headers["Location"] == "/"), (
            f"next={hostile!r} sent the browser to {headers['Location']}"
        )
        body = urllib.parse.urlencode({**credentials, "next": hostile})
        status, headers, _ = dashboard.request("POST", "/login", body, form)
        assert status == 302 and headers["Location"] == "/", (
            f"next={hostile!r} in the form: {headers['Location']}"
        )
    deep = f"/?run={dashboard.run_id}"
    status, headers, _ = dashboard.request("GET", deep)
    assert status == 302
    login = headers["Location"]
    status, _, page = dashboard.request("GET", login if login.startswith("/") else "/" + login.lstrip("./"))
    hidden = re.search(r'<input[^>]*name="next"[^>]*value="([^"]*)"', page) or re.search(
        r'<input[^>]*value="([^"]*)"[^>]*name="next"', page
    )
    assert status == 200 and hidden, "the login form carries the page the browser asked for"
    body = urllib.parse.urlencode({**credentials, "next": hidden.group(1).replace("&amp;", "&")})
    status, headers, _ = dashboard.request("POST", "/login", body, form)
    assert status == 302 and headers["Location"] == deep, headers["Location"]


def _answer_before_the_body(dashboard: Dashboard, path: str, headers: dict[str, str]) -> int | None:
    """Declare a 99 MB body, send its first KB and wait up to 5 s: the status, or None while the server reads."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{dashboard.port}\r\nContent-Length: 99000000\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=5) as connection:
        connection.sendall(head.encode() + b"x" * 1024)
        try:
            answer = connection.recv(64)
        except TimeoutError:
            return None
    found = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    return int(found.group(1)) if found else None


def test_large_bodies_are_refused_before_they_are_read(dashboard):
    viewer = dashboard.cookie(VIEWER)
    json_type, form_type = (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    cases = {
        "POST /api/runs without a session": ("/api/runs", json_type, (401, 413)),
        "POST /login": ("/login", form_type, (413,)),
        "POST /api/runs as a viewer": ("/api/runs", {**json_type, "Cookie": viewer}, (413,)),
        "POST /api/runs/<id>/stop as a viewer": (
            f"/api/runs/{dashboard.run_id}/stop",
            {**json_type, "Cookie": viewer},
            (413,),
        ),
        "POST /api/runs/<id>/replay as a viewer": (
            f"/api/runs/{dashboard.run_id}/replay",
            {**json_type, "Cookie": viewer},
            (413,),
        ),
        "POST / as a viewer": ("/", {**form_type, "Cookie": viewer}, (400, 405, 413)),
    }
    for what, (path, headers, expected) in cases.items():
        status = _answer_before_the_body(dashboard, path, headers)
        assert status in expected, f"{what}: {status or 'no answer within 5 s (the server reads the body)'}"
    padded = urllib.parse.urlencode({"username": VIEWER[0], "password": VIEWER[1], "pad": "x" * 8192})
    assert dashboard.request("POST", "/login", padded, form_type)[0] == 413, (
        "a login form is a few KB at most"
    )
    assert dashboard.process.poll() is None


def test_logout_ends_the_session_on_the_server(dashboard):
    cookie = dashboard.cookie(VIEWER)
    assert dashboard.request("GET", "/", headers={"Cookie": cookie})[0] == 200
    status, headers, _ = dashboard.request("GET", "/logout", headers={"Cookie": cookie})
    assert status == 302 and "/login" in headers["Location"]
    status, headers, _ = dashboard.request("GET", "/", headers={"Cookie": cookie})
    assert status == 302 and "/login" in headers["Location"], (
        f"the logged-out cookie still opens the page ({status})"
    )
    assert dashboard.post_json(f"/api/runs/{dashboard.run_id}/stop", cookie) == 401


def _rewrite_users(dashboard: Dashboard, change) -> None:
    """Edit the users file as an administrator would (a new file moved into place)."""
    data = json.loads(dashboard.users_file.read_text())
    change(data["users"])
    fresh = dashboard.users_file.with_suffix(".new")
    fresh.write_text(json.dumps(data))
    fresh.replace(dashboard.users_file)


def test_a_changed_role_or_a_removed_user_ends_their_sessions(dashboard):
    first = dashboard.cookie(LEAVER)
    assert dashboard.request("GET", "/", headers={"Cookie": first})[0] == 200
    _rewrite_users(dashboard, lambda users: users[LEAVER[0]].update(role="operator"))
    status, headers, _ = dashboard.request("GET", "/", headers={"Cookie": first})
    assert status == 302 and "/login" in headers["Location"], f"a session outlived its role ({status})"
    second = dashboard.cookie(LEAVER)
    assert dashboard.request("GET", "/", headers={"Cookie": second})[0] == 200, "signing in again works"
    _rewrite_users(dashboard, lambda users: users.pop(LEAVER[0]))
    status, _, _ = dashboard.request("GET", "/", headers={"Cookie": second})
    assert status == 302, f"a removed user's session still opens the page ({status})"
    assert dashboard.post_json(f"/api/runs/{dashboard.run_id}/stop", second) == 401
    assert dashboard.sign_in(LEAVER)[0] == 401, "and the removed user cannot sign in again"


async def _websocket_outlives_logout(dashboard: Dashboard, cookie: str, token: str) -> bool:
    """Open the page's websocket, log out, and tell whether the server still holds the socket open after 5 s."""
    url = f"ws://127.0.0.1:{dashboard.port}/ws"
    origin = f"http://127.0.0.1:{dashboard.port}"
    request = HTTPRequest(url, headers={"Cookie": cookie, "Origin": origin})
    socket_ = await websocket_connect(request, subprotocols=["bokeh", token])
    assert await asyncio.wait_for(socket_.read_message(), 10) is not None, "the websocket opens"
    loop = asyncio.get_running_loop()
    status = (
        await loop.run_in_executor(
            None, lambda: dashboard.request("GET", "/logout", headers={"Cookie": cookie})
        )
    )[0]
    assert status == 302
    deadline = loop.time() + 5
    try:
        while loop.time() < deadline:
            if await asyncio.wait_for(socket_.read_message(), deadline - loop.time()) is None:
                return False
    except TimeoutError:
        pass
    socket_.close()
    return True


def test_an_open_websocket_is_closed_when_its_session_ends(dashboard):
    cookie = dashboard.cookie(VIEWER)
    status, _, page = dashboard.request("GET", "/", headers={"Cookie": cookie})
    token = re.search(r'"token":\s*"([^"]+)"', page)
    assert status == 200 and token, "the page embeds its session token"
    assert not asyncio.run(_websocket_outlives_logout(dashboard, cookie, token.group(1))), (
        "the websocket of a logged-out session stays open"
    )


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
    session_id = decode_signed_value(SECRET, COOKIE, viewer).decode()  # what the signed cookie carries
    assert len(session_id) == 48 and session_id != VIEWER[0], "a random session id, not the user's name"
    fields = viewer.split("|")  # tornado's format: ...|<length>:<base64 value>|<signature>
    as_operator = [*fields[:-2], f"4:{base64.b64encode(OPERATOR[0].encode()).decode()}", fields[-1]]
    forged = {
        "signature changed": viewer[:-1] + ("0" if viewer[-1] != "0" else "1"),
        "value changed to the operator's name": "|".join(as_operator),
        "signed with another secret": create_signed_value("x" * 40, COOKIE, session_id).decode(),
        "older than a session": create_signed_value(
            SECRET, COOKIE, session_id, clock=lambda: time.time() - 2 * 86400
        ).decode(),
        "the session token's value replayed": create_signed_value(SECRET, "wb_session", session_id).decode(),
        "a signed user name, not a session": create_signed_value(SECRET, COOKIE, OPERATOR[0]).decode(),
        "a signed session id the server never issued": create_signed_value(SECRET, COOKIE, "0" * 48).decode(),
        "unsigned": session_id,
    }
    for what, value in forged.items():
        cookie = f"{COOKIE}={value}"
        status, headers, _ = dashboard.request("GET", "/", headers={"Cookie": cookie})
        assert status == 302 and "/login" in headers["Location"], f"{what}: page answered {status}"
        assert dashboard.post_json(f"/api/runs/{dashboard.run_id}/stop", cookie) == 401, what
    assert not (dashboard.runs / dashboard.run_id / "STOP").exists()
    fresh = f"{COOKIE}={create_signed_value(SECRET, COOKIE, session_id).decode()}"
    assert dashboard.request("GET", "/", headers={"Cookie": fresh})[0] == 200, (
        "the same recipe, done right, works"
    )


def test_a_viewer_cannot_reach_an_operator_action_with_hand_crafted_requests(dashboard):
    viewer = dashboard.cookie(VIEWER)
    before = sorted(p.name for p in dashboard.runs.iterdir())
    stop, replay = f"/api/runs/{dashboard.run_id}/stop", f"/api/runs/{dashboard.run_id}/replay"
    launch = {"mode": "train", "model": "tiny", "topology": "marsrl", "steps": 1, "batch_size": 1}
    assert dashboard.post_json("/api/runs", viewer, launch) == 403
    assert dashboard.post_json(stop, viewer) == 403
    assert dashboard.post_json(replay, viewer, {"call_id": 1, "n": 2}) == 403
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
        for path, body in ((stop, {}), ("/api/runs", launch), (f"{stop}?user=ops&role=operator", {}),
                           (replay, {"call_id": 1, "n": 2})):  # fmt: skip
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


def test_no_cookie_value_is_logged_however_it_was_forged(dashboard):
    """Tornado warns of a signed value whose signature fails ("Invalid cookie signature %r") with the value in
    the message; the server logs the warning without it, for its own cookie and Panel's ``user`` alike."""
    offset = len(dashboard.log.read_text())
    viewer = dashboard.cookie(VIEWER)
    forged = {
        name: f"d2JfZm9yZ2Vk{name}=|1700000000|0badc0ffee{i}" for i, name in enumerate((COOKIE, "user"))
    }
    for name, value in forged.items():
        for cookie in (f"{name}={value}", f"{viewer}; {name}={value}" if name != COOKIE else None):
            if cookie is not None:
                dashboard.request("GET", f"/?run={dashboard.run_id}", headers={"Cookie": cookie})
    log = dashboard.log_since(offset)
    assert "Invalid cookie signature '(value not logged)'" in log, "the warning stays, without the value"
    for name, value in forged.items():
        assert value not in log and value.split("|")[0] not in log, f"the {name} cookie's value is in the log"


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

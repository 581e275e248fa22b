"""The team dashboard in a real headless Chromium: sign-in, roles, the runs list, live steps.

``workbench serve`` runs in a subprocess over a runs directory that this test process writes to, so
"a run being written" is a real writer beside a real server.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from tests.browser.conftest import Served, screenshot
from widgets.access import add_user
from workbench.store import RunStore

OPERATOR, VIEWER = ("ops", "operator-password"), ("vic", "viewer-password")


def _write_steps(store: RunStore, start: int, n: int) -> None:
    for i in range(start, start + n):
        with store.step(i) as step:
            step.log_metrics({"reward/mean": 0.1 * i})
            step.log_metrics({"reward/mean": 0.2 * i, "length/mean": 10.0 + i}, role="solver")


def _run_with_calls(runs) -> None:
    """A finished run of one step: episodes whose parent and child calls have known token owners."""
    with RunStore.create(runs, config={"kind": "rollout", "model": "tiny"}, name="calls run") as store:
        with store.step(0) as step:
            for i in range(3):
                episode = step.add_episode(task_id=f"t{i}", reward=float(i % 2))
                parent = step.add_call(
                    episode_id=episode, role="solver", completion_ids=[40, 41, 42, 43], mask=[1, 1, 2, 3],
                    logprobs=[-0.1, -0.2, 0.0, 0.0], policy="base", completion_text="solution",
                )  # fmt: skip
                step.add_call(
                    episode_id=episode,
                    role="verifier1",
                    parent_id=parent,
                    completion_ids=[44, 45],
                    mask=[1, 0],
                    logprobs=[-0.3, 0.0],
                    completion_text="verdict",
                )
        store.set_status("finished")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard")
    runs = root / "runs"
    store = RunStore.create(
        runs, config={"kind": "train", "model": "tiny"}, name="live run", topology="marsrl"
    )
    store.set_status("running")
    _write_steps(store, 0, 2)
    users = root / "users.json"
    add_user(users, *OPERATOR, role="operator")
    add_user(users, *VIEWER, role="viewer")
    _run_with_calls(runs)
    served = Served(runs, "--address", "0.0.0.0", "--users", str(users))
    yield served, store, runs
    output = served.close()
    store.close()
    assert "operator-password" not in output and "viewer-password" not in output, "no secret in the log"


def _sign_in(page, url: str, user: tuple[str, str]) -> None:
    page.goto(url + "/")
    assert "/login" in page.url, "an unauthenticated page is sent to the login form"
    page.fill("input[name=username]", user[0])
    page.fill("input[name=password]", user[1])
    page.click("button[type=submit]")
    page.wait_for_selector(".wb-role span", timeout=30_000)


def _post(url: str, cookie: str | None = None, body: dict | None = None, content_type="application/json"):
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    request.add_header("Content-Type", content_type)
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _raw_get(port: int, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    return connection.getresponse()


def _cookie_header(page) -> str:
    return "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())


def test_unauthenticated_requests_are_refused(site):
    served, store, _ = site
    page = _raw_get(served.port, "/")
    assert page.status == 302 and "login" in page.getheader("Location")
    socket = _raw_get(
        served.port,
        "/ws",
        {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )
    assert socket.status != 101, "no websocket without a signed-in user"
    status, body = _post(f"{served.url}/api/runs/{store.run_id}/stop")
    assert status == 401 and "sign in" in body["error"]
    status, _ = _post(f"{served.url}/api/runs", body={"mode": "rollout"})
    assert status == 401
    forged = "wb_user=ops"  # an unsigned cookie naming an operator
    assert _post(f"{served.url}/api/runs/{store.run_id}/stop", cookie=forged)[0] == 401


def test_the_viewer_reads_but_cannot_launch_or_stop(site, page):
    served, store, runs = site
    _sign_in(page, served.url, VIEWER)
    assert page.locator(".wb-role span").get_attribute("data-role") == "viewer"
    page.get_by_text(store.run_id).first.wait_for(timeout=10_000)
    tabs = page.locator(".bk-tab").all_inner_texts()
    assert "Launch" not in tabs, tabs
    page.get_by_text(store.run_id).first.click()
    page.wait_for_selector(".wb-last-step .wb-step", timeout=20_000)
    assert page.locator(".wb-stop-run").count() == 0, "no stop button on a viewer's page"
    screenshot(page, "dashboard-viewer")
    # the operator requests sent directly with the viewer's own session are refused on the server
    cookie = _cookie_header(page)
    status, body = _post(f"{served.url}/api/runs/{store.run_id}/stop", cookie=cookie)
    assert status == 403 and "viewer" in body["error"]
    status, _ = _post(f"{served.url}/api/runs", cookie=cookie, body={"mode": "rollout", "model": "tiny"})
    assert status == 403
    assert not (runs / store.run_id / "STOP").exists()
    assert len(list(runs.iterdir())) == 2, "no run was launched (the live run and the calls run)"


def test_a_run_being_written_shows_each_new_step_within_two_seconds(site, page):
    served, store, _ = site
    _sign_in(page, served.url, OPERATOR)
    page.get_by_text(store.run_id).first.click()
    last = store.last_complete_step()
    page.wait_for_selector(f'.wb-step[data-step="{last}"]', timeout=20_000)
    for _ in range(2):
        _write_steps(store, last + 1, 1)
        started = time.monotonic()
        last += 1
        page.wait_for_selector(f'.wb-step[data-step="{last}"]', timeout=2_000)
        print(f"step {last} shown {time.monotonic() - started:.2f} s after it was written")
    screenshot(page, "dashboard-live-step")


def test_the_operator_can_stop_a_run_and_launches_need_json(site, page):
    served, store, runs = site
    _sign_in(page, served.url, OPERATOR)
    tabs = page.locator(".bk-tab").all_inner_texts()
    assert "Launch" in tabs, tabs
    cookie = _cookie_header(page)
    status, _ = _post(f"{served.url}/api/runs/{store.run_id}/stop", cookie=cookie, content_type="text/plain")
    assert status == 415, "a form post (what a cross-site page can send) is refused"
    assert _post(f"{served.url}/api/runs/..%2Fetc/stop", cookie=cookie)[0] in (400, 404)
    status, body = _post(f"{served.url}/api/runs/{store.run_id}/stop", cookie=cookie)
    assert status == 200 and body["stop"] == "requested"
    assert (runs / store.run_id / "STOP").exists()
    (runs / store.run_id / "STOP").unlink()


def test_a_call_tree_expands_with_its_token_colouring(site, page):
    served, _, _ = site
    _sign_in(page, served.url, VIEWER)
    page.get_by_text("calls run").first.click()
    page.get_by_text("Trajectories").first.click()
    page.locator(".wb-episodes").get_by_text("t1", exact=True).first.click()
    page.wait_for_selector(".wb-call", timeout=20_000)
    solver = page.locator(".wb-call").first  # its tokens first, then its child card's
    owners = [solver.locator(".tok").nth(i).get_attribute("data-owner") for i in range(4)]
    assert owners == ["1", "1", "2", "3"], "trained, trained, tool output, another role"
    child = page.locator(".wb-call").nth(1)
    assert child.locator(".tok").count() == 0 or not child.locator(".tok").first.is_visible(), "collapsed"
    child.locator(".card-header").first.click()
    child.locator(".tok").first.wait_for(state="visible", timeout=10_000)
    assert [child.locator(".tok").nth(i).get_attribute("data-owner") for i in range(2)] == ["1", "0"]
    screenshot(page, "dashboard-call-tree")


def test_a_runs_graph_tab_colours_its_topology_by_the_last_step(site, page):
    served, _, _ = site
    _sign_in(page, served.url, VIEWER)
    page.get_by_text("live run").first.click()
    page.get_by_text("Graph").first.click()
    solve = page.locator('.topology-diagram g.node[data-name="solve"]').first
    solve.wait_for(timeout=20_000)
    step = float(solve.get_attribute("data-value")) / 0.2  # the solver's reward/mean is 0.2 x step
    assert step >= 1 and abs(step - round(step)) < 1e-6, "the last complete step's number"
    assert (
        page.locator('.topology-diagram g.node[data-name="verify1"]').first.get_attribute("data-value")
        is None
    )
    screenshot(page, "dashboard-graph")


def test_the_editor_loads_marsrl_and_a_canvas_edit_reaches_the_yaml(site, page):
    served, _, _ = site
    _sign_in(page, served.url, VIEWER)
    page.get_by_text("Topology editor").first.click()
    node = page.locator('.react-flow__node[data-id="role:solver"]')
    node.wait_for(timeout=30_000)
    node.click()
    field = page.locator(".wb-field-description input")
    field.wait_for(timeout=15_000)
    field.fill("edited on the canvas")
    field.press("Enter")
    page.locator(".wb-apply button").click()
    page.locator(".wb-export button").click()
    page.locator(".wb-yaml pre", has_text="description: edited on the canvas").wait_for(timeout=15_000)
    screenshot(page, "dashboard-editor")


def test_a_link_to_a_run_survives_the_sign_in_and_logout_ends_the_session(site, page):
    served, store, _ = site
    page.goto(f"{served.url}/?run={store.run_id}")
    assert "/login" in page.url, "an unauthenticated link is sent to the login form"
    page.fill("input[name=username]", VIEWER[0])
    page.fill("input[name=password]", VIEWER[1])
    page.click("button[type=submit]")
    page.wait_for_selector(".wb-last-step .wb-step", timeout=30_000)  # the linked run is open
    assert page.url.endswith(f"/?run={store.run_id}"), page.url
    cookie = _cookie_header(page)
    page.goto(f"{served.url}/logout")
    assert "/login" in page.url
    page_request = _raw_get(served.port, "/", {"Cookie": cookie})
    assert page_request.status == 302, "the cookie from before the logout opens nothing"


def test_failed_logins_are_throttled(site, browser):
    served, _, _ = site
    context = browser.new_context()
    try:
        statuses = []
        for _ in range(6):
            response = context.request.post(
                served.url + "/login", form={"username": "ops", "password": "wrong"}, max_redirects=0
            )
            statuses.append(response.status)
        assert statuses[:5] == [401] * 5 and statuses[5] == 429, statuses
    finally:
        context.close()

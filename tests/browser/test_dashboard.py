"""The team dashboard in a real headless Chromium: sign-in, roles, the runs list, live steps, a call tree,
the graph (a click on a node opens its role's calls) and an operator's replay of a call of a tiny-model run.

``workbench serve`` runs in a subprocess over a runs directory that this test process writes to, so
"a run being written" is a real writer beside a real server.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request

import pytest

from tests.browser.conftest import Served, screenshot
from widgets.server.access import add_user
from workbench.store import RunReader, RunStore

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


def _run_named(runs, name: str) -> str:
    """The id of the run called ``name`` in ``runs``."""
    for run_dir in runs.iterdir():
        with RunReader(run_dir) as reader:
            if reader.info()["name"] == name:
                return run_dir.name
    raise LookupError(name)


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
    assert _post(f"{served.url}/api/runs/{store.run_id}/replay", body={"call_id": 1})[0] == 401
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
    replay = f"{served.url}/api/runs/{_run_named(runs, 'calls run')}/replay"
    status, body = _post(replay, cookie=cookie, body={"call_id": 1, "n": 2})
    assert status == 403 and "viewer" in body["error"]
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
    replay = f"{served.url}/api/runs/{_run_named(runs, 'calls run')}/replay"
    refused = {
        "no topology": ({"call_id": 2, "n": 2}, "records no topology"),  # a run written by hand
        "unknown call": ({"call_id": 999, "n": 2}, "no call 999"),
        "n too large": ({"call_id": 1, "n": 65}, "1 to 64"),
        "not a number": ({"call_id": "1; drop", "n": 2}, "whole number"),
        "unknown field": ({"call_id": 1, "n": 2, "arms": ["x"]}, "call_id"),
        "unknown policy": ({"call_id": 1, "n": 2, "policy": "step:3"}, "not a checkpoint"),
    }
    for case, (body, message) in refused.items():
        status, answer = _post(replay, cookie=cookie, body=body)
        assert status == 400 and message in answer["error"], (case, status, answer)
    assert _post(f"{served.url}/api/runs/no-such-run/replay", cookie=cookie, body={"call_id": 1})[0] == 404
    assert len(list(runs.iterdir())) == 2, "no replay run was made"


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
    assert page.locator(".wb-replay").count() == 0, "no replay form on a viewer's page"
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
    from playwright.sync_api import expect

    solve.click()  # opens the Trajectories tab on the Solver's calls
    page.locator(".bk-tab.bk-active", has_text="Trajectories").wait_for(timeout=20_000)
    expect(page.locator(".wb-filter-role select")).to_have_value("solver", timeout=20_000)


def test_the_editor_loads_marsrl_and_a_canvas_edit_reaches_the_yaml(site, page):
    served, _, _ = site
    _sign_in(page, served.url, VIEWER)
    page.get_by_text("Topology editor").first.click()
    node = page.locator('.react-flow__node[data-id="role:solver"]')
    node.wait_for(timeout=30_000)
    node.click()
    page.locator('.wb-inspector .wb-inspected[data-inspected="role:solver"]').wait_for(timeout=15_000)
    field = page.locator(".wb-inspector .wb-field-description input")
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


def test_an_operator_replays_a_call_of_a_tiny_model_run_and_opens_the_replay(site, page):
    from playwright.sync_api import expect

    import workbench as wb

    served, _, runs = site
    tasks = wb.generate_tasks("arithmetic", n=1, seed=1, level=1)
    source = wb.rollout("debate", tasks, model="tiny", max_tokens=4, runs_dir=runs, background=True)
    _sign_in(page, served.url, OPERATOR)
    assert source.wait(120) == "finished"
    page.get_by_text(source.run_dir.name).first.click()
    page.get_by_text("Trajectories").first.click()
    page.locator(".wb-episodes .slick-row").first.click()
    page.locator(".wb-call").nth(4).locator(".card-header").first.click()  # the judge: picked for a replay
    expect(page.locator(".wb-replay-call select")).to_have_value(re.compile("judge"), timeout=20_000)
    n = page.locator(".wb-replay-n input")
    n.fill("2")
    n.press("Enter")
    page.locator(".wb-replay-button button").click()
    launched = page.locator(".wb-replay-run").first
    launched.wait_for(timeout=20_000)
    replay_id = launched.get_attribute("data-run")
    page.locator('.wb-replay-run[data-status="finished"]').wait_for(timeout=120_000)
    with RunReader(runs / replay_id) as reader:
        config = reader.config
        assert config["kind"] == "replay" and config["n"] == 2
        assert config["source"]["run_id"] == source.run_dir.name and config["source"]["role"] == "judge"
        assert list(reader.steps()["episodes"]) == [2, 2], "the keep and resample arms"
    page.locator(".wb-runs").get_by_text(replay_id).first.wait_for(timeout=10_000)  # in the runs table
    page.locator(".wb-replay-open button").click()
    page.locator(".wb-run-view h3", has_text=replay_id).wait_for(timeout=20_000)
    page.locator(".bk-tab.bk-active", has_text="Curves").wait_for(timeout=20_000)  # the replay run's view
    screenshot(page, "dashboard-replay")


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

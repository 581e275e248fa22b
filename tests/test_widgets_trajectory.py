"""TrajectoryBrowser and its token view over real run stores, without a browser.

The synthetic run of ``tests/test_store_queries.py`` (whose tests check the store's queries: pagination,
every filter, the call tree) checks the browser's pages and filters, the token colouring against the
stored masks and the escaping of model output; a real rollout of the tiny model checks that a run the
engine wrote browses with decoded tokens.
"""

from __future__ import annotations

import re

import panel as pn
import pytest

import workbench as wb
from tests.test_store_queries import SCRIPT, SOLVER_MASK, N, episode_id, write_run
from widgets.token_text import call_tokens
from widgets.token_view import completion_spans, tokens_html
from widgets.trajectory_browser import TrajectoryBrowser
from workbench.store import RunReader, RunStore
from workbench.store import queries as q


def _tiny_ids(text: str) -> list[int]:
    from transformers import AutoTokenizer

    from workbench.models import resolve

    return AutoTokenizer.from_pretrained(resolve("tiny"))(text)["input_ids"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    store = write_run(tmp_path_factory.mktemp("runs"), script_ids=_tiny_ids(SCRIPT))
    store.close()
    reader = RunReader(store.run_dir)
    yield store.run_dir, reader
    reader.close()


def _owners_in(page: str) -> list[int]:
    return [int(o) for o in re.findall(r'<span class="tok [^"]*" data-owner="(\d+)"', page)]


def test_token_colouring_follows_the_stored_mask(run):
    _, reader = run
    solver = q.call_tree(reader, episode_id(reader, 4))[0]
    tokens = call_tokens(reader, solver.id)
    assert tokens.owners == SOLVER_MASK and tokens.decoded and tokens.policy == "base"
    assert len(tokens.completion_tokens) == 6 and tokens.prompt_ids == [11, 12, 13]
    page = tokens_html(tokens)
    assert _owners_in(page) == SOLVER_MASK
    classes = re.findall(r'<span class="(tok [^"]*)"', page)
    expected = {
        0: "owner-0 tok-masked",
        1: "owner-1 tok-trained",
        2: "owner-2 tok-tool",
        3: "owner-3 tok-other-role",
    }
    assert classes == [f"tok {expected[o]}" for o in SOLVER_MASK]
    assert 'title="#1 · id 22 · trained (base) · logprob -0.500"' in page
    assert "trained (base)" in page.split('class="wb-completion"')[0], "the legend names the policy"
    assert '<details class="wb-prompt">' in page and page.count('class="ptok"') == 3, "prompt, collapsed"
    heat = tokens_html(tokens, "logprob")
    assert _owners_in(heat) == SOLVER_MASK and "rgb(255,255,255)" in heat  # logprob 0 is white
    advantage = completion_spans(tokens, "advantage")
    backgrounds = re.findall(r"background:([^\"]+)\"", advantage)
    assert backgrounds[0] != "#eeeeee" and backgrounds[2:] == ["#eeeeee"] * 4, "only trained tokens carry one"
    assert "advantage 0.500" in advantage and "advantage —" in advantage
    with pytest.raises(ValueError, match="colour by 'size'"):
        tokens_html(tokens, "size")


def test_model_output_is_escaped_everywhere(run):
    run_dir, reader = run
    episode = episode_id(reader, 7)
    solver = q.call_tree(reader, episode)[0]
    tokens = call_tokens(reader, solver.id)
    assert "<" in "".join(tokens.completion_tokens), "the stored ids decode to markup"
    page = tokens_html(tokens)
    assert "<script" not in page and "&lt;" in page
    tokens.completion_tokens[0] = '"><img src=x onerror=alert(1)>'
    assert "<img" not in tokens_html(tokens) and "&quot;&gt;&lt;img" in tokens_html(tokens)
    browser = TrajectoryBrowser(run_dir, page_size=50)
    browser.open_episode(episode)
    browser.calls[solver.children[0].id].card.collapsed = False  # the verifier with the <script> query
    shown = "".join(
        str(getattr(o, "object", ""))
        for c in browser.calls.values()
        for o in [*c.card.objects, c.card.header]
    )
    assert "<script" not in shown and "&lt;script&gt;" in shown
    browser.close()


def test_without_a_tokenizer_token_ids_are_shown(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "rollout", "model": ""})
    with store.step(0) as step:
        step.add_call(step.add_episode(), role="solver", completion_ids=[7, 8], mask=[1, 3])
    store.close()
    with RunReader(store.run_dir) as reader:
        tokens = call_tokens(reader, 1)
        assert tokens.completion_tokens == ["⟨7⟩", "⟨8⟩"] and not tokens.decoded
        assert "could not be loaded" in tokens_html(tokens) and _owners_in(tokens_html(tokens)) == [1, 3]
        with pytest.raises(KeyError, match="no call 99"):
            call_tokens(reader, 99)


def test_the_browser_pages_filters_and_opens_a_call_tree(run, monkeypatch):
    run_dir, reader = run
    read: list[int] = []  # rows of every query the browser makes
    sql = RunReader.sql
    monkeypatch.setattr(
        RunReader, "sql", lambda self, *a, **k: read.append(len(frame := sql(self, *a, **k))) or frame
    )
    browser = TrajectoryBrowser(run_dir)
    assert browser.step == 1 and browser.total == N and len(browser._table.value) == 50
    assert browser._table.value["episode"].tolist()[:2] == [episode_id(reader, 0), episode_id(reader, 1)]
    assert 'class="wb-episode" data-episode="<%= value %>"' in browser._table.formatters["episode"].template
    assert 'data-total="120"' in browser._page_text.object and "page 1 of 3" in browser._page_text.object
    assert browser._prev.disabled and not browser._next.disabled
    browser.next_page()
    browser.next_page()
    assert browser.page == 2 and browser._table.value["task_id"].tolist()[0] == "t100"
    browser.next_page()
    assert browser.page == 2 and browser._next.disabled, "no page after the last"
    browser.format_failures = True
    assert browser.page == 0 and browser.total == 12
    browser.format_failures = False
    browser._role_select.value = "corrector1"
    assert browser.role == "corrector1" and browser.total == N // 3
    browser.role = ""
    browser.search = "answer is 12"
    assert browser._table.value["task_id"].tolist() == ["t11", "t119"]
    browser.search = ""
    browser.min_reward, browser.max_reward = 0.5, 0.6
    assert browser.total == 12
    browser.min_reward = browser.max_reward = None
    browser._step_select.value = 0
    assert browser.step == 0 and browser._table.value["task_id"].tolist() == ["warmup"]
    browser._step_select.value = -1  # all steps
    assert (
        browser.step is None
        and browser.total == N + 1
        and browser._table.value["step"].tolist()[:2] == [0, 1]
    )
    browser._step_select.value = 1

    browser._table.selection = [3]  # t3: solver -> verifier1 -> tool, and corrector1
    assert browser.episode == episode_id(reader, 3)
    cards = [o for o in browser._tree.objects if isinstance(o, pn.Card)]
    assert [browser.calls[_call_of(c)].node.role for c in cards] == ["solver", "corrector1"]
    solver = browser.calls[_call_of(cards[0])]
    assert not solver.card.collapsed and _owners_in(solver.tokens.object) == SOLVER_MASK
    verifier = next(o for o in solver.card.objects if isinstance(o, pn.Card))
    opened = browser.calls[_call_of(verifier)]
    assert opened.node.role == "verifier1" and opened.card.collapsed and opened.tokens.object == "", (
        "read lazily"
    )
    assert "wb-depth-1" in verifier.css_classes and "no verdict" not in str(verifier.objects[0].object)
    verifier.collapsed = False  # what a click on its header does
    assert _owners_in(opened.tokens.object) == [1, 0] and opened.detail is not None
    browser.colour_by = "logprob"
    assert (
        'data-colour-by="logprob"' in solver.tokens.object
        and 'data-colour-by="logprob"' in opened.tokens.object
    )
    assert pn.panel(browser).get_root() is not None
    assert max(read) <= 50, "only a page of episodes or one episode's calls is ever read"
    browser.close()


def _call_of(card: pn.Card) -> int:
    return int(re.search(r'data-call="(\d+)"', card.header.object).group(1))


def test_refresh_shows_the_steps_of_a_run_being_written(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train", "model": ""})
    browser = TrajectoryBrowser(store.run_dir, live=True, interval_ms=500)
    assert browser.step is None and browser.total == 0
    with store.step(0) as step:
        step.add_call(step.add_episode(task_id="a"), role="solver", completion_ids=[1], mask=[1])
    browser.refresh()
    assert browser.step == 0 and browser._table.value["task_id"].tolist() == ["a"]
    with store.step(1) as step:
        episode = step.add_episode(task_id="b")
        step.add_call(episode, role="solver", completion_ids=[1], mask=[1])
        step.flush()  # the step being written is listed, marked running
        browser.refresh()
        assert browser.step == 1, "follows the newest step until one is chosen"
        assert any("(running)" in label for label in browser._step_select.options)
        assert browser._table.value["task_id"].tolist() == ["b"]
        browser._step_select.value = 0  # a chosen step stays chosen
    with store.step(2) as step:
        step.add_call(step.add_episode(task_id="c"), role="verifier1", completion_ids=[1], mask=[1])
    browser.refresh()
    assert browser.step == 0 and 2 in browser._step_select.options.values()
    assert "verifier1" in browser._role_select.options
    following = TrajectoryBrowser(store.run_dir)
    with store.step(3) as step:  # a finished run's last step: its final held-out evaluation, no episodes
        step.log_metrics({"eval/accuracy": 0.5, "final_eval": 1.0})
    following.refresh()
    opened = TrajectoryBrowser(store.run_dir)
    for shown in (following, opened):
        assert shown.step == 2 and shown._table.value["task_id"].tolist() == ["c"], (
            "the last step with episodes"
        )
        assert 3 in shown._step_select.options.values(), "the evaluation-only step can still be chosen"
    opened.show_role("verifier1", step=3)  # a click on the graph at the evaluation-only step
    assert opened.step == 2 and opened.episode is not None, "the role's calls at the last step with episodes"
    for shown in (following, opened):
        shown.close()
    root = pn.panel(browser).get_root()  # live: displaying it starts the periodic refresh
    assert root is not None and browser._callback is not None
    browser.close()
    assert browser._callback is None
    store.close()


def test_a_real_rollout_browses_with_decoded_tokens(tmp_path):
    tasks = wb.generate_tasks("arithmetic", n=2, seed=0)
    result = wb.rollout("marsrl", tasks, model="tiny", max_tokens=4, runs_dir=tmp_path)
    browser = TrajectoryBrowser(result.run_dir)
    assert browser.total == 2
    browser._table.selection = [0]
    assert browser.calls, "the episode's calls are shown"
    first = next(iter(browser.calls.values()))
    detail = first.detail
    assert detail is not None and detail.decoded and detail.completion_tokens
    stored = browser.reader.calls(episode=browser.episode, columns=["mask"])["mask"].iloc[0].tolist()
    assert _owners_in(first.tokens.object) == stored
    browser.close()


def test_show_role_opens_that_roles_calls_and_the_replay_form_says_what_cannot_be_replayed(run):
    from widgets.replay_form import ReplayForm
    from widgets.replays import start_replay

    run_dir, reader = run
    form = ReplayForm(lambda call, n, policy: start_replay(run_dir, call, n, policy))
    browser = TrajectoryBrowser(run_dir, replay=form)
    browser.show_role("verifier1", step=1)
    assert browser.role == "verifier1" and browser._role_select.value == "verifier1" and browser.total == N
    assert browser.episode == episode_id(reader, 0), "the first episode with a verifier1 call"
    tree = [c.id for _, c in q.walk(q.call_tree(reader, browser.episode))]  # a corrector1's call follows
    solver, verifier, tool = (browser.calls[i] for i in tree[:3])
    assert not solver.card.collapsed and not verifier.card.collapsed, "the way to the role's call is open"
    assert tool.card.collapsed and "wb-role-match" in verifier.card.css_classes
    assert _owners_in(verifier.tokens.object) == [1, 0]
    assert browser._tree.objects[1] is form._layout and list(form.call.options.values()) == tree
    assert form.call.value == verifier.node.id, "the role's first call is picked"
    solver.card.collapsed, solver.card.collapsed = True, False  # expanding a card picks its call
    assert form.call.value == solver.node.id
    form.n.value = 2
    form.submit()
    assert "records no topology" in form.result.object and 'class="wb-replay-error"' in form.result.object
    form.n.value = 0
    form.submit()
    assert "1 to 64" in form.result.object and form.handle is None, "nothing was launched"
    browser.show_role("nobody")
    assert browser.total == 0 and browser.episode is None and "nobody" in browser._role_select.options
    browser.close()


def test_a_run_graph_follows_new_steps_and_reports_clicks_on_its_roles(tmp_path):
    from widgets.run_graph import RunGraph

    store = RunStore.create(tmp_path, config={"kind": "train", "topology": "marsrl"})

    def step(i):
        with store.step(i) as s:
            s.log_metrics({"reward/mean": 0.1 * i}, role="solver")

    step(0)
    clicked = []
    graph = RunGraph(store.run_dir, on_role=clicked.append)
    assert graph.step.options == [0] and not graph.refresh(), "nothing new: the store is not read"
    assert graph.play.disabled, "one step: nothing to play"
    step(1)
    assert graph.refresh() and graph.step.options == [0, 1] and graph.step.value == 1, "on the last: follows"
    assert not graph.play.disabled
    assert 'data-value="0.1"' in graph.diagram.object
    graph.step.value = 0
    step(2)
    assert graph.refresh() and graph.step.options == [0, 1, 2]
    assert graph.step.value == 0, "a chosen step stays"
    graph.step.value = 2
    graph.play.value = True  # play from the last step starts again at the first
    assert graph.step.value == 0 and graph._player is not None
    assert graph.next_step() and graph.step.value == 1 and graph.play.value
    assert graph.next_step() and graph.step.value == 2 and not graph.play.value, "at the last step play stops"
    assert graph._player is None and not graph.next_step() and graph.step.value == 2
    graph.diagram.param.update(clicked="solver", clicks=1)  # what a click on the Solver's node sets
    graph.diagram.param.update(clicked="nobody", clicks=2)  # not a role of the topology: ignored
    graph.diagram.param.update(clicked="solver", clicks=3)  # the same node again
    assert clicked == ["solver", "solver"] and graph.role == "solver"
    store.close()


def test_a_form_follows_one_replay_at_a_time_and_the_server_runs_at_most_max_active_replays(
    run, tmp_path, monkeypatch
):
    import multiprocessing
    import time

    from widgets import replays
    from widgets.replay_form import ReplayForm
    from workbench.training import BackgroundRun

    run_dir, _ = run
    replay_run = RunStore.create(tmp_path, config={"kind": "replay"}, name="a replay")  # status "created"
    launched: list[int] = []

    def launch(call_id: int, n: int, policy: str | None) -> BackgroundRun:
        launched.append(call_id)
        return BackgroundRun(replay_run.run_dir)

    form = ReplayForm(launch, interval_ms=60_000)
    form.call.options, form.call.value = {"call 1": 1}, 1
    form.submit()
    assert launched == [1] and form.status == "created" and form.button.disabled
    form.submit()  # a double click: the second click reaches the server before the button is disabled
    assert launched == [1], "one replay per form while it is active"
    replay_run.set_status("finished")
    form.follow()
    assert form.status == "finished" and not form.button.disabled
    form.submit()
    assert launched == [1, 1], "a new replay once the last one ended"
    form.close()
    replay_run.close()

    # the server's cap counts the replays it started whose process still runs, whoever asked for them
    monkeypatch.setattr(replays, "MAX_ACTIVE_REPLAYS", 1)
    busy = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    busy.start()
    try:
        monkeypatch.setattr(replays, "_started", [BackgroundRun(tmp_path / "running-replay", busy)])
        with pytest.raises(replays.TooManyReplays, match="running-replay.*at most 1 at once"):
            replays.start_replay(run_dir, 1, 2)
    finally:
        busy.terminate()
        busy.join(10)
    with pytest.raises(ValueError, match="no call 999"):  # past the cap: the request's own checks run
        replays.start_replay(run_dir, 999, 2)
    assert replays.active_replays() == []

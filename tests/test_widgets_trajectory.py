"""TrajectoryBrowser and its server-side queries over real run stores, without a browser.

A synthetic run written with ``RunStore`` (known rewards, masks, texts and call trees) checks pagination,
every filter, the call tree, the token colouring against the stored masks and the escaping of model
output; a real rollout of the tiny model checks that a run the engine wrote browses with decoded tokens.
"""

from __future__ import annotations

import re

import panel as pn
import pytest

import workbench as wb
from widgets import run_queries as q
from widgets.token_view import completion_spans, tokens_html
from widgets.trajectory_browser import TrajectoryBrowser
from workbench.store import RunReader, RunStore

N = 120  # episodes of step 1
SOLVER_MASK = [1, 1, 2, 2, 3, 0]
SCRIPT = "<script>alert(1)</script>"


def _tiny_ids(text: str) -> list[int]:
    from transformers import AutoTokenizer

    from workbench.models import resolve

    return AutoTokenizer.from_pretrained(resolve("tiny"))(text)["input_ids"]


def _write_run(root, model: str = "tiny"):
    """Step 0: one episode. Step 1: N episodes, each solver -> (verifier1 -> search tool call), plus
    a corrector on every third; episode i has reward i / (N - 1), a format failure when i % 10 == 0."""
    script_ids = _tiny_ids(SCRIPT)
    store = RunStore.create(root, config={"kind": "train", "model": model})
    with store.step(0) as step:
        episode = step.add_episode(task_id="warmup", reward=1.0)
        step.add_call(episode, role="solver", completion_ids=[5], mask=[1], completion_text="warm")
    with store.step(1, policy_version=1) as step:
        for i in range(N):
            episode = step.add_episode(task_id=f"t{i}", group_key=f"g{i // 4}", reward=i / (N - 1))
            solver = step.add_call(
                episode,
                role="solver",
                policy="base",
                prompt_ids=[11, 12, 13],
                prompt_text=f"Question {i}: what is {i} + 1?",
                completion_ids=script_ids[:6] if i == 7 else [21, 22, 23, 24, 25, 26],
                completion_text=SCRIPT if i == 7 else f"The answer is {i + 1}",
                mask=SOLVER_MASK,
                logprobs=[-0.1, -0.5, 0.0, 0.0, 0.0, -2.0],
                token_advantages=[0.5, 0.5, 0.0, 0.0, 0.0, 0.0],
                advantage=0.5,
                rewards={"answer": 1.0 if i % 2 else 0.0},
                action={"answer": str(i + 1)},
            )
            verifier = step.add_call(
                episode,
                role="verifier1",
                parent_id=solver,
                source_id=solver,
                completion_ids=[31, 32],
                mask=[1, 0],
                completion_text="Wrong" if i % 3 == 0 else "Correct 50%",
                format_error="no verdict" if i % 10 == 0 else None,
                tool_calls=[{"name": "search", "arguments": {"query": SCRIPT if i == 7 else f"q{i}"}}],
                tool_results=[{"content": f"result {i}"}],
            )
            step.add_call(episode, role="tool", parent_id=verifier, completion_ids=[41], mask=[2])
            if i % 3 == 0:
                step.add_call(
                    episode, role="corrector1", completion_ids=[51], mask=[1], completion_text="Fixed"
                )
    return store


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    store = _write_run(tmp_path_factory.mktemp("runs"))
    store.close()
    reader = RunReader(store.run_dir)
    yield store.run_dir, reader
    reader.close()


def _episode_id(reader, i: int) -> int:
    return int(reader.sql("SELECT id FROM episodes WHERE task_id = ?", [f"t{i}"])["id"].iloc[0])


def test_steps_list_counts_episodes_calls_and_mean_reward(run):
    _, reader = run
    steps = q.steps(reader)
    assert steps["step"].tolist() == [0, 1] and steps["status"].tolist() == ["complete"] * 2
    assert steps["episodes"].tolist() == [1, N]
    assert steps["calls"].tolist() == [1, 3 * N + N // 3]
    assert steps["mean_reward"].tolist() == pytest.approx([1.0, 0.5])
    assert q.roles(reader) == ["corrector1", "solver", "tool", "verifier1"]


def test_pages_give_their_rows_and_the_total(run):
    _, reader = run
    first = q.episodes_page(reader, 1)
    assert (first.total, first.pages, len(first.rows)) == (N, 3, 50)
    assert first.rows["task_id"].tolist() == [f"t{i}" for i in range(50)]
    last = q.episodes_page(reader, 1, page=2)
    assert last.rows["task_id"].tolist() == [f"t{i}" for i in range(100, N)] and last.first == 100
    row = first.rows.iloc[3]  # t3: solver, verifier1, tool, corrector1
    assert (row["calls"], row["format_errors"], row["step"]) == (4, 0, 1)
    assert set(row["roles"].split(", ")) == {"solver", "verifier1", "tool", "corrector1"}
    assert first.rows.iloc[0]["format_errors"] == 1
    beyond = q.episodes_page(reader, 1, page=9)
    assert beyond.rows.empty and beyond.total == N
    assert q.episodes_page(reader, None, size=200).total == N + 1, "all steps"
    with pytest.raises(ValueError, match="page must be"):
        q.episodes_page(reader, 1, page=-1)


def test_each_filter_narrows_the_episodes_on_the_server(run):
    _, reader = run

    def tasks(**where) -> list[str]:
        page = q.episodes_page(reader, 1, size=200, where=q.EpisodeFilter(**where))
        assert page.total == len(page.rows)
        return page.rows["task_id"].tolist()

    assert tasks(role="corrector1") == [f"t{i}" for i in range(0, N, 3)]
    assert tasks(role="nobody") == []
    rewards = {f"t{i}": i / (N - 1) for i in range(N)}
    assert tasks(min_reward=0.5) == [t for t, r in rewards.items() if r >= 0.5]
    assert tasks(max_reward=0.25) == [t for t, r in rewards.items() if r <= 0.25]
    assert tasks(min_reward=0.5, max_reward=0.6) == [t for t, r in rewards.items() if 0.5 <= r <= 0.6]
    assert tasks(format_failures=True) == [f"t{i}" for i in range(0, N, 10)]
    assert tasks(search="answer is 12") == ["t11", "t119"]  # "The answer is 12", "The answer is 120"
    assert tasks(search="ANSWER IS 12") == ["t11", "t119"], "case-insensitive"
    assert tasks(search="Question 42:") == ["t42"], "prompts are searched too"
    assert len(tasks(search="50%")) == N - len(range(0, N, 3)), "% is literal"
    assert tasks(search="5_%") == [], "_ is literal"
    # the call conditions hold for one call: a verifier1 saying "Wrong" and failing its format
    assert tasks(role="verifier1", search="Wrong", format_failures=True) == [f"t{i}" for i in range(0, N, 30)]
    assert tasks(role="solver", search="Wrong") == []
    assert tasks(role="corrector1", min_reward=0.9) == [f"t{i}" for i in range(0, N, 3) if i / (N - 1) >= 0.9]


def test_the_call_tree_nests_calls_by_parent(run):
    _, reader = run
    roots = q.call_tree(reader, _episode_id(reader, 3))
    assert [n.role for n in roots] == ["solver", "corrector1"]
    solver = roots[0]
    assert [c.role for c in solver.children] == ["verifier1"]
    verifier = solver.children[0]
    assert verifier.parent_id == solver.id and verifier.source_id == solver.id
    assert [c.role for c in verifier.children] == ["tool"] and verifier.children[0].parent_id == verifier.id
    assert [(d, n.role) for d, n in q.walk(roots)] == [
        (0, "solver"),
        (1, "verifier1"),
        (2, "tool"),
        (0, "corrector1"),
    ]
    assert solver.rewards == {"answer": 1.0} and solver.advantage == 0.5 and solver.action == {"answer": "4"}
    assert (solver.policy, solver.policy_version, solver.n_prompt, solver.n_completion) == ("base", 1, 3, 6)
    assert verifier.tool_calls == [{"name": "search", "arguments": {"query": "q3"}}]
    assert verifier.tool_results == [{"content": "result 3"}] and verifier.format_error is None
    assert q.call_tree(reader, _episode_id(reader, 0))[0].children[0].format_error == "no verdict"
    assert q.call_tree(reader, 10**9) == []


def _owners_in(page: str) -> list[int]:
    return [int(o) for o in re.findall(r'<span class="tok [^"]*" data-owner="(\d+)"', page)]


def test_token_colouring_follows_the_stored_mask(run):
    _, reader = run
    solver = q.call_tree(reader, _episode_id(reader, 4))[0]
    tokens = q.call_tokens(reader, solver.id)
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
    episode = _episode_id(reader, 7)
    solver = q.call_tree(reader, episode)[0]
    tokens = q.call_tokens(reader, solver.id)
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
        tokens = q.call_tokens(reader, 1)
        assert tokens.completion_tokens == ["⟨7⟩", "⟨8⟩"] and not tokens.decoded
        assert "could not be loaded" in tokens_html(tokens) and _owners_in(tokens_html(tokens)) == [1, 3]
        with pytest.raises(KeyError, match="no call 99"):
            q.call_tokens(reader, 99)


def test_the_browser_pages_filters_and_opens_a_call_tree(run, monkeypatch):
    run_dir, reader = run
    read: list[int] = []  # rows of every query the browser makes
    sql = RunReader.sql
    monkeypatch.setattr(
        RunReader, "sql", lambda self, *a, **k: read.append(len(frame := sql(self, *a, **k))) or frame
    )
    browser = TrajectoryBrowser(run_dir)
    assert browser.step == 1 and browser.total == N and len(browser._table.value) == 50
    assert browser._table.value["episode"].tolist()[:2] == [_episode_id(reader, 0), _episode_id(reader, 1)]
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
    assert browser.episode == _episode_id(reader, 3)
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

"""TrajectoryBrowser and its queries over real run stores: pagination, filters, call trees, token colouring."""

from __future__ import annotations

import panel as pn
import pytest

import workbench as wb
from widgets import run_queries as q
from widgets.token_view import tokens_html
from widgets.trajectory_browser import TrajectoryBrowser
from workbench.store import RunStore


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Two steps; step 1 has 120 episodes, each a parent call and a child call with known masks and texts."""
    store = RunStore.create(tmp_path_factory.mktemp("runs"), config={"kind": "train", "model": "tiny"})
    with store.step(0) as step:
        step.add_call(episode_id=step.add_episode(reward=0.0), role="solver", completion_ids=[1], mask=[1])
    with store.step(1) as step:
        for i in range(120):
            episode = step.add_episode(task_id=f"t{i}", reward=i / 119)
            parent = step.add_call(
                episode_id=episode, role="solver", completion_ids=[5, 6, 7, 8], mask=[1, 1, 2, 3],
                logprobs=[-0.1, -0.5, 0.0, 0.0], advantage=0.5, policy="base",
                completion_text="<script>alert(1)</script>" if i == 7 else f"answer {i}",
                rewards={"reward": i / 119},
                tool_calls=[{"name": "search", "arguments": {"query": "<script>x</script>" if i == 7 else f"q{i}"}}],
            )  # fmt: skip
            step.add_call(
                episode_id=episode,
                role="verifier1",
                parent_id=parent,
                completion_ids=[9],
                mask=[0],
                completion_text="correct",
                format_error="no verdict" if i % 10 == 0 else None,
            )
    store.close()
    return store.run_dir


def test_pages_and_filters_are_answered_by_the_store(synthetic):
    reader = wb.RunReader(synthetic)
    frame, total = q.episodes_page(reader, 1, page=2, size=50)
    assert total == 120 and len(frame) == 20 and frame["task_id"].iloc[0] == "t100"
    assert q.episodes_page(reader, 1, where=q.EpisodeFilter(format_failures=True))[1] == 12
    assert q.episodes_page(reader, 1, where=q.EpisodeFilter(min_reward=0.5))[1] == 60
    assert q.episodes_page(reader, 1, where=q.EpisodeFilter(min_reward=0.5, max_reward=0.6))[1] == 12
    assert q.episodes_page(reader, 1, where=q.EpisodeFilter(role="corrector1"))[1] == 0
    found, n = q.episodes_page(reader, 1, where=q.EpisodeFilter(search="answer 11"))
    assert n == 11 and set(found["task_id"]) == {"t11", *(f"t{i}" for i in range(110, 120))}
    assert q.steps(reader)["episodes"].tolist() == [1, 120]


def test_the_call_tree_nests_children_and_decodes_fields(synthetic):
    reader = wb.RunReader(synthetic)
    frame, _ = q.episodes_page(reader, 1, size=1)
    tree = q.call_tree(reader, int(frame["id"][0]))
    kids = q.children(tree)
    assert [tree["role"][i] for i in kids[None]] == ["solver"]
    assert [tree["role"][i] for i in kids[int(tree["id"][0])]] == ["verifier1"]
    assert tree["tool_calls"][0][0]["arguments"] == {"query": "q0"}
    assert tree["format_error"][1] == "no verdict"


def test_tokens_are_coloured_by_owner_and_escaped(synthetic):
    reader = wb.RunReader(synthetic)
    tree = q.call_tree(reader, int(q.episodes_page(reader, 1, size=50)[0]["id"][7]))
    tokens = q.call_tokens(reader, int(tree["id"][0]))
    assert tokens.owners == [1, 1, 2, 3] and len(tokens.tokens) == 4 and tokens.policy == "base"
    page = tokens_html(tokens)
    assert [f'data-owner="{o}"' in page for o in (1, 2, 3)] == [True] * 3
    assert page.count('class="tok ') == 4
    tokens.tokens[0] = "<img src=x onerror=alert(1)>"
    assert "<img" not in tokens_html(tokens) and "&lt;img" in tokens_html(tokens)
    heat = tokens_html(tokens, by="logprob")
    assert "rgb(" in heat and "logprob -0.500" in heat
    with pytest.raises(ValueError, match="colour by 'size'"):
        tokens_html(tokens, by="size")
    browser = TrajectoryBrowser(synthetic, page_size=50)
    browser.episode = int(q.episodes_page(reader, 1, size=50)[0]["id"][7])
    details = "".join(str(getattr(o, "object", "")) for card in browser._tree.objects for o in card.objects)
    assert "<script>" not in details and "&lt;script&gt;" in details, "model output is escaped"


def test_the_browser_pages_filters_and_opens_an_episode(synthetic):
    browser = TrajectoryBrowser(synthetic, page_size=50)
    assert browser.step == 1 and browser.total == 120 and len(browser._table.value) == 50
    browser.next_page()
    browser.next_page()
    assert browser.page == 2 and len(browser._table.value) == 20
    browser.next_page()
    assert browser.page == 2, "no page after the last"
    browser.format_failures = True
    assert browser.page == 0 and browser.total == 12
    browser._table.selection = [1]
    cards = browser._tree.objects
    assert len(cards) == 1 and cards[0].title.startswith("solver")
    assert any(getattr(o, "title", "").startswith("verifier1") for o in cards[0].objects), "the child nests"
    assert pn.panel(browser).get_root() is not None


def test_a_real_rollout_browses(tmp_path):
    tasks = wb.generate_tasks("arithmetic", n=3, seed=0)
    result = wb.rollout("marsrl", tasks, model="tiny", max_tokens=4, runs_dir=tmp_path)
    browser = TrajectoryBrowser(result.run_dir)
    assert browser.total == 3
    browser.episode = int(browser._table.value["id"][0])
    tokens = q.call_tokens(browser.reader, int(q.call_tree(browser.reader, browser.episode)["id"][0]))
    assert tokens.tokens and tokens.tokens != [f"<{i}>" for i in tokens.completion_ids], (
        "decoded by the tokenizer"
    )

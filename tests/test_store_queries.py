"""The dashboard's named queries (``workbench.store.queries``) over real run stores.

A synthetic run written with ``RunStore`` (known rewards, masks, texts and call trees) checks the steps
list, pagination, every episode filter, the call tree and one call's detail; a run written step by step
checks what the live views poll (the data version, new metric rows, the totals of complete steps).
``write_run`` is also the run of ``tests/test_widgets_trajectory.py``.
"""

from __future__ import annotations

import pytest

from workbench.store import RunReader, RunStore, TokenOwner
from workbench.store import queries as q

N = 120  # episodes of step 1
SOLVER_MASK = [1, 1, 2, 2, 3, 0]
SCRIPT = "<script>alert(1)</script>"


def write_run(root, script_ids=(61, 62, 63, 64, 65, 66), model: str = "tiny"):
    """Step 0: one episode. Step 1: N episodes, each solver -> (verifier1 -> search tool call), plus
    a corrector on every third; episode i has reward i / (N - 1), a format failure when i % 10 == 0.
    Episode 7's solver completes with ``script_ids`` (its first 6), its text being ``SCRIPT``."""
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
                completion_ids=list(script_ids[:6]) if i == 7 else [21, 22, 23, 24, 25, 26],
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


def episode_id(reader: RunReader, i: int) -> int:
    """The id of episode ``t{i}`` of ``write_run``'s run."""
    return int(reader.sql("SELECT id FROM episodes WHERE task_id = ?", [f"t{i}"])["id"].iloc[0])


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    store = write_run(tmp_path_factory.mktemp("runs"))
    store.close()
    with RunReader(store.run_dir) as reader:
        yield reader


def test_steps_list_counts_episodes_calls_and_mean_reward(reader):
    steps = q.step_list(reader)
    assert steps["step"].tolist() == [0, 1] and steps["status"].tolist() == ["complete"] * 2
    assert steps["episodes"].tolist() == [1, N]
    assert steps["calls"].tolist() == [1, 3 * N + N // 3]
    assert steps["mean_reward"].tolist() == pytest.approx([1.0, 0.5])
    assert q.role_list(reader) == ["corrector1", "solver", "tool", "verifier1"]


def test_pages_give_their_rows_and_the_total(reader):
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


def test_each_filter_narrows_the_episodes_on_the_server(reader):
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


def test_the_call_tree_nests_calls_by_parent(reader):
    roots = q.call_tree(reader, episode_id(reader, 3))
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
    assert solver.preview == "The answer is 4"
    assert verifier.tool_calls == [{"name": "search", "arguments": {"query": "q3"}}]
    assert verifier.tool_results == [{"content": "result 3"}] and verifier.format_error is None
    assert q.call_tree(reader, episode_id(reader, 0))[0].children[0].format_error == "no verdict"
    assert q.call_tree(reader, 10**9) == []


def test_a_call_detail_holds_its_tokens_as_stored(reader):
    solver = q.call_tree(reader, episode_id(reader, 4))[0]
    detail = q.call_detail(reader, solver.id)
    assert (detail.call_id, detail.episode_id, detail.role) == (solver.id, episode_id(reader, 4), "solver")
    assert (detail.policy, detail.policy_version, detail.advantage) == ("base", 1, 0.5)
    assert detail.prompt_ids == [11, 12, 13] and detail.completion_ids == [21, 22, 23, 24, 25, 26]
    assert detail.owners == SOLVER_MASK
    assert detail.logprobs == pytest.approx([-0.1, -0.5, 0.0, 0.0, 0.0, -2.0])
    assert detail.token_advantages == pytest.approx([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    assert (detail.prompt_text, detail.completion_text) == ("Question 4: what is 4 + 1?", "The answer is 5")
    assert all(type(i) is int for i in detail.prompt_ids + detail.completion_ids + detail.owners)
    with pytest.raises(KeyError, match="no call 999999"):
        q.call_detail(reader, 999999)


def test_a_call_without_a_mask_logprobs_or_texts_is_all_trainable(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "rollout"})
    with store.step(0) as step:
        step.add_call(step.add_episode(), role="solver", completion_ids=[7, 8])
    store.close()
    with RunReader(store.run_dir) as reader:
        detail = q.call_detail(reader, 1)
    assert detail.owners == [int(TokenOwner.TRAINABLE)] * 2 and detail.prompt_ids == []
    assert detail.logprobs is None and detail.token_advantages is None and detail.policy_version is None
    assert (detail.prompt_text, detail.completion_text) == ("", "")


def test_what_a_live_view_polls_moves_with_complete_steps(tmp_path):
    store = RunStore.create(tmp_path, config={"kind": "train"})
    with RunReader(store.run_dir) as reader:
        assert q.complete_totals(reader) == (None, 0)
        assert q.metrics_since(reader, 0).empty
        version = q.data_version(reader)
        assert q.data_version(reader) == version, "nothing committed, nothing moved"
        with store.step(0) as step:
            step.add_call(step.add_episode(), role="solver", completion_ids=[1], mask=[1])
            step.log_metrics({"reward_mean": 0.5}, role="solver")
            step.log_metrics({"loss": 2.0})
            step.flush()
            assert q.data_version(reader) != version, "another connection committed"
            assert q.metrics_since(reader, 0).empty and q.complete_totals(reader) == (None, 0), (
                "only complete steps"
            )
        rows = q.metrics_since(reader, 0)
        assert rows.columns.tolist() == ["id", "step", "role", "name", "value"]
        assert rows["name"].tolist() == ["reward_mean", "loss"] and rows["role"].iloc[0] == "solver"
        assert rows["role"].isna().tolist() == [False, True], "a run-wide metric has no role"
        assert rows["value"].tolist() == [0.5, 2.0] and rows["step"].tolist() == [0, 0]
        with store.step(1) as step:
            step.add_call(step.add_episode(), role="solver", completion_ids=[1], mask=[1])
            step.add_call(step.add_episode(), role="solver", completion_ids=[1], mask=[1])
            step.log_metrics({"reward_mean": 0.75}, role="solver")
        past = q.metrics_since(reader, int(rows["id"].max()))
        assert past["step"].tolist() == [1] and past["value"].tolist() == [0.75], "only rows past the id"
        assert q.complete_totals(reader) == (1, 3)
    store.close()

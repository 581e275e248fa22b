"""A run's signals on its topology's graph: per-role colours, edge shares, answers fixed and broken, replays."""

import re

import pytest

import workbench as wb
from workbench.analysis.signals import graph_signals
from workbench.store import RunStore
from workbench.topology.diagram import Signals, to_svg

# MarsRL episodes: (solver reward, corrector reward or None where the Verifier ended the episode)
EPISODES = [(0.0, 1.0), (1.0, None), (1.0, 0.0), (0.0, 0.0)]


def _marsrl_run(tmp_path, linked: bool):
    """Four MarsRL episodes stored by hand: solve -> verify1 -> (correct1 | end)."""
    store = RunStore.create(tmp_path, config={"kind": "rollout", "topology": "marsrl"})
    with store.step(0) as step:
        for solver_reward, corrector_reward in EPISODES:
            episode = step.add_episode()
            solver = step.add_call(
                episode, role="solver", completion_ids=[1], rewards={"reward": solver_reward}
            )
            links = {"previous_id": solver} if linked else {}
            verifier = step.add_call(episode, role="verifier1", completion_ids=[2], source_id=solver, **links)
            if corrector_reward is not None:
                links = {"previous_id": verifier} if linked else {}
                step.add_call(
                    episode,
                    role="corrector1",
                    completion_ids=[3],
                    source_id=solver,
                    rewards={"reward": corrector_reward},
                    **links,
                )
        step.log_metrics({"reward/mean": 0.5, "accuracy": 0.5}, role="solver")
        step.log_metrics({"reward/mean": 0.25, "format/rate": 1.0}, role="verifier1")
    with store.step(1) as step:  # as a training run ends: the final held-out evaluation, no episodes
        step.log_metrics({"eval/solver/reward": 0.75})
    store.close()
    return store.run_dir


@pytest.mark.parametrize("linked", [False, True], ids=["linear", "previous-links"])
def test_edges_count_the_branches_taken_and_the_answers_fixed_and_broken(tmp_path, linked):
    signals = graph_signals(_marsrl_run(tmp_path, linked))  # step 0, not the evaluation-only step 1
    assert signals.colour_by == "reward/mean" and "step 0" in signals.title
    assert signals.roles["solver"] == {"reward/mean": 0.5, "accuracy": 0.5}
    assert signals.roles["verifier1"] == {"reward/mean": 0.25, "format/rate": 1.0}
    edges = signals.edges
    assert edges[("solve", "verify1")]["taken"] == 1.0
    assert edges[("verify1", "correct1")]["taken"] == 0.75 and edges[("verify1", "<end>")]["taken"] == 0.25
    # the Corrector read the Solver's answer: wrong -> right once, right -> wrong once, wrong -> wrong once
    assert edges[("verify1", "correct1")]["fixed"] == pytest.approx(1 / 3)
    assert edges[("verify1", "correct1")]["broke"] == pytest.approx(1 / 3)
    assert "fixed" not in edges[("solve", "verify1")]  # a verdict is not an answer
    assert edges[("correct1", "<end>")]["taken"] == 1.0


def test_a_fan_out_counts_each_call_once_and_every_later_answer(tmp_path):
    """A grouped rollout: one Verifier call followed by two Corrector samples (one fixes, one does not)."""
    store = RunStore.create(tmp_path, config={"kind": "rollout", "topology": "marsrl"})
    with store.step(0) as step:
        episode = step.add_episode()
        solver = step.add_call(episode, role="solver", completion_ids=[1], rewards={"reward": 0.0})
        verifier = step.add_call(
            episode, role="verifier1", completion_ids=[2], source_id=solver, previous_id=solver
        )
        for reward in (1.0, 0.0):
            step.add_call(
                episode, role="corrector1", completion_ids=[3], rewards={"reward": reward}, source_id=solver,
                previous_id=verifier,
            )  # fmt: skip
    store.close()
    edges = graph_signals(store.run_dir).edges
    assert edges[("verify1", "correct1")] == {"taken": 1.0, "calls": 1.0, "fixed": 0.5, "broke": 0.0}
    assert edges[("correct1", "<end>")] == {"taken": 1.0, "calls": 2.0}
    with pytest.raises(ValueError, match=r"no complete step 7; it has \[0\]"):
        graph_signals(store.run_dir, step=7)


def test_the_cli_draws_a_runs_topology_coloured_by_a_measure(tmp_path, capsys):
    from workbench.cli import main

    run_dir = _marsrl_run(tmp_path, linked=True)
    out = tmp_path / "graph.html"
    assert (
        main(["topology", "diagram", "--run", str(run_dir), "--colour-by", "accuracy", "--out", str(out)])
        == 0
    )
    page = out.read_text()
    assert "colour = accuracy" in page and 'data-value="0.5"' in page and "75%" in page


def test_the_diagram_colours_nodes_and_labels_edges_by_the_signals():
    topology = wb.load_topology("marsrl")
    signals = Signals(
        "run x, step 3",
        {"solver": {"reward/mean": 0.9, "kl": 0.01}, "verifier1": {"reward/mean": 0.1}},
        "reward/mean",
        {("verify1", "correct1"): {"taken": 0.75, "fixed": 0.5}},
    )
    plain, coloured = to_svg(topology), to_svg(topology, signals)
    assert "run x, step 3" in coloured and "run x, step 3" not in plain
    solve = re.search(r'<g class="node" data-name="solve"[^>]*>.*?</g>', coloured, re.S).group(0)
    assert 'data-value="0.9"' in solve and "solver · 0.90" in solve and "kl: 0.01" in solve
    verify = re.search(r'<g class="node" data-name="verify1"[^>]*>.*?</g>', coloured, re.S).group(0)
    fill = lambda node: re.search(r'<rect [^>]*fill="(#[0-9a-f]{6})"', node).group(1)  # noqa: E731
    assert fill(solve) == signals.fill("solver") != fill(verify) == signals.fill("verifier1")
    assert "75%" in coloured and "fixed: 0.5" in coloured
    corrector = re.search(r'<g class="node" data-name="correct1"[^>]*>.*?</g>', coloured, re.S).group(0)
    assert "data-value" not in corrector  # a role without numbers keeps its colours
    assert (
        signals.fill("corrector1") is None and Signals("t", {"a": {"m": float("nan")}}, "m").fill("a") is None
    )


def test_a_replay_of_a_runs_call_gives_its_role_a_replay_advantage(tmp_path):
    tasks = wb.generate_tasks("arithmetic", n=1, seed=3, level=1)
    run = wb.rollout("debate", tasks, model="tiny", max_tokens=4, runs_dir=tmp_path, seed=1)
    with wb.RunReader(run.run_dir) as reader:
        calls = reader.calls(columns=["role", "position"])
    judge = calls[calls["position"] == calls["position"].max()].iloc[0]
    result = wb.replay(run.run_dir, int(judge["id"]), n=2)
    signals = graph_signals(run.run_dir, colour_by="replay/advantage")
    own = result.estimate.own_outcome  # the judge is rewarded on its answer: its own reward counts
    assert own == f"role/{judge['role']}"
    expected = result.estimate.advantage_of(own).mean
    assert signals.roles[judge["role"]]["replay/advantage"] == pytest.approx(expected)
    assert (signals.low, signals.high) == (-1.0, 1.0)


def test_the_run_graph_widget_redraws_for_a_step_and_a_measure(tmp_path):
    from widgets.run_graph import RunGraph

    run_dir = _marsrl_run(tmp_path, linked=False)
    graph = RunGraph(run_dir)
    assert graph.step.options == [0] and 'data-name="solve"' in graph.diagram.object
    assert 'data-value="0.5"' in graph.diagram.object and "colour = reward/mean" in graph.diagram.object
    graph.colour_by.value = "format/rate"
    assert "colour = format/rate" in graph.diagram.object and 'data-value="1.0"' in graph.diagram.object
    store = RunStore.create(tmp_path / "empty", config={"kind": "rollout", "topology": "marsrl"})
    store.close()
    assert (
        "No graph: " in RunGraph(store.run_dir).diagram.object
        and "no complete step" in RunGraph(store.run_dir).diagram.object
    )

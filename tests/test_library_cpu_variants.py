"""MATPO and MAS-Orchestra sized for a 135M model on a CPU: ``matpo_cpu`` and ``mas_orchestra_cpu``.

The mechanics on scripted outputs (a small model will not write a protocol on demand; ``tests/scripted.py``):
``matpo_cpu``'s planner asks its worker, a nested agent that searches the task's knowledge base, and the worker's
calls take the planner's reward and advantage; ``mas_orchestra_cpu``'s orchestrator writes a graph of sub-agents
(``mas_lines``), which runs level by level with upstream answers put in, and its degree (sub-agents, depth) is a
per-step metric. Then a 2-step training run of each on the ``tiny`` model: it trains, stores its steps and calls,
and the metrics are there. What SmolLM2-135M does with them is in docs/experiments.md.
"""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest
import torch
from transformers import AutoTokenizer

import workbench as wb
from tests.scripted import ScriptedBackend
from workbench.engine import Rollout
from workbench.engine.mas_graph import degree
from workbench.engine.mas_lines import parse_mas_lines
from workbench.engine.parsers import FormatError
from workbench.models import load as load_model
from workbench.models import resolve
from workbench.rewards.verifiers import register
from workbench.rl import checkpoint
from workbench.rl.advantages import compute_advantages
from workbench.rl.metrics import rollout_metrics
from workbench.rl.samples import from_episodes
from workbench.store.codec import TokenOwner
from workbench.tasks import TaskOptionError, generate
from workbench.topology import to_dict, to_yaml
from workbench.training import create, run_here


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("tiny"))


def _tail(prompt: str, marker: str) -> str:
    """What follows the last ``marker`` of a few-shot prompt: the current item and what was inserted after it."""
    return prompt.rsplit(marker, 1)[1]


# ---------------------------------------------------------------------- the tasks


def test_masbench_small_chains_have_their_depth_and_the_answer_their_steps_give():
    tasks = generate("masbench_small", 60, seed=0, values=[1, 2, 3])
    assert [t.metadata["axis_value"] for t in tasks[:6]] == [1, 2, 3, 1, 2, 3]
    assert len({t.question for t in tasks}) == 60
    for task in tasks:
        steps = task.metadata["steps"]
        assert len(steps) == task.metadata["axis_value"] == task.metadata["difficulty"]
        values: dict[str, int] = {}
        for name, left, right, value in steps:  # recomputed from the text's own numbers
            assert 1 <= right <= 9 and value == values.get(left, left) + right
            values[name] = value
        assert all(v <= 9 for v in values.values()), "single-digit sums all the way"
        assert task.answer == str(steps[-1][3]) and task.verifier == "number"
        lets = " ".join(f"Let {n} = {a} + {b}." for n, a, b, _ in steps)
        assert task.question == f"{lets} What is {steps[-1][0]}?"
    assert generate("masbench_small", 5, seed=1) == generate("masbench_small", 5, seed=1)
    assert generate("masbench_small", 5, seed=1) != generate("masbench_small", 5, seed=2)
    with pytest.raises(TaskOptionError, match="depth values must be in 1..6"):
        generate("masbench_small", 2, seed=0, values=[0])
    with pytest.raises(TaskOptionError, match="axis depth only"):
        generate("masbench_small", 2, seed=0, axis="breadth")


# ---------------------------------------------------------------------- the compact graph


def test_mas_lines_reads_agents_and_takes_edges_from_the_names_an_input_uses():
    graph = parse_mas_lines('junk first\nk = CoTAgent("1 + 6")\np = SCAgent("k + 2")\ntrailing words')
    assert [(a["id"], a["name"], a["input"]) for a in graph["agents"]] == [
        ("k", "CoTAgent", "1 + 6"),
        ("p", "SCAgent", "${k} + 2"),
    ]
    assert graph["edges"] == [["k", "p"]] and graph["order"] == [["k"], ["p"]] and graph["sink"] == "p"
    assert degree(graph) == {"agents": 2.0, "depth": 2.0, "edges": 1.0}
    fan_in = parse_mas_lines('A1 = CoTAgent("1 + 2")\nA2 = CoTAgent("3 + 4")\nA3 = CoTAgent("${A1} + ${A2}")')
    assert fan_in["order"] == [["A1", "A2"], ["A3"]] and degree(fan_in)["depth"] == 2.0
    explicit = parse_mas_lines('A1 = CoTAgent("")\nA2 = CoTAgent("")\nA1 -> A2')
    assert explicit["edges"] == [["A1", "A2"]] and explicit["agents"][0]["input"] == ""
    debate = parse_mas_lines('d = DebateAgent("", ["Optimist", "Skeptic"])')
    assert debate["agents"][0]["roles"] == ["Optimist", "Skeptic"]
    direct = parse_mas_lines("m = 3 + 4\nAnswer: 7")
    assert direct["agents"] == [] and direct["answer"] == "7" and degree(direct)["agents"] == 0.0
    for text, problem in (
        ('a = CoTAgent("1")\nb = CoTAgent("2")', "multiple agents require edges"),
        ('a = CoTAgent("1")\nb = CoTAgent("a")\nc = CoTAgent("a")', "exactly one sink"),
        ('a = CoTAgent("1")\na = CoTAgent("2")', "unique"),
        ('a = CoT("1")', "unknown agent type 'CoT'"),
        ('a = CoTAgent("b")\nb = CoTAgent("a")', "no start agent"),
        ('a = DebateAgent("x", ["Pro"])', "two debate roles"),
    ):
        with pytest.raises(FormatError, match=problem):
            parse_mas_lines(text)
    assert degree(None) is None and degree({"results": {}, "sink": "a"}) is None


# ---------------------------------------------------------------------- matpo_cpu on a script


def _matpo_script(task, answers):
    """The planner asks the worker the question and answers with what comes back (``answers`` gives each
    planner's answer in turn: None = the reply); the worker searches the entity and answers the task's answer."""
    turn = iter(answers)

    def script(prompt: str) -> str:
        if "Ask the worker" in prompt:
            tail = _tail(prompt, "Question: ")
            if "<reply>" not in tail:
                return f"<ask>{task.question}</ask>"
            reply = re.findall(r"<reply>(.*?)</reply>", tail)[-1]
            given = next(turn)
            return f"<answer>{reply if given is None else given}</answer>"
        tail = _tail(prompt, "Question: ")
        if "<information>" not in tail:
            return f"<search>{task.metadata['start']}</search>"
        return f"<answer>{task.answer}</answer>"

    return script


def test_matpo_cpu_planner_asks_a_worker_that_searches_and_the_worker_takes_the_planners_advantage(tokenizer):
    task = generate("multihop", 1, seed=5, hops=1)[0]
    spec = wb.load_topology("matpo_cpu")
    backend = ScriptedBackend(tokenizer, _matpo_script(task, [None, "Nobody"]))
    episodes = asyncio.run(Rollout(spec, backend).run([task], group_size=2))
    right, wrong = sorted(episodes, key=lambda e: -e.reward)
    assert right.answer == task.answer and right.reward == 1.0 and wrong.reward == 0.0
    for episode in episodes:
        planner = next(c for c in episode.calls if c.role == "planner")
        worker = next(c for c in episode.calls if c.role == "worker")
        assert worker.parent == planner.position and planner.tool_results[0]["via"] == "work"
        assert f"Question: {task.question}" in worker.prompt_text  # a fresh context: the subtask alone
        assert "Ask the worker" not in worker.prompt_text and "<ask>" not in worker.prompt_text
        supporting = {f"kb://{doc}" for hop in task.metadata["supporting_docs"] for doc in hop}
        assert any(url in worker.tool_results[0]["text"] for url in supporting), "it searched the task's KB"
        # the worker's answer reached the planner as another role's text, never as the planner's own tokens
        owners = zip(planner.completion_ids, planner.mask, strict=True)
        assert task.answer in tokenizer.decode([t for t, m in owners if m == TokenOwner.OTHER_ROLE])
        assert worker.rewards == planner.rewards, "MATPO: the planner's reward, broadcast to its worker"
    samples = from_episodes(episodes)
    compute_advantages(samples, episodes, spec)
    by_call = {(s.episode, s.role): s for s in samples}
    for i in range(2):
        assert by_call[(i, "worker")].advantage == by_call[(i, "planner")].advantage != 0.0
    assert by_call[(0, "planner")].advantage == -by_call[(1, "planner")].advantage


# ---------------------------------------------------------------------- mas_orchestra_cpu on a script


def _sub_agent(prompt: str) -> str:
    """A sub-agent that adds right: its sum (``What is a + b?``), or the whole chain of the task."""
    problem = _tail(prompt, "Problem: ")
    asked = re.findall(r"What is (\d+) \+ (\d+)\?", problem)
    if asked:
        return f" {int(asked[-1][0]) + int(asked[-1][1])}"
    values: dict[str, int] = {}
    for name, left, right in re.findall(r"Let (\w+) = (\w+) \+ (\d+)\.", problem):
        values[name] = values[left] + int(right) if left in values else int(left) + int(right)
    return f" {values[name]}"


def _orchestrator_script(plan):
    def script(prompt: str) -> str:
        if "Plan which helper agents" in prompt:
            return plan(_tail(prompt, "Task: "))
        return _sub_agent(prompt)

    return script


def _chain_plan(task):
    """One agent per step of the chain, named after the task's variables (what the few-shot examples show)."""
    return "\n".join(
        f'{name} = CoTAgent("{left} + {right}")' for name, left, right, _ in task.metadata["steps"]
    )


def test_mas_orchestra_cpu_runs_the_emitted_graph_level_by_level_and_records_its_degree(tokenizer):
    task = generate("masbench_small", 3, seed=0, values=[3])[0]
    spec = wb.load_topology("mas_orchestra_cpu")
    backend = ScriptedBackend(tokenizer, _orchestrator_script(lambda tail: _chain_plan(task)))
    episode = asyncio.run(Rollout(spec, backend).episode(task))
    assert episode.status == "complete", episode.error
    assert episode.answer == task.answer and episode.reward == 1.0
    orchestrator, *agents = episode.calls
    assert orchestrator.role == "orchestrator" and [c.role for c in agents] == ["cot_agent"] * 3
    # each sub-agent read its own sum alone, the upstream answer put in place of the name
    steps = task.metadata["steps"]
    sums = [re.findall(r"Problem: (What is .*?)\nAnswer:", c.prompt_text)[-1] for c in agents]
    assert sums[0] == f"What is {steps[0][1]} + {steps[0][2]}?"
    assert sums[1:] == [
        f"What is {before[3]} + {step[2]}?" for before, step in zip(steps, steps[1:], strict=False)
    ]
    assert task.question not in agents[1].prompt_text
    assert orchestrator.rewards["reward"] == 1.0 and not any(c.rewards for c in agents), (
        "only the orchestrator"
    )
    _, roles = rollout_metrics([episode])
    assert roles["orchestrator"]["mas/agents/mean"] == 3.0 and roles["orchestrator"]["mas/depth/max"] == 3.0
    assert roles["orchestrator"]["mas/direct/rate"] == 0.0 and "mas/agents/mean" not in roles["cot_agent"]


def test_mas_orchestra_cpu_scores_zero_for_an_invalid_graph_or_an_agent_type_it_does_not_run(tokenizer):
    task = generate("masbench_small", 1, seed=0, values=[2])[0]
    spec = wb.load_topology("mas_orchestra_cpu")
    plans = {
        "two sinks": 'a = CoTAgent("1 + 2")\nb = CoTAgent("a + 1")\nc = CoTAgent("a + 3")',
        "a debate": 'a = DebateAgent("1 + 2", ["Pro", "Con"])',
        "the whole task to one voting agent": 'x = SCAgent("")',
        "a direct answer": f"Answer: {task.answer}",
    }
    results = {}
    for name, plan in plans.items():
        backend = ScriptedBackend(tokenizer, _orchestrator_script(lambda tail, plan=plan: plan))
        results[name] = asyncio.run(Rollout(spec, backend).episode(task))
    assert results["two sinks"].calls[0].format_error.startswith("exactly one sink")
    assert [c.role for c in results["two sinks"].calls] == ["orchestrator"]
    assert results["two sinks"].reward == 0
    assert [c.role for c in results["a debate"].calls] == ["orchestrator"], "an unmapped type never runs"
    assert results["a debate"].answer == "" and results["a debate"].reward == 0
    voting = results["the whole task to one voting agent"]
    assert [c.role for c in voting.calls] == ["orchestrator"] + ["cot_agent"] * 3, (
        "SCAgent: 3 answers, a vote"
    )
    assert all(task.question in c.prompt_text for c in voting.calls[1:]), "an empty input: the whole task"
    assert results["a direct answer"].reward == 1.0 and len(results["a direct answer"].calls) == 1
    _, roles = rollout_metrics(list(results.values()))
    orchestrator = roles["orchestrator"]
    assert orchestrator["format/rate"] == 0.75, "the invalid graph counts as a format failure"
    assert orchestrator["mas/agents/mean"] == pytest.approx(2 / 3)
    assert orchestrator["mas/direct/rate"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------- 2-step training runs on the tiny model


_scored = itertools.count()


@register("alternating_cpu_variants")
def _alternating(prediction: str, reference: str) -> float:
    """1 for every other answer scored: a tiny random model's groups carry a reward spread to learn from (its
    planner writes no <answer> tag, so every episode answers the same empty text)."""
    return float(next(_scored) % 2)


@pytest.mark.parametrize(
    ("topology", "tasks", "options", "trained_role"),
    [
        ("matpo_cpu", "multihop", {"hops": 1}, "planner"),
        ("mas_orchestra_cpu", "masbench_small", {"values": [1, 2, 3]}, "orchestrator"),
    ],
)
def test_a_two_step_run_trains_stores_and_records_its_metrics(
    topology, tasks, options, trained_role, tmp_path
):
    spec = to_dict(wb.load_topology(topology))  # its trained role rewarded on every other answer
    spec["roles"][trained_role]["reward"]["verifier"] = "alternating_cpu_variants"
    (tmp_path / "spec.yaml").write_text(to_yaml(wb.topology_from_dict(spec)))
    config = wb.TrainConfig(
        model="tiny",
        topology=str(tmp_path / "spec.yaml"),
        tasks=tasks,
        task_options=options,
        n_tasks=8,
        steps=2,
        batch_size=2,
        group_size=4,
        max_tokens=12,
        eval_tasks=2,
        eval_every=0,
        checkpoint_every=2,
        learning_rate=1e-3,
        runs_dir=str(tmp_path),
    )
    run_dir = create(config)
    before = {k: v.clone() for k, v in load_model("tiny")[0].state_dict().items()}
    assert run_here(run_dir) == "finished", (run_dir / "run.log").read_text()
    reader = wb.RunReader(run_dir)
    assert list(reader.steps()["step"]) == [0, 1, 2]  # two updates, then the final held-out evaluation
    calls = reader.calls()
    assert trained_role in set(calls["role"]) <= set(spec["roles"])
    trained = calls[(calls["role"] == trained_role) & (calls["step"] < 2)]
    assert len(trained) == 2 * 2 * 4 and trained["advantage"].notna().all()
    assert (trained["advantage"] != 0).any(), "some group had a spread to learn from"
    wide = reader.metrics_wide()
    for column in ("loss", "grad_norm", "reward/mean", "eval/accuracy", f"{trained_role}/format/rate"):
        assert column in wide.columns, column
    assert (wide["grad_norm"].iloc[:2] > 0).any()
    saved = checkpoint.trained_weights(run_dir / "checkpoints" / "step-000001")
    after = {k.removeprefix("base/"): v for k, v in saved.items()}
    assert set(after) == set(before) and any(not torch.equal(before[k], after[k]) for k in before), (
        "weights moved"
    )
    if topology == "mas_orchestra_cpu":  # the degree of the emitted MAS, per step (a random model's text
        # holds no agent line, so it reads as a direct answer: degree 0)
        for column in (
            "mas/agents/mean",
            "mas/agents/max",
            "mas/depth/mean",
            "mas/depth/max",
            "mas/direct/rate",
        ):
            assert wide[f"orchestrator/{column}"].iloc[:2].notna().all(), column

"""Real learning with tools on a CPU: MARS's System 2 and System 1 on SmolLM2-135M answer more held-out questions.

The topology is the library's ``mars_cpu``: System 2 searches the task's knowledge base, System 1 distils the
document it found, System 2 answers; both roles share one model and the trajectory's reward (token F1 of the
answer). Training questions and held-out questions ask about disjoint sets of entities of one knowledge base,
so a rise on the held-out set is a skill (search for the name, read the answer off the result), not a memory.
Held-out scores are greedy, on 80 questions, before the first update and after the last; System 2's reward and
the exact-answer rate must each rise by more than two standard errors of the paired difference (the same
questions are scored before and after, from the run's stored per-question ``eval`` events).
Both roles sample among the 10 likeliest tokens (the topology's ``top_k``) at temperature 0.7: from the whole
vocabulary at temperature 1 the base model's sampled answers score F1 > 0 in 0 of 32 episodes (greedy: 13 of
32), so groups rarely carry a reward to learn from; with top_k 10 at 0.7, 8 of 32.
12 steps of 4 questions x 4 samples, token-mean loss, the learning rate warmed up over 2 steps: 8 steps with
GRPO's per-sample mean passed on some runs and failed on others (docs/experiments.md). A run whose first
batches held hard questions had too few rewards to learn from in 8; and with the per-sample mean, a System 1
sample that copied nothing (one token) and still ended in a rewarded answer pushed that one token with a
whole sample's weight, so that System 1 copied nothing in most calls after two updates; the run where it
happened never recovered (no reward, so no gradient).
vLLM's CPU build is the rollout engine (the weights reach it after every step), so this runs in the vLLM
phase of the suite.
"""

from __future__ import annotations

import random

import pytest

import workbench as wb
from workbench.rl.config import TrainConfig
from workbench.rl.evaluation import OUTCOME, paired_rise
from workbench.rl.loop import run_training
from workbench.tasks import generate
from workbench.training import create


def disjoint_split(n_held_out: int = 80) -> tuple[list[wb.Task], list[wb.Task]]:
    """One-hop questions of one 200-entity knowledge base, split by the entity they ask about."""
    tasks = generate("multihop", 300, seed=3, hops=1, kb_seed=0, n_entities=200, verifier="f1")
    starts = sorted({t.metadata["start"] for t in tasks})
    random.Random(0).shuffle(starts)
    held = set(starts[: len(starts) // 4])
    train = [t for t in tasks if t.metadata["start"] not in held]
    held_out = [t for t in tasks if t.metadata["start"] in held]
    return train, held_out[:n_held_out]


def test_the_split_shares_no_entity_or_question():
    train, held_out = disjoint_split()
    assert len(held_out) == 80 and len(train) > 150
    assert not {t.metadata["start"] for t in train} & {t.metadata["start"] for t in held_out}
    assert not {t.question for t in train} & {t.question for t in held_out}


@pytest.mark.slow
def test_mars_system2_and_system1_answer_more_held_out_questions(tmp_path):
    train, held_out = disjoint_split()
    config = TrainConfig(
        model="smollm2-135m",
        backend="vllm",
        topology="mars_cpu",
        tasks="multihop",
        eval_tasks=len(held_out),
        eval_every=0,
        steps=12,
        batch_size=4,
        group_size=4,
        max_tokens=None,
        temperature=0.7,
        learning_rate=3e-5,
        warmup_steps=2,
        aggregation="token_mean",
        checkpoint_every=100,
        runs_dir=str(tmp_path),
    )
    run_dir = create(config)
    assert run_training(config, run_dir, tasks=train, eval_tasks=held_out, log=print) == "finished"
    reader = wb.RunReader(run_dir)
    evals = reader.events(kind="eval").set_index("step")["payload"]
    before, after = evals[0]["tasks"], evals[config.steps]["tasks"]
    assert len(before) == len(after) == len(held_out)
    for name, key, transform in (
        ("System 2 reward", "system2", float),
        ("exact answers", OUTCOME, lambda r: float(r >= 1.0)),
    ):
        start = sum(transform(s[key]) for s in before.values()) / len(before)
        rise, se, n = paired_rise(before, after, key, transform)
        print(f"{name}: {start:.3f} -> {start + rise:.3f} ({rise / max(se, 1e-9):.1f} paired SE, n={n})")
        assert start < 0.6, f"{name} must start well below the ceiling"
        assert rise > 2.0 * se, f"{name}: {start:.3f} -> {start + rise:.3f} is {rise / max(se, 1e-9):.1f} SE"
    calls = reader.calls(columns=["step", "role", "tool_calls"])
    assert set(calls["role"]) == {"system2", "system1"}, "both roles were rolled out and stored"

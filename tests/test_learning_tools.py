"""Real learning with tools on a CPU: MARS's System 2 and System 1 on SmolLM2-135M answer more held-out questions.

The topology is the library's ``mars_cpu``: System 2 searches the task's knowledge base, System 1 distils the
document it found, System 2 answers; both roles share one model and the trajectory's reward (token F1 of the
answer). Training questions and held-out questions ask about disjoint sets of entities of one knowledge base,
so a rise on the held-out set is a skill (search for the name, read the answer off the result), not a memory.
Held-out scores are greedy, on 80 questions, before the first update and after the last; the reward must rise
by more than two standard errors (the Bernoulli bound on the variance, conservative for F1 in [0, 1]).
vLLM's CPU build is the rollout engine (the weights reach it after every step), so this runs in the vLLM
phase of the suite.
"""

from __future__ import annotations

import math
import random

import pytest

import workbench as wb
from workbench.rl.config import TrainConfig
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
@pytest.mark.skip(
    reason="not yet reliable: at 8 steps the held-out rise was 4.8, 2.2 and 1.3 standard errors in three runs "
    "(unseeded vLLM rollouts); needs seeded rollouts and more steps within the 10-minute budget (issue 4)"
)
def test_mars_system2_and_system1_answer_more_held_out_questions(tmp_path):
    train, held_out = disjoint_split()
    config = TrainConfig(
        model="smollm2-135m",
        backend="vllm",
        topology="mars_cpu",
        tasks="multihop",
        eval_tasks=len(held_out),
        eval_every=0,
        steps=8,
        batch_size=4,
        group_size=4,
        max_tokens=None,
        temperature=0.7,
        learning_rate=3e-5,
        checkpoint_every=100,
        runs_dir=str(tmp_path),
    )
    run_dir = create(config)
    assert run_training(config, run_dir, tasks=train, eval_tasks=held_out, log=print) == "finished"
    wide = wb.RunReader(run_dir).metrics_wide()
    before, after = wide.loc[0], wide.loc[config.steps]
    n = len(held_out)
    for metric in ("eval/system2/reward", "eval/accuracy"):
        b, a = before[metric], after[metric]
        rise = (a - b) / max(math.sqrt((b * (1 - b) + a * (1 - a)) / n), 1e-9)
        print(f"{metric}: {b:.3f} -> {a:.3f} ({rise:.1f} standard errors)")
        assert b < 0.6, f"{metric} must start well below the ceiling"
        assert rise > 2.0, f"{metric}: {b:.3f} -> {a:.3f} is {rise:.1f} SE"
    calls = wb.RunReader(run_dir).calls(columns=["step", "role", "tool_calls"])
    assert set(calls["role"]) == {"system2", "system1"}, "both roles were rolled out and stored"

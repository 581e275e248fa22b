"""Real learning on a CPU: MarsRL's Solver and Verifier on SmolLM2-135M both get better on held-out problems.

The topology is the library's MarsRL at CPU scale: its Solver and Verifier roles, prompts and
agent-specific rewards (Solver: its answer; Verifier: its verdict against the true correctness of the
solution it judged), one verification round, grouped rollouts picking 1 Solver output per problem
(adaptive: wrong ones first), 16-token completions sampled among the 50 likeliest tokens (sampling
from the whole vocabulary at temperature 1, a 135M model spends much of each group on junk tokens
and the run learns less in its 15 steps). Single-digit addition, asked for "just the number"
(where the base model is partly right, per DESIGN.md). Held-out scores are greedy, on 64 problems of
another seed, before the first update and after the last; each must rise by more than two standard
errors. The base Verifier almost never writes a verdict within 16 tokens (format failures score 0), so
much of its rise is learning to give one; the TP/FP/TN/FN counts are in the run's metrics.

One run serves both tests. The Solver's rise is reliable (3.0 standard errors in each of two runs here).
The Verifier's is not, so its test is an expected failure until it is: it rose 0.00 -> 0.59 in one run,
and in two later runs its greedy output after training copied the Solver's answer (one shared policy,
and in most steps every Verifier group has one reward, so no gradient); an XPASS shows a run where it rose.
Its score is measured on the Solver's greedy solutions, so "always Correct" scores the Solver's accuracy
(a verdict-first prompt did exactly that, 0.69 -> 0.97 here, and 0.50 on a fixed balanced set both
before and after): an XPASS needs the TP/FP/TN/FN counts read before it is believed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import workbench as wb
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training
from workbench.topology import from_dict, to_dict
from workbench.training import create


def marsrl_cpu() -> wb.Topology:
    spec = to_dict(wb.load_topology("marsrl"))
    nodes = spec["flow"]["nodes"]
    nodes["verify1"]["next"] = [{"goto": "end"}]
    nodes["verify1"]["select"]["k"] = 1
    for node in ("correct1", "verify2", "correct2"):
        del nodes[node]
    for role in ("corrector1", "verifier2", "corrector2"):
        del spec["roles"][role]
    for role in ("solver", "verifier1"):
        spec["roles"][role]["sampling"].update(max_tokens=16, top_k=50)
    return from_dict(spec)


def _rise_in_standard_errors(before: float, after: float, n: int) -> float:
    se = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    return (after - before) / max(se, 1e-9)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    config = TrainConfig(
        model="smollm2-135m",
        tasks="arithmetic",
        task_options={"level": 1, "format": "plain"},
        n_tasks=200,
        eval_tasks=64,
        eval_every=0,
        steps=15,
        batch_size=4,
        group_size=4,
        max_tokens=None,
        learning_rate=1e-5,
        checkpoint_every=100,
        runs_dir=str(tmp_path_factory.mktemp("marsrl")),
    )
    run_dir = create(config)
    assert run_training(config, run_dir, topology=marsrl_cpu(), log=print) == "finished"
    return run_dir, config.steps


def _assert_rises(run: tuple[Path, int], metric: str, n: int = 64) -> None:
    run_dir, steps = run
    wide = wb.RunReader(run_dir).metrics_wide()
    before, after = wide.loc[0, metric], wide.loc[steps, metric]
    rise = _rise_in_standard_errors(before, after, n)
    print(f"{metric}: {before:.3f} -> {after:.3f} ({rise:.1f} standard errors)")
    assert before < 0.9, f"{metric} must start well below the ceiling"
    assert rise > 2.0, f"{metric}: {before:.3f} -> {after:.3f} is {rise:.1f} SE"


@pytest.mark.slow
def test_marsrl_solver_improves_on_held_out_problems(trained_run):
    _assert_rises(trained_run, "eval/solver/reward")


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    reason="the Verifier's verdict accuracy rose in 1 of 3 runs; see the module docstring and the README",
)
def test_marsrl_verifier_improves_on_held_out_problems(trained_run):
    _assert_rises(trained_run, "eval/verifier1/reward")

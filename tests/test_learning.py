"""Real learning on a CPU: MarsRL's Solver and Verifier on SmolLM2-135M, scored before and after one run.

The topology is the library's ``marsrl_cpu``: MarsRL's Solver and Verifier with agent-specific rewards
(Solver: its answer; Verifier: its verdict against the true correctness of the solution it judged), one
verification round, grouped rollouts (the Verifier judges each of the Solver's G solutions G times), one
shared model. Single-digit addition asked for "just the number" (where the base model is partly right,
per DESIGN.md). One run of 25 steps serves the three tests (the third replays the run's first states with the
base model and the trained checkpoint: ``wb.replay_calls``).

The Solver is scored greedily on 64 held-out problems before the first update and after the last.

The Verifier is scored on a fixed, balanced judging set: 32 held-out problems, each shown once with its
right sum and once with a sum off by 1 to 3 (near misses, unlike most of the Solver's wrong answers it
trains on), so a Verifier that always says "Correct" (or always "Wrong") scores 0.5. Scoring it on the
Solver's own greedy solutions, as the run's ``eval/verifier1/reward`` does, rewards "always Correct" with
the Solver's accuracy. The trained model is taken out of the run with
``workbench.rl.export.export_model`` and judges the set through ``wb.rollout`` (its own check, then its
verdict), as the base model does. To pass, the Verifier must rise by more than two standard errors and
beat guessing by more than two.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import workbench as wb
from workbench.rewards.assign import verdict_of
from workbench.rl.config import TrainConfig
from workbench.rl.export import export_model
from workbench.rl.loop import run_training
from workbench.tasks import Task, generate
from workbench.topology import from_dict, to_dict
from workbench.training import create

N_HELD_OUT = 64
#: Problems in the Verifier's judging set (each shown twice): 32, not 64, to keep CI within its time. The 64-problem
#: set passed at 6.1 standard errors; half of it is expected near 4.3 (docs/experiments.md).
N_JUDGED = 32


def judging_topology() -> wb.Topology:
    """The CPU Verifier alone (its check and verdict calls, prompts and sampling as trained), judging the
    candidate each task carries."""
    spec = to_dict(wb.load_topology("marsrl_cpu"))
    roles = {name: spec["roles"][name] for name in ("checker", "verifier1")}
    verifier = roles["verifier1"]
    verifier["prefill"] = verifier["prefill"].replace("{{ solution }}", "{{ task.metadata.candidate }}")
    verifier["reward"] = {"kind": "none"}
    nodes = {
        "check": {"call": "checker", "bind": {"check": "text.strip()"}, "next": [{"goto": "verify"}]},
        "verify": {"call": "verifier1", "bind": {"verdict": "parsed.verdict"}, "next": [{"goto": "end"}]},
    }
    return from_dict(
        {
            "name": "marsrl-verifier-judging",
            "policies": {"base": {}},
            "roles": roles,
            "flow": {"start": "check", "answer": "{{ verdict }}", "nodes": nodes},
        }
    )


def judging_set(n: int, seed: int) -> list[Task]:
    """``n`` held-out problems, each twice: with its right sum and with a sum off by 1 to 3."""
    out = []
    for task in generate("arithmetic", n=n, seed=seed, level=1, format="plain"):
        right = int(task.answer)
        offsets = [d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0]
        wrong = right + random.Random(task.id).choice(offsets)
        for candidate, correct in ((right, True), (wrong, False)):
            metadata = {**task.metadata, "candidate": str(candidate), "candidate_correct": correct}
            out.append(Task(f"{task.id}-{candidate}", task.question, task.answer, task.verifier, metadata))
    return out


def verdict_accuracy(model: str | Path, tasks: list[Task], runs_dir: Path) -> tuple[float, dict[str, int]]:
    """Greedy verdict accuracy on ``tasks`` and its confusion counts (no verdict counts as not right)."""
    result = wb.rollout(
        judging_topology(), tasks, model=str(model), runs_dir=runs_dir, sampling={"temperature": 0.0}
    )
    by_id = {t.id: t for t in tasks}
    counts = dict.fromkeys(("TP", "FP", "TN", "FN", "none"), 0)
    for episode in result.episodes:
        verdict = verdict_of(next(call for call in episode.calls if call.role == "verifier1"))
        truth = by_id[episode.task_id].metadata["candidate_correct"]
        if verdict is None:
            counts["none"] += 1
        else:
            said = verdict == "correct"
            counts[("T" if said == truth else "F") + ("P" if said else "N")] += 1
    return (counts["TP"] + counts["TN"]) / len(tasks), counts


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
        eval_tasks=N_HELD_OUT,
        eval_every=0,
        steps=25,
        batch_size=4,
        group_size=4,
        max_tokens=None,
        learning_rate=1e-5,
        checkpoint_every=100,
        topology="marsrl_cpu",
        runs_dir=str(tmp_path_factory.mktemp("marsrl")),
    )
    run_dir = create(config)
    assert run_training(config, run_dir, log=print) == "finished"
    return run_dir, config.steps


def _assert_rises(before: float, after: float, n: int, what: str) -> None:
    rise = _rise_in_standard_errors(before, after, n)
    print(f"{what}: {before:.3f} -> {after:.3f} ({rise:.1f} standard errors)")
    assert before < 0.9, f"{what} must start well below the ceiling"
    assert rise > 2.0, f"{what}: {before:.3f} -> {after:.3f} is {rise:.1f} SE"


@pytest.mark.slow
def test_marsrl_solver_improves_on_held_out_problems(trained_run):
    run_dir, steps = trained_run
    wide = wb.RunReader(run_dir).metrics_wide()
    metric = "eval/solver/reward"
    _assert_rises(wide.loc[0, metric], wide.loc[steps, metric], N_HELD_OUT, metric)


@pytest.mark.slow
def test_marsrl_verifier_improves_on_a_balanced_judging_set(trained_run, tmp_path):
    run_dir, _ = trained_run
    tasks = judging_set(N_JUDGED, seed=12345)
    trained = export_model(run_dir, tmp_path / "trained", topology=wb.load_topology("marsrl_cpu"))
    before, before_counts = verdict_accuracy("smollm2-135m", tasks, tmp_path / "runs")
    after, after_counts = verdict_accuracy(trained, tasks, tmp_path / "runs")
    print(f"judging set before {before_counts}, after {after_counts}")
    what = "Verifier verdict accuracy on the balanced judging set"
    _assert_rises(before, after, len(tasks), what)
    beats_guessing = (after - 0.5) / math.sqrt(0.25 / len(tasks))
    assert beats_guessing > 2.0, f"{what}: {after:.3f} beats guessing (0.5) by {beats_guessing:.1f} SE only"


@pytest.mark.slow
def test_replays_of_the_runs_first_states_score_the_trained_checkpoint_above_the_base_model(trained_run):
    """Counterfactual replay on the trained run (issue 27): from the first Solver call of each problem of its
    first two steps (8 problems), 4 continuations each (the Solver's answer, the check and the verdict sampled
    again) with the base model and then the run's last checkpoint playing. Each role's expected reward must
    rise by more than two standard errors, as the held-out scores above do. Several problems, not one: the
    trained Solver can be wrong on a given sum every time (6 + 4 = 12 in one run)."""
    run_dir, _ = trained_run
    with wb.RunReader(run_dir) as reader:
        calls = reader.calls(step=[0, 1], role="solver", columns=["role", "episode_id"])
        task_of = reader.episodes(step=[0, 1]).set_index("id")["task_id"]
        checkpoint = int(reader.checkpoints()["step"].max())
    firsts = calls.assign(task=calls["episode_id"].map(task_of)).groupby("task")["id"].min()
    ids = sorted(int(i) for i in firsts)
    base = wb.replay_calls(run_dir, calls=ids, n=4, arms=["resample"], seed=5)
    trained = wb.replay_calls(
        run_dir, calls=ids, n=4, arms=["resample"], policies={"base": f"step:{checkpoint}"}, seed=5
    )
    for role in ("solver", "verifier1"):
        before, after = base.pooled()[f"role/{role}"], trained.pooled()[f"role/{role}"]
        rise = after.minus(before)
        print(f"replayed {role}: {before.mean:.3f} -> {after.mean:.3f} ({rise.mean / rise.stderr:.1f} SE)")
        assert before.n == after.n == 4 * len(ids) and rise.mean > 2 * rise.stderr, (
            f"{role}: {before} -> {after}"
        )

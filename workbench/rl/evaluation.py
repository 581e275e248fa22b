"""Held-out evaluation: greedy scores per task and per role, and the paired rise between two evaluations.

Every evaluation is stored with its step as an ``eval`` event whose payload maps each task id to its
outcome reward and each rewarded role's mean reward, so a before/after comparison can pair the same
questions (the paired standard error is the right yardstick for "did the same questions get answered
better", and it is smaller than the unpaired one when most answers do not change).

A role's score is its own reward, so a Verifier rewarded with the outcome scores the outcome. Every Verifier (a
role whose parser reads a verdict, whatever its reward) is therefore also scored on its verdicts against the truth
of what it judged (``workbench.rl.metrics.verdict_truth``, the rule of the training-time count in
``workbench.analysis.verdicts``): per task ``verdicts:<role>``, the share of its verdicts there that were right (no
verdict: not right), with the task's confusion cells under the payload's ``verdicts`` (task -> role -> cell ->
count); run-wide ``eval/<role>/verdict_accuracy``, ``eval/<role>/verdict_balanced_accuracy`` (the mean of its recall
on right solutions and on wrong ones; absent where it judged none of one kind) and the counts
(``eval/<role>/verdicts/<cell>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from workbench.rewards.assign import verdict_of
from workbench.rl.metrics import VERDICT_CELLS, verdict_cell, verdict_truth, verifier_role_names

#: The key of the outcome (episode) reward in a task's scores.
OUTCOME = "outcome"
#: The prefix of a Verifier's verdicts-right score in a task's scores (``verdicts:<role>``).
VERDICTS_PREFIX = "verdicts:"


def verdicts_key(role: str) -> str:
    """The key of ``role``'s verdicts right in a task's scores."""
    return VERDICTS_PREFIX + role


def evaluate(engine: Any, tasks: list[Any], run_sync: Callable[..., Any]) -> tuple[dict[str, float], dict]:
    """Greedy held-out scores: (run-wide metrics, per-task scores for the ``eval`` event)."""
    episodes = run_sync(lambda: engine.run(tasks, group_size=1))
    topology = getattr(engine, "topology", None)
    judges = verifier_role_names(topology.roles) if topology is not None else set()
    per_task: dict[str, dict[str, float]] = {}
    cells: dict[str, dict[str, dict[str, int]]] = {}  # task -> Verifier -> cell -> count
    # per Verifier and truth (right solution or wrong), the verdicts right and those judged
    recall: dict[str, dict[bool, list[int]]] = {}
    for episode in episodes:
        by_role: dict[str, list[float]] = {}
        judged: dict[str, dict[str, int]] = {}
        by_position = {call.position: call for call in episode.calls}
        for call in episode.calls:
            if call.rewards:
                by_role.setdefault(call.role, []).append(call.rewards.get("reward", 0.0))
            if call.role not in judges:
                continue
            source = by_position.get(call.source) if call.source is not None else None
            truth = verdict_truth(call.rewards, source.rewards if source is not None else None)
            if truth is None:
                continue
            cell = verdict_cell(verdict_of(call), truth)
            judged.setdefault(call.role, dict.fromkeys(VERDICT_CELLS, 0))[cell] += 1
            right = recall.setdefault(call.role, {True: [0, 0], False: [0, 0]})[truth >= 1.0]
            right[0] += cell in ("tp", "tn")
            right[1] += 1
        task = str(episode.task_id)
        scores = {OUTCOME: float(episode.reward or 0.0)}
        scores.update({role: sum(v) / len(v) for role, v in by_role.items()})
        for role, counts in judged.items():
            scores[verdicts_key(role)] = (counts["tp"] + counts["tn"]) / sum(counts.values())
        per_task[task] = scores
        if judged:
            cells[task] = judged
    metrics = {"eval/accuracy": sum(s[OUTCOME] >= 1.0 for s in per_task.values()) / len(per_task)}
    versions = [call.policy_version for episode in episodes for call in episode.calls]
    if versions:  # the weights it scored: the oldest version any of its calls decoded with
        metrics["eval/policy_version"] = float(min(versions))
    roles = sorted(
        {key for s in per_task.values() for key in s if not key.startswith(VERDICTS_PREFIX)} - {OUTCOME}
    )
    for role in roles:
        values = [s[role] for s in per_task.values() if role in s]
        metrics[f"eval/{role}/reward"] = sum(values) / len(values)
    for role, by_truth in sorted(recall.items()):
        total = {c: sum(found[role][c] for found in cells.values() if role in found) for c in VERDICT_CELLS}
        metrics.update({f"eval/{role}/verdicts/{c}": float(n) for c, n in total.items()})
        metrics[f"eval/{role}/verdict_accuracy"] = (total["tp"] + total["tn"]) / sum(total.values())
        if all(n for _, n in by_truth.values()):  # both right and wrong solutions judged
            recalls = [right / n for right, n in by_truth.values()]
            metrics[f"eval/{role}/verdict_balanced_accuracy"] = sum(recalls) / 2
    payload: dict[str, Any] = {"tasks": per_task}
    if cells:
        payload["verdicts"] = cells
    return metrics, payload


def paired_rise(
    before: Mapping[str, Mapping[str, float]],
    after: Mapping[str, Mapping[str, float]],
    key: str = OUTCOME,
    transform: Callable[[float], float] = float,
) -> tuple[float, float, int]:
    """Mean change of ``key`` over the tasks scored in both evaluations, its standard error, and their number.

    ``transform`` maps a score first (``lambda r: r >= 1`` turns rewards into exact-answer accuracy).
    """
    common = [t for t in before if t in after and key in before[t] and key in after[t]]
    if len(common) < 2:
        raise ValueError(f"paired_rise needs at least two tasks scored on {key!r} in both evaluations")
    diffs = [float(transform(after[t][key])) - float(transform(before[t][key])) for t in common]
    n = len(diffs)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(variance / n), n

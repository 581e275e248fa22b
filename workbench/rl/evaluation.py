"""Held-out evaluation: greedy scores per task and per role, and the paired rise between two evaluations.

Every evaluation is stored with its step as an ``eval`` event whose payload maps each task id to its
outcome reward and each rewarded role's mean reward, so a before/after comparison can pair the same
questions (the paired standard error is the right yardstick for "did the same questions get answered
better", and it is smaller than the unpaired one when most answers do not change).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

#: The key of the outcome (episode) reward in a task's scores.
OUTCOME = "outcome"


def evaluate(engine: Any, tasks: list[Any], run_sync: Callable[..., Any]) -> tuple[dict[str, float], dict]:
    """Greedy held-out scores: (run-wide metrics, per-task scores for the ``eval`` event)."""
    episodes = run_sync(lambda: engine.run(tasks, group_size=1))
    per_task: dict[str, dict[str, float]] = {}
    for episode in episodes:
        by_role: dict[str, list[float]] = {}
        for call in episode.calls:
            if call.rewards:
                by_role.setdefault(call.role, []).append(call.rewards.get("reward", 0.0))
        scores = {OUTCOME: float(episode.reward or 0.0)}
        scores.update({role: sum(v) / len(v) for role, v in by_role.items()})
        per_task[str(episode.task_id)] = scores
    metrics = {"eval/accuracy": sum(s[OUTCOME] >= 1.0 for s in per_task.values()) / len(per_task)}
    versions = [call.policy_version for episode in episodes for call in episode.calls]
    if versions:  # the weights it scored: the oldest version any of its calls decoded with
        metrics["eval/policy_version"] = float(min(versions))
    roles = sorted({key for s in per_task.values() for key in s} - {OUTCOME})
    for role in roles:
        values = [s[role] for s in per_task.values() if role in s]
        metrics[f"eval/{role}/reward"] = sum(values) / len(values)
    return metrics, {"tasks": per_task}


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

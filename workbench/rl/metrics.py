"""Per-step training metrics, global and per role (the complete list is in docs/training.md).

Rollout-side metrics come from the episodes (rewards, accuracy, format, lengths, tools, Verifier
confusion, the degree of the agent graphs an orchestrator emitted); learning-side ones from the samples
and the trainer (groups, clipping, KL, entropy, gradient norms and each role's share, tokens,
policy-version lag). Verifier confusion takes
"the solution is correct" as the positive class: TP = said Correct about a correct solution,
FP = said Correct about a wrong one, TN = said Wrong about a wrong one, FN = said Wrong about a
correct one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.engine.mas_graph import degree
from workbench.engine.parsers import VERDICT_PARSERS
from workbench.engine.records import EpisodeRecord
from workbench.rewards.assign import verdict_of
from workbench.rl.advantages import AdvantageStats
from workbench.rl.samples import Sample


def rollout_metrics(
    episodes: Sequence[EpisodeRecord],
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Metrics of one step's episodes: (global, per role)."""
    rewards = [e.reward or 0.0 for e in episodes]
    overall: dict[str, float] = {
        "reward/mean": _mean(rewards),
        "reward/std": float(np.std(rewards)) if rewards else 0.0,
        "accuracy": _mean([float((e.reward or 0.0) >= 1.0) for e in episodes]),
        "episodes": float(len(episodes)),
        "episodes/error": float(sum(e.status == "error" for e in episodes)),
    }
    per_role: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(list))
    tools: Counter[str] = Counter()
    lengths: list[int] = []
    for episode in episodes:
        for call in episode.calls:
            bucket = per_role[call.role]
            n = len(call.completion_ids)
            lengths.append(n)
            bucket["length"].append(n)
            bucket["format"].append(float(call.format_error is None))
            bucket["truncated"].append(float(call.finish_reason == "length"))
            bucket["tool_calls"].append(float(len(call.tool_calls)))
            for tool_call in call.tool_calls:
                tools[tool_call.get("name", "?")] += 1
            graph = degree(call.parsed)  # an orchestrator's emitted MAS (MAS-Orchestra)
            if graph is not None:
                for key, value in graph.items():
                    bucket[f"mas/{key}"].append(value)
            if call.rewards:
                bucket["reward"].append(call.rewards.get("reward", 0.0))
                bucket["accuracy"].append(call.rewards.get("accuracy", 0.0))
            if "judged_correct" in call.rewards:
                verdict = verdict_of(call)
                was_correct = call.rewards["judged_correct"] >= 1.0
                if verdict is None:  # no verdict is not a "Wrong": counted apart
                    bucket["verifier/no_verdict"].append(1.0)
                else:
                    bucket[f"verifier/{confusion_cell(verdict, was_correct)}"].append(1.0)
    if lengths:
        overall.update(
            {
                "length/min": float(min(lengths)),
                "length/mean": _mean(lengths),
                "length/max": float(max(lengths)),
            }
        )
    n_tool_calls = sum(tools.values())
    overall["tool_calls/per_question"] = n_tool_calls / max(len(episodes), 1)  # each episode answers one
    for name, count in tools.items():
        overall[f"tool_share/{name}"] = count / n_tool_calls
    roles: dict[str, dict[str, float]] = {}
    for role, bucket in per_role.items():
        out = {
            "calls": float(len(bucket["length"])),
            "length/min": float(min(bucket["length"])),
            "length/mean": _mean(bucket["length"]),
            "length/max": float(max(bucket["length"])),
            "format/rate": _mean(bucket["format"]),
            "truncated/rate": _mean(bucket["truncated"]),
            "tool_calls/mean": _mean(bucket["tool_calls"]),
        }
        if bucket["reward"]:
            out["reward/mean"] = _mean(bucket["reward"])
            out["reward/std"] = float(np.std(bucket["reward"]))
            out["accuracy"] = _mean(bucket["accuracy"])
        if bucket["mas/agents"]:  # over the graphs that parsed; the invalid ones are in format/rate
            for key in ("agents", "depth", "edges"):
                out[f"mas/{key}/mean"] = _mean(bucket[f"mas/{key}"])
                out[f"mas/{key}/max"] = float(max(bucket[f"mas/{key}"]))
            out["mas/direct/rate"] = _mean([float(n == 0) for n in bucket["mas/agents"]])
        confusion = {
            k: float(len(bucket.get(f"verifier/{k}", []))) for k in ("tp", "fp", "tn", "fn", "no_verdict")
        }
        if any(confusion.values()):
            out.update({f"verifier/{k}": v for k, v in confusion.items()})
            right = confusion["tp"] + confusion["tn"]
            out["verifier/verdict_accuracy"] = right / sum(confusion.values())  # no verdict: not right
        roles[role] = out
    return overall, roles


def learning_metrics(
    samples: Sequence[Sample],
    stats: AdvantageStats,
    trainer_metrics: dict[str, Any],
    policy_version: int,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Metrics of the update: (global, per role)."""
    overall = {
        k: float(v) for k, v in trainer_metrics.items() if k != "per_role" and isinstance(v, int | float)
    }
    overall["groups"] = float(stats.groups)
    overall["groups/zero_std_fraction"] = stats.zero_variance_fraction
    lags = [policy_version - s.policy_version for s in samples]
    overall["policy_lag/mean"] = _mean(lags)
    overall["policy_lag/max"] = float(max(lags)) if lags else 0.0
    roles: dict[str, dict[str, float]] = defaultdict(dict)
    for role in {s.role for s in samples}:
        mine = [s for s in samples if s.role == role]
        roles[role]["samples"] = float(len(mine))
        roles[role]["tokens"] = float(sum(len(s.completion_ids) for s in mine))
        roles[role]["trained_tokens"] = float(sum(s.n_trained for s in mine))
        roles[role]["advantage/mean"] = _mean([s.advantage for s in mine])
        roles[role]["groups"] = float(stats.per_role_groups.get(role, 0))
        roles[role]["groups/zero_std"] = float(stats.per_role_zero_variance.get(role, 0))
    for role, (before, after) in stats.balanced.items():
        roles[role]["balance/before"] = float(before)
        roles[role]["balance/after"] = float(after)
    for role, values in trainer_metrics.get("per_role", {}).items():
        roles[role].update({k: float(v) for k, v in values.items()})
    return overall, dict(roles)


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def confusion_cell(verdict: str, was_correct: bool) -> str:
    """A Verifier's verdict against the truth, "the solution is correct" counting as positive: tp, fp, tn or fn."""
    said_correct = verdict == "correct"
    return ("t" if said_correct == was_correct else "f") + ("p" if said_correct else "n")


#: The cells a Verifier's verdict falls in (``verdict_cell``): the confusion cells and the calls with no verdict.
VERDICT_CELLS = ("tp", "fp", "tn", "fn", "no_verdict")


def verifier_role_names(roles: Mapping[str, Any]) -> set[str]:
    """The Verifiers among ``roles`` (name -> a topology's ``Role`` or its plain-data dict): the roles whose
    parser reads a verdict (``VERDICT_PARSERS``), whatever they are rewarded with."""
    found = set()
    for name, role in roles.items():
        parser = role.get("parser") if isinstance(role, Mapping) else getattr(role, "parser", None)
        if parser in VERDICT_PARSERS:
            found.add(name)
    return found


def verdict_truth(
    rewards: Mapping[str, Any] | None, source_rewards: Mapping[str, Any] | None
) -> float | None:
    """The truth of what a Verifier's call judged (1: the solution was right): its reward's ``judged_correct``
    or, failing that, the ``accuracy`` of the call it read (its source); None where neither says."""
    found = (rewards or {}).get("judged_correct")
    if found is None:
        found = (source_rewards or {}).get("accuracy")
    return None if found is None or found != found else float(found)  # NaN (a store's empty cell): unknown


def verdict_cell(verdict: str | None, truth: float) -> str:
    """The cell of ``VERDICT_CELLS`` a Verifier's verdict (None or NaN: none written) falls in against ``truth``:
    no verdict is counted apart, and is not right."""
    if verdict is None or verdict != verdict:
        return "no_verdict"
    return confusion_cell(verdict, truth >= 1.0)

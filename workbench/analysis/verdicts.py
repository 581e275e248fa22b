"""A Verifier's verdicts against the truth of what it judged, read from a run's calls (MarsRL's Fig. 5 measure).

Read from the calls, so that it holds whatever the Verifiers were rewarded with (MarsRL's comparison: a Verifier
rewarded by the system's outcome records no confusion counts of its own). A Verifier is a role whose parser reads
a verdict (``action["verdict"]``); the truth of what it judged is its reward's ``judged_correct`` or, failing
that, the accuracy of the call it read (``source_id``). "The solution is correct" counts as positive (tp = said
correct and was). A call with no verdict is counted apart (``no_verdict``) and is not right, as the verdict
reward has it. The reports' Fig. 5 series (``workbench.reports.series.verifier_detection``) and the comparison's
"verdicts right" row (``workbench.analysis.compare``) are both this count.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.rl.metrics import VERDICT_CELLS, verdict_cell, verdict_truth, verifier_role_names
from workbench.store import RunReader

#: The columns of ``verdict_counts``: the confusion cells and the calls with no verdict.
CELLS = VERDICT_CELLS


def verifier_roles(spec: Mapping[str, Any]) -> set[str]:
    """The roles of a topology (as plain data, ``topology.to_dict``) whose parser reads a verdict."""
    roles = spec.get("roles") or {}
    return verifier_role_names({n: r for n, r in roles.items() if isinstance(r, Mapping)})


def verdict_counts(
    run_dir: str | Path, judges: Collection[str], steps: int | Sequence[int] | None = None
) -> pd.DataFrame:
    """Per step (index) the verdicts of the roles ``judges`` pooled: one column per cell of ``CELLS``; only the
    steps ``steps`` where given."""
    with RunReader(run_dir) as reader:
        calls = reader.calls(step=steps, columns=["step", "role", "source_id", "action", "rewards"])
    rewards_of = dict(zip(calls["id"], calls["rewards"], strict=True))
    counts: dict[int, dict[str, float]] = {}
    for step, role, source, action, rewards in zip(
        calls["step"], calls["role"], calls["source_id"], calls["action"], calls["rewards"], strict=True
    ):
        if role not in judges:
            continue
        truth = verdict_truth(rewards, rewards_of.get(source) if pd.notna(source) else None)
        if truth is None:
            continue
        verdict = action.get("verdict") if isinstance(action, Mapping) else None
        counts.setdefault(int(step), dict.fromkeys(CELLS, 0.0))[verdict_cell(verdict, truth)] += 1
    frame = pd.DataFrame.from_dict(counts, orient="index", columns=list(CELLS)).sort_index()
    frame.index.name = "step"
    return frame


def verdict_measures(counts: pd.DataFrame) -> pd.DataFrame:
    """Per step: ``judged`` (verdicts asked for), ``right`` (tp + tn), ``accuracy`` (right / judged) and MarsRL's
    ``recall``, a flagged error as positive: wrong solutions called wrong / wrong solutions judged (NaN: none)."""
    judged = counts[list(CELLS)].sum(axis=1)
    right = counts["tp"] + counts["tn"]
    wrong = counts["tn"] + counts["fp"]
    return pd.DataFrame(
        {
            "judged": judged,
            "right": right,
            "accuracy": right / judged,
            "recall": counts["tn"] / wrong.where(wrong > 0),
        }
    )


__all__ = ["CELLS", "verdict_counts", "verdict_measures", "verifier_roles"]

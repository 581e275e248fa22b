"""Replays stored as runs: those made from a run's calls (stored beside it), and their estimates read back.

A replay run (``wb.replay``) keeps one step per arm, in the order of its config's ``arms``; its ``source``
says which call of which run it replays, at which position of the (branch's) episode, and with which GRPO
advantage the call was trained. ``stored_estimate`` recomputes the call's Q, V and Q - V from the stored
episodes, as ``wb.replay`` computed them from its records; ``estimates`` gives one row per replay run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.analysis.estimate import CallEstimate, Mean, mean_of, outcomes
from workbench.store import RunReader
from workbench.store.errors import StoreError
from workbench.store.layout import DB_NAME

_CALL_COLUMNS = ["episode_id", "role", "position", "rewards"]


def replays_of(run_dir: str | Path) -> list[Path]:
    """The replay runs made from calls of the run in ``run_dir`` and stored beside it, oldest first."""
    run_dir = Path(run_dir).resolve()
    with RunReader(run_dir) as reader:
        run_id = reader.run_id
    found = []
    for path in sorted(
        p for p in run_dir.parent.iterdir() if (p / DB_NAME).is_file() and p.resolve() != run_dir
    ):
        config = _config(path)
        if config.get("kind") == "replay" and (config.get("source") or {}).get("run_id") == run_id:
            found.append(path)
    return found


def stored_estimate(replay_dir: str | Path) -> CallEstimate | None:
    """The estimate of a finished replay run that has a ``keep`` and a ``resample`` arm (else None)."""
    with RunReader(replay_dir) as reader:
        config = reader.config
        arms = list(config.get("arms") or [])
        if "keep" not in arms or "resample" not in arms or reader.info()["status"] != "finished":
            return None
        source = config["source"]
        point, ancestors = int(source.get("position", 0)), set(source.get("ancestors") or [])
        by_arm = {arm: _scored(reader, step, point, ancestors) for step, arm in enumerate(arms)}
    return CallEstimate(
        call_id=int(source["call_id"]),
        role=str(source["role"]),
        q=mean_of(by_arm["keep"]),
        v=mean_of(by_arm["resample"]),
        grpo_advantage=source.get("advantage"),
        replaced=mean_of(by_arm["replace"]) if "replace" in by_arm else {},
    )


def estimates(replay_dirs: Sequence[str | Path], outcome: str = "own") -> Any:
    """One row per replay run: its id, status, call, role, and (once finished) Q, V and Q - V of an outcome
    with their standard errors, beside the GRPO advantage. ``outcome``: ``own`` (the call's role's reward where
    scored, else the episode's: ``CallEstimate.own_outcome``), ``episode`` or ``role/<name>``."""
    import pandas as pd

    rows = []
    for path in replay_dirs:
        with RunReader(path) as reader:
            status, source = reader.info()["status"], reader.config.get("source") or {}
        row: dict[str, Any] = {"run": Path(path).name, "status": status, "call_id": source.get("call_id"),
                               "role": source.get("role")}  # fmt: skip
        estimate = stored_estimate(path)
        if estimate is not None:
            name = estimate.own_outcome if outcome == "own" else outcome
            q, v, a = (
                estimate.q.get(name, Mean.of([])),
                estimate.v.get(name, Mean.of([])),
                estimate.advantage_of(name),
            )
            row.update(outcome=name, q=q.mean, q_se=q.stderr, v=v.mean, v_se=v.stderr, advantage=a.mean, advantage_se=a.stderr,
                       grpo_advantage=estimate.grpo_advantage)  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def _scored(reader: RunReader, step: int, point: int, ancestors: set[int]) -> list[dict[str, float]]:
    episodes = reader.episodes(step=step)
    calls = reader.calls(step=step, columns=_CALL_COLUMNS)
    by_episode = {int(e): frame for e, frame in calls.groupby("episode_id")}
    empty = calls.iloc[0:0]
    return [
        outcomes(
            reward,
            (
                (r, p, w if isinstance(w, dict) else None)
                for r, p, w in zip(found["role"], found["position"], found["rewards"], strict=True)
            ),
            point,
            ancestors,
        )
        for episode_id, reward in zip(episodes["id"], episodes["reward"], strict=True)
        for found in [by_episode.get(int(episode_id), empty)]
    ]


def _config(path: Path) -> dict[str, Any]:
    try:
        with RunReader(path) as reader:
            return reader.config
    except (OSError, StoreError):  # an unreadable (or older) run beside it is not a replay of this run
        return {}

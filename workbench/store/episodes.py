"""Storing a rollout's episodes (the engine's records) as one step, with the step's metrics.

The training loop and ``wb.rollout`` store their steps alike through ``write_step``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import EpisodeRecord
from .writer import RunStore


def write_step(
    store: RunStore,
    index: int,
    episodes: list[EpisodeRecord],
    tasks: Mapping[str, Any],
    metrics: dict[str, float],
    role_metrics: dict[str, dict[str, float]],
    *,
    policy_version: int = 0,
    held_out: dict | None = None,
) -> None:
    """Store one step: its episodes, their calls (rewards, the advantage each was trained with, source
    links), the step's metrics, global and per role, and the held-out scores per task if any.

    ``tasks`` maps each episode's task id to its task (``metadata`` and ``answer`` are stored with it)."""
    with store.step(index, policy_version=policy_version) as step:
        for episode in episodes:
            task = tasks[episode.task_id]
            episode_id = step.add_episode(
                task_id=episode.task_id,
                group_key=episode.group,
                task_meta={**task.metadata, "answer": task.answer, "sample": episode.sample},
                reward=episode.reward or 0.0,
                status=episode.status,
                error=episode.error,
            )
            call_ids: dict[int, int] = {}  # position in the episode -> stored call id
            for call in sorted(episode.calls, key=lambda c: c.position):
                call_ids[call.position] = step.add_record(episode_id, call, call_ids)
        step.log_metrics(metrics)
        for role, values in role_metrics.items():
            step.log_metrics(values, role=role)
        if held_out is not None:
            step.log_event("eval", held_out)

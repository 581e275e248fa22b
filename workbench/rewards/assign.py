"""Reward assignment: each call gets the reward its role's rule says (``Role.reward`` in the spec).

The schemes of the papers, chosen per role:

- ``outcome``: the episode's final answer checked against the reference, broadcast to every call of the
  role (MARS: System 1 and System 2 share the trajectory's reward; MAS-Orchestra's orchestrator).
- ``answer``: the call's own answer checked against the reference (MarsRL's Solver and Correctors).
- ``verdict``: 1 when the call's verdict equals the true correctness of the solution it judged, found
  through the call's ``source`` (MarsRL's Verifiers); the judged solution's correctness is kept as
  provenance in ``judged_correct``.
- ``parent``: the reward of the call that invoked this one (MATPO's workers; their advantage is the
  planner's too, see ``workbench.rl.advantages``).
- ``none``: no reward; the role is not trained.

A rule may name an LLM ``judge`` prompt instead of a verifier (``outcome`` and ``answer`` rules): the
engine awaits ``judge_calls`` before ``assign``, which keeps the rewards it finds already set.

Each rewarded call gets ``rewards = {"reward", "accuracy", "format"}``; ``format_weight`` w mixes them as
``(1 - w) * accuracy + w * format`` (MATPO's 0.9 / 0.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workbench.rewards.verifiers import verify

if TYPE_CHECKING:
    from workbench.rewards.judge import LLMJudge
    from workbench.store.records import CallRecord, EpisodeRecord
    from workbench.tasks import Task
    from workbench.topology import Topology
    from workbench.topology.spec import RewardRule


def answer_text(call: CallRecord) -> str:
    """What a call answered: its parsed answer when its parser gives one, else its text."""
    parsed = call.parsed
    if isinstance(parsed, dict) and isinstance(parsed.get("answer"), str):
        return parsed["answer"]
    return call.completion_text


def verdict_of(call: CallRecord) -> str | None:
    """A verifier call's verdict ('correct' / 'wrong'), or None when it wrote none."""
    parsed = call.parsed
    return parsed.get("verdict") if isinstance(parsed, dict) else None


def call_reward(
    rule: RewardRule, call: CallRecord, source: CallRecord | None, task: Task
) -> dict[str, float] | None:
    """The rewards of one call under an ``answer`` or ``verdict`` rule (None for the other kinds)."""
    verifier = rule.verifier or task.verifier
    if rule.kind == "answer":
        accuracy = verify(verifier, answer_text(call), task.answer)
        return _mix(rule, accuracy, call.format_error is None, {})
    if rule.kind == "verdict":
        extra: dict[str, float] = {}
        accuracy = 0.0
        verdict = verdict_of(call)
        if source is not None:
            judged_correct = verify(verifier, answer_text(source), task.answer) >= 1.0
            extra["judged_correct"] = float(judged_correct)
            if verdict is not None:
                accuracy = float((verdict == "correct") == judged_correct)
        return _mix(rule, accuracy, verdict is not None, extra)
    return None


def assign(topology: Topology, episode: EpisodeRecord, task: Task) -> float:
    """Fill ``call.rewards`` for every call of ``episode``; returns the episode's outcome reward.

    Calls that already carry rewards (the grouped engine scores them as they finish) keep them.
    """
    outcome = verify(task.verifier, episode.answer, task.answer) if episode.status != "error" else 0.0
    by_position = {c.position: c for c in episode.calls}
    for call in sorted(episode.calls, key=lambda c: c.position):
        if call.rewards:
            continue
        rule = topology.roles[call.role].reward if call.role in topology.roles else None
        if rule is None or rule.kind == "none":
            continue
        if rule.kind == "outcome":
            if rule.verifier is not None:
                outcome_here = verify(rule.verifier, episode.answer, task.answer)
            else:
                outcome_here = outcome
            call.rewards = _mix(rule, outcome_here, call.format_error is None, {})
        elif rule.kind == "parent":
            parent = by_position.get(call.parent) if call.parent is not None else None
            call.rewards = dict(parent.rewards) if parent is not None and parent.rewards else {}
        else:
            source = by_position.get(call.source) if call.source is not None else None
            call.rewards = call_reward(rule, call, source, task) or {}
    return outcome


async def judge_calls(
    topology: Topology, episode: EpisodeRecord, task: Task, judges: Callable[[str], LLMJudge]
) -> None:
    """Reward the calls whose role's rule names a judge (``judges(prompt)`` gives the judge), concurrently.

    An ``outcome`` rule's episode answer is judged once per prompt; an ``answer`` rule judges each call's
    own answer. A judge that fails scores 0 and the call's rewards carry ``judge_error = 1``.
    """
    outcomes: dict[str, Any] = {}
    pending: list[tuple[CallRecord, RewardRule, Any]] = []
    for call in episode.calls:
        role = topology.roles.get(call.role)
        rule = role.reward if role is not None else None
        if call.rewards or rule is None or rule.judge is None:
            continue
        if rule.kind == "outcome":
            if rule.judge not in outcomes:
                outcomes[rule.judge] = asyncio.ensure_future(
                    judges(rule.judge).judge(task.question, episode.answer, task.answer)
                )
            pending.append((call, rule, outcomes[rule.judge]))
        else:
            item = judges(rule.judge).judge(task.question, answer_text(call), task.answer)
            pending.append((call, rule, asyncio.ensure_future(item)))
    for call, rule, future in pending:
        call.rewards = judged_reward(rule, call, await future)


def judged_reward(rule: RewardRule, call: CallRecord, judgement: Any) -> dict[str, float]:
    """A call's rewards from a judge's ``Judgement``."""
    return _mix(
        rule, judgement.score, call.format_error is None, {"judge_error": float(judgement.error is not None)}
    )


def _mix(rule: RewardRule, accuracy: float, well_formed: bool, extra: dict[str, Any]) -> dict[str, float]:
    fmt = float(well_formed)
    w = rule.format_weight
    return {"reward": (1.0 - w) * accuracy + w * fmt, "accuracy": accuracy, "format": fmt, **extra}

"""``wb.replay_calls``: replay many calls of a run (a role's calls at a step, a sample, or a list), one run each.

    batch = wb.replay_calls(run_dir, role="verifier1", step=11, sample=8, n=16)   # here, backends loaded once
    batch.frame()                        # a row per call: Q, V, Q - V with standard errors, the GRPO advantage
    job = wb.replay_calls(run_dir, role="verifier1", n=16, background=True)    # a spawned process
    job.runs, job.status, job.frame(), job.stop(), job.wait()

Every call is checked first (a call that cannot be replayed stops the batch before anything runs); each
replay is then a run of its own beside the source run (``wb.replay``), which the graph's signals and the
trajectory browser read like any replay. In the background the runs exist at once (``created``) and are
replayed in order by one process; ``stop()`` stops it before its next call.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.analysis.estimate import Mean, mean_of, outcomes
from workbench.analysis.replay import (
    Players,
    ReplayResult,
    create_runs,
    plan_replay,
    replay_all,
    replay_here,
)
from workbench.analysis.replay_runs import estimates
from workbench.analysis.signals import complete_steps
from workbench.store import RunReader


@dataclass
class ReplayBatch:
    """The replays of a batch of calls, done in this process."""

    results: list[ReplayResult]

    @property
    def runs(self) -> list[Path]:
        return [r.run_dir for r in self.results]

    def frame(self, outcome: str = "own") -> Any:
        """One row per replayed call: Q, V and Q - V (of the call's own role's reward, or ``outcome``), beside
        its GRPO advantage (``workbench.analysis.replay_runs.estimates``)."""
        return estimates(self.runs, outcome)

    def pooled(self, arm: str = "resample") -> dict[str, Mean]:
        """Each outcome's mean over every continuation of ``arm`` in the batch (e.g. a role's expected reward
        from the states the batch replays, under the policy that played it)."""
        return mean_of(
            outcomes(
                e.reward,
                ((c.role, c.position, c.rewards) for c in e.calls),
                r.source.position,
                r.source.ancestors,
            )
            for r in self.results
            for e in r.arms.get(arm, [])
        )

    def __repr__(self) -> str:
        return f"ReplayBatch({len(self.results)} calls replayed)"

    def _repr_html_(self) -> str:
        return f"<p>{self!r}</p>" + self.frame().to_html(float_format=lambda x: f"{x:.3f}")


def replay_calls(
    run_dir: str | Path,
    calls: Sequence[int] | None = None,
    role: str | None = None,
    step: int | None = None,
    sample: int | None = None,
    n: int = 8,
    background: bool = False,
    runs_dir: str | Path | None = None,
    **options: Any,
) -> ReplayBatch | Any:
    """Replay each of ``calls`` (default: the top-level calls of ``role``, or of every role, at ``step``,
    default the run's last complete step; ``sample`` picks that many of them at random, seeded) ``n`` times
    per arm. ``options`` are ``wb.replay``'s (arms, policies, backend, sampling, seed, ...).

    ``background=True`` returns a handle at once (``BackgroundReplays``) and replays in a spawned process.
    """
    ids = list(calls) if calls is not None else choose_calls(run_dir, role, step, sample, options.get("seed"))
    if not ids:
        raise ValueError(f"no calls to replay in {run_dir}")
    plans = [plan_replay(run_dir, call_id, n, **options) for call_id in ids]
    if background:
        plans[0].check_named()
    made = create_runs(plans, runs_dir)
    if background:
        from workbench.training import launch

        return BackgroundReplays(made, launch(made[0], replay_here).process)
    with Players(plans[0]) as players:  # every call's continuations at once: the backend batches them
        return ReplayBatch(replay_all(plans, made, players))


def choose_calls(
    run_dir: str | Path, role: str | None, step: int | None, sample: int | None, seed: int | None = None
) -> list[int]:
    """The ids of the top-level calls of ``role`` (every role if None) at ``step`` (default: the last
    complete step, ``workbench.analysis.signals.complete_steps``), ``sample`` of them at random (seeded by
    ``seed``) if given."""
    with RunReader(run_dir) as reader:
        if step is None:
            steps = complete_steps(reader)
            if not steps:
                raise ValueError(f"the run in {run_dir} has no complete step to replay calls from")
            step = steps[-1]
        calls = reader.calls(step=step, columns=["role", "parent_id"])
    top = calls[calls["parent_id"].isna()]
    chosen = top if role is None else top[top["role"] == role]
    if chosen.empty:
        raise ValueError(
            f"no top-level calls of role {role!r} at step {step} of {run_dir}; "
            f"its roles there: {', '.join(sorted(set(top['role']))) or 'none'}"
        )
    ids = sorted(int(i) for i in chosen["id"])
    if sample is not None and sample < len(ids):
        ids = sorted(random.Random(seed or 0).sample(ids, sample))
    return ids


class BackgroundReplays:
    """Replays of a batch of calls in a background process: one run each, replayed in order."""

    def __init__(self, runs: list[Path], process: Any = None) -> None:
        from workbench.training import BackgroundRun

        self.runs = runs
        self._first = BackgroundRun(runs[0], process)  # the process's log and STOP file live in the first run

    @property
    def run_dir(self) -> Path:
        return self.runs[0]

    @property
    def statuses(self) -> list[str]:
        out = []
        for path in self.runs:
            with RunReader(path) as reader:
                out.append(reader.info()["status"])
        return out

    @property
    def status(self) -> str:
        """``running`` while any replay waits or runs, else ``failed``/``interrupted``/``stopped`` if any ended
        so, else ``finished``."""
        statuses = set(self.statuses)
        if statuses & {"created", "running"}:
            return "running"
        return next((s for s in ("failed", "interrupted", "stopped") if s in statuses), "finished")

    def frame(self, outcome: str = "own") -> Any:
        """One row per call: its replay run's status and, once finished, Q, V and Q - V."""
        return estimates(self.runs, outcome)

    def stop(self, timeout: float = 120.0) -> str:
        """Stop before the next call (the current one finishes); waits up to ``timeout`` s."""
        self._first.stop(timeout)
        return self.status

    def wait(self, timeout: float | None = None) -> str:
        """Block until every replay ended; raises if the process died before recording their ends."""
        if self._first.process is not None:
            self._first.process.join(timeout)
            code = self._first.process.exitcode
            if code not in (0, None) and "created" in self.statuses:
                raise RuntimeError(
                    f"the replay process ended with code {code}: see {self._first.run_dir}/run.log"
                )
        return self.status

    def log(self) -> str:
        return self._first.log()

    def __repr__(self) -> str:
        return f"BackgroundReplays({len(self.runs)} calls, status={self.status})"

    def _repr_html_(self) -> str:
        return f"<p>{self!r}</p>" + self.frame().to_html(float_format=lambda x: f"{x:.3f}")

"""Replays launched from the dashboard: the checks, the launch, and the limit on the ones running at once.

``start_replay(run_dir, call_id, n, policy)`` starts a background counterfactual replay (``wb.replay``) of one
call of a run, stored as a new run in the same runs directory. Both ways an operator asks for one use it: the
in-page "Replay from this call" form of the dashboard's trajectory browser (``widgets.replay_form``) and the
JSON API of the served dashboard (``widgets.server.operator_api``), each of which checks the role first.
Each replay is a process of its own with the model loaded, so this process runs at most
``MAX_ACTIVE_REPLAYS`` at once, whoever asks (``TooManyReplays`` past it); a request that cannot be replayed
raises one of ``REPLAY_ERRORS`` saying what is wrong.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workbench.store.errors import StoreError

#: The most continuations (per arm) an operator's replay may ask for.
MAX_REPLAY_N = 64
#: The most replays this server runs at once (each a process with its model loaded).
MAX_ACTIVE_REPLAYS = 2
#: What a replay request may fail of, answered as a 400 (or shown in the page) rather than raised.
REPLAY_ERRORS = (ValueError, TypeError, LookupError, OverflowError, OSError, StoreError)


class TooManyReplays(RuntimeError):
    """``MAX_ACTIVE_REPLAYS`` replays started by this server are still running (answered 429)."""


_started: list[Any] = []  # the BackgroundRun of each replay this server started and that may still run
_starting = threading.Lock()


def active_replays() -> list[Any]:
    """The replays this server started whose process is still alive."""
    _started[:] = [run for run in _started if run.process is not None and run.process.is_alive()]
    return list(_started)


def checkpoint_steps(run_dir: Path) -> list[str]:
    """``step:K`` for each checkpoint the run kept (what may play a replayed call's policy), oldest first."""
    from workbench.analysis.replay_policies import kept_steps

    return [f"step:{step}" for step in kept_steps(run_dir)]


def _whole_number(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return value


def _checkpoint_plays(run_dir: Path, policy: Any, call_id: int, role: str, played: Any) -> dict | None:
    """``policies`` for the replay: None for the run's model, else the checkpoint ``policy`` ("step:K", one
    the run kept) playing the call's own policy ``played``."""
    if policy in (None, ""):
        return None
    kept = checkpoint_steps(run_dir)
    if policy not in kept:
        raise ValueError(
            f"policy {policy!r} is not a checkpoint of this run (kept: {', '.join(kept) or 'none'})"
        )
    if not isinstance(played, str) or not played:
        raise ValueError(f"call {call_id} ({role}) names no policy for the checkpoint to play")
    return {played: policy}


def start_replay(run_dir: Path, call_id: Any, n: Any = 8, policy: Any = None) -> Any:
    """Start a background replay of call ``call_id`` of the run in ``run_dir``, ``n`` continuations per arm
    (1..``MAX_REPLAY_N``), stored beside it; ``policy`` None plays the run's model, ``"step:K"`` one of its
    checkpoints for the call's policy. Returns the replay's ``BackgroundRun``; raises one of
    ``REPLAY_ERRORS`` saying what is wrong, the replay's own checks included (a call it cannot replay,
    such as one nested in a grouped rollout's call), or ``TooManyReplays`` while ``MAX_ACTIVE_REPLAYS``
    replays it started still run; nothing is started then."""
    with _starting:  # two requests at once cannot both pass the count
        running = active_replays()
        if len(running) >= MAX_ACTIVE_REPLAYS:
            names = ", ".join(run.run_dir.name for run in running)
            raise TooManyReplays(
                f"{len(running)} replays are running ({names}); this dashboard runs at most "
                f"{MAX_ACTIVE_REPLAYS} at once: wait for one to end"
            )
        handle = _launch_replay(run_dir, call_id, n, policy)
        _started.append(handle)
        return handle


def _launch_replay(run_dir: Path, call_id: Any, n: Any, policy: Any) -> Any:
    from workbench.analysis.replay import replay
    from workbench.store import RunReader

    call_id, n = _whole_number(call_id, "call_id"), _whole_number(n, "n")
    if not 1 <= n <= MAX_REPLAY_N:
        raise ValueError(f"n={n}: ask for 1 to {MAX_REPLAY_N} continuations")
    with RunReader(run_dir) as reader:
        row = reader.sql("SELECT role, policy FROM calls WHERE id = ?", (call_id,))
    if row.empty:
        raise ValueError(f"run {Path(run_dir).name} has no call {call_id}")
    policies = _checkpoint_plays(run_dir, policy, call_id, row.iloc[0]["role"], row.iloc[0]["policy"])
    return replay(run_dir, call_id, n=n, policies=policies, runs_dir=Path(run_dir).parent, background=True)

"""Replays launched from the dashboard: the checks, the launch, and the limit on the ones running at once.

``start_replay(run_dir, call_id, n, policy)`` starts a background counterfactual replay (``wb.replay``) of one
call of a run, stored as a new run in the same runs directory. Both ways an operator asks for one use it: the
in-page "Replay from this call" form of the dashboard's trajectory browser (``widgets.replay_form``) and the
JSON API of the served dashboard (``widgets.server.operator_api``), each of which checks the role first.
Each replay is a process of its own with the model loaded, so this process runs at most
``MAX_ACTIVE_REPLAYS`` at once, whoever asks (``TooManyReplays`` past it); a request that cannot be replayed
raises one of ``REPLAY_ERRORS`` saying what is wrong.

A run's code never runs in the server: the replay's checks (which load the source run's plugins, its tool kinds
and verifiers, to read its topology) and the creation of its run happen in a process of their own, forked from
a clean process that has the workbench imported (multiprocessing's fork server, started at the first replay),
and the replay itself in another (``wb.replay(..., background=True)``'s). The server's registries stay as they
were, so a later replay of a run that stores no code for the names its spec uses is refused, as a fresh server
refuses it, and never scored with another run's code.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

from workbench.store.errors import StoreError

#: The most continuations (per arm) an operator's replay may ask for.
MAX_REPLAY_N = 64
#: The most replays this server runs at once (each a process with its model loaded).
MAX_ACTIVE_REPLAYS = 2
#: How long a replay's checks may take in their own process (reading the store, loading the run's plugins).
CHECK_TIMEOUT_S = 120.0
#: What the checks import, loaded once into the fork server their processes are forked from (only their
#: speed depends on this list: a module left out is imported by each check).
CHECK_MODULES = ["widgets.replays", "workbench.analysis.replay", "workbench.engine.spec_checks",
                 "workbench.rl.policies", "workbench.rl.run_files", "workbench.store", "workbench.tools",
                 "pandas"]  # fmt: skip
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
    from workbench.analysis.replay import replay_here
    from workbench.store import RunReader, RunStore
    from workbench.training import launch

    call_id, n = _whole_number(call_id, "call_id"), _whole_number(n, "n")
    if not 1 <= n <= MAX_REPLAY_N:
        raise ValueError(f"n={n}: ask for 1 to {MAX_REPLAY_N} continuations")
    with RunReader(run_dir) as reader:
        row = reader.sql("SELECT role, policy FROM calls WHERE id = ?", (call_id,))
    if row.empty:
        raise ValueError(f"run {Path(run_dir).name} has no call {call_id}")
    policies = _checkpoint_plays(run_dir, policy, call_id, row.iloc[0]["role"], row.iloc[0]["policy"])
    replay_dir = _created_apart(Path(run_dir), call_id, n, policies)
    # its maker has exited: this server writes for the run (still "created", not "interrupted") until the
    # replay's process opens it, as when the server made it
    RunStore.open(replay_dir).close()
    return launch(replay_dir, replay_here)


def _created_apart(run_dir: Path, call_id: int, n: int, policies: dict | None) -> Path:
    """Check the replay and create its run (status ``created``, beside the source run) in a process of its own,
    where the source run's plugins are loaded; returns the replay run's directory, or raises the error the
    checks raised there (one of ``REPLAY_ERRORS`` for a request that cannot be replayed)."""
    context = _checks_context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_create_replay_run,
        args=(send, str(run_dir), call_id, n, policies),
        name=f"workbench-replay-check-{run_dir.name}",
    )
    process.start()
    send.close()  # only the child's end is left open: its exit ends the wait
    try:
        if not receive.poll(CHECK_TIMEOUT_S):
            raise RuntimeError(
                f"the checks of the replay of call {call_id} took over {CHECK_TIMEOUT_S:.0f} s"
            )
        outcome = receive.recv()
    except EOFError:
        outcome = None
    finally:
        receive.close()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
    if outcome is None:
        raise RuntimeError(f"the checks of the replay of call {call_id} ended (exit code {process.exitcode})")
    if outcome[0] == "created":
        return Path(outcome[1])
    _, kind, args = outcome
    raise kind.__new__(kind, *args)  # the checks' own error again: its type and args (no constructor runs)


def _checks_context() -> Any:
    """Fork server where there is one (the checks start in a fraction of a second once it runs), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(CHECK_MODULES)  # read when the fork server starts
    return context


def _create_replay_run(send: Any, run_dir: str, call_id: int, n: int, policies: dict | None) -> None:
    """The checks' process: plan the replay (loading the source run's plugins here), create its run, and send
    back ``("created", replay_dir)`` or ``("refused", error type, error args)``."""
    try:
        from workbench.analysis.replay import create_runs, plan_replay

        plan = plan_replay(run_dir, call_id, n, policies=policies)
        plan.check_named()
        (replay_dir,) = create_runs([plan], Path(run_dir).parent)
        outcome: tuple = ("created", str(replay_dir))
    except Exception as error:  # noqa: BLE001 - sent back to the server, which raises it
        outcome = ("refused", *_travelling(error))
    send.send(outcome)
    send.close()


def _travelling(error: Exception) -> tuple[type, tuple]:
    """``error``'s type and args as the server may load them: a type of Python's or the workbench's (loading
    another could import a run's plugin module into the server), with plain args. Another type travels as the
    built-in error it is (a ``ValueError``, ...) or a ``RuntimeError``, its message naming what was raised."""
    kind = type(error)
    plain = all(isinstance(arg, str | int | float | bool | None) for arg in error.args)
    if kind.__module__ == "builtins" or kind.__module__.startswith("workbench."):
        return kind, error.args if plain else (str(error),)
    built_in = [b for b in REPLAY_ERRORS if b.__module__ == "builtins"]
    base = next((b for b in (*built_in, Exception) if isinstance(error, b)), Exception)
    return (RuntimeError if base is Exception else base), (f"{kind.__name__}: {error}",)

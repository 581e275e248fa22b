"""Launching work from a notebook cell or the command line: ``wb.rollout`` stores a topology's episodes in a new run.

This is the notebook- and CLI-facing entry point; the engine itself lives in
``workbench.engine`` and the storage in ``workbench.store``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from workbench.backends import Backend, BackendError, make_backend
from workbench.backends.loop_thread import run_sync
from workbench.engine import EpisodeRecord, Rollout, plugins
from workbench.engine.spec_checks import load, validate
from workbench.rl.metrics import rollout_metrics
from workbench.rl.run_end import record_end
from workbench.store.episodes import write_step
from workbench.tasks import Task
from workbench.topology import Topology, to_dict
from workbench.topology.spec import with_sampling

#: How a missing value prints in a summary table (a role without a reward): the same in the terminal (the
#: demo, ``workbench rollout``) and in a notebook.
MISSING = "-"

#: The model a rollout serves when neither ``model`` nor an engine names one.
DEFAULT_MODEL = "smollm2-135m"


@dataclass
class RolloutResult:
    """The episodes of one rollout and where they were stored."""

    run_dir: Path
    episodes: list[EpisodeRecord]
    rewards: list[float]
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def summary(self) -> Any:
        """Per-role table: calls, mean completion tokens, mean reward (NaN for an unrewarded role), format
        failures (outputs the role's parser could not read), truncations."""
        import pandas as pd

        rows = [
            {
                "role": c.role,
                "tokens": len(c.completion_ids),
                "reward": c.rewards.get("reward") if c.rewards else None,
                "format_failure": c.format_error is not None,
                "truncated": c.finish_reason == "length",
            }
            for e in self.episodes
            for c in e.calls
        ]
        if not rows:
            return pd.DataFrame(columns=["calls", "mean_tokens", "reward", "format_failures", "truncated"])
        df = pd.DataFrame(rows)
        df["reward"] = pd.to_numeric(df["reward"], errors="coerce")
        return df.groupby("role", sort=False).agg(
            calls=("tokens", "size"),
            mean_tokens=("tokens", "mean"),
            reward=("reward", "mean"),
            format_failures=("format_failure", "mean"),
            truncated=("truncated", "mean"),
        )

    def summary_text(self) -> str:
        """``summary()`` as printed in a terminal: two decimals, ``MISSING`` for a role without a reward."""
        return self.summary().to_string(float_format=lambda x: f"{x:.2f}", na_rep=MISSING)

    def __repr__(self) -> str:
        return (
            f"RolloutResult({len(self.episodes)} episodes, accuracy {self.accuracy:.2f}, "
            f"{self.seconds:.1f} s, stored in {self.run_dir})"
        )

    def _repr_html_(self) -> str:
        return f"<p>{self!r}</p>" + self.summary().to_html(float_format=lambda x: f"{x:.2f}", na_rep=MISSING)


def rollout(
    topology: Topology | str,
    tasks: list[Task],
    model: str | None = None,
    backend: str | Backend = "hf",
    group_size: int = 1,
    max_tokens: int | None = None,
    runs_dir: str | Path = "runs",
    run_id: str | None = None,
    seed: int = 0,
    sampling: dict[str, Any] | None = None,
    judge: str | Backend | None = None,
    background: bool = False,
    device: str = "auto",
    dtype: str = "auto",
    per_call_seeds: bool = False,
) -> RolloutResult | Any:
    """Run ``topology`` on every task (``group_size`` episodes each) and store the calls as step 0 of a new run.

    ``backend`` is a kind (``hf``, ``vllm``: an engine started for this rollout and closed after it) or an
    engine made once with ``wb.start_engine(...)``, which serves ``model`` (default: its own) and is left open for the
    next cell. ``model`` defaults to ``smollm2-135m`` for a backend given by name.

    Shows a progress bar; an interrupt (Ctrl-C, the notebook's stop button) cancels the rollout and
    stores the episodes that finished, the others marked ``cancelled``.

    ``sampling`` overrides every role's sampling settings (e.g. ``{"temperature": 0.3}``); ``seed`` is
    recorded with the run (the demo and CLI also seed their task generators with it). ``judge`` (a model
    name served on transformers, or a backend) scores the roles whose reward rule names an LLM judge.

    ``background=True`` returns a :class:`~workbench.training.BackgroundRun` at once and rolls out in a
    spawned process (backend and judge given by name); ``run.stop()`` cancels it, keeping finished episodes.

    ``device``/``dtype`` place a backend given by name (``auto``: a GPU in bf16 where one exists, else the
    CPU in fp32; ``cpu``, ``cuda``, ``cuda:N``; ``float32``, ``bfloat16``): the hf backend loads its model
    there, vLLM takes ``dtype``.

    ``per_call_seeds=True`` seeds every generation request from ``seed``, the task, the sample and the call's
    place in the episode, so an episode's draws do not depend on the others decoded beside it: a replay
    (``wb.replay``) with the same seed and settings then reproduces it exactly. Off by default (requests
    unseeded, as before). The tasks are kept in the run directory (``tasks.jsonl``) for replays.
    """
    from workbench.models.placement import device_problem, dtype_problem
    from workbench.store import RunStore
    from workbench.tasks import save_jsonl
    from workbench.training import TASKS_FILE, launch, storage_errors

    topology = load(topology) if isinstance(topology, str) else validate(topology)  # every check
    if sampling:
        topology = with_sampling(topology, **sampling)
    if not tasks:
        raise ValueError("no tasks to roll out: generate some with wb.generate_tasks or load a file")
    problems = [p for p in (device_problem(device), dtype_problem(dtype)) if p]
    if problems:
        raise ValueError("; ".join(problems))
    if background and not (isinstance(backend, str) and (judge is None or isinstance(judge, str))):
        raise ValueError("a background rollout takes its backend and judge by name (e.g. backend='vllm')")
    model = _served_model(backend, model)
    config = {
        "kind": "rollout",
        "topology": to_dict(topology),
        "model": model,
        "backend": backend if isinstance(backend, str) else type(backend).__name__,
        "group_size": group_size,
        "max_tokens": max_tokens,
        "seed": seed,
        "tasks": len(tasks),
        "judge": judge if isinstance(judge, str) or judge is None else type(judge).__name__,
        "device": device,
        "dtype": dtype,
        "per_call_seeds": per_call_seeds,
    }
    store = RunStore.create(
        runs_dir, config=config, run_id=run_id, name=f"{topology.name} rollout", topology=topology.name
    )
    try:
        with storage_errors(store.run_dir / TASKS_FILE):
            save_jsonl(tasks, store.run_dir / TASKS_FILE)  # for a background process and for replays
        with storage_errors(store.run_dir / plugins.PLUGINS_FILE):
            plugins.save(store.run_dir)  # the notebook's own tool kinds and verifiers: its process, replays
    except BaseException:
        store.close()
        raise
    if background:
        store.close()
        return launch(store.run_dir, rollout_here)
    seed_calls = seed if per_call_seeds else None
    return _roll_out(
        store, topology, tasks, backend, model, group_size, max_tokens, judge, device, dtype, seed=seed_calls
    )


def _served_model(backend: str | Backend, model: str | None) -> str:
    """The model the rollout records (a replay serves it again): an engine's own, else ``model``."""
    if isinstance(backend, str):
        return model or DEFAULT_MODEL
    if getattr(backend, "closed", False):
        raise BackendError(
            f"the {backend.name} engine given to wb.rollout is closed: start one with wb.start_engine(...)"
        )
    served = getattr(backend, "model_name", None)
    if model and served and model != served:
        raise ValueError(
            f"model={model!r}, but the engine given serves {served!r}: leave model out, or start an engine for "
            f"it (wb.start_engine({model!r}, ...))"
        )
    return model or served or DEFAULT_MODEL


def rollout_here(run_dir: str | Path) -> RolloutResult:
    """Do the rollout stored in ``run_dir`` by ``rollout(..., background=True)``, in this process.

    A ``STOP`` file in the run directory (what ``BackgroundRun.stop`` writes) or a SIGTERM cancels it.
    """
    from workbench.engine.spec_checks import from_dict
    from workbench.store import RunStore
    from workbench.tasks import load_tasks
    from workbench.training import STOP_FILE, TASKS_FILE, stop_requests

    run_dir = Path(run_dir)
    plugins.load(run_dir)  # before the spec: it may name their tool kinds and verifiers
    store = RunStore.open(run_dir)
    c = store.config
    tasks = load_tasks(run_dir / TASKS_FILE)
    return _roll_out(
        store,
        from_dict(c["topology"]),
        tasks,
        c["backend"],
        c["model"],
        c["group_size"],
        c["max_tokens"],
        c.get("judge"),
        c.get("device", "auto"),
        c.get("dtype", "auto"),
        should_stop=stop_requests(run_dir / STOP_FILE),
        seed=c.get("seed") if c.get("per_call_seeds") else None,
    )


def _roll_out(
    store: Any,
    topology: Topology,
    tasks: list[Task],
    backend: str | Backend,
    model: str,
    group_size: int,
    max_tokens: int | None,
    judge: str | Backend | None,
    device: str = "auto",
    dtype: str = "auto",
    should_stop: Any = None,
    seed: int | None = None,
) -> RolloutResult:
    placed = {"hf": {"device": device, "dtype": dtype}, "vllm": {"dtype": None if dtype == "auto" else dtype}}
    options = placed.get(backend, {}) if isinstance(backend, str) else {}
    engine_backend = make_backend(backend, model, **options) if isinstance(backend, str) else backend
    try:
        store.set_status("running")
        started = time.perf_counter()
        judge_backend = make_backend("hf", judge) if isinstance(judge, str) else judge
        engine = Rollout(topology, engine_backend, max_tokens=max_tokens, judge=judge_backend, seed=seed)
        if should_stop is not None:
            _cancel_when(should_stop, engine)
        with tqdm(total=len(tasks) * group_size, desc=f"{topology.name} rollout", unit="episode") as bar:
            episodes = run_sync(
                lambda: engine.run(tasks, group_size=group_size, progress=lambda _: bar.update()),
                on_interrupt=engine.cancel,
            )
        by_id = {t.id: t for t in tasks}
        rewards = [e.reward or 0.0 for e in episodes]
        seconds = time.perf_counter() - started
        metrics, role_metrics = rollout_metrics(episodes)
        metrics["time/rollout_s"] = seconds
        write_step(store, 0, episodes, by_id, metrics, role_metrics)
        store.set_status("stopped" if engine.cancelled else "finished")
    except BaseException as error:
        record_end(store, error, "failed")
        raise
    finally:
        store.close()
        if isinstance(backend, str):
            engine_backend.close()
    return RolloutResult(store.run_dir, episodes, rewards, seconds, metrics)


def _cancel_when(should_stop: Any, engine: Rollout, interval: float = 0.5) -> None:
    """Cancel ``engine`` from a watcher thread as soon as ``should_stop()`` is true."""
    import threading

    def watch() -> None:
        while not engine.cancelled:
            if should_stop():
                engine.cancel()
                return
            time.sleep(interval)

    threading.Thread(target=watch, daemon=True, name="rollout-stop-watcher").start()

"""``wb.train``: launch multi-agent GRPO training from a notebook cell without blocking the kernel.

Training runs in a background process (spawned, so it owns its model and threads) that writes to
the run store; the call returns a :class:`BackgroundRun` handle at once (``wb.rollout(...,
background=True)`` returns the same handle for a rollout): ``run.stop()``,
``run.wait()``, ``run.metrics()``, ``run.status``, and a rich display with per-role curves.
``workbench train config.yaml`` runs the same loop from a shell; ``wb.resume(run_dir)`` (or
``workbench train --resume RUN_DIR``) continues a stopped or killed run from its last checkpoint.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.rl.config import TrainConfig
from workbench.rl.run_files import CONFIG_FILE, TOPOLOGY_FILE, run_config, storage_errors, write_run_file

STOP_FILE = "STOP"
LOG_FILE = "run.log"
TASKS_FILE = "tasks.jsonl"
ACTIVE = ("created", "running")


class BackgroundRun:
    """A training run or rollout in a background process; everything it knows is read from the run store."""

    def __init__(self, run_dir: Path, process: Any = None):
        self.run_dir = Path(run_dir)
        self.process = process

    @property
    def status(self) -> str:
        from workbench.store import RunReader

        with RunReader(self.run_dir) as reader:
            return reader.info()["status"]

    def request_stop(self) -> None:
        """Ask the run to stop after its current step (a rollout: cancel), without waiting."""
        (self.run_dir / STOP_FILE).touch()

    def stop(self, timeout: float = 120.0) -> str:
        """Ask the run to stop after its current step; waits up to ``timeout`` s, then terminates it."""
        self.request_stop()
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(10)
        return self.status

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run ends (or ``timeout`` s pass); raises if it failed, with its error.

        Also raises when the process ended without recording an end (killed, or its run directory could
        not be written): the store then still says ``running`` and readers say ``interrupted``.
        """
        if self.process is not None:
            self.process.join(timeout)
        else:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self.status in ACTIVE and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.5)
        status = self.status
        if status == "failed":
            raise RuntimeError(f"run {self.run_dir} failed: {self.error() or 'see ' + LOG_FILE}")
        code = None if self.process is None else self.process.exitcode
        if status == "interrupted" or (status in ACTIVE and code is not None):
            if code is None:
                how = "ended"
            else:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise RuntimeError(
                f"the process of run {self.run_dir} {how} before recording the run's end "
                f"(see {self.run_dir / LOG_FILE}; on a full or read-only disk the error could not be stored "
                "either); what it stored is kept, and a training run resumes with wb.resume(run_dir)"
            )
        return status

    def error(self) -> str | None:
        from workbench.store import RunReader

        with RunReader(self.run_dir) as reader:
            events = reader.events(kind="error")
        return None if events.empty else str(events.iloc[-1]["payload"].get("error"))

    def metrics(self, role: str | None = None) -> Any:
        """The metrics so far, one row per step: run-wide and ``role/name`` columns (``role`` picks one role)."""
        from workbench.store import RunReader

        with RunReader(self.run_dir) as reader:
            return reader.metrics_wide(role=role)

    def log(self) -> str:
        path = self.run_dir / LOG_FILE
        return path.read_text() if path.exists() else ""

    def __repr__(self) -> str:
        return f"BackgroundRun({self.run_dir}, status={self.status})"

    def _repr_html_(self) -> str:
        from workbench.rl.display import run_html

        return run_html(self)

    def _ipython_display_(self) -> None:
        """Show the run in a notebook; while it runs, a background thread redraws it every few seconds."""
        from IPython.display import HTML, display

        handle = display(HTML(self._repr_html_()), display_id=True)
        if self.status in ACTIVE:
            threading.Thread(target=self.refresh, args=(handle,), daemon=True).start()

    def refresh(self, handle: Any, interval: float = 3.0) -> None:
        """Redraw ``handle`` (an IPython display handle) every ``interval`` s until the run ends."""
        from IPython.display import HTML

        while True:
            time.sleep(interval)
            active = self.status in ACTIVE
            handle.update(HTML(self._repr_html_()))
            if not active:
                return


def train(
    topology: Any = None,
    tasks: list[Any] | None = None,
    config: TrainConfig | dict[str, Any] | str | Path | None = None,
    **overrides: Any,
) -> BackgroundRun:
    """Start training ``topology`` on ``tasks`` in a background process and return its handle at once.

    ``config`` is a :class:`TrainConfig`, a dict, or a YAML file; keyword ``overrides`` set fields.
    ``topology`` (a name or a Topology) and ``tasks`` (a list of Task) override the config's: given tasks
    are kept in the run's directory and its config says so (``tasks: tasks.jsonl``, ``n_tasks``); the first
    ``eval_tasks`` of them (at most half) are held out, as from any task file.

    The run starts its own rollout engine (``backend: hf|vllm``, ``model``) in its own process, and syncs the
    trained weights into it: an engine made in this kernel (``wb.start_engine``) cannot be handed over, and is
    refused. On a small GPU, close a warm engine first to free its memory.
    """
    from workbench.engine import plugins
    from workbench.tasks import save_jsonl
    from workbench.topology import Topology, to_yaml

    if tasks is not None and len(tasks) == 0:  # refused here, before a run is made for nothing
        raise ValueError(
            "no training tasks: pass a non-empty list (e.g. wb.generate_tasks('arithmetic', n=64)), or "
            "tasks=None to use the config's tasks"
        )
    _refuse_engines(config, overrides)
    config = _config(config, overrides)
    if tasks is not None:  # the run's own copy is its task source, as a file named in a config would be
        config.tasks, config.n_tasks, config.task_options = TASKS_FILE, len(tasks), {}
    if isinstance(topology, Topology):
        config.topology = topology.name
    elif topology is not None:
        config.topology = str(topology)
    registered = (
        plugins.snapshot()
    )  # the notebook's own tool kinds, verifiers, ...: refused before a run is made
    run_dir = create(config)
    # everything a resumed run needs lives in the run directory
    if registered is not None:
        with storage_errors(run_dir / plugins.PLUGINS_FILE):
            (run_dir / plugins.PLUGINS_FILE).write_bytes(registered)
    if isinstance(topology, Topology):
        write_run_file(run_dir / TOPOLOGY_FILE, to_yaml(topology))
    if tasks is not None:
        with storage_errors(run_dir / TASKS_FILE):
            save_jsonl(tasks, run_dir / TASKS_FILE)
    return launch(run_dir, run_here)


def resume(run_dir: str | Path, **overrides: Any) -> BackgroundRun:
    """Continue a stopped or killed run from its newest checkpoint, in a background process."""
    run_dir = Path(run_dir)
    config = TrainConfig.from_dict({**run_config(run_dir).to_dict(), **overrides})
    write_run_file(run_dir / CONFIG_FILE, config.to_yaml())
    with storage_errors(run_dir / STOP_FILE):
        (run_dir / STOP_FILE).unlink(missing_ok=True)
    return launch(run_dir, run_here)


def _refuse_engines(config: Any, overrides: dict[str, Any]) -> None:
    """A clear error for an engine object given to ``wb.train``, which could only start a second one."""
    from workbench.backends import Backend

    given = dict(overrides, **(config if isinstance(config, dict) else {}))
    names = [key for key, value in given.items() if isinstance(value, Backend)]
    if names:
        raise TypeError(
            f"wb.train got an engine for {', '.join(names)}: training runs in a process of its own, which starts "
            "its own rollout engine and syncs the trained weights into it; an engine of this kernel "
            "(wb.start_engine) cannot go there. Name it instead (backend='vllm' or 'hf', model='...'); on a small GPU "
            "close the warm engine first (engine.close())"
        )


def _config(config: Any, overrides: dict[str, Any]) -> TrainConfig:
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, TrainConfig):
        data = config.to_dict()
    elif isinstance(config, dict):
        data = dict(config)
    else:
        data = TrainConfig.from_yaml(config).to_dict()
    return TrainConfig.from_dict({**data, **overrides})


def launch(run_dir: Path, work: Callable[[Path], Any]) -> BackgroundRun:
    """Run ``work(run_dir)`` (a module-level function) in a spawned process; returns its handle at once."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(
        target=_child, args=(str(run_dir), work), name=f"workbench-{work.__name__}-{run_dir.name}"
    )
    process.start()
    return BackgroundRun(run_dir, process)


def _child(run_dir: str, work: Callable[[Path], Any]) -> None:
    """The background process: output goes to the run's log, never into the notebook.

    An exception, wherever it happens (loading the spec or its plugins, before the first step, mid-step),
    is written to the log with its traceback while the log is still open, and recorded in the run store
    (``run.error()``, the dashboard) unless the loop recorded it already; the process then exits non-zero.
    """
    import traceback

    path = Path(run_dir)
    streams = sys.stdout, sys.stderr
    failed = False
    with open(path / LOG_FILE, "a", buffering=1) as log:
        sys.stdout = sys.stderr = log
        try:
            work(path)
        except BaseException as error:  # noqa: BLE001 - recorded here, then the process exits non-zero
            failed = not isinstance(error, SystemExit) or error.code not in (0, None)
            traceback.print_exc(file=log)
            _record_failure(path, error)
        finally:
            sys.stdout, sys.stderr = streams  # never left pointing at the closed log
    if failed:
        sys.exit(1)


def _record_failure(run_dir: Path, error: BaseException) -> None:
    """Store ``error`` as the run's end, unless the run already recorded how it ended."""
    from workbench.rl.run_end import record_end
    from workbench.store import RunStore, StoreError

    status = "stopped" if isinstance(error, KeyboardInterrupt) else "failed"
    try:
        store = RunStore.open(run_dir)
    except (StoreError, OSError) as unopened:
        print(f"the run store could not record this error: {unopened}", file=sys.stderr)
        return
    try:
        if store.status not in ("failed", "stopped"):
            record_end(store, error, status)
    finally:
        store.close()


def stop_requests(stop_file: Path) -> Callable[[], bool]:
    """Whether the run was asked to stop: its ``STOP`` file, or a SIGTERM (``kill``, a scheduler's preemption).

    A SIGTERM asks for a stop after the current step (the run ends ``stopped``, its steps whole); a second
    one, or one after a stop was already asked for, interrupts the step at once (also ``stopped``: the
    steps after the last checkpoint are redone on resume). Installed only from the main thread.
    """
    import signal

    asked = threading.Event()

    def on_sigterm(signum: int, frame: Any) -> None:
        if asked.is_set() or stop_file.exists():
            raise KeyboardInterrupt("SIGTERM again: interrupting the current step")
        asked.set()
        print("SIGTERM: stopping after the current step (again to interrupt it)", flush=True)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: asked.is_set() or stop_file.exists()


def run_here(run_dir: str | Path, log: Callable[[str], None] | None = None) -> str:
    """Train (or resume) the run in ``run_dir`` in this process; the CLI and the background process end up here.
    ``log`` takes the run's lines (default: printed)."""
    from workbench.engine import plugins
    from workbench.engine.spec_checks import load
    from workbench.tasks import load_tasks

    run_dir = Path(run_dir)
    config = run_config(run_dir)
    plugins.load(run_dir, config.plugins)  # before the spec: it may name their tool kinds and verifiers
    topology = load(run_dir / TOPOLOGY_FILE) if (run_dir / TOPOLOGY_FILE).exists() else None
    own_tasks = run_dir / TASKS_FILE
    if config.tasks == TASKS_FILE and own_tasks.exists():  # given to wb.train: split for held-out as any file
        config.tasks, tasks = str(own_tasks), None
    else:  # a run made before wb.train named its own file: every task trains, none is held out
        tasks = load_tasks(own_tasks) if own_tasks.exists() else None
    return run_training(
        config,
        run_dir,
        topology=topology,
        tasks=tasks,
        should_stop=stop_requests(run_dir / STOP_FILE),
        log=log or (lambda m: print(m, flush=True)),
    )


def run_training(config: TrainConfig, run_dir: Path, **options: Any) -> str:
    """Train in this process (``workbench.rl.loop.run_training``, which takes the same ``options``), on the Ray
    cluster where ``config`` names one: the cluster's rollout scheduler and trainer are given to the loop, which
    knows nothing of Ray."""
    from workbench.rl import loop

    if config.cluster is not None:
        from workbench.cluster import parts as cluster

        options = {"trainer_for": cluster.trainer_for, "scheduler_for": cluster.scheduler_for, **options}
    return loop.run_training(config, run_dir, **options)


def create(config: TrainConfig) -> Path:
    """A new run directory for ``config`` (what ``workbench train config.yaml`` trains in)."""
    from workbench.store import RunStore

    store = RunStore.create(
        config.runs_dir,
        config={"kind": "train", **config.to_dict()},
        run_id=config.run_id,
        name=f"{config.topology} training",
        topology=config.topology,
    )
    store.close()
    try:
        (store.run_dir / CONFIG_FILE).write_text(config.to_yaml())
    except OSError as error:
        import shutil

        from workbench.store import RunsDirError
        from workbench.store.layout import cause

        shutil.rmtree(store.run_dir, ignore_errors=True)
        path = store.run_dir / CONFIG_FILE
        raise RunsDirError(
            f"cannot write {path} ({cause(error, path)}); nothing was created: free space or fix "
            "permissions, or choose another runs_dir"
        ) from error
    return store.run_dir

"""Small training runs to draw the reports from: for the tests, the notebooks and the demo.

``train_sample_run(runs_dir)`` trains the MarsRL topology on arithmetic for a few steps with a
held-out evaluation after every step, so every per-step series the MarsRL reports draw (rewards,
lengths per role, the Verifiers' confusion counts, held-out accuracy of the Solver and of the
whole system) has several points (the demo's run, on the local SmolLM2-135M); ``train_sample_runs`` makes the
report plan's runs (``workbench.reports.plan``) at their sample scale: a few steps of each paper's system on the
``tiny`` random model, in seconds.
"""

from __future__ import annotations

from pathlib import Path

from workbench.rl.config import TrainConfig


def train_sample_run(
    runs_dir: str | Path,
    topology: str = "marsrl",
    tasks: str = "arithmetic",
    task_options: dict | None = None,
    model: str = "tiny",
    steps: int = 3,
    batch_size: int = 2,
    group_size: int = 2,
    max_tokens: int = 8,
    eval_tasks: int = 4,
    **overrides: object,
) -> Path:
    """Train ``topology`` for ``steps`` steps in the foreground; returns the finished run's directory.

    ``overrides`` are further ``TrainConfig`` fields; they win over this function's defaults.
    """
    from workbench.training import create, run_here

    defaults = dict(
        topology=topology,
        tasks=tasks,
        model=model,
        steps=steps,
        batch_size=batch_size,
        group_size=group_size,
        max_tokens=max_tokens,
        eval_tasks=eval_tasks,
        eval_every=1,
        n_tasks=max(16, steps * batch_size),
        learning_rate=1e-4 if model == "tiny" else 3e-5,
        task_options={"level": 1} if task_options is None else task_options,
        checkpoint_every=steps,
        runs_dir=str(runs_dir),
    )
    config = TrainConfig(**{**defaults, **overrides})
    run_dir = create(config)
    status = run_here(run_dir)
    if status != "finished":
        raise RuntimeError(f"the sample run ended {status}; see {run_dir / 'run.log'}")
    return run_dir


def train_sample_runs(runs_dir: str | Path, model: str = "tiny") -> dict[str, Path]:
    """The report plan's runs at its ``sample`` scale in ``runs_dir`` (``workbench.reports.plan``: each paper's
    system and comparison runs, two or three steps each, and HiRA's rollout), by the plan's names."""
    from workbench.reports.plan import make_runs

    return make_runs(runs_dir, scale="sample", model=model, log=lambda _: None)

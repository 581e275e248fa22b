"""Small training runs to draw the reports from: for the tests, the notebooks and the demo.

``train_sample_run(runs_dir)`` trains the MarsRL topology on arithmetic for a few steps with a
held-out evaluation after every step, so every per-step series the MarsRL reports draw (rewards,
lengths per role, the Verifiers' confusion counts, held-out accuracy of the Solver and of the
whole system) has several points; ``train_sample_runs`` puts one small run per paper in one folder:
MarsRL, MARS (``mars_cpu`` on one-hop questions), MATPO (two-hop questions) and MAS-Orchestra
(MASBench depth tasks) trained for a few steps, and a HiRA rollout (HiRA trains nothing). On the ``tiny`` random model it takes seconds; the demo uses
the local SmolLM2-135M.
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


SAMPLE_TOPOLOGIES: dict[str, dict] = {
    "marsrl": {},
    "mars_cpu": {"tasks": "multihop", "task_options": {"hops": 1}, "steps": 2},
    "matpo": {"tasks": "multihop", "task_options": {"hops": 2}, "steps": 2},
    "mas_orchestra": {"tasks": "masbench", "task_options": {"axis": "depth", "values": [2, 3]}, "steps": 2},
}
SAMPLE_ROLLOUTS: dict[str, dict] = {
    "hira": {"tasks": "multihop", "task_options": {"hops": [1, 2]}},
}


def rollout_sample_run(
    runs_dir: str | Path,
    topology: str,
    tasks: str,
    task_options: dict | None = None,
    model: str = "tiny",
    n_tasks: int = 4,
    max_tokens: int = 8,
) -> Path:
    """Roll ``topology`` out once over ``n_tasks`` tasks (an inference-only paper's run: HiRA)."""
    import workbench as wb

    result = wb.rollout(
        topology,
        wb.generate_tasks(tasks, n=n_tasks, seed=0, **(task_options or {})),
        model=model,
        max_tokens=max_tokens,
        runs_dir=str(runs_dir),
    )
    return Path(result.run_dir)


def train_sample_runs(runs_dir: str | Path, model: str = "tiny") -> dict[str, Path]:
    """One sample run per report topology in ``runs_dir``, by topology: a short training run for each of
    ``SAMPLE_TOPOLOGIES`` and a rollout for each of ``SAMPLE_ROLLOUTS``."""
    runs = {name: train_sample_run(runs_dir, topology=name, model=model, **options)
            for name, options in SAMPLE_TOPOLOGIES.items()}  # fmt: skip
    runs.update(
        {
            name: rollout_sample_run(runs_dir, name, model=model, **options)
            for name, options in SAMPLE_ROLLOUTS.items()
        }
    )
    return runs

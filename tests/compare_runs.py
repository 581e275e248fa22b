"""Small real run stores for the comparison's tests: runs written through the store's writer, as a training run
writes them (per-step metrics per role and run-wide, a held-out ``eval`` event at the first step and the last),
with known numbers, in well under a second each.

``seeded_runs(runs_dir)`` writes four: one config (``learning_rate`` 1e-5) with seeds 0, 1 and 2, and one with
``learning_rate`` 1e-4 and seed 0. A run's reward at step ``s`` is ``REWARD(lr, seed, s)``; its held-out scores
come from ``SCORES``.
"""

from __future__ import annotations

from pathlib import Path

from workbench.store import RunStore

STEPS = 3
TASKS = [f"t{i}" for i in range(8)]
ROLES = ("solver", "verifier1")
BASE_LR, OTHER_LR = 1e-5, 1e-4


def reward(lr: float, seed: int, step: int) -> float:
    """The solver's training reward of a run at a step."""
    return round(0.1 * step + 0.05 * seed + (0.3 if lr == OTHER_LR else 0.0), 4)


def scores(lr: float, seed: int, after: bool) -> dict[str, dict[str, float]]:
    """Held-out scores per task: before training the same for every run; after, ``seed`` + 2 more tasks right
    (5 with the other learning rate)."""
    right = 2 + (0 if not after else (5 if lr == OTHER_LR else seed + 2))
    found = {}
    for i, task in enumerate(TASKS):
        ok = float(i < right)
        found[task] = {"outcome": ok, "solver": ok, "verifier1": float(i % 2 == 0)}
    return found


def write_run(runs_dir: Path, lr: float, seed: int, steps: int = STEPS, finished: bool = True) -> RunStore:
    """A training run of ``steps`` steps (left open and ``running`` where not ``finished``)."""
    config = {"kind": "train", "topology": "marsrl", "model": "tiny", "learning_rate": lr, "seed": seed,
              "runs_dir": str(runs_dir), "task_options": {"level": 1}}  # fmt: skip
    store = RunStore.create(runs_dir, config=config, name=f"lr {lr} seed {seed}", topology="marsrl")
    store.set_status("running")
    for s in range(steps):
        write_step(store, lr, seed, s, final=finished and s == steps - 1)
    if finished:
        store.set_status("finished")
        store.close()
    return store


def write_step(store: RunStore, lr: float, seed: int, s: int, final: bool = False) -> None:
    with store.step(s) as step:
        value = reward(lr, seed, s)
        step.log_metrics({"reward/mean": value, "time/step_s": 2.0, "samples": 16.0, "entropy": 1.0 - value})
        for role in ROLES:
            step.log_metrics({"reward/mean": value, "accuracy": value, "length/mean": 10.0 + s}, role=role)
        if s == 0:
            step.log_event("eval", {"tasks": scores(lr, seed, after=False)})
            step.log_metrics({"eval/accuracy": 0.25})
        if final:
            step.log_event("eval", {"tasks": scores(lr, seed, after=True)})
            step.log_metrics(
                {"eval/accuracy": sum(v["outcome"] for v in scores(lr, seed, True).values()) / 8}
            )


def seeded_runs(runs_dir: Path) -> list[Path]:
    """Seeds 0-2 of one config and seed 0 of another (its learning rate ten times higher): their run folders."""
    runs = [write_run(runs_dir, BASE_LR, seed).run_dir for seed in range(3)]
    return runs + [write_run(runs_dir, OTHER_LR, 0).run_dir]

"""A whole training step on one device: where its time goes, and the pipeline scheduler against sync.

    python -m tests.perf.bench_train_step --quick                                  # tiny, CPU (CI size)
    python -m tests.perf.bench_train_step --device cuda --model qwen2.5-0.5b       # the GPU profile's run

``workbench train``'s own loop (``workbench.rl.loop.run_training``) runs ``marsrl_cpu`` episodes (Solver,
checker and Verifier on single-digit addition, ``--batch-size`` problems x ``--group-size`` samples a step) on
``--device`` for ``--steps`` steps, once per scheduler in ``--schedulers`` (``sync`` first). ``--model`` takes a
registry name or a shape of ``tests/perf/shapes``, materialised as a checkpoint with random weights and the
``tiny`` model's tokenizer (so a random model's text is decoded; nothing is downloaded). Reported per
scheduler, over the steps after the first (warm-up: graph capture, allocator):

- each phase's share of the step's wall time (from the step before's stored end to its own, from the run's
  ``steps`` table):
  ``time/*`` metrics for rollout, score, advantages, update and weight sync, and the rest (``other``:
  recording the calls and metrics in the store, the scheduler's own work);
- seconds a step and trained samples per second, and the ratio of each scheduler's samples/s to sync's.
Results go to tests/perf/results/train_step.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.perf.runner import machine, now, write_json

DEFAULT_OUT = Path(__file__).parent / "results" / "train_step.json"
PHASES = {
    "rollout": "time/rollout_s",
    "score": "time/score_s",
    "advantages": "time/advantages_s",
    "update": "time/train_s",
    "weight_sync": "time/weight_sync_s",
}


def model_path(name: str, workdir: Path) -> str:
    """A registry name as it is; a shape of ``tests/perf/shapes`` materialised into ``workdir``."""
    from tests.perf import shapes

    if name not in shapes.names():
        return name
    return str(shapes.materialize(name, workdir / name))


def run_one(scheduler: str, args: argparse.Namespace, model: str, workdir: Path) -> dict[str, Any]:
    """``args.steps`` steps under ``scheduler``; the phases' shares and samples/s after the first step."""
    from workbench.rl import loop
    from workbench.rl.config import TrainConfig
    from workbench.store import RunReader
    from workbench.tasks import generate
    from workbench.training import create

    config = TrainConfig(
        model=model,
        topology="marsrl_cpu",
        device=args.device,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        scheduler=scheduler,
        learning_rate=1e-6,
        checkpoint_every=10_000,
        keep_checkpoints=1,
        runs_dir=str(workdir / scheduler),
        seed=0,
    )
    run_dir = create(config)
    started = time.perf_counter()
    loop.run_training(
        config,
        run_dir,
        tasks=generate("arithmetic", n=4 * args.batch_size * args.steps, seed=0, level=1, format="plain"),
        log=lambda message: None,
    )
    wall = time.perf_counter() - started
    reader = RunReader(run_dir)
    wide = reader.metrics_wide()
    finished = reader.steps(complete_only=True).set_index("step")["finished_at"]
    wide["wall_s"] = (
        finished.diff()
    )  # from the step before's stored end to this one's: every phase and the store
    steady = wide.iloc[1:] if len(wide) > 1 else wide.assign(wall_s=wide["time/step_s"])
    step_s = float(steady["wall_s"].sum())
    shares = {name: float(steady[m].fillna(0).sum()) / step_s for name, m in PHASES.items() if m in steady}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return {
        "wall_s": round(wall, 3),
        "step_s": round(step_s / len(steady), 4),
        "samples_per_s": round(float(steady["samples"].sum()) / step_s, 3),
        "phase_share": {k: round(v, 4) for k, v in shares.items()},
        "phase_s": {
            name: round(float(steady[m].fillna(0).mean()), 4) for name, m in PHASES.items() if m in steady
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 3 small steps (CI)")
    parser.add_argument("--model", default=None, help="a registry name or a shape of tests/perf/shapes")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--schedulers", default="sync,pipeline")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the runs go (default: a temporary folder)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.model = args.model or "tiny"
    args.steps = args.steps or (3 if args.quick else 4)
    args.batch_size = args.batch_size or (2 if args.quick else 16)
    names = [n for n in args.schedulers.split(",") if n]
    if "sync" not in names:
        names.insert(0, "sync")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        model = model_path(args.model, workdir)
        runs = {name: run_one(name, args, model, workdir) for name in names}
    sync = runs["sync"]["samples_per_s"]
    result = {
        "benchmark": "train_step",
        "mode": "quick" if args.quick else "full",
        "model": args.model,
        "device": args.device,
        "workload": {
            "topology": "marsrl_cpu",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "group_size": args.group_size,
        },
        "schedulers": runs,
        "ratios": {
            f"{n}_vs_sync": round(r["samples_per_s"] / sync, 3)
            for n, r in runs.items()
            if n != "sync" and sync
        },
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, result)
    for name, r in runs.items():
        shares = ", ".join(f"{k} {v:.0%}" for k, v in r["phase_share"].items())
        print(f"{name}: {r['step_s']:.2f} s a step, {r['samples_per_s']:.2f} samples/s ({shares})")
    print(f"ratios: {result['ratios']}")
    return result


if __name__ == "__main__":
    main()

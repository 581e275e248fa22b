"""How far two training runs of one seed drift apart on vLLM: the share of calls with identical tokens, step by step.

Every request of a training step carries its own seed (``SamplingParams.seed``), so vLLM draws a call's tokens
from a generator of its own. What can still differ between two runs is the logits: where the engine's kernels
are not batch-invariant (its CPU build; GPU kernels whose reduction order follows the batch), a call's logits
depend on what shares its batch, a token drawn near a boundary of the distribution flips, and the calls after
it in the episode and the update built on them differ too.

    python -m tests.perf.vllm_same_seed [--steps 3] [--scheduler sync] [--out results.json]

Trains the tiny model twice with one seed (vLLM's CPU build here; run it on a GPU as it is) and prints, per
step, how many calls of the second run have the same prompt and completion token ids as the first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training
from workbench.tasks import generate
from workbench.training import create


def train(root: Path, name: str, steps: int, scheduler: str, seed: int) -> Path:
    config = TrainConfig(
        model="tiny",
        backend="vllm",
        topology="marsrl",
        scheduler=scheduler,
        steps=steps,
        batch_size=4,
        group_size=4,
        max_tokens=16,
        learning_rate=1e-3,
        runs_dir=str(root / name),
        checkpoint_every=100,
        task_options={"level": 1},
        seed=seed,
    )
    run_dir = create(config)
    tasks = generate("arithmetic", n=16, seed=0, level=1)
    assert run_training(config, run_dir, tasks=tasks, log=lambda line: None) == "finished"
    return run_dir


def calls(run_dir: Path) -> dict[tuple, tuple]:
    """Each call's token ids by (step, task, sample, position)."""
    reader = wb.RunReader(run_dir)
    where = {row.id: (row.task_id, row.task_meta["sample"]) for row in reader.episodes().itertuples()}
    return {
        (row.step, *where[row.episode_id], row.position): (tuple(row.prompt_ids), tuple(row.completion_ids))
        for row in reader.calls().itertuples()
    }


def drift(first: dict, second: dict) -> dict[int, dict[str, int]]:
    """Per step: calls in the first run, of them with identical token ids in the second."""
    out: dict[int, dict[str, int]] = {}
    for key, tokens in first.items():
        step = out.setdefault(int(key[0]), {"calls": 0, "identical": 0, "same_prompt": 0})
        step["calls"] += 1
        other = second.get(key)
        step["identical"] += other == tokens
        step["same_prompt"] += other is not None and other[0] == tokens[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scheduler", default="sync")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm-same-seed-"))
    started = time.perf_counter()
    runs = [train(root, f"run{i}", args.steps, args.scheduler, args.seed) for i in range(2)]
    per_step = drift(calls(runs[0]), calls(runs[1]))
    total = sum(s["calls"] for s in per_step.values())
    same = sum(s["identical"] for s in per_step.values())
    result = {
        "scheduler": args.scheduler,
        "steps": per_step,
        "identical_share": same / total if total else None,
        "seconds": time.perf_counter() - started,
    }
    for step, counts in sorted(per_step.items()):
        print(f"step {step}: {counts['identical']} of {counts['calls']} calls identical")
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

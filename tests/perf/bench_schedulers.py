"""Schedulers against each other: samples trained per second on a long-tail workload, side by side.

    python -m tests.perf.bench_schedulers --quick        # tiny model, 6 steps x 4 problems (CI)
    python -m tests.perf.bench_schedulers                # smollm2-135m, 10 steps x 2 problems
    python -m tests.perf.bench_schedulers --quick --only all --rounds 3   # every variant, alternating
    python -m tests.perf.bench_schedulers --backend vllm --model Qwen/Qwen2.5-0.5B-Instruct   # GPU profile
    OMP_NUM_THREADS=1 python -m tests.perf.bench_schedulers --ray --rounds 4   # local Ray, 2 rollout workers

The workload is a grouped three-agent chain in MarsRL's shape (Solver sampled G times; 2 solutions
selected at random for a Verifier sampled G times each; 2 verifications selected for a Corrector),
trained with GRPO on arithmetic. The chain has no early exit, so every scheduler makes the same calls.
Completion lengths follow a long-tailed (log-normal) distribution: each request's length is a seeded
draw keyed on its agent, its problem and how many requests of that agent and problem came before,
decoded past end-of-sequence (``ignore_eos``), so every scheduler decodes the same lengths (the
token totals are reported; their ratio is 1). Each scheduler trains the same steps from the same
initial weights; rounds alternate the schedulers so background load falls on all alike.
samples/s = trained samples / summed step wall time, over the steady steps (from ``--warmup`` to the
one before the last: the pipeline has filled and not begun its final drain; what a long run sees)
and over the whole run (fill and drain included). ratio = scheduler's samples/s / synchronous
samples/s. Results go to tests/perf/results/schedulers.json.

Where the gains come from (hf backend, CPU): the pipeline decodes a step's Solvers, Verifiers and
Correctors as one batch that sheds rows as they finish, so one long tail a step instead of three;
with segments it decodes at most one segment of each call a step (the rest carries over, re-reading
its prompt); async rolls the next batch out (its own weight copy) while the update runs on this one.

``--ray``: the rollout on two Ray rollout workers (a local cluster, started once), the update in the driver, on
MarsRL's ``marsrl_cpu`` workload (tiny model, arithmetic): the long-tail wrapper cannot reach the workers'
backends, so lengths are the model's own and the token ratios are reported beside. Results go to
tests/perf/results/schedulers_ray.json. Run it with ``OMP_NUM_THREADS=1`` (Ray gives each worker one thread; the
training process otherwise takes two): on a busy 2-core machine OpenMP's waiting threads made single runs up to
50x slower and the ratios noise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import os
import random
import re
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tests.perf.runner import machine, now, write_json
from workbench.backends.base import Generation, GenerationRequest
from workbench.backends.wrapper import BackendWrapper
from workbench.rewards import register
from workbench.rl import loop
from workbench.rl.config import TrainConfig
from workbench.store import RunReader
from workbench.tasks import generate
from workbench.topology import from_dict
from workbench.training import create

DEFAULT_OUT = Path(__file__).parent / "results" / "schedulers.json"
RAY_OUT = Path(__file__).parent / "results" / "schedulers_ray.json"


@register("even_length_bench")
def _even_length(prediction: str, reference: str) -> float:
    """About half of any model's outputs: every group has a reward signal to train on."""
    return float(len(prediction) % 2 == 0)


SCHEDULERS = {
    "sync": {"scheduler": "sync"},
    "pipeline": {"scheduler": "pipeline", "max_staleness": 0},  # agent-level batching alone
    "pipeline+overlap": {"scheduler": "pipeline", "max_staleness": 1},  # and the next level during the update
    # MarsRL's: a step decodes at most 2 x the median length of a call; longer ones carry over (<= 4 segments)
    "pipeline+segments": {"scheduler": "pipeline", "max_staleness": 3, "segment_len": "2 x median"},
    "async": {"scheduler": "async", "max_staleness": 1},
    "async+segments": {"scheduler": "async", "max_staleness": 1, "segment_len": 16},
}


def chain(max_tokens: int) -> Any:
    """Solver -> Verifier -> Corrector, grouped, no early exit (equal call counts for every scheduler)."""

    def role(prompt: str, kind: str) -> dict:
        return {
            "messages": [{"role": "user", "content": prompt}],
            "reward": {"kind": kind, "verifier": "even_length_bench"},
            "sampling": {"max_tokens": max_tokens},
        }

    return from_dict(
        {
            "name": "bench_chain",
            "roles": {
                "solver": role("Solve: {{ question }}", "answer"),
                "verifier": role("Check this solution to {{ question }}:\n{{ solution }}", "answer"),
                "corrector": role(
                    "Correct the solution to {{ question }}:\n{{ solution }}\n{{ report }}", "answer"
                ),
            },
            "flow": {
                "start": "solve",
                "answer": "{{ solution }}",
                "nodes": {
                    "solve": {"call": "solver", "bind": {"solution": "text"}, "next": [{"goto": "verify"}]},
                    "verify": {
                        "select": {"k": 2, "strategy": "random"},
                        "call": "verifier",
                        "bind": {"report": "text"},
                        "next": [{"goto": "correct"}],
                    },
                    "correct": {
                        "select": {"k": 2, "strategy": "random"},
                        "call": "corrector",
                        "bind": {"solution": "text"},
                        "next": [{"goto": "end"}],
                    },
                },
            },
        }
    )


#: the line of a chain prompt that names its agent and problem (the rest holds earlier agents' text)
AGENT_LINE = re.compile(r"^(Solve: |Check this solution to |Correct the solution to ).*$", re.M)


class LongTail(BackendWrapper):
    """Gives each request a long-tailed length and decodes it in full. The length is a seeded draw
    keyed on the agent and problem the prompt names and on how many such requests came before, not on
    the earlier agents' text in it, so every scheduler draws the same lengths."""

    def __init__(self, inner: Any, median: int, cap: int, sigma: float = 1.0):
        super().__init__(inner)
        self.median, self.cap, self.sigma = median, cap, sigma
        self.seen: Counter[str] = Counter()

    def length(self, key: str, sample: int) -> int:
        digest = hashlib.sha256(f"{key}-{sample}".encode()).digest()
        draw = random.Random(digest).lognormvariate(math.log(self.median), self.sigma)
        return max(2, min(self.cap, round(draw)))

    def key(self, prompt_ids: Any) -> str:
        text = self.tokenizer.decode(list(prompt_ids))
        agent = AGENT_LINE.search(text)
        key = agent.group(0) if agent else text
        self.seen[key] += 1
        return f"{key}#{self.seen[key]}"

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        key = self.key(request.prompt_ids)
        sized = [
            dataclasses.replace(request, n=1, max_tokens=self.length(key, i), ignore_eos=True)
            for i in range(request.n)
        ]
        return [g for (g,) in await asyncio.gather(*(self.inner.generate(r) for r in sized))]


def run_one(name: str, options: dict, args: argparse.Namespace, base: Path) -> dict[str, float]:
    if options.get("segment_len") == "2 x median":
        options = {**options, "segment_len": 2 * args.median}
    if args.ray:
        return run_on_ray(name, options, args, base)
    config = TrainConfig(
        model=args.model,
        backend=args.backend,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=None,
        learning_rate=1e-6,
        checkpoint_every=10_000,
        keep_checkpoints=1,
        runs_dir=str(base / name),
        seed=0,
        **options,
    )
    run_dir = create(config)
    original = loop.rollout_backends

    def long_tail(served: dict, segment_len: int | None) -> dict:
        backends = original(served, segment_len)
        # lengths drawn once per request, outside the segments
        wrapped = {id(b): LongTail(b, args.median, args.cap) for b in backends.values()}
        return {name: wrapped[id(b)] for name, b in backends.items()}

    loop.rollout_backends = long_tail  # the workload: imposed lengths inside the scheduler's meter
    try:
        loop.run_training(
            config,
            run_dir,
            topology=chain(args.cap),
            tasks=generate("arithmetic", n=64, seed=0, level=1),
            log=lambda message: None,
        )
    finally:
        loop.rollout_backends = original
    return measured(run_dir, args)


def run_on_ray(name: str, options: dict, args: argparse.Namespace, base: Path) -> dict[str, float]:
    """The run on two rollout workers of the local Ray cluster (``main`` started it), MarsRL's CPU workload."""
    from workbench.training import run_training

    config = TrainConfig(
        model=args.model,
        topology="marsrl_cpu",
        tasks="arithmetic",
        n_tasks=64,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        learning_rate=1e-6,
        checkpoint_every=10_000,
        keep_checkpoints=1,
        runs_dir=str(base / name),
        seed=0,
        cluster="local",
        cluster_workers=2,
        **options,
    )
    run_dir = create(config)
    run_training(config, run_dir, log=lambda message: None)
    return measured(run_dir, args)


def measured(run_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """A finished run's throughput, from what it stored."""
    reader = RunReader(run_dir)
    wide = reader.metrics_wide()
    calls = reader.calls(columns=["n_completion"])
    seconds = float(wide["time/step_s"].sum())
    samples = float(wide["samples"].sum())
    steady = wide.loc[args.warmup : args.steps - 2]
    return {
        "seconds": seconds,
        "samples": samples,
        "completion_tokens": float(calls["n_completion"].sum()),
        "steady_samples_per_s": float(steady["samples"].sum() / steady["time/step_s"].sum()),
        "samples_per_s": samples / seconds,
        "tokens_per_s": float(calls["n_completion"].sum()) / seconds,
        "bubble_rollout": float(wide["bubble/rollout"].mean()),
        "bubble_trainer": float(wide["bubble/trainer"].mean()),
        "staleness_max": float(wide["policy_lag/max"].max()),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, small workload (CI)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="rollout backend")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--median", type=int, default=None, help="median completion length (tokens)")
    parser.add_argument("--cap", type=int, default=None, help="longest completion (tokens)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds; medians are reported")
    parser.add_argument(
        "--warmup", type=int, default=3, help="steps before the steady window (pipeline fill)"
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"schedulers to run, comma-separated, of {', '.join(SCHEDULERS)} (or: all); default "
        "sync,pipeline,async (--quick) or sync,pipeline,pipeline+segments,async",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="roll out on 2 workers of a local Ray cluster (marsrl_cpu, tiny model)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.out = args.out or (RAY_OUT if args.ray else DEFAULT_OUT)
    args.model = args.model or ("tiny" if args.quick or args.ray else "smollm2-135m")
    args.steps = args.steps or (6 if args.quick else 10)
    args.only = args.only or (
        "sync,pipeline+overlap,async"
        if args.ray
        else "sync,pipeline,async"
        if args.quick
        else "sync,pipeline,pipeline+segments,async"
    )
    if args.steps < args.warmup + 2:
        parser.error(
            f"--steps must be at least --warmup + 2 = {args.warmup + 2} (a steady window of one step)"
        )
    args.batch_size = args.batch_size or (4 if args.quick or args.ray else 2)
    args.median = args.median or (12 if args.quick else 24)
    args.cap = args.cap or (96 if args.quick else 192)
    args.rounds = args.rounds or 1
    names = list(SCHEDULERS) if args.only == "all" else [n for n in args.only.split(",") if n]
    if "sync" not in names:
        names.insert(0, "sync")
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    if args.ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    rounds[name].append(run_one(name, SCHEDULERS[name], args, Path(tmp) / f"round{r}"))
    finally:
        if args.ray:
            ray.shutdown()
    summary = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in rounds.items()}
    sync = summary["sync"]
    result = {
        "mode": "ray" if args.ray else "quick" if args.quick else "full",
        "model": args.model,
        "workload": {
            "topology": "marsrl_cpu on 2 Ray rollout workers (update in the driver)",
            "length_distribution": "the model's own completion lengths (the long-tail wrapper cannot reach the workers)",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "group_size": args.group_size,
            "rounds": args.rounds,
            "steady_steps": [args.warmup, args.steps - 2],
        }
        if args.ray
        else {
            "topology": "solver -> verifier -> corrector, grouped (G samples, 2 selected a level)",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "group_size": args.group_size,
            "length_median": args.median,
            "length_cap": args.cap,
            "length_distribution": "log-normal, sigma 1, seeded by agent, problem and request count, decoded past EOS",
            "rounds": args.rounds,
            "steady_steps": [args.warmup, args.steps - 2],
        },
        "samples_per_s": {n: round(s["steady_samples_per_s"], 3) for n, s in summary.items()},
        "ratios": {
            f"{n}_vs_sync": round(s["steady_samples_per_s"] / sync["steady_samples_per_s"], 3)
            for n, s in summary.items()
            if n != "sync"
        },
        "run_samples_per_s": {n: round(s["samples_per_s"], 3) for n, s in summary.items()},
        "run_ratios": {
            f"{n}_vs_sync": round(s["samples_per_s"] / sync["samples_per_s"], 3)
            for n, s in summary.items()
            if n != "sync"
        },
        "token_ratios": {
            f"{n}_vs_sync": round(s["completion_tokens"] / sync["completion_tokens"], 3)
            for n, s in summary.items()
            if n != "sync"
        },
        "schedulers": summary,
        "rounds_raw": rounds,
        "machine": machine(
            load_average=[round(x, 2) for x in os.getloadavg()],
            omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        ),
        "when": now(),
    }
    write_json(args.out, result)
    print(
        f"{'scheduler':<18}{'steady/s':>9}{'ratio':>7}{'run/s':>7}{'ratio':>7}{'bubble r/t':>12}{'stale':>6}"
    )
    for n, s in summary.items():
        print(
            f"{n:<18}{s['steady_samples_per_s']:>9.2f}"
            f"{s['steady_samples_per_s'] / sync['steady_samples_per_s']:>7.2f}{s['samples_per_s']:>7.2f}"
            f"{s['samples_per_s'] / sync['samples_per_s']:>7.2f}"
            f"{s['bubble_rollout']:>6.2f}/{s['bubble_trainer']:.2f}{s['staleness_max']:>6.0f}"
        )
    return result


if __name__ == "__main__":
    main()

"""Trainer step time: the workbench's GRPO update against ``trl.GRPOTrainer``'s on the same workload.

    python -m tests.perf.bench_trainer --quick        # tiny model (CI)
    python -m tests.perf.bench_trainer                # smollm2-135m
    python -m tests.perf.bench_trainer --device cuda --dtype bfloat16 --model qwen2.5-0.5b   # a GPU, both in bf16

One single-role batch (random prompts and completions with a long-tailed length spread, fixed
advantages), the same hyperparameters, the same model copied for both. Each side runs ``--steps``
updates after one warm-up update; TRL's step is timed from its own step-begin to step-end callbacks
(forward, backward, clipping, optimizer), ours around ``PolicyTrainer.step``. The two sides alternate
step by step, so background load falls on both alike. ratio = workbench step time / TRL step time
(target <= 1.0). Results go to tests/perf/results/trainer.json.
"""

from __future__ import annotations

import argparse
import copy
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from tests.perf.bench_precision import load_model
from tests.perf.runner import machine, now, write_json
from tests.trl_fixed_batch import trl_trainer
from workbench.rl.loss import LossConfig
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer

DEFAULT_OUT = Path(__file__).parent / "results" / "trainer.json"


def workload(vocab: int, n: int, prompt: int, completion: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        p = max(4, int(rng.lognormvariate(0, 0.5) * prompt))
        c = max(2, min(4 * completion, int(rng.lognormvariate(0, 0.7) * completion)))
        samples.append(
            Sample(
                [rng.randrange(10, vocab) for _ in range(p)],
                [rng.randrange(10, vocab) for _ in range(c)],
                [1] * c,
                [0.0] * c,
                advantage=rng.choice([-1.0, 1.0]) * rng.random(),
            )
        )
    return samples


class _Lockstep(TrainerCallback):
    """Times TRL's steps, and lets the benchmark interleave them with ours one by one."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)

    def on_step_begin(self, args, state, control, **kwargs):
        self.go.acquire()
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.durations.append(time.perf_counter() - self._started)
        self.done.release()


def measure(
    model_name: str,
    n: int,
    prompt: int,
    completion: int,
    steps: int,
    device: str = "cpu",
    dtype: str = "float32",
    token_budget: int = 4096,
) -> dict[str, Any]:
    base = load_model(model_name, torch.device(device), torch.float32)  # fp32 master weights on both sides
    samples = workload(base.config.vocab_size, n, prompt, completion)
    ours_model, trl_model = copy.deepcopy(base), copy.deepcopy(base)
    lr = 1e-6
    config = OptimConfig(
        learning_rate=lr,
        max_grad_norm=1.0,
        compute_dtype=dtype,
        token_budget=max(token_budget, max(s.n_tokens for s in samples)),
        loss=LossConfig(aggregation="seq_mean_token_mean"),
    )
    ours = PolicyTrainer({"base": ours_model}, config)
    lockstep = _Lockstep()
    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(
            trl_model,
            samples,
            "grpo",
            out,
            lr,
            1e-8,
            steps=steps + 1,
            callbacks=[lockstep],
            bf16=dtype == "bfloat16",
        )
        errors: list[BaseException] = []

        def run_trl() -> None:
            try:
                trainer.train()
            except BaseException as error:  # noqa: BLE001 - re-raised below
                errors.append(error)
                lockstep.done.release()

        thread = threading.Thread(target=run_trl, daemon=True)
        thread.start()
        our_times = []
        for i in range(steps + 1):
            lockstep.go.release()  # one TRL step, alone
            lockstep.done.acquire()
            if errors:
                raise errors[0]
            started = time.perf_counter()  # then one of ours, alone
            ours.step(samples, step_index=i)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            our_times.append(time.perf_counter() - started)
        thread.join()
    trl_times = lockstep.durations[1:]
    our_times = our_times[1:]
    ours_s, trl_s = sum(our_times) / len(our_times), sum(trl_times) / len(trl_times)
    tokens = sum(s.n_tokens for s in samples)
    return {
        "samples": n,
        "tokens": tokens,
        "padded_tokens_trl": n
        * (max(len(s.prompt_ids) for s in samples) + max(len(s.completion_ids) for s in samples)),
        "steps": steps,
        "workbench_step_s": round(ours_s, 3),
        "trl_step_s": round(trl_s, 3),
        "ratio": round(ours_s / trl_s, 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, small batch")
    parser.add_argument("--model", default=None)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=None, help="median prompt tokens")
    parser.add_argument("--completion", type=int, default=None, help="median completion tokens")
    parser.add_argument("--device", default="cpu", help="both trainers' device (cpu, cuda)")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: both autocast"
    )
    parser.add_argument("--token-budget", type=int, default=4096, help="our tokens per packed micro-batch")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    model = args.model or ("tiny" if args.quick else "smollm2-135m")
    n = args.samples or 16
    steps = args.steps or 3
    prompt, completion = (32, 24) if args.quick else (48, 32)
    prompt, completion = args.prompt or prompt, args.completion or completion
    figures = measure(model, n, prompt, completion, steps, args.device, args.dtype, args.token_budget)
    report = {
        "benchmark": "trainer",
        "mode": "quick" if args.quick else "full",
        "model": model,
        "device": args.device,
        "dtype": args.dtype,
        "prompt_tokens_median": prompt,
        "completion_tokens_median": completion,
        **figures,
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, report)
    print(
        f"workbench {figures['workbench_step_s']} s/step, TRL {figures['trl_step_s']} s/step, "
        f"ratio {figures['ratio']} ({n} samples, {figures['tokens']} tokens)"
    )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

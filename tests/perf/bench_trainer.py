"""Trainer step time: the workbench's GRPO update against ``trl.GRPOTrainer``'s on the same workload.

    python -m tests.perf.bench_trainer --quick        # tiny model (CI)
    python -m tests.perf.bench_trainer                # smollm2-135m
    python -m tests.perf.bench_trainer --device cuda --dtype bfloat16 --model qwen2.5-0.5b   # a GPU, both in bf16

One single-role batch (random prompts and completions with a long-tailed length spread, fixed
advantages), the same hyperparameters, the same model copied for each side. TRL runs once per setting of
its gradient checkpointing in ``--trl-checkpointing`` (``off,on``: TRL 1.16's ``GRPOConfig`` turns it on by
default, which costs TRL a recompute of every layer; the workbench does not checkpoint here), each on a
copy of its own. Each side runs ``--steps`` updates after one warm-up update; TRL's step is timed from its
own step-begin to step-end callbacks (forward, backward, clipping, optimizer), ours around
``PolicyTrainer.step``. The sides take turns step by step, so background load falls on all alike.

ratio = workbench step time / TRL step time with TRL's checkpointing off (the headline; target <= 1.0 on a
CPU, <= 0.5 on a GPU), ``ratio_vs_trl_ckpt`` the same against TRL with it on. Also the FLOP rates two ways
(``bench_precision``'s counts): the workbench's on the tokens its kernels compute (``tokens_computed``) and on
the logical tokens, TRL's on its padded batch and on the logical tokens; MFU where the GPU's peak is known.
The JSON is written after every round of steps (``steps_done``), so a run stopped midway keeps its means so
far. Results go to tests/perf/results/trainer.json.
"""

from __future__ import annotations

import argparse
import copy
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from tests.perf.bench_precision import (
    computed_flops,
    load_model,
    micro_batches,
    model_flops,
    rates,
    token_flops,
)
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
        self.ready = threading.Event()  # set once TRL's set-up is done and its first step waits

    def on_step_begin(self, args, state, control, **kwargs):
        self.ready.set()
        self.go.acquire()
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.durations.append(time.perf_counter() - self._started)
        self.done.release()


class _TRLSide:
    """One ``trl.GRPOTrainer`` (one checkpointing setting) training in a thread of its own, a step at a time.

    accelerate's state is one per process and a new trainer resets it, so the next side is made only once
    this one's set-up is done (``ready``): the state it then rebuilds is the same (one device, one precision)."""

    def __init__(self, trainer: Any, lockstep: _Lockstep) -> None:
        self.lockstep = lockstep
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                trainer.train()
            except BaseException as error:  # noqa: BLE001 - re-raised in step()
                self.errors.append(error)
                lockstep.done.release()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        while not lockstep.ready.wait(0.1) and not self.errors:
            pass
        if self.errors:
            raise self.errors[0]

    def step(self) -> None:
        """Let TRL run one step, alone, and wait for its end."""
        self.lockstep.go.release()
        self.lockstep.done.acquire()
        if self.errors:
            raise self.errors[0]


SETTINGS = ("off", "on")  # TRL's gradient checkpointing


def measure(
    model_name: str,
    n: int,
    prompt: int,
    completion: int,
    steps: int,
    device: str = "cpu",
    dtype: str = "float32",
    token_budget: int = 4096,
    trl_checkpointing: tuple[str, ...] = SETTINGS,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Time ``steps`` workbench steps and as many TRL steps per setting of ``trl_checkpointing``, side by side;
    ``on_round`` gets the figures so far after every measured round."""
    base = load_model(model_name, torch.device(device), torch.float32)  # fp32 master weights on every side
    samples = workload(base.config.vocab_size, n, prompt, completion)
    ours_model = copy.deepcopy(base)
    trl_models = {setting: copy.deepcopy(base) for setting in trl_checkpointing}
    del base
    lr = 1e-6
    config = OptimConfig(
        learning_rate=lr,
        max_grad_norm=1.0,
        compute_dtype=dtype,
        token_budget=max(token_budget, max(s.n_tokens for s in samples)),
        loss=LossConfig(aggregation="seq_mean_token_mean"),
    )
    ours = PolicyTrainer({"base": ours_model}, config)
    tokens = sum(s.n_tokens for s in samples)
    longest = max(len(s.prompt_ids) for s in samples) + max(len(s.completion_ids) for s in samples)
    completions = max(len(s.completion_ids) for s in samples)
    flops = {  # per step: ours on its packed rows and logically; TRL on its padded batch and logically
        "computed": computed_flops(ours_model, micro_batches(ours, samples)),
        "logical": model_flops(ours_model, samples),
        "padded": token_flops(ours_model, n * longest, n * completions, float(n * longest**2)),
    }
    figures: dict[str, Any] = {
        "samples": n,
        "tokens": tokens,
        "tokens_computed": sum(b.n_tokens for b in micro_batches(ours, samples)),
        "padded_tokens_trl": n * longest,
        "trl_gradient_checkpointing": list(trl_checkpointing),
    }
    our_times: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        sides = {}
        for setting in trl_checkpointing:
            lockstep = _Lockstep()
            trainer = trl_trainer(
                trl_models[setting],
                samples,
                "grpo",
                f"{out}/{setting}",
                lr,
                1e-8,
                steps=steps + 1,
                callbacks=[lockstep],
                bf16=dtype == "bfloat16",
                gradient_checkpointing=setting == "on",
            )
            sides[setting] = _TRLSide(trainer, lockstep)
        for i in range(steps + 1):
            for side in sides.values():  # one TRL step of each setting, alone
                side.step()
            started = time.perf_counter()  # then one of ours, alone
            ours.step(samples, step_index=i)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            our_times.append(time.perf_counter() - started)
            if i == 0:
                continue  # the warm-up
            figures.update(_means(our_times[1:], {k: v.lockstep.durations[1:] for k, v in sides.items()}))
            figures |= rates(
                {k: flops[k] for k in ("computed", "logical")},
                figures["workbench_step_s"],
                torch.device(device),
            )
            if "trl_step_s" in figures:
                figures |= rates(
                    {"computed": flops["padded"], "logical": flops["logical"]},
                    figures["trl_step_s"],
                    torch.device(device),
                    prefix="trl_",
                )
            figures["steps_done"] = i
            if on_round is not None:
                on_round(figures)
        for side in sides.values():
            side.thread.join()
    figures["steps"] = steps
    return figures


def _means(ours: list[float], trl: dict[str, list[float]]) -> dict[str, Any]:
    """Mean step times so far, and the workbench's against TRL's for each checkpointing setting."""
    ours_s = sum(ours) / len(ours)
    out: dict[str, Any] = {"workbench_step_s": round(ours_s, 3)}
    for setting, times in trl.items():
        trl_s = sum(times) / len(times)
        key = "trl_step_s" if setting == "off" else "trl_ckpt_step_s"
        out[key] = round(trl_s, 3)
        out["ratio" if setting == "off" else "ratio_vs_trl_ckpt"] = round(ours_s / trl_s, 3)
    return out


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
    parser.add_argument("--device", default="cpu", help="the trainers' device (cpu, cuda)")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: every side autocasts"
    )
    parser.add_argument("--token-budget", type=int, default=4096, help="our tokens per packed micro-batch")
    parser.add_argument(
        "--trl-checkpointing",
        default="off,on",
        help="TRL's gradient checkpointing settings to run, of off,on (the ratio is against off)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = tuple(dict.fromkeys(x.strip() for x in args.trl_checkpointing.split(",") if x.strip()))
    if not settings or set(settings) - set(SETTINGS):
        parser.error(f"--trl-checkpointing takes off, on or off,on, got {args.trl_checkpointing!r}")
    model = args.model or ("tiny" if args.quick else "smollm2-135m")
    n = args.samples or 16
    steps = args.steps or 3
    prompt, completion = (32, 24) if args.quick else (48, 32)
    prompt, completion = args.prompt or prompt, args.completion or completion
    report: dict[str, Any] = {
        "benchmark": "trainer",
        "mode": "quick" if args.quick else "full",
        "model": model,
        "device": args.device,
        "dtype": args.dtype,
        "prompt_tokens_median": prompt,
        "completion_tokens_median": completion,
    }

    def save(figures: dict[str, Any]) -> None:  # after every round: a run stopped midway keeps its means
        write_json(args.out, {**report, **figures, "machine": machine(), "when": now()})

    figures = measure(
        model, n, prompt, completion, steps, args.device, args.dtype, args.token_budget, settings, save
    )
    report |= figures
    save(figures)
    trl = ", ".join(
        f"TRL ckpt {k} {figures[key]} s/step"
        for k, key in (("off", "trl_step_s"), ("on", "trl_ckpt_step_s"))
        if key in figures
    )
    print(
        f"workbench {figures['workbench_step_s']} s/step, {trl}; ratio {figures.get('ratio')} (TRL ckpt off), "
        f"{figures.get('ratio_vs_trl_ckpt')} (TRL ckpt on) ({n} samples, {figures['tokens']} tokens)"
    )
    print(f"wrote {args.out}")
    return {**report, "machine": machine(), "when": now()}


if __name__ == "__main__":
    main()

"""Trainer precision and memory: fp32 against bf16 mixed precision, with and without gradient checkpointing.

    python -m tests.perf.bench_precision --quick                          # tiny, CPU (CI size)
    python -m tests.perf.bench_precision                                  # smollm2-135m on the CPU
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-1.5b --samples 64 --prompt 256 --completion 256
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-7b --lora --variants bf16,bf16+ckpt
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-0.5b --compare-cpu

One GRPO batch (random prompts and completions with a long-tailed length spread, a GRPO group per prompt,
fixed advantages) trained by ``PolicyTrainer`` in each variant: ``fp32``, ``bf16`` (autocast over fp32
master weights and AdamW state), ``+ckpt`` (gradient checkpointing). Each variant runs in a process of its
own (so its peak memory is its own): one warm-up step, then ``--steps`` timed steps. Reported per variant:
step seconds, trained tokens/s, peak memory (CUDA: the allocator's peak; CPU: the process's peak RSS), and
on CUDA the model FLOPs utilisation: (6·N·tokens + 6·layers·width·Σ len²) / step time / the chip's dense
bf16 peak (N: the parameters a token passes through; the LM head only at completion positions; 4·N for a
frozen LoRA base, which needs no weight gradients). Ratios:
bf16 step / fp32 step, and each ``+ckpt`` peak memory and step time / the same variant's without.

``--model`` takes a shape of ``tests/perf/shapes`` (random weights) or a registry name. ``--lora`` trains
one LoRA adapter per role (two roles) on the frozen base, stored in the compute dtype. ``--compare-cpu``
also runs one fp32 step on the CPU and on the device on the same weights and batch (TF32 off) and reports
the relative difference of the loss and the gradient norm. ``--profile`` runs one more step of each variant
under torch.profiler and reports the step's CPU time, its device (kernel) time and the share of the wall
time the device was busy, and prints the operator table. ``--compare-kernels`` scores one packed micro-batch
with the device's attention path (the varlen kernel on a GPU in bf16) and with the padded sdpa path
(``packed_attention.forced_path``) in the compute dtype and reports how far their log-probs and gradient
norms are apart. Results go to
tests/perf/results/precision.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tests.perf.runner import machine, now, write_json
from workbench.rl.samples import Sample

DEFAULT_OUT = Path(__file__).parent / "results" / "precision.json"
# dense bf16 tensor-core peaks (FLOP/s), by a word in the device's name
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def workload(vocab: int, n: int, prompt: int, completion: int, group: int = 8, seed: int = 0) -> list[Sample]:
    """``n`` samples: GRPO groups of ``group`` completions per prompt, lengths log-normal around the medians."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    while len(samples) < n:
        p = max(4, int(rng.lognormvariate(0, 0.5) * prompt))
        ids = [rng.randrange(10, vocab) for _ in range(p)]
        for _ in range(min(group, n - len(samples))):
            c = max(2, min(4 * completion, int(rng.lognormvariate(0, 0.7) * completion)))
            role = "solver" if len(samples) % 2 == 0 else "verifier"
            completion_ids = [rng.randrange(10, vocab) for _ in range(c)]
            samples.append(
                Sample(
                    ids,
                    completion_ids,
                    [1] * c,
                    [0.0] * c,
                    role=role,
                    policy=role,
                    advantage=rng.uniform(-1, 1),
                )
            )
    return samples


def load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A model of shape ``name`` (random weights, made on ``device``) or a registry model moved there."""
    from tests.perf import shapes

    if name in shapes.names():
        return shapes.build(name, device=device, dtype=dtype, seed=seed)
    from workbench.models import load

    model, _ = load(name)
    return model.to(device=device, dtype=dtype)


def model_flops(model: Any, samples: list[Sample], frozen: bool = False) -> float:
    """Training FLOPs of one pass over ``samples``: 6 per parameter a token passes through (4 when the
    weights are ``frozen``, a LoRA base: no weight gradients), plus attention."""
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    head = 0 if config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embedding - head
    tokens = sum(s.n_tokens for s in samples)
    completions = sum(len(s.completion_ids) for s in samples)
    head_flops = config.vocab_size * config.hidden_size * completions
    attention = config.num_hidden_layers * config.hidden_size * sum(s.n_tokens**2 for s in samples)
    return (4.0 if frozen else 6.0) * (body * tokens + head_flops) + 6.0 * attention


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Train ``args.steps`` timed steps (after one warm-up) in ``variant``, in this process."""
    from workbench.models.placement import Placement
    from workbench.rl.loss import LossConfig
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    dtype = "bfloat16" if variant.startswith("bf16") else "float32"
    placement = Placement.resolve(args.device, dtype)
    device = placement.device
    model = load_model(args.model, device, placement.dtype if args.lora else torch.float32)
    samples = workload(model.config.vocab_size, args.samples, args.prompt, args.completion)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        options = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
        model = get_peft_model(model, LoraConfig(**options), adapter_name="solver")
        model.add_adapter("verifier", LoraConfig(**options))
        for name, parameter in model.named_parameters():
            parameter.requires_grad = "lora_" in name
            if parameter.requires_grad:
                parameter.data = parameter.data.float()  # adapters: fp32 master weights

        def activate(policy: str) -> Any:
            model.set_adapter(policy)
            return model

        models = {"solver": model, "verifier": model}
    else:
        models, activate = {"solver": model, "verifier": model}, None
    config = OptimConfig(
        learning_rate=1e-6,
        token_budget=args.token_budget,
        compute_dtype=dtype,
        gradient_checkpointing="ckpt" in variant,
        loss=LossConfig(aggregation="seq_mean_token_mean"),
    )
    trainer = PolicyTrainer(models, config, activate=activate)
    trainer.step(samples, step_index=0)  # warm-up: allocator, kernels, optimizer state
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.steps):
        started = time.perf_counter()
        trainer.step(samples, step_index=i + 1)
        _sync(device)
        times.append(time.perf_counter() - started)
    step_s = sum(times) / len(times)
    profile = profile_step(trainer, samples, device, args.steps + 1) if args.profile else None
    tokens = sum(s.n_tokens for s in samples)
    out = {
        "variant": variant,
        "step_s": round(step_s, 4),
        "tokens": tokens,
        "tokens_per_s": round(tokens / step_s, 1),
        "peak_memory_gb": round(_peak_memory(device) / 2**30, 3),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        base = model.get_base_model() if args.lora else model
        flops = model_flops(base, samples, frozen=args.lora) / step_s
        out["tflops"] = round(flops / 1e12, 1)
        out["mfu"] = round(flops / peak, 4) if peak else None
    if profile:
        out["profile"] = profile
    return out


def profile_step(
    trainer: Any, samples: list[Sample], device: torch.device, step_index: int
) -> dict[str, Any]:
    """One step under torch.profiler: its wall, CPU and device seconds and the share of the wall the device
    was busy (the sum of kernel times over the wall time); prints the 25 costliest operators by CPU time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        started = time.perf_counter()
        trainer.step(samples, step_index=step_index)
        _sync(device)
        wall = time.perf_counter() - started
    events = profiler.key_averages()
    cpu_s = sum(e.self_cpu_time_total for e in events) / 1e6
    device_s = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr, flush=True)
    return {
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu_s, 4),
        "device_s": round(device_s, 4),
        "device_busy": round(device_s / wall, 3) if device.type == "cuda" else None,
        "operators": sum(e.count for e in events),
    }


def compare_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """One packed micro-batch (shared prefixes) scored with the device's attention path and the padded one."""
    from workbench.models.placement import Placement
    from workbench.rl.packed_attention import attention_path, forced_path
    from workbench.rl.packing import collate, plan_shared_micro_batches, token_logprobs, use_block_attention

    placement = Placement.resolve(args.device, "bfloat16" if args.device != "cpu" else "float32")
    model = use_block_attention(load_model(args.model, placement.device, torch.float32))
    samples = workload(model.config.vocab_size, 16, 64, 48)
    batch = collate(samples, plan_shared_micro_batches(samples, 4096)[0], share_prefixes=True)
    batch = batch.to(placement.device)
    probe = torch.zeros(1, 1, 1, 64, device=placement.device, dtype=placement.dtype)
    results = {}
    default = attention_path(probe)  # varlen on a GPU in bf16; loop on a CPU
    for name, context in (("default", contextlib.nullcontext()), ("padded", forced_path("padded"))):
        model.zero_grad(set_to_none=True)
        with context, placement.autocast():
            logp, _ = token_logprobs(model, batch, 1.0)
        logp.sum().backward()
        norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters() if p.grad is not None))
        results[name] = (logp.detach().float(), float(norm))
    return {
        "default_path": default,
        "tokens": batch.n_tokens,
        "shared_tokens": batch.shared_tokens,
        "max_logprob_difference": float((results["default"][0] - results["padded"][0]).abs().max()),
        "mean_abs_logprob": float(results["padded"][0].abs().mean()),
        "grad_norm_rel_diff": abs(results["default"][1] - results["padded"][1]) / results["padded"][1],
    }


def compare_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """One fp32 step on the CPU and on ``args.device``, same weights and batch: loss and gradient norm."""
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = {}
    base = load_model(args.model, torch.device("cpu"), torch.float32)
    samples = workload(base.config.vocab_size, 8, 64, 48)
    for where in ("cpu", args.device):
        model = (
            base if where == "cpu" else load_model(args.model, torch.device("cpu"), torch.float32).to(where)
        )
        metrics = PolicyTrainer({"solver": model, "verifier": model}, OptimConfig(learning_rate=0.0)).step(
            samples
        )
        results[where] = {
            "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"],
            "entropy": metrics["entropy"],
        }
    cpu, dev = results["cpu"], results[args.device]
    return {
        **results,
        "loss_rel_diff": abs(dev["loss"] - cpu["loss"]) / max(abs(cpu["loss"]), 1e-12),
        "grad_norm_rel_diff": abs(dev["grad_norm"] - cpu["grad_norm"]) / cpu["grad_norm"],
        "entropy_rel_diff": abs(dev["entropy"] - cpu["entropy"]) / cpu["entropy"],
    }


def _in_own_process(argv: list[str], variant: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.perf.bench_precision", *argv, "--one", variant],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"variant": variant, "error": (done.stderr or done.stdout)[-1500:]}
    return json.loads(lines[-1])


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    out = {}
    ok = {k: v for k, v in variants.items() if "error" not in v}
    if "fp32" in ok and "bf16" in ok:
        out["bf16_vs_fp32_step"] = round(ok["bf16"]["step_s"] / ok["fp32"]["step_s"], 3)
    for name, figures in ok.items():
        plain = ok.get(name.removesuffix("+ckpt"))
        if name.endswith("+ckpt") and plain:
            out[f"{name}_memory_vs_without"] = round(figures["peak_memory_gb"] / plain["peak_memory_gb"], 3)
            out[f"{name}_step_vs_without"] = round(figures["step_s"] / plain["step_s"], 3)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, small batch")
    parser.add_argument("--model", default=None, help="a shape of tests/perf/shapes or a registry name")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", default="fp32,fp32+ckpt,bf16,bf16+ckpt")
    parser.add_argument("--lora", action="store_true", help="an adapter per role on a frozen base")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--completion", type=int, default=None)
    parser.add_argument("--token-budget", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--compare-cpu", action="store_true", help="also: one fp32 step on the CPU and the device"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also: one step of each variant under torch.profiler"
    )
    parser.add_argument(
        "--compare-kernels",
        action="store_true",
        help="also: the device's attention path against the padded one",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a single variant, in this process
    args = parser.parse_args(argv)
    args.model = args.model or ("tiny" if args.quick else "smollm2-135m")
    args.samples = args.samples or (8 if args.quick else 16)
    args.prompt, args.completion = (
        args.prompt or (24 if args.quick else 96),
        args.completion or (16 if args.quick else 64),
    )
    args.steps = args.steps or (1 if args.quick else 2)
    if args.one:
        print(json.dumps(run_variant(args, args.one)))
        return {}
    passed = [
        a
        for a in (argv if argv is not None else sys.argv[1:])
        if a not in ("--compare-cpu", "--compare-kernels")
    ]
    variants = {v: _in_own_process(passed, v) for v in args.variants.split(",")}
    report: dict[str, Any] = {
        "benchmark": "precision",
        "mode": "quick" if args.quick else "full",
        "model": args.model,
        "device": args.device,
        "lora": args.lora,
        "samples": args.samples,
        "prompt_tokens_median": args.prompt,
        "completion_tokens_median": args.completion,
        "token_budget": args.token_budget,
        "variants": variants,
        "ratios": ratios(variants),
    }
    if args.compare_cpu:
        report["cpu_vs_device_fp32"] = compare_cpu(args)
    if args.compare_kernels:
        report["varlen_vs_padded"] = compare_kernels(args)
    report.update({"machine": machine(), "when": now()})
    write_json(args.out, report)
    for name, figures in variants.items():
        print(f"{name}: {figures}")
    print(f"ratios: {report['ratios']}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

"""Trainer precision and memory: fp32 against bf16 mixed precision, with and without gradient checkpointing.

    python -m tests.perf.bench_precision --quick                          # tiny, CPU (CI size)
    python -m tests.perf.bench_precision                                  # smollm2-135m on the CPU
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-1.5b --samples 64 --prompt 256 --completion 256
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-7b --lora --variants bf16,bf16+ckpt
    python -m tests.perf.bench_precision --device cuda --model qwen2.5-0.5b --compare-cpu

One GRPO batch (random prompts and completions with a long-tailed length spread, a GRPO group per prompt,
fixed advantages) trained by ``PolicyTrainer`` in each variant: ``fp32``, ``bf16`` (autocast over fp32
master weights and AdamW state), ``+ckpt`` (gradient checkpointing). Each variant runs in a process of its
own (so its peak memory is its own; a run of a single variant measures it in the run's own process, before
anything else): one warm-up step, then ``--steps`` timed steps. Reported per variant:
step seconds, trained tokens/s, peak memory (CUDA: the allocator's peak; CPU: the process's peak RSS), the
attention paths the step took (``workbench.rl.packed_attention``), and the model FLOPs per second two ways:

- ``computed``: the tokens the kernels compute, the packed micro-batches the trainer runs (a GRPO group's
  shared prompt once, each segment attending over its own keys);
- ``logical``: every sample counted whole, as if each were run alone (what MFU figures usually count).

FLOPs = 6·N·tokens + 6·layers·width·Σ q·(2k − q) over the attention segments (q queries, k keys; q = k = len
for a sample alone), N the parameters a token passes through (the LM head only at completion positions; 4·N
for a frozen LoRA base, which needs no weight gradients); gradient checkpointing's recompute is not counted.
On CUDA each is also given as MFU, over the chip's dense bf16 peak: ``mfu_computed`` is the headline,
``mfu_logical`` flatters by the share of tokens shared prefixes save. Ratios: bf16 step / fp32 step, and
each ``+ckpt`` peak memory and step time / the same variant's without (``--ratios-with`` takes variants from
another run's JSON of the same workload).

``--model`` takes a shape of ``tests/perf/shapes`` (random weights) or a registry name. ``--lora`` trains
one LoRA adapter per role (two roles) on the frozen base, stored in the compute dtype. ``--compare-cpu``
also runs one fp32 step on the CPU and on the device on the same weights and batch (TF32 off) and reports
the relative difference of the loss and the gradient norm. ``--profile`` runs one more step of each variant
under torch.profiler and reports the step's CPU time, its device (kernel) time and the share of the wall
time the device was busy, and prints the operator table. ``--compare-kernels`` scores one packed micro-batch
with the device's attention path (the varlen kernel on a GPU in bf16) and with the padded sdpa path
(``packed_attention.forced_path``) in the compute dtype and reports how far their log-probs and gradient
norms are apart. The JSON is written after each variant and each comparison, so a run stopped midway keeps
what it measured (``complete`` says whether it ran to the end). Results go to
tests/perf/results/precision.json.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tests.perf.runner import machine, now, write_json
from workbench.rl.samples import Sample

DEFAULT_OUT = Path(__file__).parent / "results" / "precision.json"
# dense bf16 tensor-core peaks (FLOP/s), by a word in the device's name
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
# a device kernel that computes attention, by its name (FlashAttention, cuDNN's, the memory-efficient one, sdpa)
ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn|sdpa|cudnn", re.I)


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


def token_flops(
    model: Any, tokens: int, completions: int, attention_pairs: float, frozen: bool = False
) -> float:
    """Training FLOPs of ``tokens`` through ``model``: 6 per parameter a token passes through (4 when the
    weights are ``frozen``, a LoRA base: no weight gradients; the LM head at ``completions`` positions only),
    plus attention over ``attention_pairs`` = Σ q·(2k − q) over segments of q queries and k keys."""
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    head = 0 if config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embedding - head
    head_flops = config.vocab_size * config.hidden_size * completions
    attention = config.num_hidden_layers * config.hidden_size * attention_pairs
    return (4.0 if frozen else 6.0) * (body * tokens + head_flops) + 6.0 * attention


def model_flops(model: Any, samples: list[Sample], frozen: bool = False) -> float:
    """Training FLOPs of one pass over ``samples`` on their logical tokens: every sample whole, run alone."""
    return token_flops(
        model,
        sum(s.n_tokens for s in samples),
        sum(len(s.completion_ids) for s in samples),
        float(sum(s.n_tokens**2 for s in samples)),
        frozen,
    )


def computed_flops(model: Any, batches: list[Any], frozen: bool = False) -> float:
    """Training FLOPs of the packed micro-batches ``batches`` (``workbench.rl.packing.PackedBatch``) the kernels
    compute: each row's tokens (shared prefixes once), each segment's queries over its keys."""
    tokens = completions = 0
    pairs = 0.0
    for batch in batches:
        tokens += batch.n_tokens
        completions += int(batch.target_ids.numel())
        q = (batch.layout.cu_q[1:] - batch.layout.cu_q[:-1]).double()
        k = (batch.layout.cu_k[1:] - batch.layout.cu_k[:-1]).double()
        pairs += float((q * (2 * k - q)).sum())
    return token_flops(model, tokens, completions, pairs, frozen)


def micro_batches(trainer: Any, samples: list[Sample]) -> list[Any]:
    """The packed micro-batches ``trainer`` (a ``PolicyTrainer``) runs for one update over ``samples``, made on
    the host by its own plan (roles apart, shared prefixes when its config shares them)."""
    from workbench.rl.packing import collate

    plan = trainer._plan(samples, [i for i, s in enumerate(samples) if s.n_trained > 0])
    return [collate(samples, micro, share_prefixes=trainer._sharing) for micro in plan]


def flops_figures(
    model: Any, samples: list[Sample], batches: list[Any], step_s: float, device: torch.device, frozen: bool
) -> dict[str, Any]:
    """Tokens, TFLOP/s and (on CUDA, where the chip's peak is known) MFU, on computed and on logical tokens."""
    return {
        "tokens_computed": sum(b.n_tokens for b in batches),
        **rates(
            {
                "computed": computed_flops(model, batches, frozen),
                "logical": model_flops(model, samples, frozen),
            },
            step_s,
            device,
        ),
    }


def peak_flops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` (FLOP/s) where its name is known, else None (a CPU, an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def rates(flops: dict[str, float], step_s: float, device: torch.device, prefix: str = "") -> dict[str, Any]:
    """``tflops_<kind>`` and ``mfu_<kind>`` (None without a known peak) for each kind of FLOP count."""
    peak = peak_flops(device)
    out: dict[str, Any] = {}
    for kind, value in flops.items():
        out[f"{prefix}tflops_{kind}"] = float(f"{value / step_s / 1e12:.4g}")
        out[f"{prefix}mfu_{kind}"] = round(value / step_s / peak, 4) if peak else None
    return out


@contextlib.contextmanager
def paths_taken() -> Iterator[Counter]:
    """Counts the attention paths ``packed_attention`` actually runs while inside, one per layer call (its own
    counter, ``counting_paths``; empty where it has none). On a GPU the profiled step also names the attention
    kernels that ran."""
    from workbench.rl import packed_attention

    counting = getattr(packed_attention, "counting_paths", None)
    if counting is None:
        yield Counter()
        return
    with counting() as counts:
        yield counts


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
    with paths_taken() as paths:
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
    base = model.get_base_model() if args.lora else model
    out = {
        "variant": variant,
        "step_s": round(step_s, 4),
        "tokens": tokens,
        "tokens_per_s": round(tokens / step_s, 1),
        "peak_memory_gb": round(_peak_memory(device) / 2**30, 3),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        **flops_figures(base, samples, micro_batches(trainer, samples), step_s, device, args.lora),
        "attention_paths": dict(paths),  # layer calls of the warm-up step, by path
    }
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
    attention = sorted(
        (e for e in events if ATTENTION_KERNEL.search(e.key) and getattr(e, "self_device_time_total", 0) > 0),
        key=lambda e: -e.self_device_time_total,
    )
    return {
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu_s, 4),
        "device_s": round(device_s, 4),
        "device_busy": round(device_s / wall, 3) if device.type == "cuda" else None,
        "operators": sum(e.count for e in events),
        # the attention kernels that ran on the device (their names say which: flash, cuDNN, efficient, math)
        "attention_kernels": {e.key[:120]: round(e.self_device_time_total / 1e6, 4) for e in attention[:6]},
    }


def compare_kernels(args: argparse.Namespace, forcing: dict[str, str | None] | None = None) -> dict[str, Any]:
    """One packed micro-batch (shared prefixes) scored with the device's attention path and the padded one.

    Each run's paths are read from ``packed_attention``'s counters (its forward and backward: one count a
    layer call); raises ``RuntimeError`` when both runs took the same paths, a comparison of nothing.
    ``forcing``: the path each run is forced to, None for the device's own (default ``{"default": None,
    "padded": "padded"}``; the tests plant a same-path pair here)."""
    from workbench.models.placement import Placement
    from workbench.rl.packed_attention import counting_paths, forced_path
    from workbench.rl.packing import collate, plan_shared_micro_batches, token_logprobs, use_block_attention

    forcing = forcing or {"default": None, "padded": "padded"}
    placement = Placement.resolve(args.device, "bfloat16" if args.device != "cpu" else "float32")
    model = use_block_attention(load_model(args.model, placement.device, torch.float32))
    samples = workload(model.config.vocab_size, 16, 64, 48)
    batch = collate(samples, plan_shared_micro_batches(samples, 4096)[0], share_prefixes=True)
    batch = batch.to(placement.device)
    results, paths = {}, {}
    for name, path in forcing.items():
        model.zero_grad(set_to_none=True)
        with counting_paths() as taken:
            with forced_path(path) if path else contextlib.nullcontext(), placement.autocast():
                logp, _ = token_logprobs(model, batch, 1.0)
            logp.sum().backward()
        norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters() if p.grad is not None))
        results[name] = (logp.detach().float(), float(norm))
        paths[name] = dict(taken)
    if paths["default"].keys() == paths["padded"].keys():
        raise RuntimeError(
            f"the kernel comparison compared nothing: both runs took {', '.join(sorted(paths['padded']))} "
            f"(layer calls by path: {paths})"
        )
    return {  # default_path: what ran, varlen on a GPU in bf16, loop on a CPU
        "default_path": "+".join(sorted(paths["default"])),
        "paths": paths,
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
    """``variant`` run by a child process of its own (its peak memory its own); its figures or its error."""
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


def _here(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """``variant`` run in this process (the run's only one); its figures or its error."""
    try:
        return run_variant(args, variant)
    except Exception as error:  # noqa: BLE001 - recorded as the variant's error, as a child's would be
        return {"variant": variant, "error": f"{type(error).__name__}: {error}"[-1500:]}
    finally:  # its model and optimizer state go before the comparisons load models of their own
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


WORKLOAD = (
    "model",
    "device",
    "lora",
    "samples",
    "prompt_tokens_median",
    "completion_tokens_median",
    "token_budget",
)


def _variants_of(path: Path | None, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The measured variants of another run's JSON at ``path`` if it ran the same workload as ``report``."""
    if path is None or not path.is_file():
        return {}
    other = json.loads(path.read_text())
    if any(other.get(key) != report[key] for key in WORKLOAD):
        return {}
    return {k: v for k, v in other.get("variants", {}).items() if "error" not in v}


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
    parser.add_argument(
        "--ratios-with",
        type=Path,
        default=None,
        help="another run's JSON of the same workload: its variants join this run's ratios (if it is there)",
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
        "variants": {},
        "ratios": {},
        "complete": False,
    }
    others = _variants_of(args.ratios_with, report)
    if others:
        report["ratios_with"] = {"file": args.ratios_with.name, "variants": sorted(others)}

    def save() -> None:  # after every measurement: a run stopped midway keeps what it measured
        report.update({"machine": machine(), "when": now()})
        write_json(args.out, report)

    variants = report["variants"]
    names = args.variants.split(",")
    for name in names:  # a lone variant has this process to itself: no child needed (nothing ran here before)
        variants[name] = _here(args, name) if len(names) == 1 else _in_own_process(passed, name)
        report["ratios"] = ratios({**others, **variants})
        save()
    if args.compare_cpu:
        report["cpu_vs_device_fp32"] = compare_cpu(args)
        save()
    if args.compare_kernels:
        try:  # both runs on one path, or a kernel that failed: recorded as the comparison's error
            report["varlen_vs_padded"] = compare_kernels(args)
        except Exception as error:
            report["varlen_vs_padded"] = {"error": f"{type(error).__name__}: {error}"}
        save()
    report["complete"] = True
    save()
    for name, figures in variants.items():
        print(f"{name}: {figures}")
    print(f"ratios: {report['ratios']}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

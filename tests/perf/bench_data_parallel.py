"""FSDP2 trainer ranks against one process: the NCCL path on a GPU, gloo on CPUs.

    python -m tests.perf.bench_data_parallel --device cuda      # 1 rank over NCCL, then 2 ranks sharing the GPU
    python -m tests.perf.bench_data_parallel --quick            # CPU: 2 ranks over gloo (a rehearsal)
    python -m tests.perf.bench_data_parallel --model tiny --compare --repeat 3 --token-budget 160 \
        --out tests/perf/results/data_parallel@tiny.json        # and the variants below, side by side

With ``--compare``, the FSDP ranks also time a second trainer on the same sharded model, alternating steps
with the first (paired, so the machine's load falls on both alike): ``sync_every_micro_batch``, FSDP2
reduce-scattering after every micro-batch instead of once per model, role and optimizer step
(``PolicyTrainer(defer_gradient_sync=False)``); and two more ranks run ``flat_all_reduce``, the data-parallel
group issue 48 removed (every rank holding the whole model, each role's gradients concatenated into one flat
tensor and all-reduced), from its own source: ``workbench/rl/trainer.py`` at ``FLAT_COMMIT`` read out of git,
against today's modules (none it imports has changed since but ``data_parallel``'s docstring). Without git
history that variant is recorded as an error.

Each group runs the trainer ranks' own path (``workbench.rl.data_parallel.join``, the model sharded with
``workbench.rl.fsdp.shard_models``, then ``PolicyTrainer`` with the rank's ``Shard``: the code a ``TrainerRank``
actor runs, without Ray) in processes of its own, on the same seeded
random weights of a shape and the same batch; the lone trainer (no group) runs the same step in this process.
Reported per group: the collective backend it used, its step time, and how far its loss, gradient norm and
updates of the weights are from the lone trainer's (fp32, TF32 off). One GPU holds every rank of a group; NCCL may refuse
two ranks on one device, and that error is recorded, not raised.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.perf.bench_precision import load_model, workload
from tests.perf.runner import machine, now, write_json

DEFAULT_OUT = Path(__file__).parent / "results" / "data_parallel.json"
#: The last commit whose trainer ranks summed gradients with one flat all-reduce (the parent of ed793cf, issue 48).
FLAT_COMMIT = "c83dd54ddc24707ad52b465677ad9e3678b0f76a"
VARIANTS = ("fsdp", "flat_all_reduce")


def flat_trainer_class() -> Any:
    """``PolicyTrainer`` as it was at ``FLAT_COMMIT`` (unsharded ranks, a flat all-reduce per role), from git."""
    import types

    root = Path(__file__).resolve().parents[2]
    source = subprocess.run(
        ["git", "show", f"{FLAT_COMMIT}:workbench/rl/trainer.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("flat_all_reduce_trainer")
    exec(compile(source, f"{FLAT_COMMIT[:7]}:workbench/rl/trainer.py", "exec"), module.__dict__)  # noqa: S102
    return module.PolicyTrainer


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def one_step(args: argparse.Namespace, shard: Any = None, variant: str = "fsdp") -> dict[str, Any]:
    """``args.repeat`` timed steps (after ``args.warmup`` untimed ones with the learning rate at 0) of the trainer
    that ``shard`` places in its group (None: alone) as ``variant`` runs it; the first step's metrics and each
    parameter's update in it, and every step's time."""
    from workbench.models.placement import Placement
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = Placement.resolve(args.device, "float32").device
    torch.manual_seed(0)  # a registry model (tiny) is initialised from the global generator
    model = load_model(args.model, device, torch.float32, seed=0)
    samples = workload(model.config.vocab_size, args.samples, args.prompt, args.completion)
    options: dict[str, Any] = {}
    if variant == "flat_all_reduce":  # every rank the whole model
        trainer_class = flat_trainer_class() if shard is not None else PolicyTrainer
    else:
        trainer_class = PolicyTrainer
        if shard is not None:  # a rank of a group: the model sharded over it
            from workbench.rl.fsdp import shard_models

            shard_models([model], device.type, torch.float32)
    models = {"solver": model, "verifier": model}
    budget = {"token_budget": args.token_budget} if args.token_budget else {}

    def config(rate: float) -> Any:
        return OptimConfig(learning_rate=rate, **budget)

    # with --compare, FSDP ranks time a trainer syncing after every micro-batch too, a step each in turn
    paired = args.compare and shard is not None and variant == "fsdp"
    for _ in range(args.warmup):  # kernels and the collective's buffers set up; weights left as they are
        trainer_class(models, config(0.0), shard=shard, **options).step(samples)
        if paired:
            PolicyTrainer(models, config(0.0), shard=shard, defer_gradient_sync=False).step(samples)
    trainer = trainer_class(models, config(args.learning_rate), shard=shard, **options)
    every = (
        PolicyTrainer(models, config(args.learning_rate), shard=shard, defer_gradient_sync=False)
        if paired
        else None
    )

    def timed(trainer: Any) -> tuple[float, dict[str, Any]]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        metrics = trainer.step(samples)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started, metrics

    times, every_times, first = [], [], None
    for repeat in range(args.repeat):
        if paired and repeat % 2:  # the order alternates
            every_times.append(timed(every)[0])
        before = [p.detach().clone() for p in model.parameters()] if repeat == 0 else []
        seconds, metrics = timed(trainer)
        times.append(seconds)
        if repeat == 0:
            first = {
                "loss": metrics["loss"],
                "grad_norm": metrics["grad_norm"],
                "update": sketch(model, before),
            }
        if paired and not repeat % 2:
            every_times.append(timed(every)[0])
    return {
        "step_s": statistics.median(times),
        "step_times_s": times,
        "deferred_sync": bool(getattr(trainer, "defer_sync", False)),
        **({"sync_every_step_times_s": every_times} if paired else {}),
        **first,
    }


def sketch(model: Any, before: list[torch.Tensor]) -> list[tuple[float, float]]:
    """Each parameter's update: its norm and its projection on a fixed random direction (seeded by the parameter's
    index), enough to tell two updates apart without moving the weights between processes."""
    out = []
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for i, (p, old) in enumerate(zip(model.parameters(), before, strict=True)):
            delta = (p - old).double()
            delta = delta.full_tensor() if isinstance(delta, DTensor) else delta  # a collective
            direction = torch.randn(
                delta.shape, generator=torch.Generator(p.device).manual_seed(i), device=p.device
            )
            out.append((float(delta.norm()), float((delta * direction).sum())))
    return out


def _rank(
    rank: int, size: int, address: str, args: argparse.Namespace, results: Any, variant: str = "fsdp"
) -> None:
    """One rank of the group: joins it, trains its steps, puts its figures (or its error) on ``results``."""
    import torch.distributed as dist

    from workbench.rl.data_parallel import join

    try:
        torch.set_num_threads(1)
        if args.device == "cuda":
            torch.cuda.set_device(0)  # one GPU: every rank of the group on it
        shard = join(address, rank, size, timeout_s=120, on_gpu=args.device == "cuda")
        figures = one_step(args, shard, variant)
        results.put({"rank": rank, "backend": dist.get_backend(), **figures})
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - the group's failure is a result (NCCL may refuse a shared GPU)
        results.put(
            {
                "rank": rank,
                "error": f"{type(error).__name__}: {error}"[:1500],
                "trace": traceback.format_exc()[-3000:],
            }
        )


def run_group(
    args: argparse.Namespace, size: int, alone: dict[str, Any], variant: str = "fsdp"
) -> dict[str, Any]:
    """``size`` ranks in processes of their own; rank 0's figures against the lone trainer's."""
    context = mp.get_context("spawn")
    results = context.Queue()
    address = _free_address()
    processes = [
        context.Process(target=_rank, args=(r, size, address, args, results, variant)) for r in range(size)
    ]
    for process in processes:
        process.start()
    got = []
    deadline = time.monotonic() + args.timeout
    while len(got) < size and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=5))
        except Exception:  # noqa: BLE001 - queue.Empty: a rank may have died; keep waiting until the deadline
            if all(not p.is_alive() for p in processes) and results.empty():
                break
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()
    errors = [g for g in got if "error" in g]
    if errors or len(got) < size:
        first = errors[0] if errors else {"error": f"{size - len(got)} rank(s) ended without a result"}
        return {"ranks": size, "error": first["error"], "trace": first.get("trace", "")}
    lead = next(g for g in got if g["rank"] == 0)
    # how far rank 0's update of each parameter is from the lone trainer's, against the size of that update
    update_diff = max(
        max(abs(a[0] - b[0]), abs(a[1] - b[1])) / max(b[0], 1e-12)
        for a, b in zip(lead["update"], alone["update"], strict=True)
        if b[0] > 0
    )
    # a step of the group lasts as long as its slowest rank's: the median over the steps of the ranks' longest
    steps = [max(column) for column in zip(*(g["step_times_s"] for g in got), strict=True)]
    paired = {}
    if "sync_every_step_times_s" in lead:
        every = [max(column) for column in zip(*(g["sync_every_step_times_s"] for g in got), strict=True)]
        paired = {
            "sync_every_micro_batch": {
                "step_s": round(statistics.median(every), 4),
                "step_times_s": [round(t, 4) for t in every],
                # each deferred step's time over the sync-every step's next to it (< 1: deferring is faster)
                "deferred_vs_every_median_of_pairs": round(
                    statistics.median(a / b for a, b in zip(steps, every, strict=True)), 3
                ),
            }
        }
    return {
        "ranks": size,
        "variant": variant,
        "backend": lead["backend"],
        "deferred_sync": lead["deferred_sync"],
        "step_s": round(statistics.median(steps), 4),
        "step_times_s": [round(t, 4) for t in steps],
        "loss_rel_diff": abs(lead["loss"] - alone["loss"]) / max(abs(alone["loss"]), 1e-12),
        "grad_norm_rel_diff": abs(lead["grad_norm"] - alone["grad_norm"]) / alone["grad_norm"],
        "update_max_rel_diff": update_diff,
        "ranks_agree": all(g["update"] == lead["update"] for g in got),
        **paired,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small shapes (CI size)")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--model", default=None, help="a shape of tests/perf/shapes or a registry model")
    parser.add_argument("--ranks", default=None, help="group sizes, comma-separated (cuda: 1,2; cpu: 2)")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--completion", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (learning rate 0)")
    parser.add_argument("--repeat", type=int, default=1, help="timed steps (the median is reported)")
    parser.add_argument(
        "--token-budget", type=int, default=None, help="tokens a micro-batch (default: the trainer's)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="2 ranks also syncing every micro-batch, and as the flat all-reduce group (from git)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a group may take")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    small = args.quick or args.device == "cpu"
    args.model = args.model or ("qwen2-mini" if small else "qwen2.5-0.5b")
    args.samples = args.samples or (8 if small else 32)
    args.prompt = args.prompt or (32 if small else 256)
    args.completion = args.completion or (32 if small else 256)
    sizes = [int(n) for n in (args.ranks or ("1,2" if args.device == "cuda" else "2")).split(",")]

    alone = one_step(args)
    groups = {}
    for size in sizes:
        print(f"{size} rank(s) on {args.device} ...", flush=True)
        groups[str(size)] = run_group(args, size, alone)
        print({k: v for k, v in groups[str(size)].items() if k != "trace"}, flush=True)
    result = {
        "mode": "quick" if args.quick else "full",
        "model": args.model,
        "device": args.device,
        "workload": {
            "samples": args.samples,
            "prompt": args.prompt,
            "completion": args.completion,
            "token_budget": args.token_budget,
            "timed_steps": args.repeat,
        },
        "alone": {
            "step_s": round(alone["step_s"], 4),
            "step_times_s": [round(t, 4) for t in alone["step_times_s"]],
            "loss": alone["loss"],
            "grad_norm": alone["grad_norm"],
        },
        "groups": groups,
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, result)
    if args.compare:  # 2 ranks as the other variants, after the default's groups (which stay as they were)
        result["variants"] = {"fsdp": groups.get("2") or run_group(args, 2, alone)}
        for variant in VARIANTS[1:]:
            print(f"2 ranks, {variant} ...", flush=True)
            result["variants"][variant] = run_group(args, 2, alone, variant)
            print({k: v for k, v in result["variants"][variant].items() if k != "trace"}, flush=True)
            write_json(args.out, result)
        fsdp = result["variants"]["fsdp"]
        result["ratios"] = {  # step time / step time (> 1: the first is slower)
            f"{name}_vs_{other}": round(a["step_s"] / b["step_s"], 3)
            for name, a, other, b in [
                ("fsdp", fsdp, "alone", alone),
                ("fsdp", fsdp, "flat_all_reduce", result["variants"]["flat_all_reduce"]),
                ("fsdp", fsdp, "sync_every_micro_batch", fsdp.get("sync_every_micro_batch", {})),
                ("flat_all_reduce", result["variants"]["flat_all_reduce"], "alone", alone),
            ]
            if "step_s" in a and "step_s" in b
        }
        print(result["ratios"], flush=True)
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()

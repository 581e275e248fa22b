"""FSDP2 trainer ranks against one process: the NCCL path on a GPU, gloo on CPUs.

    python -m tests.perf.bench_data_parallel --device cuda      # 1 rank over NCCL, then 2 ranks sharing the GPU
    python -m tests.perf.bench_data_parallel --quick            # CPU: 2 ranks over gloo (a rehearsal)

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
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.perf.bench_precision import load_model, workload
from tests.perf.runner import machine, now, write_json

DEFAULT_OUT = Path(__file__).parent / "results" / "data_parallel.json"


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def one_step(args: argparse.Namespace, shard: Any = None) -> dict[str, Any]:
    """One timed step (after ``args.warmup`` untimed ones with the learning rate at 0) of the trainer that
    ``shard`` places in its group (None: alone); the step's metrics and each parameter's sum and norm after it."""
    from workbench.models.placement import Placement
    from workbench.rl.trainer import OptimConfig, PolicyTrainer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = Placement.resolve(args.device, "float32").device
    model = load_model(args.model, device, torch.float32, seed=0)
    samples = workload(model.config.vocab_size, args.samples, args.prompt, args.completion)
    if shard is not None:  # a rank of a group: the model sharded over it
        from workbench.rl.fsdp import shard_models

        shard_models([model], device.type, torch.float32)
    models = {"solver": model, "verifier": model}
    for _ in range(args.warmup):  # kernels and the collective's buffers set up; weights left as they are
        PolicyTrainer(models, OptimConfig(learning_rate=0.0), shard=shard).step(samples)
    trainer = PolicyTrainer(models, OptimConfig(learning_rate=args.learning_rate), shard=shard)
    before = [p.detach().clone() for p in model.parameters()]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    metrics = trainer.step(samples)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_s = time.perf_counter() - started
    return {
        "step_s": step_s,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "update": sketch(model, before),
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


def _rank(rank: int, size: int, address: str, args: argparse.Namespace, results: Any) -> None:
    """One rank of the group: joins it, trains one step, puts its figures (or its error) on ``results``."""
    import torch.distributed as dist

    from workbench.rl.data_parallel import join

    try:
        torch.set_num_threads(1)
        if args.device == "cuda":
            torch.cuda.set_device(0)  # one GPU: every rank of the group on it
        shard = join(address, rank, size, timeout_s=120, on_gpu=args.device == "cuda")
        figures = one_step(args, shard)
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


def run_group(args: argparse.Namespace, size: int, alone: dict[str, Any]) -> dict[str, Any]:
    """``size`` ranks in processes of their own; rank 0's figures against the lone trainer's."""
    context = mp.get_context("spawn")
    results = context.Queue()
    address = _free_address()
    processes = [context.Process(target=_rank, args=(r, size, address, args, results)) for r in range(size)]
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
    return {
        "ranks": size,
        "backend": lead["backend"],
        "step_s": round(max(g["step_s"] for g in got), 4),
        "loss_rel_diff": abs(lead["loss"] - alone["loss"]) / max(abs(alone["loss"]), 1e-12),
        "grad_norm_rel_diff": abs(lead["grad_norm"] - alone["grad_norm"]) / alone["grad_norm"],
        "update_max_rel_diff": update_diff,
        "ranks_agree": all(g["update"] == lead["update"] for g in got),
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
        "workload": {"samples": args.samples, "prompt": args.prompt, "completion": args.completion},
        "alone": {
            "step_s": round(alone["step_s"], 4),
            "loss": alone["loss"],
            "grad_norm": alone["grad_norm"],
        },
        "groups": groups,
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()

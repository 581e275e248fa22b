"""Engine overhead and decode throughput: a multi-role topology rollout against the raw backend on the same
generation work, and the hf backend's decode tokens/s unprofiled and under torch.profiler.

    python -m tests.perf.bench_engine --quick                 # tiny model, hf backend (CI)
    python -m tests.perf.bench_engine --model smollm2-135m --backends hf vllm
    python -m tests.perf.bench_engine --model qwen2.5-0.5b --backends hf --tasks 64 --max-tokens 128 \
        --decode static --parts decode,profile              # a GPU: decode tokens/s both ways

``--parts`` picks what is measured, in this order: ``decode`` (unprofiled decode tokens/s of ``--tasks`` rows
with varied prompt and completion lengths, sampled, with stop strings and end-of-sequence honoured: what a
rollout asks; a warm-up pass, then the timed one), ``profile`` (one batch of identical prompts decoded to
``--max-tokens`` with ``ignore_eos`` under torch.profiler: where a step's time goes, and a tokens/s the
profiler slows) and ``overhead`` (below; the default). The JSON is written after each part, so a run stopped
midway keeps the parts it measured.

The engine runs MarsRL (Solver -> Verifier -> Corrector ...) greedily over N problems at once. The
baseline then sends the very same requests (the recorded prompt token ids and max_tokens, greedy)
straight to the backend, wave by wave as the engine's episodes reached them (call 0 of every
episode, then call 1, ...), so both do the same generation work; greedy decoding makes the
completions, and so the token counts, identical (checked). overhead ratio = raw time / engine time
(1.0 means the engine costs nothing on top; the target is >= 0.90). Results go to
tests/perf/results/engine.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.perf import shapes
from tests.perf.runner import machine, now, write_json
from workbench.backends import make_backend
from workbench.backends.base import GenerationRequest
from workbench.engine import Rollout
from workbench.runs import with_sampling
from workbench.tasks import generate
from workbench.topology import load

DEFAULT_OUT = Path(__file__).parent / "results" / "engine.json"
PARTS = ("decode", "profile", "overhead")  # in the order they run


def measure(backend: Any, n_tasks: int, max_tokens: int) -> dict[str, Any]:
    topology = with_sampling(load("marsrl"), temperature=0.0)
    tasks = generate("arithmetic", n=n_tasks, seed=0, level=2)
    engine = Rollout(topology, backend, max_tokens=max_tokens)
    started = time.perf_counter()
    asyncio.run(engine.run(tasks))  # warm-up: the same shapes for both timed runs
    warmup_s = time.perf_counter() - started
    print(f"warm-up rollout: {warmup_s:.1f} s", flush=True)

    started = time.perf_counter()
    episodes = asyncio.run(engine.run(tasks))
    engine_s = time.perf_counter() - started
    print(f"engine rollout: {engine_s:.1f} s, {sum(len(e.calls) for e in episodes)} calls", flush=True)

    waves: dict[int, list] = defaultdict(list)
    for episode in episodes:
        for call in episode.calls:
            waves[call.position].append(call)

    async def replay(calls: list) -> list:
        requests = [GenerationRequest(c.prompt_ids, max_tokens=max_tokens, temperature=0.0) for c in calls]
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    raw_s, raw_tokens, same = 0.0, 0, True
    for position in sorted(waves):
        started = time.perf_counter()
        outputs = asyncio.run(replay(waves[position]))
        raw_s += time.perf_counter() - started
        print(f"raw wave {position}: {len(waves[position])} requests, {raw_s:.1f} s so far", flush=True)
        for call, (generation,) in zip(waves[position], outputs, strict=True):
            raw_tokens += len(generation.completion_ids)
            same &= len(generation.completion_ids) == len(call.completion_ids)
    engine_tokens = sum(len(c.completion_ids) for e in episodes for c in e.calls)
    return {
        "episodes": len(episodes),
        "calls": sum(len(e.calls) for e in episodes),
        "warmup_s": round(warmup_s, 3),  # the first rollout: kernels chosen, graphs captured
        "engine_s": round(engine_s, 3),
        "raw_s": round(raw_s, 3),
        "engine_tokens": engine_tokens,
        "raw_tokens": raw_tokens,
        "same_token_counts": bool(same),
        "engine_tokens_per_s": round(engine_tokens / engine_s, 1),
        "raw_tokens_per_s": round(raw_tokens / raw_s, 1),
        "overhead_ratio": round(raw_s / engine_s, 3),
    }


def profile_decode(backend: Any, n: int, max_tokens: int) -> dict[str, Any]:
    """Where one batch of ``n`` greedy requests spends its time in the hf backend (torch.profiler): prints the
    top operators, returns tokens/s, the wall, CPU and device seconds and the device's busy share. The batch
    is decoded in this thread: the profiler records operators of its own thread only."""
    import torch

    requests = [
        GenerationRequest(list(range(10, 74)), max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ]
    requests = requests * n
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    backend._generate_rows(requests, time.perf_counter())  # warm-up
    with torch.profiler.profile(activities=activities) as profiler:
        started = time.perf_counter()
        backend._generate_rows(requests, started)
        elapsed = time.perf_counter() - started
    print(
        f"profiled decode: {n} x {max_tokens} tokens in {elapsed:.2f} s ({n * max_tokens / elapsed:,.0f} tokens/s)"
    )
    events = profiler.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    device_s = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    return {
        "decode": getattr(backend, "decode_mode", None),
        "tokens_per_s": round(n * max_tokens / elapsed, 1),
        "wall_s": round(elapsed, 4),
        "cpu_s": round(sum(e.self_cpu_time_total for e in events) / 1e6, 4),
        "device_s": round(device_s, 4),
        "device_busy": round(device_s / elapsed, 3) if torch.cuda.is_available() else None,
    }


STOPS = ("\n\n", "</answer>")  # what marsrl's roles stop on, about


def decode_requests(vocab: int, n: int, max_tokens: int, seed: int = 0) -> list[GenerationRequest]:
    """``n`` sampled requests as a rollout sends them: prompt lengths log-normal around 64 tokens (8-256),
    completion limits log-normal around ``max_tokens`` (up to twice it), stop strings, end-of-sequence
    honoured, each row seeded."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = min(256, max(8, int(rng.lognormvariate(0, 0.6) * 64)))
        limit = min(2 * max_tokens, max(2, int(rng.lognormvariate(0, 0.6) * max_tokens)))
        requests.append(
            GenerationRequest(
                [rng.randrange(10, vocab) for _ in range(prompt)],
                max_tokens=limit,
                temperature=1.0,
                stop=STOPS,
                seed=seed * 100_003 + i,
            )
        )
    return requests


def decode_rate(backend: Any, n: int, max_tokens: int) -> dict[str, Any]:
    """Unprofiled decode tokens/s: ``n`` varied requests (``decode_requests``) sent at once through the backend's
    own interface, as the engine sends them; one warm-up pass (kernels, graphs), then the timed one."""
    vocab = int(backend.model.config.vocab_size)
    requests = decode_requests(vocab, n, max_tokens)

    async def send() -> list:
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    started = time.perf_counter()
    asyncio.run(send())
    warmup_s = time.perf_counter() - started
    started = time.perf_counter()
    outputs = [g for (g,) in asyncio.run(send())]
    elapsed = time.perf_counter() - started
    lengths = [len(g.completion_ids) for g in outputs]
    tokens = sum(lengths)
    print(
        f"decode (not profiled): {n} rows, {tokens:,} tokens in {elapsed:.2f} s ({tokens / elapsed:,.0f} tokens/s)"
    )
    return {
        "decode": getattr(backend, "decode_mode", None),
        "rows": n,
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "prompt_lengths": [
            min(len(r.prompt_ids) for r in requests),
            max(len(r.prompt_ids) for r in requests),
        ],
        "max_tokens": [min(r.max_tokens for r in requests), max(r.max_tokens for r in requests)],
        "stop": list(STOPS),
        "completion_tokens": tokens,
        "completion_lengths": [min(lengths), max(lengths)],
        "finished_by_stop": sum(g.stop_reason is not None for g in outputs),
        "finished_by_eos": sum(g.finish_reason == "stop" and g.stop_reason is None for g in outputs),
        "warmup_s": round(warmup_s, 3),
        "wall_s": round(elapsed, 4),
        "tokens_per_s": round(tokens / elapsed, 1),
    }


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, hf only, few problems")
    parser.add_argument("--model", default=None)
    parser.add_argument("--backends", nargs="+", default=None)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--parts",
        default="overhead",
        help="what to measure, of decode,profile,overhead (decode and profile: the hf backend only)",
    )
    parser.add_argument("--profile", action="store_true", help="also profile one decode batch (hf)")
    parser.add_argument(
        "--decode", default="auto", choices=["auto", "dynamic", "static"], help="the hf backend's decode loop"
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.profile and "profile" not in parts:
        parts.insert(0, "profile")
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts takes some of {','.join(PARTS)}, got {args.parts!r}")
    parts = [p for p in PARTS if p in parts]  # decode, then profile, then overhead
    model = args.model or ("tiny" if args.quick else "smollm2-135m")
    kinds = args.backends or (["hf"] if args.quick else ["hf", "vllm"])
    n_tasks = args.tasks or (8 if args.quick else 16)
    max_tokens = args.max_tokens or (16 if args.quick else 48)
    results: dict[str, Any] = {}
    served = model
    if model in shapes.names():  # a shape of tests/perf/shapes: random weights written to a checkpoint first
        served = str(
            shapes.materialize(model, Path(tempfile.mkdtemp(prefix="shape-")) / model, device=_device())
        )
    report = {
        "benchmark": "engine",
        "mode": "quick" if args.quick else "full",
        "model": model,
        "device": _device(),
        "topology": "marsrl",
        "tasks": n_tasks,
        "max_tokens": max_tokens,
        "parts": parts,
        "backends": results,
        "complete": False,
    }

    def save() -> None:  # after every part: a run stopped midway keeps what it measured
        write_json(args.out, {**report, "machine": machine(), "when": now()})

    for kind in kinds:
        backend = make_backend(kind, served, **({"decode": args.decode} if kind == "hf" else {}))
        results[kind] = {}
        try:
            if "decode" in parts and kind == "hf":
                results[kind]["decode"] = decode_rate(backend, n_tasks, max_tokens)
                save()
            if "profile" in parts and kind == "hf":
                results[kind]["profile"] = profile_decode(backend, n_tasks, max_tokens)
                save()
            if "overhead" in parts:
                results[kind].update(measure(backend, n_tasks, max_tokens))
                save()
        finally:
            backend.close()
    report["complete"] = True
    save()
    for kind, r in results.items():
        if "overhead_ratio" in r:
            print(
                f"{kind}: engine {r['engine_tokens_per_s']} tokens/s, raw {r['raw_tokens_per_s']} tokens/s, ratio "
                f"{r['overhead_ratio']}, same token counts {r['same_token_counts']}"
            )
        for part in ("decode", "profile"):
            if part in r:
                print(
                    f"{kind} decode tokens/s{' (profiled)' if part == 'profile' else ''}: {r[part]['tokens_per_s']}"
                )
    print(f"wrote {args.out}")
    return {**report, "machine": machine(), "when": now()}


if __name__ == "__main__":
    main()

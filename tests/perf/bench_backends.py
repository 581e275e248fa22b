"""Raw backend throughput: completion tokens per second of each backend on one fixed generation workload.

    python -m tests.perf.bench_backends --quick     # 32 prompts x 64 tokens on smollm2-135m, hf and vllm
    python -m tests.perf.bench_backends             # 128 prompts x 128 tokens, best of 2
    python -m tests.perf.bench_backends --backends vllm,vllm-reserved   # vLLM's CPU thread binding against ours

All prompts are submitted at once (``asyncio.gather``), as the engine does with many concurrent agent
calls: the hf backend decodes them in left-padded batches of up to 32, vLLM batches them continuously.
Prompts are raw story openings (completion mode) sampled at temperature 1 (no per-request seed, which
would split the hf backend's batches), so completions mostly run to ``max_tokens``; end-of-sequence stops are allowed, and the tokens actually
generated are what is counted. Start-up (model load, engine processes) and one warm-up request are
timed apart. The same workload is the denominator of the engine-overhead benchmark: import
``workload`` and ``measure`` from here. Results go to tests/perf/results/backends.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from tests.perf.runner import machine, now, write_json
from workbench.backends import make_backend
from workbench.backends.base import GenerationRequest

DEFAULT_OUT = Path(__file__).parent / "results" / "backends.json"
OPENINGS = (
    "Once upon a time, in a village by the sea,",
    "The old lighthouse keeper opened the door and",
    "On the first day of school, the new teacher",
    "Deep in the forest there was a small house where",
    "The scientist looked at the results again and",
    "When the train stopped in the middle of nowhere,",
    "My grandmother always told me that",
    "The robot had never seen snow before, so",
)


def workload(tokenizer: Any, n_prompts: int) -> list[list[int]]:
    """``n_prompts`` prompt token ids: story openings, each made distinct by a numbered prefix."""
    texts = [f"Story {i + 1}. {OPENINGS[i % len(OPENINGS)]}" for i in range(n_prompts)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def measure(backend: Any, prompts: list[list[int]], max_tokens: int, repeats: int = 1) -> dict[str, Any]:
    """Submit every prompt at once; the best of ``repeats`` wall times and its completion tokens per second."""
    # no per-request seeds: the hf backend batches only requests with equal sampling settings
    requests = [GenerationRequest(p, max_tokens=max_tokens, temperature=1.0) for p in prompts]

    async def all_at_once() -> list:
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    asyncio.run(backend.generate(GenerationRequest(prompts[0], max_tokens=4)))  # warm-up
    best: dict[str, Any] | None = None
    for _ in range(repeats):
        started = time.perf_counter()
        results = asyncio.run(all_at_once())
        seconds = time.perf_counter() - started
        tokens = sum(len(g.completion_ids) for (g,) in results)
        if best is None or seconds < best["seconds"]:
            best = {
                "seconds": round(seconds, 3),
                "completion_tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1),
            }
    return best


#: vLLM's CPU build with its own thread binding (one CPU kept for the engine core) instead of the workbench's
#: (every CPU for the model on a small machine: ``workbench.backends.vllm.cpu_binding``)
VLLM_RESERVED = "vllm-reserved"


@contextlib.contextmanager
def vllm_binding(kind: str):
    """vLLM's own CPU binding while a ``vllm-reserved`` engine starts (its processes read it then)."""
    if kind != VLLM_RESERVED:
        yield
        return
    saved = {
        k: os.environ.pop(k, None) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")
    }
    os.environ.update(VLLM_CPU_OMP_THREADS_BIND="auto", VLLM_CPU_NUM_OF_RESERVED_CPU="1")  # vLLM's defaults
    try:
        yield
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
        os.environ.pop("VLLM_CPU_NUM_OF_RESERVED_CPU")
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def run(model: str, kinds: list[str], n_prompts: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in kinds:
        started = time.perf_counter()
        engine = "vllm" if kind == VLLM_RESERVED else kind
        options = {"max_model_len": 1024} if engine == "vllm" else {}
        with vllm_binding(kind):
            backend = make_backend(engine, model, **options)
        startup = time.perf_counter() - started
        try:
            prompts = workload(backend.tokenizer, n_prompts)
            results[kind] = {"startup_s": round(startup, 1), **measure(backend, prompts, max_tokens, repeats)}
        finally:
            backend.close()
        print(f"{kind:>5}: {results[kind]}", flush=True)
    return {
        "benchmark": "backends",
        "model": model,
        "prompts": n_prompts,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "backends": results,
        "machine": machine(),
        "when": now(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 prompts x 64 tokens, one repeat")
    parser.add_argument("--model", default="smollm2-135m", help="registry name or checkpoint path")
    parser.add_argument(
        "--backends",
        default="hf,vllm",
        help=f"comma-separated backend kinds ({VLLM_RESERVED}: vllm with one CPU kept for its engine core)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON results")
    args = parser.parse_args(argv)
    n_prompts, max_tokens, repeats = (32, 64, 1) if args.quick else (128, 128, 2)
    results = run(args.model, args.backends.split(","), n_prompts, max_tokens, repeats)
    results["mode"] = "quick" if args.quick else "full"
    write_json(args.out, results)
    return results


if __name__ == "__main__":  # vLLM spawns its engine processes: keep the guard
    main()

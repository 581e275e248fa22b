"""First-Fit-Decreasing benchmark: time per 10k-item pack and bins against the lower bound ceil(sum/capacity).

    python -m tests.perf.bench_binpack --quick    # 1 instance per distribution, a few seconds
    python -m tests.perf.bench_binpack            # 5 instances each, the figures for the README

Each distribution draws 10,000 integer sizes (token counts) with a fixed seed. ``workbench.engine.binpack.
ffd_pack`` (max-tree first-fit search) is timed as the median of several runs; the plain two-loop
version of the MARS sketch (``ffd_pack_naive``, O(items x bins)) packs the same instance once in the
same run, and the two packings must be identical. Quality is bins / ceil(sum / capacity), counting a
truncated item as ``capacity``. That bound is loose where items cannot share bins well: with every
size in (C/3, C/2] no three items fit a bin, so the optimum is exactly ceil(n/2) while the bound is
about 0.83 of that; the table reports that case against its known optimum too.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.perf.runner import machine, now, write_json
from workbench.engine.binpack import ffd_pack, ffd_pack_naive

DEFAULT_OUT = Path(__file__).parent / "results" / "binpack.json"


def _lognormal(median: float, sigma: float) -> Callable[[random.Random], int]:
    return lambda rng: max(1, round(rng.lognormvariate(math.log(median), sigma)))


# name -> (capacity, size sampler, description, known optimum of n items or None)
DISTRIBUTIONS: dict[str, tuple[int, Callable[[random.Random], int], str, Callable[[int], int] | None]] = {
    "uniform": (2048, lambda rng: rng.randint(1, 2048), "sizes uniform in [1, C], C = 2,048", None),
    "pages": (
        23_552,
        _lognormal(1200, 1.0),
        "web pages: lognormal tokens (median 1,200, sigma 1), C = 23,552 (MARS System 1 prompt)",
        None,
    ),
    "snippets": (
        2048,
        _lognormal(300, 1.0),
        "documents: lognormal tokens (median 300, sigma 1), C = 2,048 (library default)",
        None,
    ),
    "small": (2048, lambda rng: rng.randint(1, 256), "small items uniform in [1, C/8], C = 2,048", None),
    "thirds": (
        2048,
        lambda rng: rng.randint(683, 1024),
        "sizes uniform in (C/3, C/2], C = 2,048: two per bin at best",
        lambda n: -(-n // 2),
    ),
}


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def run(items: int = 10_000, seeds: int = 5, repeats: int = 7) -> dict[str, Any]:
    """Run every distribution over ``seeds`` instances; returns the results written as JSON."""
    out: dict[str, Any] = {}
    for name, (capacity, sample, description, optimum) in DISTRIBUTIONS.items():
        fast_ms, naive_ms, ratios, bins, bounds, truncated, optimal = [], [], [], [], [], [], []
        for seed in range(seeds):
            rng = random.Random(f"binpack:{name}:{seed}")
            sizes = [sample(rng) for _ in range(items)]
            ms, packing = _median_ms(
                lambda sizes=sizes, capacity=capacity: ffd_pack(sizes, capacity), repeats
            )
            t0 = time.perf_counter()
            reference = ffd_pack_naive(sizes, capacity)
            naive_ms.append((time.perf_counter() - t0) * 1000)
            if reference.bins != packing.bins:
                raise SystemExit(f"{name} seed {seed}: ffd_pack and ffd_pack_naive disagree")
            fast_ms.append(ms)
            bins.append(len(packing))
            bounds.append(packing.lower_bound)
            ratios.append(len(packing) / packing.lower_bound)
            truncated.append(len(packing.truncated))
            if optimum is not None:
                optimal.append(len(packing) / optimum(items))
        out[name] = {
            "description": description,
            "capacity": capacity,
            "ffd_ms": round(statistics.median(fast_ms), 3),
            "ffd_ms_max": round(max(fast_ms), 3),
            "naive_ms": round(statistics.median(naive_ms), 1),
            "speedup": round(statistics.median(naive_ms) / statistics.median(fast_ms), 1),
            "bins": round(statistics.mean(bins), 1),
            "lower_bound": round(statistics.mean(bounds), 1),
            "ratio_mean": round(statistics.mean(ratios), 4),
            "ratio_max": round(max(ratios), 4),
            "truncated": round(statistics.mean(truncated), 1),
            "ratio_to_optimum": round(max(optimal), 4) if optimal else None,
            "identical_to_naive": True,
        }
    return {
        "benchmark": "binpack",
        "items": items,
        "seeds": seeds,
        "repeats": repeats,
        "distributions": out,
        "machine": machine(),
        "when": now(),
    }


def table(results: dict[str, Any]) -> str:
    """The results as a small plain-text table."""
    lines = [
        f"First-Fit-Decreasing, {results['items']:,} items, {results['seeds']} instance(s) per distribution",
        f"  {'distribution':<10} {'ffd ms':>8} {'naive ms':>9} {'speedup':>8} {'bins':>8} {'bound':>8} "
        f"{'bins/bound':>11} {'max':>7} {'vs opt':>7}",
    ]
    for name, r in results["distributions"].items():
        opt = f"{r['ratio_to_optimum']:.3f}" if r["ratio_to_optimum"] is not None else "-"
        lines.append(
            f"  {name:<10} {r['ffd_ms']:>8.2f} {r['naive_ms']:>9.0f} {r['speedup']:>7.0f}x {r['bins']:>8.0f} "
            f"{r['lower_bound']:>8.0f} {r['ratio_mean']:>11.4f} {r['ratio_max']:>7.4f} {opt:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 instance per distribution instead of 5")
    parser.add_argument("--items", type=int, default=10_000, help="items per instance")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON results path (default {DEFAULT_OUT} in full mode)"
    )
    args = parser.parse_args(argv)
    results = run(args.items, seeds=1 if args.quick else 5, repeats=3 if args.quick else 7)
    results["mode"] = "quick" if args.quick else "full"
    out = args.out or (None if args.quick else DEFAULT_OUT)
    print(table(results))
    if out is not None:
        write_json(out, results)
        print(f"results written to {out}")
    return results


if __name__ == "__main__":
    main()

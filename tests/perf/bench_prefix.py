"""Shared-prefix prefill: a few-shot topology's rollout on the hf backend with the prefix its prompts share
prefilled once, against every prompt prefilled whole.

    python -m tests.perf.bench_prefix --quick      # tiny model, 8 problems (CI)
    python -m tests.perf.bench_prefix              # SmolLM2-135M, 16 problems, the README's figure

``marsrl_cpu``'s checker and Verifier prompts repeat a few-shot transcript (about 230 tokens) before a
problem and a solution of their own (20 to 50 tokens). The same greedy rollout of N problems runs twice on
one backend, side by side and interleaved: once as the backend decodes (``hf_decode.SHARED_PREFIX_MIN``:
the prefix all of a batch's prompts share is run once, its cache copied to each prompt), once with every
prompt prefilled whole. Greedy decoding gives both the same work; the completions are compared. The ratio
is shared time / whole time (below 1: the shared prefix saves).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import workbench as wb
from tests.perf.runner import machine, now, write_json
from workbench.backends import hf_decode
from workbench.backends.hf import HFBackend
from workbench.topology.spec import with_sampling

DEFAULT_OUT = Path(__file__).parent / "results" / "prefix.json"
TOPOLOGY = "marsrl_cpu"


def measure(backend: HFBackend, n_tasks: int, repeats: int, runs_dir: Path) -> dict[str, Any]:
    topology = with_sampling(wb.load_topology(TOPOLOGY), temperature=0.0)
    tasks = wb.generate_tasks("arithmetic", n=n_tasks, seed=0, level=1, format="plain")
    settings = {"shared": hf_decode.SHARED_PREFIX_MIN, "whole": 10**9}
    times: dict[str, list[float]] = {name: [] for name in settings}
    completions: dict[str, list] = {}
    prompt_tokens = 0
    try:
        for _ in range(repeats + 1):  # the first round warms up both
            for name, shortest in settings.items():
                hf_decode.SHARED_PREFIX_MIN = shortest
                started = time.perf_counter()
                result = wb.rollout(topology, tasks, backend=backend, runs_dir=runs_dir)
                times[name].append(time.perf_counter() - started)
                completions[name] = [c.completion_ids for e in result.episodes for c in e.calls]
                prompt_tokens = sum(len(c.prompt_ids) for e in result.episodes for c in e.calls)
    finally:
        hf_decode.SHARED_PREFIX_MIN = settings["shared"]
    shared_s, whole_s = min(times["shared"][1:]), min(times["whole"][1:])
    same = sum(a == b for a, b in zip(completions["shared"], completions["whole"], strict=True))
    return {
        "tasks": n_tasks,
        "calls": len(completions["shared"]),
        "prompt_tokens": prompt_tokens,
        "same_completions": round(same / len(completions["shared"]), 3),
        "shared_s": round(shared_s, 3),
        "whole_s": round(whole_s, 3),
        "ratio": round(shared_s / whole_s, 3),
        "times": {k: [round(t, 3) for t in v[1:]] for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 problems, one timed round")
    parser.add_argument("--model", default=None)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    model = args.model or ("tiny" if args.quick else "smollm2-135m")
    n_tasks = args.tasks or (8 if args.quick else 16)
    repeats = args.repeats or (1 if args.quick else 2)
    backend = HFBackend(model)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-prefix-") as runs_dir:
            result = measure(backend, n_tasks, repeats, Path(runs_dir))
    finally:
        backend.close()
    report = {
        "benchmark": "prefix",
        "mode": "quick" if args.quick else "full",
        "model": model,
        "topology": TOPOLOGY,
        **result,
        "machine": machine(),
        "when": now(),
    }
    write_json(args.out, report)
    print(
        f"{n_tasks} {TOPOLOGY} episodes, greedy: shared prefix {result['shared_s']:.2f} s, whole prompts "
        f"{result['whole_s']:.2f} s, ratio {result['ratio']:.2f}; same completions {result['same_completions']:.0%}"
    )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()

"""Dashboard query benchmark: each server-side query of the trajectory views on a run with 100k calls.

    python -m tests.perf.bench_dashboard_queries --quick   # 20k calls
    python -m tests.perf.bench_dashboard_queries           # 100k calls: the README's figures (target: < 500 ms)

The run has steps of 100 episodes of 10 calls (a parent and nine children, 32-token completions with
logprobs and masks). Every query of ``widgets.run_queries`` is timed on the last step: the steps list,
the first and the last page of episodes, pages filtered by role, by reward, by format failure and by
a text search, one episode's call tree, and one call's tokens. Median and max of repeated runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.perf.runner import machine, now, write_json
from widgets import run_queries as q
from workbench.store import RunReader, RunStore

DEFAULT_OUT = Path(__file__).parent / "results" / "dashboard_queries.json"
EPISODES, CALLS = 100, 10


def write_run(root: Path, n_calls: int) -> Path:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 49_000, 32).astype(np.int32)
    with RunStore.create(root, config={"kind": "train", "model": ""}) as store:
        for s in range(n_calls // (EPISODES * CALLS)):
            with store.step(s) as step:
                for e in range(EPISODES):
                    episode = step.add_episode(task_id=f"s{s}e{e}", reward=float(e % 5) / 4)
                    parent = step.add_call(episode_id=episode, role="solver", completion_ids=ids, mask=[1] * 32,
                                           logprobs=-rng.random(32), completion_text=f"solution {s}-{e}")  # fmt: skip
                    step.add_calls([
                        {"episode_id": episode, "role": "verifier" if c % 2 else "corrector", "parent_id": parent,
                         "completion_ids": ids, "mask": [1] * 32, "logprobs": -rng.random(32),
                         "completion_text": f"verdict {c}", "format_error": "no verdict" if (e + c) % 17 == 0 else None}
                        for c in range(CALLS - 1)
                    ])  # fmt: skip
        return store.run_dir


def timed(fn: Callable[[], object], repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": statistics.median(times), "max_ms": max(times)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n_calls = 20_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        run_dir = write_run(Path(tmp), n_calls)
        write_s = time.perf_counter() - started
        reader = RunReader(run_dir)
        last = int(q.steps(reader)["step"].max())
        episode = int(q.episodes_page(reader, last, size=1)[0]["id"][0])
        call = int(q.call_tree(reader, episode)["id"][0])
        queries = {
            "steps list": lambda: q.steps(reader),
            "episodes, first page": lambda: q.episodes_page(reader, last, 0),
            "episodes, last page": lambda: q.episodes_page(reader, last, 1, size=50),
            "episodes with a corrector call": lambda: q.episodes_page(reader, last, where=q.EpisodeFilter(role="corrector")),
            "episodes rewarded >= 0.5": lambda: q.episodes_page(reader, last, where=q.EpisodeFilter(min_reward=0.5)),
            "episodes with a format failure": lambda: q.episodes_page(reader, last, where=q.EpisodeFilter(format_failures=True)),
            "episodes, text search": lambda: q.episodes_page(reader, last, where=q.EpisodeFilter(search="solution 3-7")),
            "call tree of an episode": lambda: q.call_tree(reader, episode),
            "tokens of a call": lambda: q.call_tokens(reader, call),
        }  # fmt: skip
        results = {name: timed(fn, args.repeats) for name, fn in queries.items()}
        reader.close()
    figures = {"mode": "quick" if args.quick else "full", "calls": n_calls, "write_s": write_s,
               "queries": results, "machine": machine(), "finished": now()}  # fmt: skip
    write_json(args.out, figures)
    print(f"{'query':40s} {'median ms':>10s} {'max ms':>10s}   ({n_calls} calls)")
    for name, r in results.items():
        print(f"{name:40s} {r['median_ms']:10.1f} {r['max_ms']:10.1f}")
    print(f"written to {args.out}")
    return figures


if __name__ == "__main__":
    main()

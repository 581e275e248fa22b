"""Dashboard query benchmark: every server-side query of the trajectory browser on runs of 100k calls.

    python -m tests.perf.bench_dashboard_queries --quick   # 20k calls a run, about a minute on 2 cores
    python -m tests.perf.bench_dashboard_queries           # 100k calls a run (the issue's target: < 500 ms)

Two runs of the same calls, shaped as the two kinds of run the workbench writes: a training run
(100 steps of 100 episodes; in quick mode 20 steps) and a rollout (one step holding every episode).
An episode is a tree of 10 calls (a solver; three verifiers under it, each with a tool call under it;
two correctors under the solver; a summariser at the top level), each with a 64-token prompt and
prompt text of about 400 characters, a 32-token completion with logprobs, mask and per-token
advantages, and about 100 characters of completion text; every 17th verifier fails its format.
Calls are written with ``RunStore`` in batches (``add_calls``, one flush per 100 episodes).

Each query of ``workbench.store.queries`` (and the token view's HTML) is then timed on the run's last step:
the steps and roles lists, the first and the last page of episodes, a page filtered by role, by reward
range and by format failure, a text search that matches one episode and one that matches none (the
worst case: every call's text of the step is read), the same without a step (all steps), one episode's
call tree and one call's tokens. Reported per query: the first run, the median and the max of
``--repeats`` runs, in milliseconds. Timings are reported, not asserted (tests/perf/test_*_bench.py
only checks that they are produced).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.perf.runner import machine, now, write_json
from widgets.token_text import call_tokens
from widgets.token_view import tokens_html
from workbench.store import RunReader, RunStore
from workbench.store import queries as q

DEFAULT_OUT = Path(__file__).parent / "results" / "dashboard_queries.json"
CALLS_PER_EPISODE = 10
EPISODES_PER_STEP = 100
TARGET_MS = 500.0
WORDS = ("the", "solver", "reads", "a", "question", "writes", "its", "reasoning", "before", "answer")


def _episode_calls(episode: int, tag: str, rng: np.random.Generator, arrays: dict[str, Any]) -> list[dict]:
    """The 10 calls of one episode; ``parent`` indexes into the list (resolved to ids when written)."""
    prompt = " ".join(rng.choice(WORDS, 70)) + f" [{tag}]"
    shapes = [
        ("solver", None), ("verifier", 0), ("tool", 1), ("verifier", 0), ("tool", 3),
        ("verifier", 0), ("tool", 5), ("corrector", 0), ("corrector", 0), ("summariser", None),
    ]  # fmt: skip
    calls = []
    for c, (role, parent) in enumerate(shapes):
        calls.append(
            {
                "episode_id": episode,
                "role": role,
                "parent": parent,
                "policy": "base",
                **arrays,
                "prompt_text": prompt,
                "completion_text": f"{role} {tag}-{c}: " + " ".join(rng.choice(WORDS, 14)),
                "rewards": {"answer": float(c % 2)},
                "advantage": 0.5 - (c % 2),
                "format_error": "no verdict" if role == "verifier" and (episode + c) % 17 == 0 else None,
                "tool_calls": [{"name": "search", "arguments": {"query": tag}}]
                if role == "verifier"
                else None,
            }
        )
    return calls


def write_run(runs_dir: Path, n_calls: int, steps: int, run_id: str, model: str) -> Path:
    """Write ``n_calls`` calls in ``steps`` steps; returns the run directory."""
    rng = np.random.default_rng(0)
    arrays = {
        "prompt_ids": rng.integers(0, 49_000, 64).astype(np.int32),
        "completion_ids": rng.integers(0, 49_000, 32).astype(np.int32),
        "logprobs": -rng.random(32).astype(np.float32) * 3,
        "mask": rng.integers(0, 4, 32).astype(np.uint8),
        "token_advantages": rng.standard_normal(32).astype(np.float32),
    }
    episodes_per_step = n_calls // CALLS_PER_EPISODE // steps
    with RunStore.create(runs_dir, config={"kind": "bench", "model": model}, run_id=run_id) as store:
        for s in range(steps):
            with store.step(s, policy_version=s) as step:
                for first in range(0, episodes_per_step, 100):
                    batch = []
                    for e in range(first, min(first + 100, episodes_per_step)):
                        episode = step.add_episode(
                            task_id=f"s{s}e{e}", group_key=f"g{e // 8}", reward=(e % 5) / 4
                        )
                        calls = _episode_calls(episode, f"s{s}e{e}", rng, arrays)
                        ids = [step.new_call_id() for _ in calls]
                        for call_id, call in zip(ids, calls, strict=True):
                            parent = call.pop("parent")
                            call.update(call_id=call_id, parent_id=None if parent is None else ids[parent])
                        batch += calls
                    step.add_calls(batch)
                    step.flush()
        return store.run_dir


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return {"first_ms": times[0], "median_ms": statistics.median(times[1:]), "max_ms": max(times[1:])}


def queries(reader: RunReader) -> dict[str, Callable[[], object]]:
    """The dashboard's queries on the run's last step, by name."""
    last = int(q.step_list(reader)["step"].iloc[-1])
    first_page = q.episodes_page(reader, last)
    last_page = first_page.pages - 1
    episode = int(first_page.rows["id"].iloc[7])
    tag = str(first_page.rows["task_id"].iloc[7])
    call = q.call_tree(reader, episode)[0].id
    tokens = call_tokens(reader, call)
    F = q.EpisodeFilter  # noqa: N806 - a short alias keeps the table below readable
    return {
        "steps list": lambda: q.step_list(reader),
        "roles list": lambda: q.role_list(reader),
        "episodes: first page": lambda: q.episodes_page(reader, last, 0),
        "episodes: last page": lambda: q.episodes_page(reader, last, last_page),
        "episodes: role filter": lambda: q.episodes_page(reader, last, where=F(role="corrector")),
        "episodes: reward range": lambda: q.episodes_page(
            reader, last, where=F(min_reward=0.25, max_reward=0.75)
        ),
        "episodes: format failures": lambda: q.episodes_page(reader, last, where=F(format_failures=True)),
        "episodes: search, one match": lambda: q.episodes_page(reader, last, where=F(search=f"[{tag}]")),
        "episodes: search, no match": lambda: q.episodes_page(reader, last, where=F(search="no such text")),
        "episodes: role + format + search": lambda: q.episodes_page(
            reader, last, where=F(role="verifier", format_failures=True, search="reads")
        ),
        "all steps: first page": lambda: q.episodes_page(reader, None, 0),
        "all steps: search, no match": lambda: q.episodes_page(reader, None, where=F(search="no such text")),
        "call tree of an episode": lambda: q.call_tree(reader, episode),
        "tokens of a call": lambda: call_tokens(reader, call),
        "token view HTML of a call": lambda: tokens_html(tokens, "advantage"),
    }


def measure(run_dir: Path, repeats: int) -> dict[str, dict[str, float]]:
    with RunReader(run_dir) as reader:
        return {name: timed(fn, repeats) for name, fn in queries(reader).items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k calls a run instead of 100k")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each query (after a first one)")
    parser.add_argument("--model", default="", help="tokenizer of the runs' config ('' shows token ids)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the temporary runs")
    args = parser.parse_args(argv)
    n_calls = 20_000 if args.quick else 100_000
    shapes = {
        "training": n_calls // (EPISODES_PER_STEP * CALLS_PER_EPISODE),  # steps of 100 episodes
        "rollout": 1,  # every episode in one step
    }
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_dashboard_", dir=args.workdir) as tmp:
        for shape, steps in shapes.items():
            started = time.perf_counter()
            run_dir = write_run(Path(tmp), n_calls, steps, shape, args.model)
            written = time.perf_counter() - started
            runs[shape] = {
                "steps": steps,
                "episodes_per_step": n_calls // CALLS_PER_EPISODE // steps,
                "write_s": written,
                "db_mb": (run_dir / "run.db").stat().st_size / 2**20,
                "queries": measure(run_dir, args.repeats),
            }
    slowest = max(r["max_ms"] for run in runs.values() for r in run["queries"].values())
    figures = {
        "benchmark": "dashboard_queries",
        "mode": "quick" if args.quick else "full",
        "calls": n_calls,
        "calls_per_episode": CALLS_PER_EPISODE,
        "repeats": args.repeats,
        "target_ms": TARGET_MS,
        "slowest_ms": slowest,
        "runs": runs,
        "machine": machine(),
        "finished": now(),
    }
    write_json(args.out, figures)
    print(table(figures))
    print(f"written to {args.out}")
    return figures


def table(figures: dict) -> str:
    lines = []
    for shape, run in figures["runs"].items():
        lines.append(
            f"\n{shape} run: {figures['calls']:,} calls, {run['steps']} step(s) of {run['episodes_per_step']:,} "
            f"episodes, written in {run['write_s']:.1f} s ({run['db_mb']:.0f} MiB)"
        )
        lines.append(f"{'query (on the last step)':36s} {'first ms':>9s} {'median ms':>10s} {'max ms':>8s}")
        for name, r in run["queries"].items():
            lines.append(f"{name:36s} {r['first_ms']:9.1f} {r['median_ms']:10.1f} {r['max_ms']:8.1f}")
    verdict = "within" if figures["slowest_ms"] < figures["target_ms"] else "OVER"
    lines.append(
        f"\nslowest: {figures['slowest_ms']:.1f} ms ({verdict} the {figures['target_ms']:.0f} ms target)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Run-store benchmark: ingest rate against raw sqlite3, and the query times a dashboard needs.

    python -m tests.perf.bench_store --quick      # 20k calls, well under a minute on 2 cores
    python -m tests.perf.bench_store              # 100k calls, the figures for the README

Ingest writes calls with 256-token prompt and completion arrays (plus logprobs and ownership
masks), in batches committed with `step.flush()`, through `RunStore`; the baseline inserts the same
rows, already encoded to BLOBs, with plain `sqlite3.executemany` into the same schema in the same
process, so `overhead` is what the store's Python layer costs on top of SQLite. Queries then run
through `RunReader` on the run just written. Results go to a JSON file and a printed table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.perf.runner import machine, write_json
from workbench.store import RunReader, RunStore
from workbench.store.schema import migrate

ROLES = ("planner", "solver", "verifier", "corrector")
DEFAULT_OUT = Path(__file__).parent / "results" / "store.json"


def _pool(n: int, prompt_len: int, completion_len: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """A few distinct token arrays, reused cyclically so that random generation is not timed."""
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt_ids": rng.integers(0, 150_000, prompt_len, dtype=np.int32),
            "completion_ids": rng.integers(0, 150_000, completion_len, dtype=np.int32),
            "logprobs": -rng.random(completion_len, dtype=np.float32) * 5,
            "mask": rng.integers(0, 4, completion_len).astype(np.uint8),
        }
        for _ in range(n)
    ]


def _calls_of_step(step: int, episodes: list[int], per_step: int, pool: list[dict]) -> list[dict[str, Any]]:
    calls = []
    for i in range(per_step):
        arrays = pool[(step * per_step + i) % len(pool)]
        calls.append(
            {
                "episode_id": episodes[i // len(ROLES)],
                "role": ROLES[i % len(ROLES)],
                "policy": "base",
                **arrays,
                "rewards": {"correct": float(i % 2), "format": 1.0},
                "advantage": 0.5 - (i % 2),
                "timings": {"queued": 0.0, "started": 0.1, "finished": 0.9, "tokens_per_s": 300.0},
            }
        )
    return calls


def ingest_store(
    runs_dir: Path, n_calls: int, per_step: int, batch: int, pool: list[dict]
) -> tuple[float, Path]:
    """Write `n_calls` calls through RunStore; returns (seconds spent in store calls, run directory)."""
    store = RunStore.create(runs_dir, {"benchmark": "store"}, run_id="bench")
    spent = 0.0
    for step_index in range(n_calls // per_step):
        t0 = time.perf_counter()
        with store.step(step_index, policy_version=step_index) as step:
            episodes = [
                step.add_episode(task_id=f"t{e}", group_key=f"g{e // 8}")
                for e in range(per_step // len(ROLES))
            ]
            spent += time.perf_counter() - t0
            calls = _calls_of_step(step_index, episodes, per_step, pool)  # building inputs is not timed
            t0 = time.perf_counter()
            for start in range(0, per_step, batch):
                step.add_calls(calls[start : start + batch])
                step.flush()
            for role in ROLES:
                step.log_metrics({"reward_mean": 0.5, "kl": 0.01, "entropy": 1.2, "length": 256.0}, role=role)
        spent += time.perf_counter() - t0
    store.set_status("finished")
    store.close()
    return spent, store.run_dir


# The plain-sqlite3 baseline writes its own INSERT: the calls table's columns in the order its rows list them.
RAW_CALL_COLUMNS = (
    "id", "step", "episode_id", "parent_id", "role", "policy", "position", "policy_version", "n_prompt",
    "n_completion", "advantage", "rewards", "timings", "format_error", "action", "tool_calls", "tool_results",
    "prompt_text", "completion_text", "prompt_ids", "completion_ids", "logprobs", "mask", "token_advantages",
    "source_id",
)  # fmt: skip
RAW_INSERT = (
    f"INSERT INTO calls ({', '.join(RAW_CALL_COLUMNS)}) VALUES ({', '.join('?' * len(RAW_CALL_COLUMNS))})"
)


def ingest_raw(db: Path, n_calls: int, per_step: int, batch: int, pool: list[dict]) -> float:
    """The same rows, pre-encoded, through plain sqlite3 executemany; returns seconds spent inserting."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn, db, fresh=True)
    blobs = [{k: v.tobytes() for k, v in arrays.items()} for arrays in pool]
    spent = 0.0
    call_id = episode_id = 0
    for step in range(n_calls // per_step):
        rows = []
        first_episode = episode_id + 1
        for i in range(per_step):
            call_id += 1
            b = blobs[(step * per_step + i) % len(blobs)]
            rows.append(
                (call_id, step, first_episode + i // len(ROLES), None, ROLES[i % len(ROLES)], "base", i // len(ROLES), step,
                 256, 256, 0.5 - (i % 2), json.dumps({"correct": float(i % 2), "format": 1.0}),
                 json.dumps({"queued": 0.0, "started": 0.1, "finished": 0.9, "tokens_per_s": 300.0}),
                 None, None, None, None, None, None, b["prompt_ids"], b["completion_ids"], b["logprobs"], b["mask"], None, None)
            )  # fmt: skip
        t0 = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT INTO steps VALUES (?, 'running', ?, NULL, ?)", (step, time.time(), step))
        conn.execute("COMMIT")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO episodes (id, step, task_id, group_key, status) VALUES (?, ?, ?, ?, 'running')",
            [(first_episode + e, step, f"t{e}", f"g{e // 8}") for e in range(per_step // len(ROLES))],
        )
        episode_id += per_step // len(ROLES)
        for start in range(0, per_step, batch):
            conn.executemany(RAW_INSERT, rows[start : start + batch])
            conn.execute("COMMIT")
            conn.execute("BEGIN")
        conn.execute(
            "UPDATE steps SET status = 'complete', finished_at = ? WHERE step = ?", (time.time(), step)
        )
        conn.execute("COMMIT")
        spent += time.perf_counter() - t0
    conn.close()
    return spent


def _time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time in milliseconds over `repeats` runs, and the last result."""
    times = []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def queries(run_dir: Path, n_calls: int, per_step: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Time the dashboard's queries on the written run; returns {name: {ms, rows}}."""
    reader = RunReader(run_dir)
    mid_step = (n_calls // per_step) // 2
    per_role = n_calls // len(ROLES)
    cases = {
        "open reader": lambda: RunReader(run_dir).close(),
        f"calls of one step ({per_step} rows, arrays decoded)": lambda: reader.calls(step=mid_step),
        "calls of one step, no arrays": lambda: reader.calls(
            step=mid_step, columns=["step", "episode_id", "role", "advantage", "rewards"]
        ),
        "calls by role, page 1 (50 rows)": lambda: reader.calls(role="solver", limit=50),
        "calls by role, middle page (50 rows)": lambda: reader.calls(
            role="solver", limit=50, offset=per_role // 2
        ),
        "calls of one episode": lambda: reader.calls(episode=per_step // len(ROLES) * mid_step + 1),
        "metrics of one role": lambda: reader.metrics(role="solver"),
        "metrics wide (all roles)": lambda: reader.metrics_wide(),
        "count of calls per role": lambda: reader.call_counts("role"),
        "steps table": lambda: reader.steps(),
    }
    out = {}
    for name, fn in cases.items():
        ms, result = _time(fn, repeats)
        out[name] = {"ms": round(ms, 3), "rows": None if result is None else len(result)}
    reader.close()
    return out


def run(
    n_calls: int, per_step: int = 1000, batch: int = 250, repeats: int = 5, workdir: Path | None = None
) -> dict:
    """Run the whole benchmark and return the results (also what is written as JSON)."""
    if n_calls % per_step:
        raise SystemExit(f"--calls must be a multiple of the {per_step} calls per step")
    tmp = Path(tempfile.mkdtemp(prefix="bench_store_", dir=workdir))
    try:
        pool = _pool(64, 256, 256)
        raw_s = ingest_raw(tmp / "raw.db", n_calls, per_step, batch, pool)
        store_s, run_dir = ingest_store(tmp / "runs", n_calls, per_step, batch, pool)
        db_bytes = (run_dir / "run.db").stat().st_size
        query_times = queries(run_dir, n_calls, per_step, repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "store",
        "calls": n_calls,
        "calls_per_step": per_step,
        "flush_every": batch,
        "prompt_tokens": 256,
        "completion_tokens": 256,
        "ingest": {
            "store_s": round(store_s, 3),
            "raw_sqlite_s": round(raw_s, 3),
            "store_calls_per_s": round(n_calls / store_s),
            "raw_sqlite_calls_per_s": round(n_calls / raw_s),
            "overhead_ratio": round(store_s / raw_s, 3),
            "db_mb": round(db_bytes / 2**20, 1),
        },
        "queries": query_times,
        "machine": machine(sqlite=sqlite3.sqlite_version),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def table(results: dict) -> str:
    """The results as a small plain-text table."""
    ing = results["ingest"]
    lines = [
        f"run store, {results['calls']} calls of 256+256 tokens, flush every {results['flush_every']} calls",
        f"  {'ingest, RunStore':<48} {ing['store_calls_per_s']:>10,} calls/s",
        f"  {'ingest, raw sqlite3 executemany':<48} {ing['raw_sqlite_calls_per_s']:>10,} calls/s",
        f"  {'store overhead (store time / raw time)':<48} {ing['overhead_ratio']:>10.2f} x",
        f"  {'database size':<48} {ing['db_mb']:>10.1f} MB",
    ]
    for name, q in results["queries"].items():
        lines.append(f"  {name:<48} {q['ms']:>10.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k calls instead of 100k")
    parser.add_argument("--calls", type=int, default=None, help="number of calls (multiple of 1000)")
    parser.add_argument("--flush-every", type=int, default=250, help="calls per flush")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"JSON results path (default {DEFAULT_OUT})"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the temporary databases")
    args = parser.parse_args(argv)
    n_calls = args.calls or (20_000 if args.quick else 100_000)
    results = run(n_calls, batch=args.flush_every, workdir=args.workdir)
    results["mode"] = "quick" if args.quick else "full"
    write_json(args.out, results)
    print(table(results))
    print(f"results written to {args.out}")
    return results


if __name__ == "__main__":
    main()

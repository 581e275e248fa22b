"""Runs the run-store benchmark (`python -m tests.perf.bench_store --quick`) as users run it."""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_store_quick(tmp_path):
    out = tmp_path / "store.json"
    result = run_bench("bench_store", "--quick", "--out", str(out), "--workdir", str(tmp_path), timeout=300)
    figures = json.loads(out.read_text())
    ingest = figures["ingest"]
    assert figures["mode"] == "quick" and figures["calls"] == 20_000
    assert ingest["store_calls_per_s"] > 0 and ingest["raw_sqlite_calls_per_s"] > 0
    # The store encodes and validates every array in Python; it must stay within a small factor of SQLite.
    assert ingest["overhead_ratio"] < 5, ingest
    queries = figures["queries"]
    assert queries["calls of one step (1000 rows, arrays decoded)"]["rows"] == 1000
    assert queries["calls by role, page 1 (50 rows)"]["rows"] == 50
    assert queries["calls by role, middle page (50 rows)"]["rows"] == 50
    assert queries["count of calls per role"]["rows"] == 4
    assert queries["metrics of one role"]["rows"] == 4 * 20
    assert all(q["ms"] > 0 for q in queries.values())
    assert "calls/s" in result.stdout and str(out) in result.stdout
    assert list(tmp_path.iterdir()) == [out]  # the benchmark's databases were removed

"""Runs the dashboard query benchmark (`python -m tests.perf.bench_dashboard_queries --quick`) as users run it."""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_dashboard_queries_quick(tmp_path):
    out = tmp_path / "dashboard_queries.json"
    result = run_bench("bench_dashboard_queries", "--quick", "--repeats", "3", "--out", str(out), timeout=300)
    figures = json.loads(out.read_text())
    assert figures["calls"] == 20_000 and len(figures["queries"]) == 9
    assert all(r["median_ms"] > 0 and r["max_ms"] >= r["median_ms"] for r in figures["queries"].values())
    assert "tokens of a call" in result.stdout

"""Runs the dashboard query benchmark (`python -m tests.perf.bench_dashboard_queries --quick`) as users run it.

The timings are reported, not asserted: the < 500 ms target is read off the full run's figures.
"""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_dashboard_queries_quick(tmp_path):
    out = tmp_path / "dashboard_queries.json"
    args = ("--quick", "--repeats", "3", "--out", str(out), "--workdir", str(tmp_path))
    result = run_bench("bench_dashboard_queries", *args, timeout=300)
    figures = json.loads(out.read_text())
    assert (
        figures["benchmark"] == "dashboard_queries"
        and figures["mode"] == "quick"
        and figures["calls"] == 20_000
    )
    assert set(figures["runs"]) == {"training", "rollout"}
    assert (
        figures["runs"]["training"]["steps"] == 20 and figures["runs"]["rollout"]["episodes_per_step"] == 2000
    )
    for run in figures["runs"].values():
        assert len(run["queries"]) == 15
        for timing in run["queries"].values():
            assert 0 < timing["median_ms"] <= timing["max_ms"] and timing["first_ms"] > 0
    assert figures["slowest_ms"] == max(
        t["max_ms"] for r in figures["runs"].values() for t in r["queries"].values()
    )
    assert "tokens of a call" in result.stdout and "slowest:" in result.stdout
    assert list(tmp_path.iterdir()) == [out], "the benchmark's runs were removed"

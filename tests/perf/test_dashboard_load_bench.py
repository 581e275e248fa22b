"""Runs the dashboard load benchmark (`python -m tests.perf.bench_dashboard_load --quick`) as users run it."""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_dashboard_load_quick(tmp_path):
    out = tmp_path / "dashboard_load.json"
    run_bench("bench_dashboard_load", "--quick", "--out", str(out), timeout=300)
    figures = json.loads(out.read_text())
    assert figures["sessions_connected"] == figures["viewers"] == 5, figures["session_failures"]
    assert figures["session_failures"] == [] and figures["server_tracebacks"] == 0
    assert figures["calls_per_s_unwatched"] > 0 and figures["calls_per_s_watched"] > 0

"""Runs the engine-overhead benchmark in quick mode (tiny model, hf backend) as users run it."""

import json

import pytest

from tests.perf.runner import run_bench


@pytest.mark.perf
def test_bench_engine_quick(tmp_path):
    out = tmp_path / "engine.json"
    result = run_bench("bench_engine", "--quick", "--out", str(out))
    figures = json.loads(out.read_text())["backends"]["hf"]
    assert figures["same_token_counts"], "the baseline must do the same generation work"
    assert figures["engine_tokens"] == figures["raw_tokens"] > 0
    assert figures["calls"] >= 2 * figures["episodes"]  # a multi-role topology, not one call each
    assert "ratio" in result.stdout

"""Runs the engine-overhead benchmark in quick mode (tiny model, hf backend) as users run it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.perf
def test_bench_engine_quick(tmp_path):
    out = tmp_path / "engine.json"
    result = subprocess.run(
        [sys.executable, "-m", "tests.perf.bench_engine", "--quick", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())["backends"]["hf"]
    assert figures["same_token_counts"], "the baseline must do the same generation work"
    assert figures["engine_tokens"] == figures["raw_tokens"] > 0
    assert figures["calls"] >= 2 * figures["episodes"]  # a multi-role topology, not one call each
    assert "ratio" in result.stdout

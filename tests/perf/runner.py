"""Runs a benchmark module the way users run it (``python -m tests.perf.<name> ...``), for the pytest wrappers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``python -m tests.perf.<module> <args>`` from the repository root; fails the test on a non-zero exit."""
    result = subprocess.run(
        [sys.executable, "-m", f"tests.perf.{module}", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    return result

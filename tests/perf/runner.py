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


def machine(**extra: object) -> dict:
    """What a benchmark ran on (Python, CPUs, platform, plus ``extra``), for its JSON."""
    import platform

    return {
        "python": platform.python_version(),
        **extra,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def now() -> str:
    """The UTC time a benchmark finished, as its JSON records it."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json(path: Path, data: dict) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")

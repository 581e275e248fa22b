"""What every benchmark module shares: the repository root, the machine it ran on, the time, writing its JSON."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def machine(**extra: object) -> dict:
    """What a benchmark ran on (Python, CPUs, platform, plus ``extra``), for its JSON."""
    import platform
    import sys

    torch = sys.modules.get("torch")  # the GPU's name where a benchmark ran on one
    if torch is not None and torch.cuda.is_available():
        extra.setdefault("gpu", torch.cuda.get_device_name(0))
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

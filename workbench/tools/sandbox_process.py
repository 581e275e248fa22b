"""Process plumbing for the sandbox's child: capped pipe reads, killing its group, its report, who can reach it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any


def reachable_by_others(paths: list[str], directories: list[str]) -> bool:
    """Whether others (``nobody``) can reach each path (its parents searchable) and enter each directory."""
    needed = [p for raw in paths for p in Path(os.path.realpath(raw)).parents]
    needed += [
        p for raw in directories for p in (Path(os.path.realpath(raw)), *Path(os.path.realpath(raw)).parents)
    ]
    for directory in needed:
        try:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


async def drain_capped(stream: asyncio.StreamReader, cap: int, sink: bytearray) -> int:
    """Read ``stream`` to EOF keeping at most ``cap`` bytes in ``sink``; returns the total byte count."""
    total = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return total
        total += len(chunk)
        room = cap - len(sink)
        if room > 0:
            sink += chunk[:room]


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the process's whole group (it leads its own session), then the process itself."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def read_report(fd: int) -> dict[str, Any]:
    """The JSON the child wrote to the report pipe (what was in force); {} when it wrote none."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}

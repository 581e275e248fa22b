"""Is a run's writer still alive? The process that opens a run for writing leaves its identity in the store.

A run killed with ``kill -9`` cannot record its end, so its status stays ``running``. The writer's host,
pid and process start time (from ``/proc`` where there is one, so a reused pid is not mistaken for the
writer) let a reader on the same host tell that the writer is gone and show the run as ``interrupted``.
From another host the writer cannot be checked, and the stored status stands.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None where /proc cannot tell."""
    state = _stat(pid)
    return None if state is None else state[1]


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[19])  # state, starttime (fields 3 and 22 of proc(5))


def identity() -> dict[str, Any]:
    """This process as a writer: host, pid and start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_started": _start_time(pid)}


def writer_gone(writer: dict[str, Any] | None) -> bool:
    """True when ``writer`` (an ``identity()``) ran on this host and has ended; False when alive or unknown."""
    if not writer or writer.get("host") != socket.gethostname() or not isinstance(writer.get("pid"), int):
        return False
    pid = writer["pid"]
    if Path("/proc/self").is_dir():
        state = _stat(pid)
        if state is None or state[0] in ("Z", "X"):  # no such process, or one that has exited (a zombie)
            return True
        started = writer.get("pid_started")
        return started is not None and state[1] != started  # the pid now belongs to another process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False

"""What one sandbox run returns, and how its end is explained: the result record and the stop reasons."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SandboxResult:
    """One run: captured output, how it ended, and which containment layers were in force."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed: str | None  # "timeout", "cpu", "memory", "file_size", "signal SIGSEGV", ... or None
    seconds: float
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    network: str = "unknown"  # "namespace", "user+network namespace" or "guard only"
    user: str = "unknown"  # "nobody (uid 65534)" or "unchanged"
    guard: bool = False
    limits: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """What the agent sees: stdout, then stderr and a non-zero exit code when there are any."""
        out = self.stdout
        if self.stderr:
            out += ("" if not out or out.endswith("\n") else "\n") + "[stderr]\n" + self.stderr
        if self.exit_code not in (0, None) and self.killed is None:
            out += ("" if not out or out.endswith("\n") else "\n") + f"[exit code {self.exit_code}]"
        return out if out.strip() else "[no output]"


def why_killed(code: int | None, timed_out: bool, stderr: str) -> str | None:
    """Why a run was stopped (``timeout``, ``cpu``, ``memory``, ``file_size``, ``signal NAME``), or None."""
    if timed_out:
        return "timeout"
    if code is None or code == 0:
        return None
    if code < 0:
        number = -code
        if number == signal.SIGXCPU:
            return "cpu"
        if number == signal.SIGXFSZ:
            return "file_size"
        try:
            return f"signal {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return "memory"
    if last.startswith("OSError: [Errno 27]"):
        return "file_size"
    return None


STOP_REASONS = {
    "timeout": "killed after the {wall_seconds:g} s wall-clock limit",
    "cpu": "killed after the {cpu_seconds} s CPU limit",
    "memory": "ran out of memory (limit {memory_mb} MB)",
    "file_size": "wrote a file over the {file_size_mb} MB limit",
}


def stop_reason(result: SandboxResult) -> str:
    """A run stopped by a limit, in words (``killed after the 10 s wall-clock limit``)."""
    return STOP_REASONS.get(result.killed, "died from {killed}").format(killed=result.killed, **result.limits)

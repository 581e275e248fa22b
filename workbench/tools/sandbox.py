"""A Python sandbox for model-written code: a separate, limited, network-less process per run.

Each run gets:

- a fresh process (``python -I -u -B``: isolated mode ignores ``PYTHON*`` variables, the user site
  and the current directory) in its own session, so a wall-clock timeout kills its whole group;
- a fresh temporary working directory (also ``HOME`` and ``TMPDIR``), deleted afterwards;
- a minimal environment: nothing of the parent's environment is inherited (no API keys);
- resource limits set in the child before any user code runs: CPU seconds, address space, file
  size, open files, processes (``RLIMIT_NPROC``) and no core dumps;
- no network: a new network namespace when the kernel lets the process make one (root, or an
  unprivileged user namespace), and always an audit-hook guard (``sys.addaudithook``) that refuses
  sockets, process creation (``fork``, ``exec``, ``subprocess``, ``os.system``, ``posix_spawn``),
  native code through ``ctypes`` (loading libraries, looking up symbols, memory at an address; the
  module itself imports, as pandas and sympy need it), signals to other processes, resource-limit
  changes, writes outside the working directory and reads outside the Python installation and a
  few system directories;
- when started as root and the interpreter is readable by others, the child drops to ``nobody``.

stdout and stderr are read with a cap (the rest is drained and counted, never kept) and cut to
``output_limit`` characters. The result says why a run was stopped (``timeout``, ``cpu``, ``memory``,
``file_size`` or a signal).

What this cannot contain without privileges: audit hooks are not a security boundary (the Python
docs say so). Code written to defeat them can get past the guard, e.g. by writing to memory through
unaudited ``ctypes`` pointer indexing or ``memmove``, or numpy's ``as_strided``, both importable. The layers that hold regardless are the separate process, the
rlimits, the scrubbed environment and the kill of the process group; the network namespace and the
switch to ``nobody`` hold when the OS allows them (``SandboxResult.network`` and ``.user`` say what
was in force). Root ignores ``RLIMIT_NPROC``, so a root child without the user switch relies on the
guard to stop fork bombs. For hostile code use a container or VM (gVisor, nsjail, bubblewrap).

This module holds the parent side (:class:`PythonSandbox`, the ``python`` tool kind); the child's own
code is in :mod:`workbench.tools.sandbox_child`, the process plumbing in
:mod:`workbench.tools.sandbox_process` and the result record in :mod:`workbench.tools.sandbox_result`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any

from workbench.tools.base import Tool, ToolOptionError, ToolResult, truncate_text
from workbench.tools.sandbox_child import BOOTSTRAP
from workbench.tools.sandbox_process import drain_capped, kill_group, reachable_by_others, read_report
from workbench.tools.sandbox_result import SandboxResult, stop_reason, why_killed

NOBODY = 65534
_MB = 1024 * 1024


class SandboxError(ToolOptionError):
    """The sandbox was configured wrongly (bad limits, missing interpreter)."""


class PythonSandbox:
    """Runs Python source in a fresh limited process (see the module docstring for the layers).

    ``timeout`` is wall-clock seconds; ``cpu_seconds`` defaults to ``ceil(timeout) + 1`` (so the wall
    clock fires first for single-threaded code); ``memory_mb`` limits the address space;
    ``file_size_mb`` the size of any file written; ``open_files`` the open descriptors; ``max_processes`` sets ``RLIMIT_NPROC`` (0: a non-root child can start no process or
    thread; root ignores it). ``output_limit`` caps stdout and stderr in characters each.
    ``network_namespace``, ``guard`` and ``drop_privileges`` switch the layers (all on by default).
    ``read_paths`` adds directories the guard lets the code read; ``env`` adds environment variables.
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        cpu_seconds: int | None = None,
        memory_mb: int | None = 1024,
        file_size_mb: int | None = 16,
        open_files: int | None = 64,
        max_processes: int | None = 0,
        output_limit: int = 10_000,
        network_namespace: bool = True,
        guard: bool = True,
        drop_privileges: bool = True,
        echo_last_expression: bool = True,
        read_paths: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        python: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        max_concurrent: int | None = None,
    ):
        if timeout <= 0:
            raise SandboxError(f"sandbox timeout must be > 0 seconds, got {timeout}")
        for label, value in (
            ("memory_mb", memory_mb),
            ("file_size_mb", file_size_mb),
            ("open_files", open_files),
        ):
            if value is not None and value < 1:
                raise SandboxError(f"sandbox {label} must be >= 1 (or None for no limit), got {value}")
        if output_limit < 0:
            raise SandboxError(f"sandbox output_limit must be >= 0 characters, got {output_limit}")
        self.python = python or sys.executable
        if not os.access(self.python, os.X_OK):
            raise SandboxError(f"sandbox python {self.python!r} is not an executable; pass python=<path>")
        self.timeout = float(timeout)
        self.cpu_seconds = cpu_seconds if cpu_seconds is not None else int(-(-timeout // 1)) + 1
        self.memory_mb, self.file_size_mb, self.open_files = memory_mb, file_size_mb, open_files
        self.max_processes = max_processes
        self.output_limit = output_limit
        self.network_namespace, self.guard, self.echo = network_namespace, guard, echo_last_expression
        self.read_paths = [os.path.realpath(p) for p in read_paths]
        self.extra_env = dict(env or {})
        self.workdir = os.fspath(workdir) if workdir is not None else None
        self.max_concurrent = max_concurrent or max(2, os.cpu_count() or 2)
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.drop_to: tuple[int, int] | None = None
        if drop_privileges and os.geteuid() == 0:
            interpreter = [self.python]
            if self.python == sys.executable:
                interpreter += [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
            if reachable_by_others(interpreter, [self.workdir or tempfile.gettempdir()]):
                self.drop_to = (NOBODY, NOBODY)

    @property
    def limits(self) -> dict[str, Any]:
        return {
            "wall_seconds": self.timeout,
            "cpu_seconds": self.cpu_seconds,
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "open_files": self.open_files,
            "processes": self.max_processes,
        }

    def _env(self, home: str) -> dict[str, str]:
        threads = "1"
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": home,
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            **self.extra_env,
        }

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrent)
        return semaphore

    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` as ``__main__`` in a fresh sandbox; never raises for anything the code does."""
        async with self._semaphore():
            return await self._run(code)

    async def _run(self, code: str) -> SandboxResult:
        started = time.perf_counter()
        root = os.path.realpath(tempfile.mkdtemp(prefix="wb-sandbox-", dir=self.workdir))
        report_read, report_write = os.pipe()
        process = readers = None
        try:
            Path(root, "main.py").write_text(code, encoding="utf-8")
            if self.drop_to is not None:
                for path in (root, os.path.join(root, "main.py")):
                    os.chown(path, *self.drop_to)
            config = {
                "root": root,
                "network_namespace": self.network_namespace,
                "guard": self.guard,
                "echo": self.echo,
                "drop_to": self.drop_to,
                "read_paths": self.read_paths,
                "report_fd": report_write,
                "limits": {
                    "cpu": self.cpu_seconds,
                    "memory": None if self.memory_mb is None else self.memory_mb * _MB,
                    "file_size": None if self.file_size_mb is None else self.file_size_mb * _MB,
                    "open_files": self.open_files,
                    "processes": self.max_processes,
                },
            }
            process = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                "-u",
                "-B",
                "-X",
                "utf8",
                "-c",
                BOOTSTRAP,
                json.dumps(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=root,
                env=self._env(root),
                start_new_session=True,
                pass_fds=(report_write,),
            )
            os.close(report_write)
            report_write = -1
            cap = self.output_limit * 4 + 4  # UTF-8: at most 4 bytes a character
            out, err = bytearray(), bytearray()
            readers = asyncio.gather(
                drain_capped(process.stdout, cap, out), drain_capped(process.stderr, cap, err)
            )
            timed_out = False
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), self.timeout)
            except TimeoutError:
                timed_out = True
                kill_group(process)
                await process.wait()
            kill_group(process)  # anything left in its group (the guard normally stops children)
            try:
                out_bytes, err_bytes = await asyncio.wait_for(readers, 2.0)
            except TimeoutError:  # a descendant outside the group still holds a pipe
                readers.cancel()
                out_bytes, err_bytes = len(out), len(err)
            report = read_report(report_read)
            stdout, cut_out = truncate_text(out.decode("utf-8", "replace"), self.output_limit)
            stderr, cut_err = truncate_text(err.decode("utf-8", "replace"), self.output_limit)
            cut = cut_out or cut_err or out_bytes > len(out) or err_bytes > len(err)
            return SandboxResult(
                stdout=stdout,
                stderr=stderr,
                exit_code=process.returncode,
                timed_out=timed_out,
                killed=why_killed(process.returncode, timed_out, stderr),
                seconds=time.perf_counter() - started,
                truncated=cut,
                stdout_bytes=out_bytes,
                stderr_bytes=err_bytes,
                network=report.get("network", "unknown"),
                user=report.get("user", "unknown"),
                guard=bool(report.get("guard", False)),
                limits=self.limits,
            )
        finally:
            if process is not None and process.returncode is None:
                kill_group(process)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(process.wait(), 5.0)
            if readers is not None and not readers.done():
                readers.cancel()
            for fd in (report_read, report_write):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            shutil.rmtree(root, ignore_errors=True)


class PythonTool(Tool):
    """Tool kind ``python``: runs the ``code`` argument in a :class:`PythonSandbox`.

    The content is stdout, then ``[stderr]`` and the exit code when there are any (an exception in
    the code is output the model should read, so ``ok`` stays true). A run stopped by a limit is a
    tool error (``ok`` false) naming the limit. Options are :class:`PythonSandbox`'s.
    """

    description = "Run Python code in a sandbox and return what it prints (the last expression is echoed)."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source to run."}},
        "required": ["code"],
    }

    def __init__(self, name: str = "python", **options: Any):
        self.name = name
        self.sandbox = PythonSandbox(**options)

    async def __call__(self, **arguments: Any) -> ToolResult:
        result = await self.sandbox.run(arguments["code"])
        metadata = {k: v for k, v in asdict(result).items() if k not in ("seconds",)}
        if result.killed is not None:
            return ToolResult(
                ok=False,
                content=result.text(),
                error=f"{self.name}: {stop_reason(result)}",
                truncated=result.truncated,
                seconds=result.seconds,
                metadata=metadata,
            )
        return ToolResult(
            ok=True,
            content=result.text(),
            truncated=result.truncated,
            seconds=result.seconds,
            metadata=metadata,
        )

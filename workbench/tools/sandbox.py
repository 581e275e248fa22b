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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.tools.base import Tool, ToolOptionError, ToolResult, truncate_text

NOBODY = 65534
_MB = 1024 * 1024

# Runs in the child as ``python -I -u -B -c BOOTSTRAP <config json>``, before the user's code. Everything
# lives inside one function whose names are deleted before the user's code starts, and the guard takes
# the builtins it needs as default arguments (replacing builtins later does not change the guard).
BOOTSTRAP = r"""
def _sandbox_main():
    import json, os, resource, sys, sysconfig
    config = json.loads(sys.argv[1])
    report = {"network": "guard only", "user": "unchanged"}

    # 1. A network namespace with no interfaces up (needs root, or unprivileged user namespaces).
    if config["network_namespace"]:
        newnet, newuser = 0x40000000, 0x10000000
        unshare = getattr(os, "unshare", None)
        if unshare is None:
            try:
                import ctypes
                libc = ctypes.CDLL(None, use_errno=True)
                def unshare(flags):
                    if libc.unshare(flags) != 0:
                        raise OSError(ctypes.get_errno(), "unshare failed")
            except Exception:
                unshare = None
        for flags, label in ((newnet, "namespace"), (newuser | newnet, "user+network namespace")):
            if unshare is None:
                break
            try:
                unshare(flags)
                report["network"] = label
                break
            except OSError:
                continue
        unshare = libc = None

    # 2. Resource limits (soft = hard, so the code cannot raise them again).
    def limit(which, value, hard=None):
        if value is None:
            return
        _, old_hard = resource.getrlimit(which)
        hard = value if hard is None else hard
        if old_hard != resource.RLIM_INFINITY:
            hard, value = min(hard, old_hard), min(value, old_hard)
        resource.setrlimit(which, (value, hard))
    limits = config["limits"]
    limit(resource.RLIMIT_CPU, limits["cpu"], None if limits["cpu"] is None else limits["cpu"] + 1)
    limit(resource.RLIMIT_AS, limits["memory"])
    limit(resource.RLIMIT_FSIZE, limits["file_size"])
    limit(resource.RLIMIT_NOFILE, limits["open_files"])
    limit(resource.RLIMIT_NPROC, limits["processes"])
    limit(resource.RLIMIT_CORE, 0)

    # 3. Drop root privileges to nobody (the parent checked the interpreter is readable by others).
    drop = config["drop_to"]
    if drop is not None and os.geteuid() == 0 and report["network"] != "user+network namespace":
        os.setgroups([])
        os.setgid(drop[1])
        os.setuid(drop[0])
        report["user"] = "nobody (uid %d)" % drop[0]

    # 4. The guard.
    root = config["root"]
    if config["guard"]:
        import _posixsubprocess
        def _refuse_fork_exec(*args, **kwargs):
            raise PermissionError("sandbox: starting processes is not allowed")
        _posixsubprocess.fork_exec = _refuse_fork_exec  # direct calls bypass subprocess.Popen's audit event
        reads = {root, "/usr/lib", "/usr/lib64", "/usr/share", "/usr/local/lib", "/lib", "/lib64",
                 "/etc/localtime", "/etc/ssl", "/etc/mime.types", "/dev/null", "/dev/zero", "/dev/urandom"}
        for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
            reads.add(os.path.realpath(prefix))
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                reads.add(os.path.realpath(path))
        reads.update(config["read_paths"])
        writes = (root, "/dev/null")
        write_events = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.utime",
                        "os.truncate", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
                        "shutil.rmtree", "os.mkfifo", "os.mknod"}
        denied = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.startfile",
                  "subprocess.Popen", "os.link", "os.symlink", "resource.setrlimit", "resource.prlimit",
                  "gc.get_objects", "gc.get_referrers", "gc.get_referents", "webbrowser.open",
                  "urllib.Request", "http.client.connect", "os.chroot", "os.setns", "os.unshare"}
        denied_prefixes = ("socket.", "pty.", "_winapi.", "winreg.", "ftplib.", "smtplib.",
                           "poplib.", "imaplib.", "nntplib.", "telnetlib.")
        denied_imports = {"_posixsubprocess"}
        # ctypes may be imported (pandas and sympy do) but not load libraries, look up symbols,
        # call foreign functions by address or read memory at an address.
        denied_ctypes = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
                         "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.call_function"}
        write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        o_path = getattr(os, "O_PATH", 0)

        def guard(event, args, _reads=tuple(sorted(reads)), _writes=writes, _root=root,
                  _write_events=frozenset(write_events), _denied=frozenset(denied),
                  _denied_prefixes=denied_prefixes, _denied_imports=frozenset(denied_imports),
                  _denied_ctypes=frozenset(denied_ctypes),
                  _write_flags=write_flags, _o_path=o_path, _pid=os.getpid(), _getcwd=os.getcwd,
                  _fspath=os.fspath, _fsdecode=os.fsdecode, _stat=os.stat, _isinstance=isinstance,
                  _str=str, _int=int, _PermissionError=PermissionError, _ImportError=ImportError):
            def absolute(path):
                try:
                    path = _fspath(path)
                except TypeError:
                    return None
                if _isinstance(path, bytes):
                    path = _fsdecode(path)
                if not path.startswith("/"):
                    path = _getcwd() + "/" + path
                parts = []
                for part in path.split("/"):
                    if part == "" or part == ".":
                        continue
                    if part == "..":
                        if parts:
                            parts.pop()
                        continue
                    parts.append(part)
                return "/" + "/".join(parts)

            def within(path, roots):
                for r in roots:
                    if path == r or path.startswith(r + "/"):
                        return True
                return False

            def refuse(what):
                raise _PermissionError("sandbox: " + what + " is not allowed")

            if event == "open":
                path, mode, flags = args
                if path is None or _isinstance(path, _int):
                    return
                where = absolute(path)
                if where is None:
                    return
                writing = (_isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode
                           or "+" in mode)) or (_isinstance(flags, _int) and flags & _write_flags)
                if writing:
                    if not within(where, _writes):
                        refuse("writing " + where + " (outside the sandbox directory)")
                    return
                if not within(where, _reads):
                    refuse("reading " + where)
                if mode is None and not within(where, (_root,)):
                    if _isinstance(flags, _int) and flags & _o_path:
                        refuse("opening " + where + " with O_PATH")
                    try:
                        is_dir = (_stat(where).st_mode & 0o170000) == 0o040000
                    except OSError:
                        is_dir = False
                    if is_dir:
                        refuse("opening the directory " + where)
                return
            if event in _write_events:
                paths = args[:2] if event == "os.rename" else args[:1]
                for path in paths:
                    if path is None or _isinstance(path, _int):
                        continue
                    where = absolute(path)
                    if where is not None and not within(where, _writes):
                        refuse(event + " on " + where + " (outside the sandbox directory)")
                return
            if event == "import":
                if args[0] in _denied_imports:
                    raise _ImportError("sandbox: importing " + args[0] + " is not allowed")
                return
            if event == "socket.__new__":
                if args[1:2] == (1,):  # AF_UNIX (socket pairs: asyncio's wake-up pipe)
                    return
                refuse("network access (socket.__new__)")
            if event in ("os.kill", "os.killpg"):
                if args[0] != _pid:
                    refuse("signalling another process")
                return
            if event.startswith("ctypes."):
                if event == "ctypes.dlopen" and args[0] is None:  # the interpreter itself, at import
                    return
                if event in _denied_ctypes:
                    refuse(event)
                return
            if event.startswith("socket."):
                refuse("network access (" + event + ")")
            if event in _denied or event.startswith(_denied_prefixes):
                refuse(event)

        sys.addaudithook(guard)
        guard = None
        report["guard"] = True

    # 5. Report what is in force, then run the user's code as __main__.
    with os.fdopen(config["report_fd"], "w") as pipe:
        pipe.write(json.dumps(report))
    import ast, builtins, traceback, types
    path = os.path.join(root, "main.py")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    echo = config["echo"]
    del config, report, limits, drop
    for name in [n for n in globals() if not n.startswith("__")]:
        del globals()[name]
    try:
        tree = ast.parse(source, "main.py")  # relative (cwd): no random directory in a traceback
        last = None
        if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "main.py", "exec"), module.__dict__)
        if last is not None:
            value = eval(compile(last, "main.py", "eval"), module.__dict__)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next
        report = traceback.TracebackException(type(error), error, tb)
        inner = ("guard", "refuse", "absolute", "within", "_refuse_fork_exec")
        report.stack = traceback.StackSummary.from_list(
            [f for f in report.stack if not (f.filename == "<string>" and f.name in inner)]
        )
        sys.stderr.write("".join(report.format()))
        sys.stderr.flush()
        os._exit(1)
_sandbox_main()
"""


class SandboxError(ToolOptionError):
    """The sandbox was configured wrongly (bad limits, missing interpreter)."""


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


def _reachable_by_others(paths: list[str], directories: list[str]) -> bool:
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


async def _drain(stream: asyncio.StreamReader, cap: int, sink: bytearray) -> int:
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


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


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
            if _reachable_by_others(interpreter, [self.workdir or tempfile.gettempdir()]):
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
            readers = asyncio.gather(_drain(process.stdout, cap, out), _drain(process.stderr, cap, err))
            timed_out = False
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), self.timeout)
            except TimeoutError:
                timed_out = True
                _kill_group(process)
                await process.wait()
            _kill_group(process)  # anything left in its group (the guard normally stops children)
            try:
                out_bytes, err_bytes = await asyncio.wait_for(readers, 2.0)
            except TimeoutError:  # a descendant outside the group still holds a pipe
                readers.cancel()
                out_bytes, err_bytes = len(out), len(err)
            report = _read_report(report_read)
            stdout, cut_out = truncate_text(out.decode("utf-8", "replace"), self.output_limit)
            stderr, cut_err = truncate_text(err.decode("utf-8", "replace"), self.output_limit)
            cut = cut_out or cut_err or out_bytes > len(out) or err_bytes > len(err)
            return SandboxResult(
                stdout=stdout,
                stderr=stderr,
                exit_code=process.returncode,
                timed_out=timed_out,
                killed=self._why_killed(process.returncode, timed_out, stderr),
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
                _kill_group(process)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(process.wait(), 5.0)
            if readers is not None and not readers.done():
                readers.cancel()
            for fd in (report_read, report_write):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            shutil.rmtree(root, ignore_errors=True)

    def _why_killed(self, code: int | None, timed_out: bool, stderr: str) -> str | None:
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


def _read_report(fd: int) -> dict[str, Any]:
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}


_REASONS = {
    "timeout": "killed after the {wall_seconds:g} s wall-clock limit",
    "cpu": "killed after the {cpu_seconds} s CPU limit",
    "memory": "ran out of memory (limit {memory_mb} MB)",
    "file_size": "wrote a file over the {file_size_mb} MB limit",
}


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
            reason = _REASONS.get(result.killed, "died from {killed}").format(
                killed=result.killed, **result.limits
            )
            return ToolResult(
                ok=False,
                content=result.text(),
                error=f"{self.name}: {reason}",
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

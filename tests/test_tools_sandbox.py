"""The Python sandbox, with real subprocesses: output, errors, limits, and what it refuses.

Containment has layers (see workbench/tools/sandbox.py): the audit-hook guard, a network namespace,
rlimits, a scrubbed environment and, for root with a world-readable interpreter, a switch to nobody.
Where a layer can be switched off, a test checks the others still hold, and a control run with
every layer off shows the test's target (a listening socket, a writable directory) is really there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from workbench.tools import make_tool, run_tool
from workbench.tools.sandbox import PythonSandbox, PythonTool, SandboxError

pytestmark = pytest.mark.timeout(60)

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin")


def run(code: str, **options):
    return asyncio.run(PythonSandbox(**options).run(code))


def test_normal_code_prints_and_the_last_expression_is_echoed():
    result = run("x = 6\nprint('x is', x)\nx * 7")
    assert result.exit_code == 0 and result.killed is None
    assert result.stdout == "x is 6\n42\n" and result.stderr == ""
    assert run("1 + 1", echo_last_expression=False).stdout == ""
    assert run("None").text() == "[no output]"


def test_installed_packages_and_the_standard_library_import():
    result = run("import numpy, json, fractions, statistics, asyncio\nprint(numpy.arange(4).sum())")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "6\n"
    result = run("import pandas\nprint(pandas.DataFrame({'a': [1, 2]}).a.sum())")  # pandas imports ctypes
    assert result.stdout == "3\n", result.stderr


def test_sympy_works_in_the_sandbox():
    result = run(
        "import sympy\nx = sympy.Symbol('x')\nprint(sympy.integrate(sympy.sin(x), x), sympy.factorint(360))"
    )
    assert result.stdout == "-cos(x) {2: 3, 3: 2, 5: 1}\n", result.stderr


def test_an_exception_is_reported_as_output_with_its_traceback():
    result = run("def f():\n    return 1 / 0\nprint('before')\nf()")
    assert result.exit_code == 1 and result.killed is None
    assert result.stdout == "before\n"
    assert 'main.py", line 4' in result.stderr and result.stderr.rstrip().endswith(
        "ZeroDivisionError: division by zero"
    )
    assert "_sandbox_main" not in result.stderr  # the sandbox's own frames are hidden
    assert result.text().endswith("[exit code 1]")
    assert "SyntaxError" in run("def (:").stderr
    assert run("import sys; sys.exit(3)").exit_code == 3


def test_an_infinite_loop_is_killed_at_the_wall_clock_limit():
    result = run("while True:\n    pass", timeout=1.0, cpu_seconds=30)
    assert result.timed_out and result.killed == "timeout" and result.exit_code == -9
    assert result.seconds < 5
    sleeper = run("import time\nprint('start', flush=True)\ntime.sleep(60)", timeout=1.0)
    assert sleeper.killed == "timeout" and sleeper.stdout == "start\n"  # output before the kill is kept


def test_the_cpu_limit_stops_a_busy_loop_before_the_wall_clock_does():
    result = run("while True:\n    pass", timeout=30.0, cpu_seconds=1)
    assert result.killed == "cpu" and not result.timed_out and result.seconds < 20


def test_a_memory_bomb_is_contained():
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))"
    result = run(code, memory_mb=256, timeout=30)
    assert result.killed == "memory" and "MemoryError" in result.stderr and not result.timed_out
    assert run("x = bytearray(2 * 1024**3)", memory_mb=256).killed == "memory"


def test_a_fork_bomb_is_contained():
    result = run("import os\nwhile True:\n    os.fork()")
    assert result.exit_code == 1 and "PermissionError: sandbox: os.fork is not allowed" in result.stderr
    result = run("import multiprocessing\nmultiprocessing.Process(target=print).start()")
    assert result.exit_code == 1 and "is not allowed" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['echo', 'escaped'])",
        "import os\nos.system('echo escaped')",
        "import os\nos.posix_spawn('/bin/echo', ['echo', 'escaped'], {})",
        "import os\nos.execv('/bin/echo', ['echo', 'escaped'])",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import pty\npty.spawn('/bin/echo')",
        "import ctypes\nctypes.CDLL('libc.so.6').system(b'echo escaped')",
        "import ctypes\nctypes.CDLL(None).system(b'echo escaped')",
        "import ctypes\nctypes.pythonapi.Py_GetVersion",
        "import ctypes\nctypes.string_at(id(1), 8)",
    ],
)
def test_starting_processes_and_loading_native_code_are_refused(code):
    result = run(code)
    assert result.exit_code == 1 and "escaped" not in result.stdout
    assert "sandbox:" in result.stderr and "is not allowed" in result.stderr


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[bool] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(True)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


CONNECT = "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"


def test_network_access_is_refused(listener):
    port, accepted = listener
    result = run(CONNECT.format(port=port))
    assert result.exit_code == 1 and "connected" not in result.stdout and not accepted
    assert "sandbox: network access" in result.stderr


def test_the_guard_alone_refuses_the_network(listener):
    port, accepted = listener
    result = run(CONNECT.format(port=port), network_namespace=False)
    assert result.network == "guard only" and result.guard
    assert "PermissionError: sandbox: network access (socket.getaddrinfo) is not allowed" in result.stderr
    raw = run(f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))", network_namespace=False)
    assert "PermissionError: sandbox: network access (socket.__new__) is not allowed" in raw.stderr
    assert not accepted


def test_the_network_namespace_alone_refuses_the_network(listener):
    port, accepted = listener
    result = run(CONNECT.format(port=port), guard=False)
    if result.network == "guard only":
        pytest.skip("this kernel lets the sandbox make no network namespace (needs root or user namespaces)")
    assert not result.guard and "connected" not in result.stdout and not accepted
    assert "OSError" in result.stderr  # unreachable: the namespace has no interfaces up


def test_control_with_every_layer_off_the_listener_is_reachable(listener):
    port, accepted = listener
    result = run(CONNECT.format(port=port), guard=False, network_namespace=False)
    assert result.stdout == "connected\n", result.stderr
    assert accepted


def test_writing_outside_the_sandbox_directory_is_refused(tmp_path):
    target = tmp_path / "escape.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        f"import os\nos.chdir({str(tmp_path)!r})\nopen('escape.txt', 'w')",
        f"open('../../{target.relative_to('/')}', 'w')",
        f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\nos.open('escape.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w')",
        f"import shutil\nshutil.copy('main.py', {str(target)!r})",
    ):
        result = run(code)
        assert result.exit_code == 1 and "is not allowed" in result.stderr, (code, result.stderr)
    assert not target.exists()
    (tmp_path / "keep.txt").write_text("precious")
    for code in (
        f"import os\nos.remove({str(tmp_path / 'keep.txt')!r})",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
    ):
        assert "is not allowed" in run(code).stderr
    assert (tmp_path / "keep.txt").read_text() == "precious"
    control = run(f"open({str(target)!r}, 'w').write('x')", guard=False)
    if control.user == "unchanged":  # nothing but the guard stood in the way: the write goes through
        assert target.exists()


def test_the_code_gets_its_own_working_directory_which_is_deleted_afterwards():
    result = run(
        "import os\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))"
    )
    cwd, listing = result.stdout.splitlines()
    assert listing == "['main.py', 'scratch.txt']"
    assert Path(cwd).name.startswith("wb-sandbox-") and not Path(cwd).exists()
    assert (
        run("import tempfile\nprint(tempfile.gettempdir())")
        .stdout.strip()
        .split("/")[-1]
        .startswith("wb-sandbox-")
    )


def test_environment_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEST_SECRET", "hunter2")
    result = run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('WORKBENCH_TEST_SECRET'))")
    names, secret = result.stdout.splitlines()
    assert secret == "None" and "WORKBENCH_TEST_SECRET" not in names
    assert "PATH" in names and "HOME" in names
    # nor through the parent's /proc entry, or another file outside the allowed places
    result = run("import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())")
    assert "hunter2" not in result.stdout and "is not allowed" in result.stderr
    assert "is not allowed" in run("print(open('/etc/hostname').read())").stderr
    assert run("print(1)", env={"EXTRA": "given"}).exit_code == 0
    assert run("import os; print(os.environ['EXTRA'])", env={"EXTRA": "given"}).stdout == "given\n"


def test_huge_output_is_truncated_and_never_held_in_full():
    result = run(
        "import sys\nsys.stdout.write('x' * 20_000_000)\nprint('tail')", output_limit=1000, timeout=30
    )
    assert result.exit_code == 0 and result.truncated
    assert result.stdout == "x" * 1000 + "\n[truncated]"
    assert result.stdout_bytes == 20_000_005  # drained and counted, not kept


def test_a_file_over_the_size_limit_is_refused():
    result = run("open('big.bin', 'wb').write(b'x' * 3 * 1024**2)", file_size_mb=1)
    assert result.killed == "file_size" and "File too large" in result.stderr


def test_signalling_other_processes_is_refused():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        result = run(f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)")
        assert "signalling another process is not allowed" in result.stderr
        assert sleeper.poll() is None
        parent = run("import os\nos.kill(os.getppid(), 0)")  # signal 0: a probe that harms nothing
        assert "signalling another process is not allowed" in parent.stderr
        own = run(
            "import os, signal\nsignal.signal(signal.SIGUSR1, lambda *a: print('got it'))\nos.kill(os.getpid(), signal.SIGUSR1)"
        )
        assert own.stdout == "got it\n"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_limits_cannot_be_raised_from_inside():
    result = run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))")
    assert "is not allowed" in result.stderr
    result = run("import resource\nprint(resource.getrlimit(resource.RLIMIT_AS))", memory_mb=300, guard=False)
    assert result.stdout == f"({300 * 1024**2}, {300 * 1024**2})\n"


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None, reason="needs root and a system python3")
def test_as_root_the_child_runs_as_nobody_which_holds_without_the_guard(tmp_path):
    sandbox = dict(python=SYSTEM_PYTHON, guard=False)
    if PythonSandbox(**sandbox).drop_to is None:
        pytest.skip(f"{SYSTEM_PYTHON} is not readable by others")
    result = run("import os\nprint(os.getuid(), os.getgid())", **sandbox)
    assert result.user == "nobody (uid 65534)" and result.stdout == "65534 65534\n"
    os.chmod(tmp_path, 0o755)
    write = run(f"open({str(tmp_path / 'escape.txt')!r}, 'w')", **sandbox)
    assert "PermissionError" in write.stderr and not (tmp_path / "escape.txt").exists()
    parent = run("import os\nos.kill(os.getppid(), 0)", **sandbox)
    assert "PermissionError" in parent.stderr  # the kernel refuses: another user's process
    # RLIMIT_NPROC=0 applies to nobody: one fork attempt (a child would exit at once) fails
    fork = run("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('forked')", **sandbox)
    assert "forked" not in fork.stdout and "BlockingIOError" in fork.stderr


def test_bad_options_are_refused_with_a_fix():
    with pytest.raises(SandboxError, match="timeout must be > 0"):
        PythonSandbox(timeout=0)
    with pytest.raises(SandboxError, match="memory_mb must be >= 1"):
        PythonSandbox(memory_mb=0)
    with pytest.raises(SandboxError, match="is not an executable"):
        PythonSandbox(python="/nonexistent/python")


def test_the_python_tool_reports_limits_as_tool_errors_and_exceptions_as_output():
    tool = make_tool("python", timeout=1.0)
    assert isinstance(tool, PythonTool) and tool.name == "python"
    ok = asyncio.run(run_tool(tool, {"code": "print(6 * 7)"}, timeout=30))
    assert ok.ok and ok.content == "42\n" and ok.metadata["exit_code"] == 0
    failed = asyncio.run(run_tool(tool, {"code": "raise ValueError('bad input')"}, timeout=30))
    assert failed.ok and "ValueError: bad input" in failed.content and failed.metadata["exit_code"] == 1
    slow = asyncio.run(run_tool(tool, {"code": "while True: pass"}, timeout=30))
    assert not slow.ok and slow.error == "python: killed after the 1 s wall-clock limit"
    assert slow.metadata["killed"] == "timeout"
    missing = asyncio.run(run_tool(tool, {"source": "print(1)"}, timeout=30))
    assert not missing.ok and "'code' is a required property" in missing.error


def test_run_tools_timeout_kills_the_sandboxed_process(tmp_path):
    tool = PythonTool(timeout=60, workdir=tmp_path)
    result = asyncio.run(run_tool(tool, {"code": "import time\ntime.sleep(60)"}, timeout=0.5))
    assert not result.ok and "timed out after 0.5 s" in result.error
    assert list(tmp_path.iterdir()) == []  # the cancelled run removed its directory


def test_runs_are_concurrent_and_work_from_a_thread_with_its_own_loop():
    sandbox = PythonSandbox(timeout=20)

    async def many():
        return await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(4)))

    results: list = []
    thread = threading.Thread(target=lambda: results.extend(asyncio.run(many())))
    thread.start()
    thread.join()
    assert [r.stdout for r in results] == ["0\n", "1\n", "4\n", "9\n"]
    assert sys.executable  # the sandbox used this interpreter by default

"""The README's commands, run as written: ``make demo`` and every line of the tour's shell block.

Both run from a copy of the repository as the working directory, with the README's relative paths
(``runs/``, ``reports-out``, ``trained/``), the way a new user types them. What differs is only what a
test needs for time, stated here: the tiny model stands in for SmolLM2-135M (``DEMO_MODEL=tiny``, and
``smollm2-135m`` replaced by ``tiny`` in the tour), the demo trains two steps on four held-out problems,
and ``<run_id>`` is the id of the run the tour's ``workbench train`` line made. A tour line without a
check here fails the test, so the README and this file change together.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
FOR_TIME = {"smollm2-135m": "tiny"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files (tracked, and new ones not ignored) copied into a fresh folder."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    dest = tmp_path_factory.mktemp("fresh") / "workbench"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def shell(command: str | list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_DEBUG"}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    args = ["bash", "-c", command] if isinstance(command, str) else command
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_make_demo_runs_as_written_from_a_fresh_copy(clone: Path) -> None:
    done = shell(
        ["make", "-o", f"{VENV}/.stamp-demo", "demo", f"VENV={VENV}", "DEMO_MODEL=tiny",
         "DEMO_ARGS=--n 2 --train-steps 2 --eval-tasks 4"],
        clone,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:] + out[-3000:]
    for role in ("solver", "checker", "verifier1"):
        assert re.search(rf"^{role}\s+\d+", out, re.M), f"no rollout summary row for {role}:\n{out}"
    assert re.search(r"^checker\s+\d+\s+[\d.]+\s+-\s", out, re.M), "a role without a reward shows -"
    assert re.search(r"^step 1: reward [\d.]+, loss -?\d\.\d\de[+-]\d\d, grad norm [\d.e+-]+, ", out, re.M), (
        out
    )
    assert re.search(r"^\s+solver\s+[\d.]+ -> [\d.]+ .*SE\)$", out, re.M), out
    side = out[out.index("one held-out problem, greedy, before and after training") :]
    assert re.search(r"^\s+base model\s+trained model$", side, re.M), side
    for row in ("solver", "checker", "verifier1", "answer", "rewards"):
        assert re.search(rf"^  {row} ", side, re.M), f"no {row} row in the side-by-side:\n{side}"
    assert re.search(r"system \(final answer\)\s+[\d.]+ -> [\d.]+", out), out
    assert "figures and tables: reports-out/index.html" in out
    assert (clone / "reports-out" / "index.html").is_file()
    assert (clone / "reports-out" / "marsrl" / "fig5_verifier" / "fig5_verifier.png").is_file()
    runs = sorted(p.name for p in (clone / "runs").iterdir() if (p / "run.db").is_file())
    assert len(runs) == 2, f"the rollout and the training run: {runs}"
    next_commands = out[out.index("==> next") :]
    assert "make lab" in next_commands and "make serve" in next_commands
    assert f"?run={runs[-1]}" in next_commands or f"?run={runs[0]}" in next_commands
    for target, program in (("lab", "jupyter lab notebooks/"), ("serve", "workbench serve runs/")):
        dry = shell(["make", "-n", "-o", f"{VENV}/.stamp-demo", target, f"VENV={VENV}"], clone)
        assert dry.returncode == 0 and program in dry.stdout, dry.stdout + dry.stderr
        assert (VENV / "bin" / program.split()[0]).exists(), f"make demo installs {program.split()[0]}"


def test_make_lab_serves_jupyterlab_as_root_too_with_lab_args(clone: Path, tmp_path: Path) -> None:
    """``make lab`` as the user running the suite (root in CI's container, where JupyterLab refuses to start
    without ``--allow-root``), with ``LAB_ARGS`` giving it a port: it answers HTTP, then is stopped."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path)  # its runtime files here, not in the user's folder
    args = f"--port={port} --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port_retries=0"
    lab = subprocess.Popen(
        ["make", "-o", f"{VENV}/.stamp-demo", "lab", f"VENV={VENV}", f"LAB_ARGS={args}"],
        cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # make, the shell and JupyterLab in one process group, stopped together
    )  # fmt: skip
    try:
        deadline, answer = time.monotonic() + 90, None
        while answer is None and lab.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=5) as reply:
                    answer = json.loads(reply.read())
            except OSError:
                time.sleep(0.25)
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            output = lab.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            output = lab.communicate()[0]
    assert answer is not None and "version" in answer, f"JupyterLab did not answer:\n{output[-3000:]}"
    assert ("--allow-root" in output) == (os.geteuid() == 0), output[:500]


def tour_commands(readme: str) -> list[str]:
    """The shell block of the README's tour, one command a line, comments dropped."""
    tour = readme.split("## A 5-minute tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", tour, re.S)
    assert block, "the README's tour has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _run_ids(cwd: Path) -> list[str]:
    return sorted(p.name for p in (cwd / "runs").iterdir() if (p / "run.db").is_file())


Check = Callable[[subprocess.CompletedProcess, Path], None]


def _expect(*texts: str) -> Check:
    def check(done: subprocess.CompletedProcess, cwd: Path) -> None:
        for text in texts:
            assert text in done.stdout, f"{text!r} not in:\n{done.stdout[-2000:]}"

    return check


def _files(*names: str) -> Check:
    def check(done: subprocess.CompletedProcess, cwd: Path) -> None:
        for name in names:
            assert (cwd / name).exists(), f"{name} was not written"

    return check


def _schema(done: subprocess.CompletedProcess, cwd: Path) -> None:
    assert "properties" in json.loads((cwd / "topology.schema.json").read_text())


def _tasks(done: subprocess.CompletedProcess, cwd: Path) -> None:
    lines = (cwd / "masbench.jsonl").read_text().splitlines()
    assert len(lines) == 20 and all("question" in json.loads(line) for line in lines)


def _runs_listed(done: subprocess.CompletedProcess, cwd: Path) -> None:
    ids = _run_ids(cwd)
    assert len(ids) == 2 and all(i in done.stdout for i in ids), done.stdout


#: The check of each tour command, by the command's first words (after the substitutions above).
CHECKS: dict[str, Check] = {
    "workbench models list": _expect("smollm2-135m", "tiny"),
    "workbench models prepare": _expect("tiny"),
    "workbench topology list": _expect("marsrl_cpu", "mars_cpu", "debate"),
    "workbench topology show": _files("my_topology.yaml"),
    "workbench topology validate": _expect("ok: 'marsrl_cpu' has 3 roles and 3 flow nodes"),
    "workbench topology diagram": _files("my_topology.svg"),
    "workbench topology schema": _schema,
    "workbench tasks generate": _tasks,
    "workbench rollout": _expect("stored in ", "solver", "verifier1"),
    "workbench train": _expect("run finished: "),
    "workbench runs": _runs_listed,
    "workbench reproduce": _files("reports-out/index.html", "reports-out/marsrl/tables/table1_run.csv"),
    "workbench export": _files("trained/config.json", "trained/model.safetensors"),
}


def test_every_tour_command_runs_as_written_from_a_fresh_copy(clone: Path) -> None:
    cwd = clone / "tour"
    cwd.mkdir()
    commands = tour_commands((clone / "README.md").read_text())
    assert len(commands) >= 10, commands
    trained = None
    for written in commands:
        command = written
        for old, new in FOR_TIME.items():
            command = command.replace(old, new)
        if "<run_id>" in command:
            assert trained, f"{written!r} needs the run of the tour's `workbench train` line before it"
            command = command.replace("<run_id>", trained)
        check = next((c for prefix, c in CHECKS.items() if command.startswith(prefix)), None)
        assert check is not None, f"no check for the README's tour command {written!r}: add one to CHECKS"
        done = shell(command, cwd)
        assert done.returncode == 0, f"{written!r} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        check(done, cwd)
        if command.startswith("workbench train"):
            trained = Path(re.search(r"run finished: (\S+)", done.stdout).group(1)).name
            assert (cwd / "runs" / trained / "run.db").is_file(), (
                "the run is in runs/ under the working folder"
            )

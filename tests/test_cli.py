"""The `workbench` command as a user runs it: subcommands and one-line errors (the demo and the README's
tour run as written in tests/test_readme_commands.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKBENCH = [sys.executable, "-m", "workbench.cli"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_DEBUG"}
    return subprocess.run([*WORKBENCH, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_tasks_generate_prints_one_json_task_per_line():
    out = run("tasks", "generate", "masbench", "--n", "3", "--seed", "4")
    assert out.returncode == 0, out.stderr
    tasks = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(tasks) == 3 and all(t["verifier"] and t["question"] for t in tasks)


def test_topology_commands(tmp_path):
    shown = run("topology", "show", "marsrl")
    assert shown.returncode == 0 and "verifier1:" in shown.stdout
    spec = tmp_path / "mine.yaml"
    spec.write_text(shown.stdout)
    assert run("topology", "validate", str(spec)).returncode == 0
    schema = json.loads(run("topology", "schema").stdout)
    assert "roles" in schema["properties"]
    drawn = run("topology", "diagram", "hira", "--out", str(tmp_path / "hira.html"))
    assert drawn.returncode == 0 and "meta_planner" in (tmp_path / "hira.html").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("models", "prepare", "no-such-model"), "unknown model 'no-such-model'"),
        (("rollout", "marsrl", "--tasks", "missing.jsonl"), "task file not found: missing.jsonl"),
        (("rollout", "marsrl", "--tasks", "arithmetc"), "no task generator or file 'arithmetc'"),
        (("topology", "validate", "nowhere.yaml"), "no topology 'nowhere.yaml'"),
    ],
)
def test_bad_input_gives_a_clear_error_without_a_traceback(args, message, tmp_path):
    out = run(*args, cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_malformed_task_file_names_the_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1+1?", "answer": "2"}\n{not json\n')
    out = run("rollout", "marsrl", "--tasks", str(tasks), "--model", "tiny", "--runs-dir", str(tmp_path))
    assert out.returncode == 2
    assert f"{tasks}:2" in out.stderr and "Traceback" not in out.stderr
    assert not any(p.is_dir() for p in tmp_path.iterdir()), "nothing half-written in the runs directory"

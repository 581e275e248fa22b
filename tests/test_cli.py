"""The `workbench` command as a user runs it: subcommands and one-line errors (the demo and the README's
tour run as written in tests/test_readme_commands.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.store.records import CallRecord, EpisodeRecord

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


def test_help_is_plain_text():
    from workbench.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    texts = [parser.format_help(), *(sub.format_help() for sub in commands.values())]
    assert "The workbench command: models" in texts[0]
    for text in texts:
        assert "`" not in text, text


def test_runs_prints_local_iso_times(tmp_path, capsys):
    from datetime import datetime

    from workbench.cli import main
    from workbench.store import RunReader, RunStore

    RunStore.create(tmp_path, config={"kind": "rollout"}, run_id="r1").close()
    with RunReader(tmp_path / "r1") as reader:
        created = reader.info()["created_at"]
    assert main(["runs", str(tmp_path)]) == 0
    shown = datetime.fromtimestamp(created).astimezone().isoformat(timespec="seconds")
    out = capsys.readouterr().out
    assert shown in out and "e+09" not in out, out


def _call(role: str, rewards: dict, text: str = "") -> CallRecord:
    return CallRecord(
        role=role,
        completion_ids=[1, 2],
        completion_text=text,
        rewards=rewards,
        node=role,
        finish_reason="stop",
        trainable=True,
    )


def test_a_role_without_a_reward_prints_as_in_the_demo(tmp_path, monkeypatch, capsys):
    """``workbench rollout`` prints the missing reward as the demo and a notebook do: ``-``, not NaN."""
    import workbench.runs
    from workbench.cli import main

    episode = EpisodeRecord(
        task_id="t", group="t", sample=0, calls=[_call("solver", {"reward": 1.0}), _call("checker", {})]
    )
    result = workbench.runs.RolloutResult(tmp_path, [episode], [1.0], 0.1)
    monkeypatch.setattr(workbench.runs, "rollout", lambda *args, **kwargs: result)
    assert main(["rollout", "marsrl_cpu", "--n", "1", "--runs-dir", str(tmp_path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert rows["solver"][3] == "1.00" and rows["checker"][3] == workbench.runs.MISSING == "-"
    assert "NaN" not in result._repr_html_() and "<td>-</td>" in result._repr_html_()


def test_the_demo_sets_base_and_trained_answers_side_by_side():
    from workbench.demo import pick_problem, side_by_side
    from workbench.tasks import generate

    tasks = generate("arithmetic", n=3, seed=0, level=1, format="plain")
    before = {t.id: {"outcome": 0.0, "solver": 0.0} for t in tasks}
    after = {**before, tasks[1].id: {"outcome": 0.0, "solver": 0.5}, tasks[2].id: {"outcome": 1.0}}
    assert pick_problem(tasks, before, after)[0] is tasks[2], "the first turned from wrong to right"
    assert pick_problem(tasks, before, {**after, tasks[2].id: {"outcome": 0.0}})[0] is tasks[1]
    assert pick_problem(tasks, before, before)[0] is tasks[0]

    def episode(answer: str, reward: float) -> EpisodeRecord:
        verdicts = [_call("verifier1", {"reward": 1.0}, " Yes")] * 4
        calls = [_call("solver", {"reward": reward}, answer), _call("checker", {}, ""), *verdicts]
        return EpisodeRecord(task_id="t", group="t", sample=0, answer=answer, reward=reward, calls=calls)

    lines = side_by_side({"base model": episode("6", 0.0), "trained model": episode("5", 1.0)})
    rows = {line.split()[0]: line for line in lines[1:]}
    assert lines[0].split() == ["base", "model", "trained", "model"]
    assert rows["solver"].split() == ["solver", "6", "5"] and rows["checker"].split().count("(empty)") == 2
    assert rows["verifier1"].split() == ["verifier1", "Yes", "×4", "Yes", "×4"], "repeats counted"
    assert rows["answer"].split() == ["answer", "6:", "wrong", "5:", "right"]
    assert lines[0].index("trained") == rows["solver"].index("5"), "the trained column lines up"

"""Plugins defined in a notebook reach every process of a run: by value (cloudpickle, into the run directory) and
by name (``TrainConfig.plugins`` modules). Code "from a notebook cell" is simulated by executing its source in a
module that is not importable (``__notebook__``), so it can only travel by value, as a kernel's ``__main__`` does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

import workbench as wb
from workbench.engine import plugins, spec_checks
from workbench.rewards.verifiers import VERIFIERS
from workbench.tools import TOOL_KINDS
from workbench.topology import TopologyError, from_dict

CELL = '''
from workbench.tools import Tool, ToolResult, register_tool_kind
from workbench.rewards import register

class Calculator(Tool):
    """Adds two numbers."""
    name = "calculator"
    description = "Adds two numbers."
    parameters = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}

    def __init__(self, **options):
        self.options = options

    async def __call__(self, a, b):
        return ToolResult(ok=True, content=str(a + b))

register_tool_kind("calculator", Calculator, replace=True)

@register("length_is_even")
def length_is_even(prediction, reference):
    return float(len(prediction) % 2 == 0)
'''


@pytest.fixture
def notebook_plugins():
    namespace = {"__name__": "__notebook__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)  # noqa: S102 - a notebook cell, simulated
    yield namespace
    TOOL_KINDS.pop("calculator", None)
    VERIFIERS.pop("length_is_even", None)


def _spec(name: str, tools: dict, verifier: str, node: dict, max_tokens: int) -> dict:
    """A one-role topology: its solver's call ``node`` (a call or an agent), bound to the answer."""
    return {
        "name": name,
        "tools": tools,
        "roles": {
            "solver": {
                "messages": [{"role": "user", "content": "{{ question }}"}],
                "reward": {"kind": "answer", "verifier": verifier},
                "sampling": {"max_tokens": max_tokens},
            }
        },
        "flow": {
            "start": "solve",
            "nodes": {"solve": {**node, "bind": {"reply": "text"}}},
            "answer": "{{ reply }}",
        },
    }


SPEC = _spec(
    "with_plugins",
    {"calc": {"kind": "calculator", "description": "Adds two numbers."}},
    "length_is_even",
    {"call": "solver"},
    max_tokens=6,
)


def test_only_what_was_registered_outside_the_workbench_travels(notebook_plugins):
    registered = plugins.registered()  # (other test modules' registrations may be there too)
    assert registered["tool kinds"]["calculator"] is notebook_plugins["Calculator"]
    assert registered["verifiers"]["length_is_even"] is notebook_plugins["length_is_even"]
    assert not any(key in found for found in registered.values() for key in ("bm25", "exact", "boxed"))
    program = (
        "import asyncio, sys; from workbench.engine import plugins; from workbench.rewards.verifiers import verify; "
        "from workbench.tools import make_tool, run_tool; print(plugins.restore(sys.stdin.buffer.read())); "
        "print(verify('length_is_even', 'ab', '')); "
        "print(asyncio.run(run_tool(make_tool('calculator'), {'a': 2, 'b': 3}, timeout=5)).content)"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], input=plugins.snapshot(), capture_output=True, check=True
    ).stdout.decode()
    restored, score, total = out.splitlines()
    assert "'tool kinds: calculator'" in restored and "'verifiers: length_is_even'" in restored
    assert (score, total) == ("1.0", "5")


def _background_run(tmp_path, spec, **overrides):
    """A background run of ``spec`` on the tiny model: steps of 2 tasks x 2 samples, 8-token completions."""
    config = {
        "model": "tiny",
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "n_tasks": 4,
        "max_tokens": 8,
        "runs_dir": str(tmp_path / "runs"),
        **overrides,
    }
    return wb.train(from_dict(spec), config=config, task_options={"level": 1})


def test_a_background_run_and_its_resume_get_the_notebooks_plugins(notebook_plugins, tmp_path):
    run = _background_run(tmp_path, SPEC)  # the spec validates here: the kernel knows the calculator kind
    assert run.wait(300) == "finished", run.log()
    assert (run.run_dir / plugins.PLUGINS_FILE).is_file()
    episodes = wb.RunReader(run.run_dir).episodes()
    assert len(episodes) == 4 and set(episodes["reward"]) <= {0.0, 1.0}  # scored by the notebook's verifier
    assert (episodes["status"] == "complete").all()
    # a fresh process again: the plugins come from the run directory
    resumed = wb.resume(run.run_dir, steps=2)
    assert resumed.wait(300) == "finished", resumed.log()
    # replays where the notebook's cell never ran (a restarted kernel, the dashboard's server), of a call
    # rewarded by the notebook's verifier: in this process, then from the dashboard (a background process)
    solver = int(wb.RunReader(run.run_dir).calls(step=1, columns=["role"])["id"].iloc[0])
    _forget_notebook_plugins()
    replayed = wb.replay(run.run_dir, solver, n=1, arms=["resample"])
    assert replayed.arms["resample"][0].calls[0].rewards["reward"] in (0.0, 1.0)
    _forget_notebook_plugins()
    from widgets.replays import start_replay

    background = start_replay(run.run_dir, solver, n=1)
    assert background.wait(300) == "finished", background.log()
    assert len(wb.RunReader(background.run_dir).calls()) == 2  # keep and resample, one continuation each


def _forget_notebook_plugins() -> None:
    """This process as one that never ran the notebook's cell: its spec's tool kind and verifier are unknown."""
    TOOL_KINDS.pop("calculator", None)
    VERIFIERS.pop("length_is_even", None)
    with pytest.raises(TopologyError, match="unknown tool kind 'calculator'"):
        spec_checks.from_dict(SPEC)


def test_a_replay_imports_the_plugin_modules_its_training_run_named(tmp_path, monkeypatch):
    """A run whose config names its plugin modules (``plugins:``, as ``workbench train`` takes them) replays in
    a process that never imported them: the replay imports them as training and resume do."""
    from workbench.rl.config import TrainConfig
    from workbench.rl.run_files import TOPOLOGY_FILE
    from workbench.topology import to_yaml
    from workbench.training import create, run_here

    (tmp_path / "calc_plugin.py").write_text(CELL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import calc_plugin  # noqa: F401 - registers the spec's tool kind and verifier, as the CLI's --plugins does

    config = TrainConfig(model="tiny", steps=1, batch_size=1, group_size=2, n_tasks=2, max_tokens=8,
                         runs_dir=str(tmp_path / "runs"), plugins=["calc_plugin"])  # fmt: skip
    try:
        run_dir = create(config)
        (run_dir / TOPOLOGY_FILE).write_text(to_yaml(from_dict(SPEC)))
        assert run_here(run_dir) == "finished"
        assert not (run_dir / plugins.PLUGINS_FILE).exists(), "the plugins travel by name only"
        solver = int(wb.RunReader(run_dir).calls(columns=["role"])["id"].iloc[0])
        _forget_notebook_plugins()
        sys.modules.pop("calc_plugin")
        replayed = wb.replay(run_dir, solver, n=1, arms=["resample"])
        assert replayed.arms["resample"][0].status == "complete" and "calc_plugin" in sys.modules
    finally:
        sys.modules.pop("calc_plugin", None)
        TOOL_KINDS.pop("calculator", None)
        VERIFIERS.pop("length_is_even", None)


def test_a_plugin_module_named_on_the_command_line_is_imported_and_a_broken_one_is_named(tmp_path):
    with pytest.raises(ValueError, match="plugin module 'no_such_plugin_module' could not be imported"):
        plugins.import_modules(["no_such_plugin_module"])
    (tmp_path / "calc_plugin.py").write_text(CELL)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    command = [sys.executable, "-m", "workbench.cli", "topology", "validate", str(spec)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    refused = subprocess.run(command, capture_output=True, text=True, env=env)
    assert refused.returncode != 0 and "unknown tool kind 'calculator'" in refused.stderr
    accepted = subprocess.run([*command, "--plugins", "calc_plugin"], capture_output=True, text=True, env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert "ok: 'with_plugins'" in accepted.stdout


# --- a plugin that fails: reported where a user looks (run.wait(), run.status, run.error(), run.log()) ---


# the same spec without the notebook's plugins: a built-in verifier (the task's own), no tools
SPEC_BUILTIN = {
    **SPEC,
    "tools": {},
    "roles": {"solver": {**SPEC["roles"]["solver"], "reward": {"kind": "answer"}}},
}


def test_a_plugin_module_that_raises_at_import_fails_the_run_with_its_message_and_traceback(
    tmp_path, monkeypatch
):
    (tmp_path / "broken_import_plugin.py").write_text(
        "def _load_table():\n    raise RuntimeError('calculator table missing: /no/such/table.csv')\n\n_load_table()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # spawn hands the parent's sys.path to the child
    run = _background_run(tmp_path, SPEC_BUILTIN, plugins=["broken_import_plugin"])
    with pytest.raises(RuntimeError) as failed:
        run.wait(120)
    message = str(failed.value)
    assert "plugin module 'broken_import_plugin' could not be imported" in message
    assert "RuntimeError: calculator table missing: /no/such/table.csv" in message
    assert run.status == "failed"
    assert "calculator table missing: /no/such/table.csv" in run.error()
    log = run.log()
    assert "Traceback (most recent call last)" in log
    assert "_load_table" in log and "broken_import_plugin.py" in log  # the plugin's own frame
    assert run.process.exitcode == 1


BROKEN_TOOL_CELL = """
from workbench.tools import Tool, ToolResult, register_tool_kind

class NeedsAKey(Tool):
    name = "lookup"
    description = "Looks a word up."
    parameters = {"type": "object", "properties": {"word": {"type": "string"}}}

    def __init__(self, **options):
        raise RuntimeError("LOOKUP_API_KEY is not set")

    async def __call__(self, word):
        return ToolResult(ok=True, content=word)

register_tool_kind("broken_lookup", NeedsAKey, replace=True)
"""

# An agent whose tool calls the random tiny model writes by chance: the ``tags`` protocol with a space and an "n"
# as its tags (most of its turns hold " ...n"), so the tool is built, and fails, in about half of the episodes.
TOOL_SPEC = _spec(
    "with_a_broken_tool",
    {"lookup": {"kind": "broken_lookup", "description": "Looks a word up."}},
    "exact",
    {
        "agent": "solver",
        "tools": ["lookup"],
        "protocol": "tags",
        "protocol_options": {
            "begin": " ",
            "end": "n",
            "tool": "lookup",
            "argument": "word",
            "result_begin": "<result>",
            "result_end": "</result>",
        },
        "max_turns": 3,
    },
    max_tokens=16,
)


def test_a_tool_whose_constructor_raises_is_recorded_on_each_episode_that_calls_it_and_the_run_goes_on(
    tmp_path,
):
    """The engine builds a tool when an agent first calls it, inside the episode: the exception becomes that
    episode's error (``Type: message``, no traceback), the episode ends with status ``error`` and reward 0, the
    step counts it (``episodes/error``) and its log line names the first such error, and the run finishes:
    ``run.error()`` is None (no error ended the run)."""
    exec(compile(BROKEN_TOOL_CELL, "<notebook cell>", "exec"), {"__name__": "__notebook__"})  # noqa: S102
    try:
        run = _background_run(tmp_path, TOOL_SPEC, steps=2)
        assert run.wait(120) == "finished", run.log()
    finally:
        TOOL_KINDS.pop("broken_lookup", None)
    assert run.status == "finished" and run.error() is None
    reader = wb.RunReader(run.run_dir)
    episodes = reader.episodes()
    failed = episodes[episodes["status"] == "error"]
    assert len(failed) > 0, "the tiny model called the tool in no episode"  # about 1 in 4**8 runs
    assert set(failed["error"]) == {
        "RuntimeError: LOOKUP_API_KEY is not set"
    }  # the real message, never empty
    assert (failed["reward"] == 0.0).all()
    assert set(episodes["status"]) <= {"error", "complete"}  # the others never called the tool
    metrics = run.metrics()
    assert metrics["episodes/error"].sum() == len(failed)
    assert "episodes failed; the first: RuntimeError: LOOKUP_API_KEY is not set" in run.log()


def test_a_verifier_that_raises_mid_run_fails_the_run_with_its_message_and_traceback(tmp_path):
    """Rewards are assigned after the episode's own error handling, so a verifier's exception is not an episode
    error: it ends the step and the run (``failed``), with the verifier's message and the traceback through it;
    the steps before it stay stored."""
    cell = (
        "from workbench.rewards import register\n"
        "scored = 0\n"
        "@register('flaky_after_a_step')\n"
        "def flaky_after_a_step(prediction, reference):\n"
        "    global scored\n"
        "    scored += 1\n"
        "    if scored > 4:  # step 0 scores its 2 x 2 episodes; step 1's first one raises\n"
        "        raise ZeroDivisionError(f'flaky verifier: no unit for reference {reference!r}')\n"
        "    return 1.0\n"
    )
    exec(compile(cell, "<notebook cell>", "exec"), {"__name__": "__notebook__"})  # noqa: S102
    spec = {**SPEC, "tools": {}}
    spec["roles"] = {
        "solver": {**SPEC["roles"]["solver"], "reward": {"kind": "answer", "verifier": "flaky_after_a_step"}}
    }
    try:
        run = _background_run(tmp_path, spec, steps=2)
        with pytest.raises(
            RuntimeError, match=r"failed: ZeroDivisionError: flaky verifier: no unit for reference '\d+'"
        ):
            run.wait(120)
    finally:
        VERIFIERS.pop("flaky_after_a_step", None)
    assert run.status == "failed" and run.process.exitcode == 1
    assert run.error().startswith("ZeroDivisionError: flaky verifier: no unit for reference ")
    log = run.log()
    assert "Traceback (most recent call last)" in log
    assert "in flaky_after_a_step" in log and "in verify" in log  # through the workbench into the verifier
    assert log.count("ZeroDivisionError: flaky verifier") == 1  # printed once, by the background process
    metrics = run.metrics()
    assert list(metrics.index) == [0], metrics  # step 0 kept
    assert metrics.loc[0, "solver/reward/mean"] == 1.0, list(
        metrics.columns
    )  # scored by the notebook's verifier


def test_an_entry_that_cannot_travel_is_left_out_with_a_warning_naming_it(notebook_plugins):
    import threading

    lock = threading.Lock()
    VERIFIERS["holds_a_lock"] = lambda prediction, reference, lock=lock: 1.0  # a lock cannot be pickled
    try:
        with pytest.warns(UserWarning, match="verifier 'holds_a_lock' registered here cannot be sent"):
            data = plugins.snapshot()
    finally:
        VERIFIERS.pop("holds_a_lock")
    import cloudpickle

    sent = cloudpickle.loads(data)["verifiers"]
    assert "length_is_even" in sent and "holds_a_lock" not in sent


def test_an_entry_this_process_cannot_load_is_left_out_with_a_warning(tmp_path, monkeypatch):
    """Pickled by reference to a module only the sender can import (a Ray worker without the notebook's
    folder on its path): the other entries still arrive."""
    (tmp_path / "local_only_plugin.py").write_text(
        "from workbench.rewards import register\n\n@register('local_only')\ndef local_only(p, r):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import local_only_plugin  # noqa: F401 - registers its verifier

    try:
        data = plugins.snapshot()
    finally:
        VERIFIERS.pop("local_only", None)
    program = "import sys, warnings; from workbench.engine import plugins; print(plugins.restore(sys.stdin.buffer.read()))"
    done = subprocess.run(
        [sys.executable, "-c", program], input=data, capture_output=True, cwd=tmp_path.parent
    )
    assert done.returncode == 0, done.stderr.decode()
    assert "verifier 'local_only' of this run cannot be loaded here" in done.stderr.decode()
    assert "local_only" not in done.stdout.decode()

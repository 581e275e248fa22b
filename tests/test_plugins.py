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


@pytest.fixture(scope="module")
def scripted():
    """A policy that answers "12" to everything (the tiny model's tokenizer): no model to load."""
    from transformers import AutoTokenizer

    from tests.scripted import ScriptedBackend
    from workbench.models import resolve

    return ScriptedBackend(AutoTokenizer.from_pretrained(resolve("tiny")), lambda prompt: "12")


def _foreground_rollout(tmp_path, backend):
    """A foreground rollout of ``SPEC`` (the notebook's tool kind and verifier) in this process: one task."""
    tasks = wb.generate_tasks("arithmetic", n=1, seed=3, level=1)
    return wb.rollout(from_dict(SPEC), tasks, backend=backend, model="tiny", runs_dir=tmp_path / "runs")


def _first_call(run_dir) -> int:
    return int(wb.RunReader(run_dir).calls(columns=["role"])["id"].iloc[0])


def test_a_foreground_rollout_keeps_the_notebooks_plugins_for_its_replays(
    notebook_plugins, scripted, tmp_path
):
    """``wb.rollout`` in the kernel stores the cell's code as a background run does: a process that never ran
    the cell (a restarted kernel) replays the run; without its code, the refusal names the plugins and says
    how to register them, and doing what it says works."""
    run_dir = _foreground_rollout(tmp_path, scripted).run_dir
    assert (run_dir / plugins.PLUGINS_FILE).is_file()
    _forget_notebook_plugins()
    replayed = wb.replay(run_dir, _first_call(run_dir), n=1, arms=["resample"], backend=scripted)
    assert replayed.arms["resample"][0].calls[0].rewards["reward"] == 1.0  # the cell's verifier: "12" is even
    _forget_notebook_plugins()
    (run_dir / plugins.PLUGINS_FILE).unlink()  # a run stored before foreground rollouts kept their code
    with pytest.raises(TopologyError) as refused:
        wb.replay(run_dir, _first_call(run_dir), n=1, arms=["resample"], backend=scripted)
    message = str(refused.value)
    assert "unknown verifier 'length_is_even'" in message and "tool kind 'calculator'" in message
    assert "it keeps no code for them" in message and f"plugins.save('{run_dir}')" in message
    exec(compile(CELL, "<notebook cell>", "exec"), {"__name__": "__notebook__"})  # noqa: S102 - the cell again
    plugins.save(run_dir)  # what the refusal says: the run keeps them from now on
    _forget_notebook_plugins()
    assert wb.replay(run_dir, _first_call(run_dir), n=1, arms=["resample"], backend=scripted).arms["resample"]


def _post_replay(runs_dir, run_id: str, body: dict) -> tuple[int, dict]:
    """``POST /api/runs/<run_id>/replay`` to the dashboard's operator API (no users file: the local operator)."""
    import asyncio
    import json

    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port
    from tornado.web import Application

    from widgets.server.operator_api import operator_routes

    async def post() -> tuple[int, dict]:
        sock, port = bind_unused_port()
        server = HTTPServer(Application(operator_routes(runs_dir, None)))
        server.add_sockets([sock])
        client = AsyncHTTPClient(force_instance=True)
        try:
            response = await client.fetch(
                f"http://127.0.0.1:{port}/api/runs/{run_id}/replay",
                method="POST",
                body=json.dumps(body),
                headers={"Content-Type": "application/json"},
                raise_error=False,
                request_timeout=120,
            )
        finally:
            client.close()
            server.stop()
        return response.code, json.loads(response.body)

    return asyncio.run(post())


def test_the_dashboard_replays_a_runs_plugins_in_their_own_processes_never_in_its_own_registry(
    notebook_plugins, scripted, tmp_path, monkeypatch
):
    """A served dashboard replays a run whose spec names a notebook's plugins; its registries stay as they were,
    so a later replay of a run that keeps no code for those names is refused (400), as a fresh server
    refuses it, and never scored with the first run's code. (The replay's own process, which loads the run's
    code and scores with it, runs in ``test_a_background_run_and_its_resume_...``; here its launch is only
    recorded.)"""
    import cloudpickle

    from workbench import training

    launched = []

    def launch(run_dir, work):
        launched.append((run_dir, work))
        return training.BackgroundRun(run_dir)

    monkeypatch.setattr(training, "launch", launch)
    with_code = _foreground_rollout(tmp_path, scripted).run_dir
    without_code = _foreground_rollout(tmp_path, scripted).run_dir
    (without_code / plugins.PLUGINS_FILE).unlink()  # the same names, none of their code
    _forget_notebook_plugins()  # the server never ran the notebook's cell
    before = {kind: dict(registry) for kind, registry in plugins.registries().items()}

    call = _first_call(with_code)
    status, answer = _post_replay(tmp_path / "runs", with_code.name, {"call_id": call, "n": 1})
    assert status == 200 and answer["status"] == "created", answer  # the server writes for it until it runs
    assert plugins.registries() == before, "the run's plugins were loaded into the server"
    ((replay_dir, work),) = launched
    assert replay_dir.name == answer["run"] and work.__name__ == "replay_here"  # in a process of its own
    carried = cloudpickle.loads((replay_dir / plugins.PLUGINS_FILE).read_bytes())  # what that process loads
    assert "calculator" in carried["tool kinds"] and "length_is_even" in carried["verifiers"]

    call = _first_call(without_code)
    status, answer = _post_replay(tmp_path / "runs", without_code.name, {"call_id": call, "n": 1})
    assert status == 400, answer
    error = answer["error"]
    assert error.startswith("TopologyError: ") and "unknown verifier 'length_is_even'" in error
    assert "it keeps no code for them" in error
    assert plugins.registries() == before
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == sorted([with_code.name, without_code.name, replay_dir.name]), (
        "a refused replay makes no run"
    )
    assert len(launched) == 1
    # its Graph tab draws the run from its spec alone: no plugin need be known to the server
    assert set(wb.graph_signals(with_code, 0).roles) == {"solver"}

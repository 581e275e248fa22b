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
from workbench.engine import plugins
from workbench.rewards.verifiers import VERIFIERS
from workbench.tools import TOOL_KINDS
from workbench.topology import from_dict

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


SPEC = {
    "name": "with_plugins",
    "tools": {"calc": {"kind": "calculator", "description": "Adds two numbers."}},
    "roles": {
        "solver": {
            "messages": [{"role": "user", "content": "{{ question }}"}],
            "reward": {"kind": "answer", "verifier": "length_is_even"},
            "sampling": {"max_tokens": 6},
        }
    },
    "flow": {
        "start": "solve",
        "nodes": {"solve": {"call": "solver", "bind": {"reply": "text"}}},
        "answer": "{{ reply }}",
    },
}


def test_only_what_was_registered_outside_the_workbench_travels(notebook_plugins):
    assert plugins.registered() == {
        "tool kinds": {"calculator": notebook_plugins["Calculator"]},
        "verifiers": {"length_is_even": notebook_plugins["length_is_even"]},
    }
    program = (
        "import asyncio, sys; from workbench.engine import plugins; from workbench.rewards.verifiers import verify; "
        "from workbench.tools import make_tool, run_tool; print(plugins.restore(sys.stdin.buffer.read())); "
        "print(verify('length_is_even', 'ab', '')); "
        "print(asyncio.run(run_tool(make_tool('calculator'), {'a': 2, 'b': 3}, timeout=5)).content)"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], input=plugins.snapshot(), capture_output=True, check=True
    ).stdout.decode()
    assert out.splitlines() == ["['tool kinds: calculator', 'verifiers: length_is_even']", "1.0", "5"]


def test_a_background_run_and_its_resume_get_the_notebooks_plugins(notebook_plugins, tmp_path):
    topology = from_dict(SPEC)  # validates here: the kernel knows the calculator kind
    config = {
        "model": "tiny",
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "n_tasks": 4,
        "runs_dir": str(tmp_path),
    }
    run = wb.train(topology, config=config, task_options={"level": 1})
    assert run.wait(300) == "finished", run.log()
    assert (run.run_dir / plugins.PLUGINS_FILE).is_file()
    episodes = wb.RunReader(run.run_dir).episodes()
    assert len(episodes) == 4 and set(episodes["reward"]) <= {0.0, 1.0}  # scored by the notebook's verifier
    assert (episodes["status"] == "complete").all()
    resumed = wb.resume(
        run.run_dir, steps=2
    )  # a fresh process again: the plugins come from the run directory
    assert resumed.wait(300) == "finished", resumed.log()


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

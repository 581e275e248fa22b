"""The builder's "Export notebook": a topology as a runnable, papermill-parameterised notebook.

``notebook_for(spec_yaml)`` writes the notebook a researcher would write next: a ``parameters`` cell (model,
tasks, steps and the rest, which ``papermill -p`` overrides), the spec itself as YAML in a cell (the notebook
needs no file beside it) loaded with every check, tasks generated (or read from a JSONL/Parquet file), a
rollout with its summary, and training in the background with its live monitor, waited for at the end. The
same cells run under ``papermill`` on the tiny model (``tests/test_widgets_editor.py`` does it).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The parameters cell's defaults: a real small model on the CPU, a short run.
PARAMETERS = {
    "model": "smollm2-135m",
    "backend": "hf",
    "tasks": "arithmetic",
    "n_tasks": 8,
    "steps": 2,
    "batch_size": 2,
    "group_size": 2,
    "max_tokens": None,
    "runs_dir": "runs",
}
_NOTES = {
    "model": "local registry: smollm2-135m (real, 135M) or tiny (random, for tests); or a HF checkpoint",
    "backend": "hf (transformers) or vllm",
    "tasks": "a task generator (arithmetic, multihop, masbench, ...) or a JSONL/Parquet file of tasks",
    "n_tasks": "tasks generated (ignored for a file)",
    "steps": "training steps",
    "batch_size": "tasks per training step",
    "group_size": "samples per task (GRPO's G)",
    "max_tokens": "a cap on every call's completion; None: each role's own",
    "runs_dir": "where the runs are stored",
}


def _cell(kind: str, source: str, tags: list[str] | None = None) -> dict:
    cell: dict = {"cell_type": kind, "metadata": {"tags": tags} if tags else {}, "source": source}
    if kind == "code":
        cell |= {"execution_count": None, "outputs": []}
    return cell


def notebook_for(spec_yaml: str, name: str = "topology") -> dict:
    """A notebook (nbformat 4, as a dict) that loads the spec in ``spec_yaml``, rolls it out, trains it and
    shows the run's monitor; its ``parameters`` cell holds ``PARAMETERS``."""
    parameters = "\n".join(f"{k} = {v!r}  # {_NOTES[k]}" for k, v in PARAMETERS.items())
    cells = [
        _cell(
            "markdown",
            f"# {name}\n\nExported from the topology editor: the spec below, rolled out and trained. "
            "Run it with `papermill` and `-p model tiny -p steps 1` for a quick check.",
        ),  # fmt: skip
        _cell("code", "# Parameters (papermill can override them).\n" + parameters, ["parameters"]),
        _cell(
            "code",
            f'import workbench as wb\n\nSPEC = """\\\n{_quoted(spec_yaml)}"""\n'
            "topology = wb.topology_from_yaml(SPEC)  # every check, the registries' included\n"
            "print(topology.name, '|', ', '.join(topology.roles))",
        ),  # fmt: skip
        _cell(
            "code",
            "if str(tasks).endswith(('.jsonl', '.parquet')):\n    task_list = wb.load_tasks(tasks)\n"
            "else:\n    task_list = wb.generate_tasks(tasks, n=n_tasks, seed=0)\nprint(len(task_list), 'tasks')",
        ),  # fmt: skip
        _cell("markdown", "## Roll out"),
        _cell(
            "code",
            "result = wb.rollout(topology, task_list, model=model, backend=backend, group_size=group_size,\n"
            "                    max_tokens=max_tokens, runs_dir=runs_dir)\nresult.summary()",
        ),  # fmt: skip
        _cell("markdown", "## Train\n\nTraining runs in a background process; the monitor follows it live."),
        _cell(
            "code",
            "run = wb.train(topology, task_list, model=model, backend=backend, steps=steps,\n"
            "               batch_size=batch_size, group_size=group_size, max_tokens=max_tokens,\n"
            "               eval_tasks=0, eval_every=0, runs_dir=runs_dir)\n"
            "from widgets import RewardMonitor\n\nRewardMonitor(run.run_dir)",
        ),  # fmt: skip
        _cell(
            "code",
            "status = run.wait()\nprint(status, run.run_dir)\nassert status == 'finished', run.error()",
        ),
    ]
    for number, cell in enumerate(cells):
        cell["id"] = f"cell-{number}"
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return {"cells": cells, "metadata": {"kernelspec": kernel, "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}  # fmt: skip


def _quoted(text: str) -> str:
    """``text`` safe inside a triple-quoted Python string."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def write_notebook(path: str | Path, spec_yaml: str, name: str = "topology") -> Path:
    """Write ``notebook_for(spec_yaml, name)`` to ``path`` (``.ipynb``); returns the path."""
    path = Path(path)
    path.write_text(json.dumps(notebook_for(spec_yaml, name), indent=1) + "\n", encoding="utf-8")
    return path

"""Store the outputs of notebooks' deterministic cells, so that nbval checks them.

nbval compares a cell's outputs with the ones stored in the notebook, and a cell stored without an
execution count is not compared at all: a ``# NBVAL_CHECK_OUTPUT`` cell in a cleared notebook checks
nothing. This runs each notebook on its default parameters in a real kernel and keeps the outputs of
exactly those cells; every other cell is stored cleared (its outputs vary from run to run).

    python -m tests.notebook_outputs notebooks/*.ipynb

Run it after changing what a checked cell prints; ``tests/test_notebook_checks.py`` fails when a
checked cell has no stored output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

MARKER = "NBVAL_CHECK_OUTPUT"


def is_checked(cell: nbformat.NotebookNode) -> bool:
    """A code cell whose outputs nbval compares: one of its lines is the comment ``# NBVAL_CHECK_OUTPUT``."""
    lines = (line.strip() for line in cell.source.splitlines())
    return cell.cell_type == "code" and any(
        line.startswith("#") and line.lstrip("#").strip() == MARKER for line in lines
    )


def store_checked_outputs(path: Path, timeout: float = 1200) -> int:
    """Execute ``path`` and write it back with only its checked cells' outputs; returns their number."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=timeout, record_timing=False, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    checked = 0
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            checked += 1
        else:
            cell.outputs, cell.execution_count = [], None
    nbformat.write(notebook, path)
    return checked


def main(paths: list[str]) -> int:
    for name in paths:
        print(f"{name}: {store_checked_outputs(Path(name))} checked cells stored", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

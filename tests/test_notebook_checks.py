"""The notebooks' deterministic cells are really checked: nbval compares only outputs that are stored."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.notebook_outputs import is_checked

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("reports/*/*.ipynb")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_checked_cells_store_their_outputs_and_the_others_are_cleared(path):
    notebook = nbformat.read(path, as_version=4)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            assert cell.execution_count is not None and cell.outputs, (
                f"cell {index} is marked NBVAL_CHECK_OUTPUT but stores no output, so nbval checks nothing: "
                f"run python -m tests.notebook_outputs {path.relative_to(ROOT)}"
            )
        else:
            assert not cell.outputs, f"cell {index} stores outputs that vary from run to run: clear them"


def test_a_stored_check_fails_when_the_output_changes(tmp_path):
    """nbval's own behaviour, which the stored outputs rely on: a changed output is a failure."""
    import subprocess
    import sys

    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)")
    notebook.cells = [cell]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "check.ipynb"
    nbformat.write(notebook, path)
    from tests.notebook_outputs import store_checked_outputs

    assert store_checked_outputs(path) == 1
    run = [sys.executable, "-m", "pytest", "--nbval-lax", str(path), "-q", "-p", "no:cacheprovider"]
    assert subprocess.run(run, capture_output=True, cwd=tmp_path).returncode == 0
    stored = nbformat.read(path, as_version=4)
    stored.cells[0].source = stored.cells[0].source.replace("6 * 7", "6 * 8")
    nbformat.write(stored, path)
    failed = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path)
    assert failed.returncode != 0 and "outputs differ" in failed.stdout

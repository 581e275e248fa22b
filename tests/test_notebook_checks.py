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


def test_the_comparison_notebook_under_papermill_draws_seeds_as_a_band(tmp_path):
    """``notebooks/compare_runs.ipynb`` on three seeds of one config and a run of another (the browser test's
    comparison, ``tests.compare_runs``) instead of its default gallery pair: its checked cells' assertions hold,
    the seeds are one group drawn as a band beside the other run's line, and the outcomes set each run against
    the first on the same tasks."""
    import papermill

    from tests.compare_runs import seeded_runs

    runs = [str(run) for run in seeded_runs(tmp_path / "runs")]
    done = papermill.execute_notebook(
        str(ROOT / "notebooks" / "compare_runs.ipynb"), str(tmp_path / "out.ipynb"), parameters={"runs": runs},
        cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False,
    )  # fmt: skip
    printed = "".join(o.get("text", "") for c in done["cells"] for o in c.get("outputs", []))
    names = [Path(run).name for run in runs]
    assert f"learning_rate=1e-05: {names[:3]}" in printed and f"learning_rate=0.0001: {names[3:]}" in printed
    assert "'band:learning_rate=1e-05'" in printed and "'line:learning_rate=0.0001'" in printed
    assert f"{names[3]} vs {names[0]}, system after training: +0.375 ± 0.183" in printed

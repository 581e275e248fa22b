"""``workbench reproduce``: run the report notebooks headlessly with papermill.

Each notebook ``reports/<paper>/<name>.ipynb`` runs in its own papermill process (``workers`` at
once) with the parameters ``runs``, ``out_dir`` (``OUT/<paper>/<name>/``, where it saves its
figures and tables) and ``benchmark``; the executed notebook is written beside its outputs. An
``index.html`` at the top of ``OUT`` links every notebook, figure and table, failed ones first
with the end of their error.

Where the runs' folder holds several seeds' runs of the report plan (``reports/runs/marsrl/``,
``reports/runs/marsrl-seed1/`` ...: ``workbench reproduce all --train --seeds 0,1,2``), the notebooks draw one
seed's, by the plan's names (``drawn_runs``): seed 0's unless told another (``--seed``).
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from workbench.reference import PAPERS

REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
OUTPUT_SUFFIXES = (".png", ".svg", ".html", ".csv")


@dataclass
class NotebookResult:
    """One executed report notebook."""

    paper: str
    name: str
    out_dir: Path
    seconds: float
    error: str | None = None
    outputs: list[Path] = field(default_factory=list)

    @property
    def executed(self) -> Path:
        return self.out_dir / f"{self.name}.ipynb"

    @property
    def ok(self) -> bool:
        return self.error is None


def chosen_papers(papers: str | Sequence[str] = "all") -> list[str]:
    """``papers`` ("all", a paper, or several) as a list of known paper names; an unknown one is refused."""
    chosen = list(PAPERS) if papers == "all" else [papers] if isinstance(papers, str) else list(papers)
    unknown = [p for p in chosen if p not in PAPERS]
    if unknown:
        raise ValueError(f"unknown paper(s) {', '.join(unknown)}; choose from all, {', '.join(PAPERS)}")
    return chosen


def report_notebooks(papers: str | Sequence[str] = "all", reports_dir: Path = REPORTS_DIR) -> list[Path]:
    """The report notebooks of ``papers`` ("all", a paper, or several), in paper then name order."""
    return [nb for paper in chosen_papers(papers) for nb in sorted((reports_dir / paper).glob("*.ipynb"))]


def _run_one(notebook: Path, runs: str, out: Path, benchmark: str, timeout: float) -> NotebookResult:
    paper, name = notebook.parent.name, notebook.stem
    out_dir = (out / paper / name).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "papermill", str(notebook), str(out_dir / f"{name}.ipynb"),
        "--cwd", str(notebook.parent), "--no-progress-bar", "--execution-timeout", str(int(timeout)),
        "-p", "runs", runs, "-p", "out_dir", str(out_dir), "-p", "benchmark", benchmark,
    ]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60)
        error = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])
        error = None if error is None else "\n".join(error[-15:])
    except subprocess.TimeoutExpired:
        error = f"did not finish within {timeout + 60:.0f} s"
    outputs = sorted(p for p in out_dir.iterdir() if p.suffix in OUTPUT_SUFFIXES)
    return NotebookResult(paper, name, out_dir, time.monotonic() - started, error, outputs)


def absolute_runs(runs: str) -> str:
    """``runs`` ('label=run_dir,...', a run directory or a folder of runs) with every path made absolute."""
    if not runs.strip():
        return runs
    parts = []
    for item in runs.split(","):
        label, sep, path = item.rpartition("=")
        parts.append(f"{label}{sep}{Path(path.strip()).expanduser().resolve()}" if path.strip() else item)
    return ",".join(parts)


def drawn_runs(runs: str, seed: int = 0) -> str:
    """The notebooks' ``runs`` for ``runs`` (as ``workbench reproduce --runs`` takes it; empty: the
    ``WORKBENCH_REPORT_RUNS`` variable, else the committed summaries) and ``seed``.

    A folder holding runs of several seeds (a ``<name>-seed<k>`` folder beside ``<name>``) is given as
    ``name=path,...`` of ``seed``'s runs only, by the plan's names: seed 0's are the folders without the suffix.
    Anything else is returned as it is (a seed other than 0 is then refused: no other seed's runs are there)."""
    from workbench.reports.seed_folders import SEED_FOLDER, split_seed
    from workbench.reports.series import COMMITTED_RUNS, RUNS_ENV, newest_run
    from workbench.store.layout import DB_NAME
    from workbench.store.summary import is_summary

    given = runs.strip() or os.environ.get(RUNS_ENV, "").strip() or str(COMMITTED_RUNS)
    folder = Path(given).expanduser()
    several = (
        "," not in given
        and "=" not in given
        and folder.is_dir()
        and not (folder / DB_NAME).is_file()
        and not is_summary(folder)
        and any(SEED_FOLDER.match(p.name) for p in folder.iterdir() if p.is_dir())
    )
    if not several:
        if seed:
            raise ValueError(f"no runs of seed {seed} (folders named <run>-seed{seed}) in {given!r}")
        return runs
    pairs = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        name, of_seed = split_seed(child.name)
        if of_seed != seed:
            continue
        run = child if (child / DB_NAME).is_file() or is_summary(child) else newest_run(child)
        if run is not None:
            pairs.append(f"{name}={run}")
    if not pairs:
        raise ValueError(f"no runs of seed {seed} in {folder}")
    return ",".join(pairs)


def reproduce(
    papers: str | Sequence[str],
    runs: str,
    out: str | Path,
    benchmark: str = "",
    workers: int = 2,
    timeout: float = 900.0,
    reports_dir: Path = REPORTS_DIR,
    seed: int = 0,
) -> list[NotebookResult]:
    """Execute the report notebooks of ``papers`` on ``runs`` (of ``seed`` where they hold several seeds:
    ``drawn_runs``); writes ``OUT/index.html``."""
    notebooks = report_notebooks(papers, reports_dir)
    if not notebooks:
        raise ValueError(f"no report notebooks for {papers!r} under {reports_dir}")
    # The notebooks run in their own folder: paths the user gave relative to here are made absolute.
    out = Path(out).resolve()
    runs = absolute_runs(drawn_runs(runs, seed))
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda nb: _run_one(nb, runs, out, benchmark, timeout), notebooks))
    write_index(results, out)
    return results


def write_index(results: Sequence[NotebookResult], out: Path) -> Path:
    """An HTML page linking each executed notebook and its figures and tables (failures first)."""
    rows = []
    for r in sorted(results, key=lambda r: (r.ok, r.paper, r.name)):
        links = " ".join(
            f'<a href="{html.escape(str(p.relative_to(out)))}">{html.escape(p.name)}</a>' for p in r.outputs
        )
        status = "ok" if r.ok else f"<b>failed</b><pre>{html.escape(r.error or '')}</pre>"
        notebook = html.escape(str(r.executed.relative_to(out)))
        rows.append(
            f"<tr><td>{r.paper}</td><td><a href='{notebook}'>{r.name}</a></td><td>{status}</td>"
            f"<td>{r.seconds:.0f} s</td><td>{links}</td></tr>"
        )
    page = (
        "<!doctype html><meta charset='utf-8'><title>workbench reproduce</title>"
        "<style>body{font-family:sans-serif}td{padding:4px 8px;vertical-align:top}</style>"
        f"<h1>Paper reports</h1><p>{sum(r.ok for r in results)} of {len(results)} notebooks ran.</p>"
        "<table><tr><th>paper</th><th>notebook</th><th>status</th><th>time</th><th>outputs</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    index = out / "index.html"
    index.write_text(page)
    return index


def summarise(results: Sequence[NotebookResult], out: str | Path) -> int:
    """Print a line per notebook and where the index is; name the failed ones on stderr. The exit code."""
    for r in results:
        shown = ", ".join(p.name for p in r.outputs if p.suffix in (".png", ".csv")) or "-"
        print(f"{'ok    ' if r.ok else 'FAILED'} {r.paper}/{r.name} ({r.seconds:.0f} s): {shown}")
    print(f"figures and tables: {Path(out) / 'index.html'}")
    failed = [r for r in results if not r.ok]
    if failed:
        names = ", ".join(f"{r.paper}/{r.name}" for r in failed)
        print(f"error: {len(failed)} notebook(s) failed: {names}", file=sys.stderr)
        for r in failed:
            print(f"--- {r.paper}/{r.name}\n{r.error}", file=sys.stderr)
        return 1
    return 0

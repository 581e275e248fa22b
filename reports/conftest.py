"""nbval runs the report notebooks on their default parameters against small runs built here.

The runs (one per paper, on the tiny model; ``workbench.reports.sample.train_sample_runs``) are
made once per pytest invocation in one folder, in the main process before xdist starts its
workers, and handed to every notebook kernel through ``WORKBENCH_REPORT_RUNS`` (kernels inherit
the environment); a value already set is used as it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from workbench.reports.series import RUNS_ENV

_BUILT: list[Path] = []


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput") or os.environ.get(RUNS_ENV):
        return
    from workbench.reports.sample import train_sample_runs

    runs_dir = Path(tempfile.mkdtemp(prefix="workbench-report-runs-"))
    _BUILT.append(runs_dir)
    train_sample_runs(runs_dir)
    os.environ[RUNS_ENV] = str(runs_dir)


def pytest_unconfigure(config) -> None:
    for runs_dir in _BUILT:
        shutil.rmtree(runs_dir, ignore_errors=True)

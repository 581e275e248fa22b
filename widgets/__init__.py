"""The workbench's visual side: Panel components for JupyterLab and the team dashboard.

    from widgets import TopologyEditor, RunLauncher, TrajectoryBrowser, RewardMonitor, Compare, Dashboard

Each is a ``pn.viewable.Viewer``: display it in a notebook cell (after ``widgets.extension()``, which loads
Panel's JavaScript from the Jupyter server: see widgets.notebook) or serve it. The served application, what
``workbench serve RUNS_DIR`` runs (the Dashboard behind sign-in, sessions, the gate and the operator API), is
in ``widgets.server``; these views never import it. Imports are lazy, so ``import widgets`` does not load
Panel.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TopologyEditor": "widgets.topology_editor",
    "RunLauncher": "widgets.run_launcher",
    "TrajectoryBrowser": "widgets.trajectory_browser",
    "RewardMonitor": "widgets.reward_monitor",
    "Dashboard": "widgets.dashboard",
    "Compare": "widgets.compare",
    "extension": "widgets.notebook",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'widgets' has no attribute '{name}'")
    return getattr(importlib.import_module(_LAZY[name]), name)

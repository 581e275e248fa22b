"""Analyses of stored runs: counterfactual replay (which agent's decision mattered).

``wb.replay(run_dir, call_id, n)`` (``workbench.analysis.replay``) re-runs a stored episode from one of
its calls, keeping everything before it token for token, and estimates the call's advantage (Q - V)
from the replays' outcomes (``workbench.analysis.estimate``).
"""

from workbench.analysis.estimate import CallEstimate, Mean
from workbench.analysis.replay_policies import Checkpoint

__all__ = ["CallEstimate", "Checkpoint", "Mean"]

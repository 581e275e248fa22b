"""The numbers behind the papers' figures and tables, read from runs.

Every function takes run directories and returns a pandas frame in long form (one row per run,
step and series), so a notebook only draws. Runs are named by a label (``resolve_runs``): a
report comparing strategies or ablations passes ``"random=runs/a,adaptive=runs/b"``. A run's summary
(``workbench.store.summary``: the run without its prompts and token ids, what ``reports/runs/`` holds)
stands wherever a run does; given nothing, the reports draw on the summaries committed in ``reports/runs/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.reports.seed_folders import SEED_FOLDER
from workbench.store import RunReader
from workbench.store.layout import DB_NAME
from workbench.store.summary import is_summary, open_summary

RUNS_ENV = "WORKBENCH_REPORT_RUNS"
#: The summaries of the report plan's runs, committed with the repository (``workbench reproduce --train``).
COMMITTED_RUNS = Path(__file__).resolve().parents[2] / "reports" / "runs"


def _is_run(path: Path) -> bool:
    return (path / DB_NAME).is_file() or is_summary(path)


def _readable(path: Path) -> Path:
    """A run directory as it is; a summary as the run directory built from it in the model cache."""
    if not is_summary(path):
        return path
    from workbench.models.cache import cache_root

    return open_summary(path, cache_root() / "summaries")


def resolve_runs(
    runs: str | Path | Mapping[str, str | Path] | Sequence[str | Path] | None,
) -> dict[str, Path]:
    """Labelled run directories from a notebook parameter.

    Accepted: a mapping label -> directory; ``"label=dir,label=dir"``; ``"dir,dir"`` (labels are the
    run ids); one run directory; a directory of runs (every run in it, by id, and the newest run of each folder
    in it, by the folder's name). A run's summary counts as a run (its label: its folder's name). Empty: the
    ``WORKBENCH_REPORT_RUNS`` environment variable, in the same forms, else the committed summaries
    (``reports/runs/``).
    """
    if runs is None or (isinstance(runs, str) and not runs.strip()):
        runs = os.environ.get(RUNS_ENV, "")
        if not runs.strip() and COMMITTED_RUNS.is_dir():
            runs = str(COMMITTED_RUNS)
        if not runs.strip():
            raise ValueError(f"no runs given: pass runs='label=dir,...' or set {RUNS_ENV}")
    if isinstance(runs, Mapping):
        pairs = [(str(k), Path(v)) for k, v in runs.items()]
    else:
        items = [s.strip() for s in runs.split(",")] if isinstance(runs, str) else [str(r) for r in runs]
        pairs = []
        for item in filter(None, items):
            label, _, path = item.rpartition("=") if "=" in item else ("", "", item)
            folder = Path(path).expanduser()
            if not label and not _is_run(folder) and folder.is_dir():
                pairs += _runs_in(folder)
            else:
                pairs.append((label or folder.name, folder))
    missing = [f"{label}={path}" for label, path in pairs if not _is_run(path)]
    if missing:
        raise FileNotFoundError(f"not a run directory (no {DB_NAME}): {', '.join(missing)}")
    if not pairs:
        raise ValueError(f"no runs found in {runs!r}")
    return {label: _readable(path) for label, path in pairs}


def newest_run(folder: Path) -> Path | None:
    """The newest run directly in ``folder`` (run ids begin with their start time), or None."""
    runs = sorted(p for p in folder.iterdir() if (p / DB_NAME).is_file()) if folder.is_dir() else []
    return runs[-1] if runs else None


def _runs_in(folder: Path) -> list[tuple[str, Path]]:
    """The runs in ``folder``, by id, and those one level down, by their folder's name (the newest run of each:
    ``workbench reproduce --train`` keeps each planned run in a folder named after it; a summary is named
    after its folder). Runs of other seeds than the first (``<name>-seed<k>``, ``workbench reproduce --seeds``)
    are left out: a report draws one seed's runs by their plan names."""
    found = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if SEED_FOLDER.match(child.name):
            continue
        if _is_run(child):
            found.append((child.name, child))
        elif (inner := newest_run(child)) is not None:
            found.append((child.name, inner))
    return found


def run_topology(run_dir: Path) -> str:
    """The name of the topology a run ran (``marsrl``, ``mars_cpu`` ...)."""
    with RunReader(run_dir) as reader:
        return str(reader.info()["topology"])


def select_runs(runs: Mapping[str, Path], topologies: Sequence[str], paper: str) -> dict[str, Path]:
    """The runs whose topology is one of ``topologies``: a paper's report draws only its own runs."""
    found = {label: run_topology(path) for label, path in runs.items()}
    picked = {label: runs[label] for label, name in found.items() if name in topologies}
    if not picked:
        ran = ", ".join(f"{label} ({name})" for label, name in found.items())
        raise ValueError(f"no {paper} run (topology {' or '.join(topologies)}) among: {ran}")
    return picked


def trained_runs(runs: Mapping[str, Path]) -> dict[str, Path]:
    """The training runs among ``runs`` (not rollouts: a tool ablation rolls out a trained model): what a
    figure of training curves draws."""
    kept = {}
    for label, path in runs.items():
        with RunReader(path) as reader:
            if reader.config.get("kind") != "rollout":
                kept[label] = path
    return kept


def metric_curves(runs: Mapping[str, Path], names: Sequence[str], role: str | None = None) -> pd.DataFrame:
    """Long frame (run, step, series, value) of run-wide metrics, or of one role's with ``role``."""
    frames = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            metrics = reader.metrics(name=list(names), role=role)
        if role is None:
            metrics = metrics[metrics["role"].isna()]
        frames.append(metrics.assign(run=label, series=metrics["name"])[["run", "step", "series", "value"]])
    return _concat(frames, ["run", "step", "series", "value"])


def role_metric(runs: Mapping[str, Path], name: str, roles: Sequence[str] | None = None) -> pd.DataFrame:
    """Long frame (run, step, role, value) of one per-role metric (``length/mean``, ``grad_share``...)."""
    frames = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            metrics = reader.metrics(name=name, role=list(roles) if roles else None)
        metrics = metrics[metrics["role"].notna()]
        frames.append(metrics.assign(run=label)[["run", "step", "role", "value"]])
    return _concat(frames, ["run", "step", "role", "value"])


def verifier_detection(runs: Mapping[str, Path], roles: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run and step, the Verifiers' error detection: accuracy and recall (MarsRL Fig. 5), pooled over the
    verifier roles (``roles``: those of them only); counted from the calls (``workbench.analysis.verdicts``)."""
    from workbench.analysis.verdicts import verdict_counts, verdict_measures, verifier_roles
    from workbench.topology import to_dict

    frames = []
    for label, run_dir in runs.items():
        judging = verifier_roles(to_dict(run_spec(run_dir)))
        found = verdict_measures(verdict_counts(run_dir, judging & set(roles or judging)))
        long = found[["accuracy", "recall"]].reset_index().melt("step", var_name="series", value_name="value")
        frames.append(long.assign(run=label).sort_values(["step", "series"], kind="stable"))
    return _concat(frames, ["run", "step", "series", "value"])


def eval_scores(runs: Mapping[str, Path]) -> pd.DataFrame:
    """Held-out scores per run, evaluation step, task and scorer (``outcome`` or a role's reward)."""
    rows = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            events = reader.events(kind="eval")
        for step, payload in zip(events["step"], events["payload"], strict=True):
            for task, scores in payload.get("tasks", {}).items():
                rows += [
                    {"run": label, "step": int(step), "task": task, "scorer": k, "value": float(v)}
                    for k, v in scores.items()
                ]
    return _concat([pd.DataFrame(rows)], ["run", "step", "task", "scorer", "value"])


def tool_shares(runs: Mapping[str, Path]) -> pd.DataFrame:
    """Per run, step and tool of the run's topology, that tool's share of the step's tool calls.

    Every tool the topology declares has a row at every step (share 0 when it was not called, NaN
    when no tool was called at all), so a figure has one panel per tool even before the model uses it.
    """
    rows = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            tools = sorted(run_spec(run_dir).tools)
            wide = reader.metrics_wide()
        for step, at in wide.iterrows():
            calls = at.get("tool_calls/per_question", float("nan"))
            for tool in tools:
                share = at.get(f"tool_share/{tool}", float("nan"))
                if pd.isna(share):
                    share = 0.0 if calls and not pd.isna(calls) else float("nan")
                rows.append({"run": label, "step": int(step), "series": tool, "value": float(share)})
    return _concat([pd.DataFrame(rows)], ["run", "step", "series", "value"])


def correct_counts(runs: Mapping[str, Path], step: int | None = None) -> pd.DataFrame:
    """Per run and task, how many of the task's sampled episodes in ``step`` (default: the first) were
    right (reward >= 1): best-of-N with N the group size (MARS Fig. 5)."""
    frames = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            first = reader.steps(complete_only=True)["step"].min() if step is None else step
            episodes = reader.episodes(step=int(first))
        if episodes.empty:
            continue
        right = (episodes["reward"].fillna(0.0) >= 1.0).astype(int)
        counts = right.groupby(episodes["task_id"]).agg(["sum", "size"]).reset_index()
        counts.columns = ["task", "correct", "n"]
        frames.append(counts.assign(run=label, step=int(first)))
    return _concat(frames, ["run", "step", "task", "n", "correct"])


def tool_volume(runs: Mapping[str, Path], by: str = "hops") -> pd.DataFrame:
    """Information gathered per question (MARS Table 4): per run, task group and tool, the mean number
    of calls and of results returned per episode. ``by`` names the task metadata key that groups tasks
    (its value, or ``all``)."""
    rows = []
    for label, run_dir in runs.items():
        with RunReader(run_dir) as reader:
            tools = sorted(run_spec(run_dir).tools)
            episodes = reader.episodes()
            calls = reader.calls(columns=["episode_id", "tool_results"])
        group = {
            e: str((m or {}).get(by, "all"))
            for e, m in zip(episodes["id"], episodes["task_meta"], strict=True)
        }
        totals = {(e, t): [0, 0] for e in group for t in tools}
        for episode_id, results in zip(calls["episode_id"], calls["tool_results"], strict=True):
            for info in results or []:
                key = (episode_id, info.get("name"))
                if key in totals:
                    totals[key][0] += 1
                    totals[key][1] += int(info.get("results", 0) or 0)
        for (episode_id, tool), (n_calls, n_results) in totals.items():
            rows.append(
                {"run": label, by: group[episode_id], "tool": tool, "calls": n_calls, "results": n_results}
            )
    frame = _concat([pd.DataFrame(rows)], ["run", by, "tool", "calls", "results"])
    if frame.empty:
        return frame
    return frame.groupby(["run", by, "tool"], as_index=False)[["calls", "results"]].mean()


def run_spec(run_dir: Path) -> Any:
    """The topology spec a run ran: saved beside it (a training run given a Topology object), stored whole
    in its config (a rollout), or named there (a built-in or a file)."""
    from workbench.topology import from_dict, load
    from workbench.training import TOPOLOGY_FILE

    if (Path(run_dir) / TOPOLOGY_FILE).is_file():
        return load(Path(run_dir) / TOPOLOGY_FILE)
    with RunReader(run_dir) as reader:
        stored = reader.config["topology"]
    return from_dict(stored) if isinstance(stored, Mapping) else load(stored)


def tools_used(run_dir: Path) -> list[str]:
    """The tools the run's nodes (of its flow and subflows) could call; a search whose options block every
    document of the knowledge base (a tool ablation) is not counted."""
    topology = run_spec(run_dir)
    flows = [topology.flow, *topology.subflows.values()]
    named = {
        tool for flow in flows for node in flow.nodes.values() for tool in getattr(node, "tools", None) or []
    }
    blind = {name for name, tool in topology.tools.items() if "kb://" in tool.options.get("blocklist", [])}
    return sorted(named - blind)


def entry_role(run_dir: Path) -> str:
    """The role of the flow's first node (MATPO's planner, a single agent's only role)."""
    topology = run_spec(run_dir)
    node = topology.flow.nodes[topology.flow.start]
    return str(getattr(node, "agent", None) or next(iter(topology.roles)))


def benchmark_of(run_dir: Path) -> str:
    """The task set a run ran on: a training run's ``tasks`` setting (a generator or a file), else the
    ``source`` its tasks' metadata names."""
    with RunReader(run_dir) as reader:
        tasks = reader.config.get("tasks")
        if isinstance(tasks, str):
            return Path(tasks).stem
        first = reader.sql("SELECT task_meta FROM episodes WHERE task_meta IS NOT NULL ORDER BY id LIMIT 1")
    meta = first["task_meta"].iloc[0] if len(first) else {}
    return str(meta.get("source") or "tasks")


def heldout_accuracy(runs: Mapping[str, Path]) -> pd.DataFrame:
    """Per run and evaluation step, the percentage of held-out tasks answered right (outcome >= 1)."""
    scores = eval_scores(runs)
    outcome = scores[scores["scorer"] == "outcome"]
    if outcome.empty:
        return pd.DataFrame(columns=["run", "step", "value"])
    right = outcome.assign(value=100.0 * (outcome["value"] >= 1.0))
    return right.groupby(["run", "step"], as_index=False)["value"].mean()


def episode_stats(runs: Mapping[str, Path], by: str = "hops", step: int | None = None) -> pd.DataFrame:
    """Per run and episode of ``step`` (default: the last complete one; a rollout has one): the task group
    (metadata ``by``), whether it was right (reward >= 1), the entry role's output tokens and tool calls
    (HiRA Fig. 5's reasoning length and interactions), and all calls' output tokens."""
    frames = []
    for label, run_dir in runs.items():
        role = entry_role(run_dir)
        with RunReader(run_dir) as reader:
            at = reader.last_complete_step() if step is None else step
            if at is None:
                continue
            episodes = reader.episodes(step=at)
            calls = reader.calls(step=at, columns=["episode_id", "role", "n_completion", "tool_calls"])
        entry = calls[calls["role"] == role]
        n_tools = entry["tool_calls"].map(lambda c: len(c or []))
        frame = pd.DataFrame(
            {
                "run": label,
                "step": at,
                "episode": episodes["id"],
                "task": episodes["task_id"],
                by: [str((m or {}).get(by, "all")) for m in episodes["task_meta"]],
                "correct": (episodes["reward"].fillna(0.0) >= 1.0).astype(float),
            }
        )
        frame["entry_tokens"] = (
            frame["episode"].map(entry.groupby("episode_id")["n_completion"].sum()).fillna(0)
        )
        frame["interactions"] = frame["episode"].map(n_tools.groupby(entry["episode_id"]).sum()).fillna(0)
        frame["all_tokens"] = (
            frame["episode"].map(calls.groupby("episode_id")["n_completion"].sum()).fillna(0)
        )
        frames.append(frame)
    return _concat(
        frames,
        ["run", "step", "episode", "task", by, "correct", "entry_tokens", "interactions", "all_tokens"],
    )


def orchestration(runs: Mapping[str, Path], by: str = "axis") -> pd.DataFrame:
    """MAS-Orchestra per run, step and episode: the task group (metadata ``by`` and ``axis_value``),
    whether it was right, the sub-agents the entry role (the orchestrator) declared (their types, ``|``
    joined, and how many: the degree of MAS, 0 for a direct answer), and the episode's cost: LLM
    calls and prompt plus completion tokens."""
    frames = []
    for label, run_dir in runs.items():
        role = entry_role(run_dir)
        with RunReader(run_dir) as reader:
            episodes = reader.episodes()
            calls = reader.calls(columns=["episode_id", "role", "n_prompt", "n_completion", "action"])
        if episodes.empty:
            continue
        first = calls[calls["role"] == role].groupby("episode_id")["action"].first()
        agents = first.map(lambda a: [g.get("name", "?") for g in (a or {}).get("agents", [])])
        tokens = (
            (calls["n_prompt"].fillna(0) + calls["n_completion"].fillna(0)).groupby(calls["episode_id"]).sum()
        )
        meta = episodes["task_meta"].map(lambda m: m if isinstance(m, Mapping) else {})
        frame = pd.DataFrame(
            {
                "run": label,
                "step": episodes["step"],
                "episode": episodes["id"],
                by: meta.map(lambda m: str(m.get(by, "all"))),
                "value": meta.map(lambda m: m.get("axis_value")),
                "correct": (episodes["reward"].fillna(0.0) >= 1.0).astype(float),
            }
        )
        listed = frame["episode"].map(agents).map(lambda a: a if isinstance(a, list) else [])
        frame["agents"] = listed.map("|".join)
        frame["degree"] = listed.map(len)
        frame["calls"] = frame["episode"].map(calls.groupby("episode_id").size()).fillna(0)
        frame["tokens"] = frame["episode"].map(tokens).fillna(0)
        frames.append(frame)
    columns = ["run", "step", "episode", by, "value", "correct", "agents", "degree", "calls", "tokens"]
    return _concat(frames, columns)


def topology_param(run_dir: Path, name: str) -> object:
    """A ``params`` value of the run's topology (HiRA's ``max_subtasks``), or None."""
    return run_spec(run_dir).params.get(name)


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]

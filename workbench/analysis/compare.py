"""Compare runs side by side: their config diff, seed groups, curves, and held-out outcomes.

    comparison = Comparison(["runs/a", "runs/b", "reports/runs/marsrl"])   # run folders, run.db files, summaries
    comparison.diff            # the config fields on which the runs differ, and only those (dotted keys)
    comparison.groups          # runs that differ only in seed-like fields, grouped: {group label: [run labels]}
    comparison.curves()        # per run: panel, series, step, wall_s, samples, value
    comparison.group_curves()  # per group: the mean across its seeds and its standard error, per step
    comparison.outcomes()      # per run and group: held-out scores before and after, per role, paired SEs
    comparison.outcomes_csv()

A run is named by its folder (a run id, or a summary's folder name). Configs are flattened to dotted keys;
where a run was written (``runs_dir``, ``run_id``) is never a difference. A group's key is the config diff
without its seed-like fields (``seed``, ``*_seed``): three seeds of one config are one group, named after
the fields that set it apart from the other groups.

Held-out outcomes come from a run's first and last ``eval`` events (``workbench.rl.evaluation``: each task's
outcome reward and each rewarded role's reward). The rise from before to after and its standard error are
``paired_rise`` over the same tasks; a group's per-task scores are its seeds' means, task by task, so its
standard error is still a paired one over tasks. Each run (group) is also compared with the first run (group)
on the scores after training, paired where both were evaluated on the same tasks (else left empty).

A role's score is its own reward, so a Verifier rewarded with the trajectory's outcome scores the outcome, not
its verdicts. Each Verifier (a role whose parser reads a verdict) therefore also has a held-out ``<role>: verdicts
right`` row where the run's evaluations score its verdicts (``verdicts:<role>``, stored since 2026-11-28; older
runs and summaries have none): per task the share of its verdicts that were right against the truth of what it
judged, before and after, with the paired rise and SE like every held-out row. A run with Verifiers also has a
training-time ``verdicts right`` row, counted the same way whatever the reward (``workbench.analysis.verdicts``):
the share of its Verifiers' verdicts that were right, on the problems of its first complete step (before) and of
its last (after), each step's problems new to the policy that judged them; its standard errors are those of
independent proportions (other problems, other samples), and it is compared with the first run that has one.

Curves are read from the store (``RunReader.metrics``) or from frames a caller already holds (the dashboard's
shared polls: ``metrics=``); wall time is the running sum of a run's ``time/step_s``, samples seen the
running sum of its run-wide ``samples``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.analysis.verdicts import verdict_counts, verdict_measures, verifier_roles
from workbench.rl.evaluation import OUTCOME, VERDICTS_PREFIX, paired_rise
from workbench.store import RunReader
from workbench.store.layout import DB_NAME
from workbench.store.summary import is_summary, open_summary

#: The summaries of the report plan's runs, committed with the repository (what the gallery draws).
COMMITTED_RUNS = Path(__file__).resolve().parents[2] / "reports" / "runs"
#: Config fields that say where a run was written, not what it did: never a difference.
IGNORED_FIELDS = frozenset({"runs_dir", "run_id"})
#: The label of run-wide metric rows (stored with no role).
RUN_WIDE = "run"
#: The label of the outcome (final answer) score in the outcomes table.
SYSTEM = "system"
#: The label of the Verifiers' verdicts in the outcomes table (``verdicts``).
VERDICTS = "verdicts right"
OUTCOME_COLUMNS = [
    "name", "kind", "runs", "score", "tasks", "before", "after", "rise", "se", "z", "vs", "diff", "diff_se",
]  # fmt: skip

Scores = Mapping[str, Mapping[str, float]]
#: Verdicts right and verdicts asked for, on a run's first and last complete steps.
Verdicts = tuple[tuple[float, float], tuple[float, float]]


@dataclass(frozen=True)
class Panel:
    """One plot of the comparison: a title and the metrics it draws, by name or by a name prefix (each
    matching metric a series, named without the prefix); a series is a role where stored per role."""

    title: str
    names: tuple[str, ...] = ()
    prefix: str | None = None
    #: a prefix panel leaves out the metrics whose name holds one of these (counts beside the scores)
    skip: tuple[str, ...] = ()


PANELS = (
    Panel("reward", ("reward/mean",)),
    # each role's training accuracy beside the verifiers' verdict accuracy
    Panel("accuracy", ("accuracy", "verifier/verdict_accuracy")),
    Panel("response length (tokens)", ("length/mean",)),
    Panel("entropy", ("entropy",)),
    Panel("gradient share", ("grad_share",)),
    Panel("held-out scores", prefix="eval/", skip=("/verdicts/",)),
)
#: The x axes a comparison can draw its curves along.
X_AXES = ("step", "wall_s", "samples")


# ---------------------------------------------------------------------------------------------- the runs
def run_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The run directory of ``source``: a run folder, its ``run.db``, or a summary (built once as a run
    under ``cache_dir``, by default the workbench cache's ``summaries/``, and read like any run)."""
    path = Path(source).expanduser()
    if path.name == DB_NAME and path.is_file():
        return path.parent
    if (path / DB_NAME).is_file():
        return path
    if is_summary(path):
        if cache_dir is None:
            from workbench.models.cache import cache_root

            cache_dir = cache_root() / "summaries"
        return open_summary(path, cache_dir)
    raise FileNotFoundError(f"{path} is neither a run folder, a {DB_NAME} nor a run summary")


def committed_summaries() -> dict[str, Path]:
    """The committed summaries (``reports/runs/<name>``) by name."""
    if not COMMITTED_RUNS.is_dir():
        return {}
    return {p.name: p for p in sorted(COMMITTED_RUNS.iterdir()) if is_summary(p)}


#: A training run's topology, saved beside its store when it is not a library one as it stands.
TOPOLOGY_FILE = "topology.yaml"


def run_config(run_dir: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """A run's config with its topology as the whole spec it ran (saved beside the run, a rollout's own spec,
    or the library's by name, with every default filled in), so a changed reward or prompt is a difference
    like any field; the name stays where no spec can be read."""
    from workbench import topology

    found = dict(config)
    spec = config.get("topology")
    try:
        if (run_dir / TOPOLOGY_FILE).is_file():
            found["topology"] = topology.to_dict(topology.load(run_dir / TOPOLOGY_FILE))
        elif isinstance(spec, Mapping):
            found["topology"] = topology.to_dict(topology.from_dict(dict(spec)))
        elif isinstance(spec, str) and spec:
            found["topology"] = topology.to_dict(topology.load(spec))
    except Exception:  # noqa: BLE001 - a spec this code cannot read is compared as stored
        pass
    return found


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and other values kept as they are."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def is_seed_field(key: str) -> bool:
    """Whether a dotted config key is a seed (``seed``, ``rollout.seed``, ``data_seed``)."""
    last = key.rsplit(".", 1)[-1]
    return last == "seed" or last.endswith("_seed")


_MISSING = object()


def _text(value: Any) -> str:
    """A config value as one comparable, readable string (``—`` where a run has no such field)."""
    if value is _MISSING:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def config_diff(configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """The fields (dotted keys, in order) on which ``configs`` (label -> config) differ: one row per field,
    one column per run, each value as text (``—`` where a run lacks the field)."""
    flat = {label: flatten(config) for label, config in configs.items()}
    keys: list[str] = []
    for config in flat.values():
        keys += [k for k in config if k not in keys and k not in IGNORED_FIELDS]
    rows = {}
    for key in keys:
        values = [_text(config.get(key, _MISSING)) for config in flat.values()]
        if len(set(values)) > 1:
            rows[key] = values
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=list(flat))
    frame.index.name = "field"
    return frame


def seed_groups(diff: pd.DataFrame) -> dict[str, list[str]]:
    """Runs grouped by their config diff without its seed-like fields (the group's key): group label -> run
    labels, groups in the order of their first run. A group is labelled by the fields that set it apart
    (``learning_rate=0.001``; the first two, each by its last two dotted parts), ``all runs`` where only
    seeds differ."""
    keys = [k for k in diff.index if not is_seed_field(k)]
    by_key: dict[tuple[str, ...], list[str]] = {}
    for label in diff.columns:
        by_key.setdefault(tuple(diff.at[k, label] for k in keys), []).append(label)
    groups: dict[str, list[str]] = {}
    for values, runs in by_key.items():
        others = [other for other in by_key if other != values]
        # named by the fields whose value no other group has (else every field), the first two of them
        apart = [i for i, v in enumerate(values) if all(other[i] != v for other in others)]
        apart = apart or list(range(len(keys)))
        parts = [f"{_short_key(keys[i])}={_short_value(values[i])}" for i in apart]
        name = ", ".join(parts[:2]) + (f" (+{len(parts) - 2} fields)" if len(parts) > 2 else "") or "all runs"
        if name in groups:
            name = f"{name} [{runs[0]}]"
        groups[name] = runs
    return groups


def _short_key(key: str) -> str:
    return ".".join(key.split(".")[-2:])


def _short_value(value: str, limit: int = 24) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------- curves
def run_curves(metrics: pd.DataFrame, panels: Sequence[Panel] = PANELS) -> pd.DataFrame:
    """One run's curves in long form (panel, series, step, wall_s, samples, value) from its metric rows
    (step, role, name, value; role empty or ``run`` for run-wide rows)."""
    columns = ["panel", "series", "step", "wall_s", "samples", "value"]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    rows = metrics[["step", "role", "name", "value"]].copy()
    rows["role"] = rows["role"].fillna(RUN_WIDE)
    run_wide = rows[rows["role"] == RUN_WIDE]
    axes = pd.DataFrame(index=sorted(rows["step"].unique()))
    for column, name in (("wall_s", "time/step_s"), ("samples", "samples")):
        per_step = run_wide[run_wide["name"] == name].groupby("step")["value"].last()
        axes[column] = per_step.reindex(axes.index).fillna(0.0).cumsum() if not per_step.empty else math.nan
    parts = []
    for panel in panels:
        if panel.prefix is not None:
            chosen = rows[rows["name"].str.startswith(panel.prefix)]
            for part in panel.skip:
                chosen = chosen[~chosen["name"].str.contains(part, regex=False)]
            series = chosen["name"].str.slice(len(panel.prefix))
        else:
            chosen = rows[rows["name"].isin(panel.names)]
            several = len(panel.names) > 1
            series = chosen["role"] + " · " + chosen["name"] if several else chosen["role"]
        if chosen.empty:
            continue
        part = pd.DataFrame(
            {"panel": panel.title, "series": series, "step": chosen["step"], "value": chosen["value"]}
        )
        parts.append(part.drop_duplicates(["series", "step"], keep="last"))
    if not parts:
        return pd.DataFrame(columns=columns)
    found = pd.concat(parts, ignore_index=True)
    found["step"] = found["step"].astype(int)
    found["value"] = found["value"].astype(float)
    found = found.join(axes, on="step")
    return found[columns].sort_values(["panel", "series", "step"], ignore_index=True)


def group_curves(curves: pd.DataFrame, groups: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    """Each group's curves (``curves``: per run, with a ``run`` column) as the mean across its runs at each
    step, its standard error and the number of runs there: group, panel, series, step, wall_s, samples,
    mean, se, n (the x axes are the runs' means)."""
    columns = ["group", "panel", "series", "step", "wall_s", "samples", "mean", "se", "n"]
    member = {run: group for group, runs in groups.items() for run in runs}
    frame = curves[curves["run"].isin(member)].copy()
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["group"] = frame["run"].map(member)
    keys = ["group", "panel", "series", "step"]
    grouped = frame.groupby(keys, sort=False)
    found = grouped[["wall_s", "samples"]].mean()
    found["mean"] = grouped["value"].mean()
    found["n"] = grouped["value"].count()
    std = grouped["value"].std(ddof=1).fillna(0.0)
    found["se"] = std / found["n"].pow(0.5)
    found = found.reset_index()
    order = {name: i for i, name in enumerate(groups)}
    found = found.sort_values(
        ["group", "panel", "series", "step"], key=lambda s: s.map(order) if s.name == "group" else s
    )
    return found[columns].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- outcomes
def held_out(reader: RunReader) -> tuple[Scores, Scores] | None:
    """A run's held-out scores per task before training and after it: its first and last ``eval`` events
    (None: fewer than two)."""
    events = reader.events(kind="eval")
    if len(events) < 2:
        return None
    return events["payload"].iloc[0]["tasks"], events["payload"].iloc[-1]["tasks"]


def task_means(tables: Sequence[Scores]) -> dict[str, dict[str, float]]:
    """Per task (those every table scored) and score key, the mean across ``tables`` (a group's seeds)."""
    if not tables:
        return {}
    common = [t for t in tables[0] if all(t in table for table in tables[1:])]
    found: dict[str, dict[str, float]] = {}
    for task in common:
        keys = set.intersection(*(set(table[task]) for table in tables))
        found[task] = {k: sum(float(table[task][k]) for table in tables) / len(tables) for k in sorted(keys)}
    return found


def _rise(before: Scores, after: Scores, key: str) -> tuple[float, float]:
    try:
        rise, se, _ = paired_rise(before, after, key)
    except ValueError:  # fewer than two tasks scored on key in both
        return math.nan, math.nan
    return rise, se


def outcome_rows(
    name: str, kind: str, runs: int, before: Scores, after: Scores, baseline: tuple[str, Scores] | None
) -> list[dict[str, Any]]:
    """The outcome rows of one run or group: per score (each role's, then the system's final answer) the
    held-out mean before and after, the paired rise and its SE, and the paired difference of the scores after
    from ``baseline``'s (its name and per-task scores after) where both hold the same tasks."""
    found = {k for scores in before.values() for k in scores} - {OUTCOME}
    judged = sorted(k for k in found if k.startswith(VERDICTS_PREFIX))
    keys = sorted(found - set(judged)) + judged + [OUTCOME]
    same_tasks = baseline is not None and baseline[0] != name and set(baseline[1]) == set(after)
    rows = []
    for key in keys:
        scored = [s[key] for s in before.values() if key in s]
        if not scored:
            continue
        mean_before = sum(scored) / len(scored)
        after_scores = [s[key] for s in after.values() if key in s]
        mean_after = sum(after_scores) / len(after_scores) if after_scores else math.nan
        rise, se = _rise(before, after, key)
        diff, diff_se = _rise(baseline[1], after, key) if same_tasks else (math.nan, math.nan)
        rows.append({
            "name": name, "kind": kind, "runs": runs, "score": _score_label(key),
            "tasks": len(before), "before": mean_before, "after": mean_after, "rise": rise, "se": se,
            "z": rise / se if se and not math.isnan(se) else math.nan,
            "vs": baseline[0] if same_tasks else "", "diff": diff, "diff_se": diff_se,
        })  # fmt: skip
    return rows


def verdicts_score(role: str) -> str:
    """The outcomes table's label of a Verifier's held-out verdicts right (``verifier1: verdicts right``)."""
    return f"{role}: {VERDICTS}"


def _score_label(key: str) -> str:
    if key == OUTCOME:
        return SYSTEM
    if key.startswith(VERDICTS_PREFIX):
        return verdicts_score(key[len(VERDICTS_PREFIX) :])
    return key


def verdicts(run_dir: Path, spec: Any) -> Verdicts | None:
    """A run's Verifiers' verdicts right and asked for, on its first and last complete steps (None: no Verifier,
    fewer than two complete steps, or no verdict on either)."""
    judges = verifier_roles(spec) if isinstance(spec, Mapping) else set()
    if not judges:
        return None
    marks = ", ".join("?" * len(judges))
    with RunReader(run_dir) as reader:  # the first and last complete steps with a Verifier's call
        first, last = reader.sql(
            "SELECT min(c.step), max(c.step) FROM calls c JOIN steps s ON s.step = c.step "
            f"WHERE s.status = 'complete' AND c.role IN ({marks})",
            sorted(judges),
        ).iloc[0]
    if pd.isna(first) or first == last:
        return None
    found = verdict_measures(verdict_counts(run_dir, judges, [int(first), int(last)]))
    if len(found) < 2:
        return None
    return tuple((float(row.right), float(row.judged)) for row in found.iloc[[0, -1]].itertuples())  # type: ignore[return-value]


def _proportions(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """b's share minus a's, and the standard error of that difference of independent proportions."""
    p, q = a[0] / a[1], b[0] / b[1]
    return q - p, math.sqrt(p * (1 - p) / a[1] + q * (1 - q) / b[1])


def verdict_row(name: str, found: Verdicts, baseline: tuple[str, Verdicts] | None) -> dict[str, Any]:
    """The ``verdicts right`` row of one run (see the module's docstring)."""
    (before, after), compared = found, baseline is not None and baseline[0] != name
    rise, se = _proportions(before, after)
    diff, diff_se = _proportions(baseline[1][1], after) if compared else (math.nan, math.nan)
    return {
        "name": name, "kind": "run", "runs": 1, "score": VERDICTS, "tasks": int(after[1]),
        "before": before[0] / before[1], "after": after[0] / after[1], "rise": rise, "se": se,
        "z": rise / se if se else math.nan, "vs": baseline[0] if compared else "", "diff": diff, "diff_se": diff_se,
    }  # fmt: skip


def outcomes(
    evaluations: Mapping[str, tuple[Scores, Scores] | None],
    groups: Mapping[str, Sequence[str]],
    verdicts: Mapping[str, Verdicts | None] | None = None,
) -> pd.DataFrame:
    """The outcomes table (``OUTCOME_COLUMNS``): one block of rows per group of more than one run (its seeds'
    per-task means), then one per run (its ``verdicts right`` row last, where ``verdicts`` has one); runs without
    two evaluations are left out. Groups are compared with the first group, runs with the first run
    (``outcome_rows``, ``verdict_row``)."""
    rows: list[dict[str, Any]] = []
    group_scores = {}
    for group, members in groups.items():
        tables = [evaluations[m] for m in members if evaluations.get(m) is not None]
        if len(members) > 1 and len(tables) == len(members):
            group_scores[group] = (task_means([t[0] for t in tables]), task_means([t[1] for t in tables]))
    first = next(iter(group_scores.items()), None)
    for group, (before, after) in group_scores.items():
        baseline = (first[0], first[1][1]) if first else None
        rows += outcome_rows(group, "group", len(groups[group]), before, after, baseline)
    run_scores = {label: found for label, found in evaluations.items() if found is not None}
    first_run = next(iter(run_scores.items()), None)
    judged = {label: found for label, found in (verdicts or {}).items() if found is not None}
    first_judged = next(iter(judged.items()), None)
    for label, (before, after) in run_scores.items():
        baseline = (first_run[0], first_run[1][1]) if first_run else None
        rows += outcome_rows(label, "run", 1, before, after, baseline)
        if label in judged:
            rows.append(verdict_row(label, judged[label], first_judged))
    return pd.DataFrame(rows, columns=OUTCOME_COLUMNS)


# ---------------------------------------------------------------------------------------------- together
def _labels(paths: Sequence[Path]) -> list[str]:
    labels: list[str] = []
    for path in paths:
        label, n = path.name, 2
        while label in labels:
            label, n = f"{path.name} ({n})", n + 1
        labels.append(label)
    return labels


class Comparison:
    """Several runs side by side (see the module's docstring).

    ``runs``: run folders, ``run.db`` files or summaries, or a mapping label -> one of them; ``metrics``: a
    function giving a run directory's metric rows (default: read from its store each time ``curves`` is
    called); ``cache_dir``: where summaries are built as runs."""

    def __init__(
        self,
        runs: Mapping[str, str | Path] | Sequence[str | Path],
        metrics: Callable[[Path], pd.DataFrame] | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        if isinstance(runs, Mapping):
            labels, sources = [str(k) for k in runs], [Path(v) for v in runs.values()]
        else:
            sources = [Path(r) for r in runs]
            labels = _labels(sources)
        if not sources:
            raise ValueError("a comparison needs at least one run")
        #: label -> the run directory read (a summary's is built under the cache)
        self.runs = {
            label: run_path(source, cache_dir) for label, source in zip(labels, sources, strict=True)
        }
        #: the labels of the runs opened from a summary (read-only copies)
        self.summaries = {label for label, source in zip(labels, sources, strict=True) if is_summary(source)}
        self._metrics = metrics or _stored_metrics
        self.configs: dict[str, dict[str, Any]] = {}
        self.statuses: dict[str, str] = {}
        self.evaluations: dict[str, tuple[Scores, Scores] | None] = {}
        #: label -> its Verifiers' verdicts right and asked for, first and last complete step (``verdicts``)
        self.verdicts: dict[str, Verdicts | None] = {}
        for label, run_dir in self.runs.items():
            with RunReader(run_dir) as reader:
                info = reader.info()
                self.configs[label] = run_config(run_dir, info["config"])
                self.statuses[label] = info["status"]
                self.evaluations[label] = held_out(reader)
            self.verdicts[label] = verdicts(run_dir, self.configs[label].get("topology"))
        #: the fields on which the runs differ (rows) per run (columns)
        self.diff = config_diff(self.configs)
        #: group label -> run labels (runs that differ only in seed-like fields)
        self.groups = seed_groups(self.diff)

    def refresh_outcomes(self) -> None:
        """Read the runs' evaluations again (a running run's last evaluation comes when it finishes)."""
        for label, run_dir in self.runs.items():
            with RunReader(run_dir) as reader:
                self.statuses[label] = reader.info()["status"]
                self.evaluations[label] = held_out(reader)
            self.verdicts[label] = verdicts(run_dir, self.configs[label].get("topology"))

    def curves(self, panels: Sequence[Panel] = PANELS) -> pd.DataFrame:
        """Every run's curves: run, panel, series, step, wall_s, samples, value."""
        parts = []
        for label, run_dir in self.runs.items():
            found = run_curves(self._metrics(run_dir), panels)
            found.insert(0, "run", label)
            parts.append(found)
        return pd.concat(parts, ignore_index=True)

    def group_curves(self, curves: pd.DataFrame | None = None) -> pd.DataFrame:
        """Each group's mean curves and standard errors (``group_curves``) from ``curves`` (default: read now)."""
        return group_curves(self.curves() if curves is None else curves, self.groups)

    def outcomes(self) -> pd.DataFrame:
        """The held-out outcomes per group and run (``outcomes``)."""
        return outcomes(self.evaluations, self.groups, self.verdicts)

    def outcomes_csv(self) -> str:
        """The outcomes table as CSV text."""
        return self.outcomes().to_csv(index=False, float_format="%.4g")

    def __repr__(self) -> str:
        return f"Comparison({list(self.runs)}, groups={list(self.groups)})"

    def _repr_html_(self) -> str:
        """In a notebook: the groups, the config diff and the outcomes (``widgets.Compare`` draws the curves)."""
        groups = "".join(
            f"<li><b>{html.escape(g)}</b>: {html.escape(', '.join(r))}</li>" for g, r in self.groups.items()
        )
        return (
            f"<p>Groups (runs that differ only in seed-like fields):</p><ul>{groups}</ul>"
            f"<p>Config diff:</p>{self.diff.to_html() if not self.diff.empty else '<p>(the same configs)</p>'}"
            f"<p>Held-out outcomes (paired standard errors):</p>{self.outcomes().to_html(index=False, float_format='%.3f')}"
        )


def _stored_metrics(run_dir: Path) -> pd.DataFrame:
    with RunReader(run_dir) as reader:
        return reader.metrics()


__all__ = [
    "COMMITTED_RUNS",
    "IGNORED_FIELDS",
    "OUTCOME_COLUMNS",
    "PANELS",
    "VERDICTS",
    "X_AXES",
    "Comparison",
    "Panel",
    "committed_summaries",
    "config_diff",
    "flatten",
    "group_curves",
    "held_out",
    "is_seed_field",
    "outcomes",
    "run_curves",
    "run_config",
    "run_path",
    "seed_groups",
    "task_means",
    "verdict_row",
    "verdicts",
    "verdicts_score",
]

"""The gallery's claims across seeds: each claim's measure read from the report plan's runs (or their summaries) of
every seed, the mean across seeds with its standard error, and a verdict judged across seeds.

The runs of seed 0 are in ``<folder>/<name>/``, those of seed k in ``<folder>/<name>-seed<k>/``
(``workbench.reports.plan.seed_folder``: ``workbench reproduce all --train --seeds 0,1,2 --summaries reports/runs``).
A claim's measure is one number per seed (a held-out score after training minus before, paired by task; or the
difference between the two runs of a comparison, paired by task where they share tasks), shown with its standard
error within the seed. Across seeds: the mean, its standard error ``SE = sd / sqrt(n)`` (``sd`` with the ``n - 1``
denominator), and the verdict (``verdict``):

- **holds**: at least two seeds, the mean above 2 SE across seeds, and every seed's value above zero;
- **reversed**: at least two seeds, the mean below -2 SE, and every seed's value below zero;
- **not shown**: at least two seeds and neither;
- **one seed**: a single seed's runs (no spread across seeds to judge by: its own SE is shown, no verdict);
- **no runs**: no seed has all the claim's runs.

``write_seeds_table`` puts the table into docs/gallery.md between ``<!-- seeds:begin -->`` and
``<!-- seeds:end -->`` (``workbench reproduce all --seeds-table``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.reports.plan import PLAN
from workbench.reports.reproduce import REPORTS_DIR
from workbench.reports.seed_folders import split_seed

#: The gallery the table goes into, and its markers.
GALLERY = REPORTS_DIR.parent / "docs" / "gallery.md"
BEGIN, END = "<!-- seeds:begin -->", "<!-- seeds:end -->"
#: The seeds the plan's claims are to be judged on: always a column each in the table.
PLANNED_SEEDS = (0, 1, 2)
#: How many of a training run's last steps the Verifier's verdicts are pooled over.
LAST_STEPS = 5


@dataclass(frozen=True)
class Measured:
    """One seed's value of a claim's measure, with its standard error within the seed (NaN: none) and ``n``, the
    tasks (or verdicts, episodes) it is taken over."""

    value: float
    se: float = math.nan
    n: int = 0


@dataclass(frozen=True)
class Claim:
    """A claim of the gallery: ``measure`` (in words) computed by ``compute`` from the runs ``runs`` (the plan's
    names) of one seed, given as readable run directories by name; positive where the claim holds."""

    paper: str
    claim: str
    measure: str
    runs: tuple[str, ...]
    compute: Callable[[Mapping[str, Path]], Measured]


@dataclass(frozen=True)
class ClaimRow:
    """A claim's values by seed, their mean and standard error across seeds, and the verdict."""

    claim: Claim
    by_seed: Mapping[int, Measured]

    @property
    def values(self) -> list[float]:
        return [m.value for _, m in sorted(self.by_seed.items()) if math.isfinite(m.value)]

    @property
    def mean_se(self) -> tuple[float, float]:
        return mean_se(self.values)

    @property
    def verdict(self) -> str:
        return verdict(self.values)


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error, ``sd / sqrt(n)`` with the ``n - 1`` denominator (NaN for
    fewer than two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd / math.sqrt(n)


def verdict(values: Sequence[float]) -> str:
    """``holds`` where at least two seeds' values have a mean above 2 SE across seeds and every one is above
    zero; ``reversed`` the same the other way; ``not shown`` otherwise; ``one seed`` for one value; ``no runs``
    for none (NaN values are left out)."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "no runs"
    if len(values) == 1:
        return "one seed"
    mean, se = mean_se(values)
    if mean > 2 * se and all(v > 0 for v in values):
        return "holds"
    if mean < -2 * se and all(v < 0 for v in values):
        return "reversed"
    return "not shown"


# --- the measures --------------------------------------------------------------------------------------------


def exact_scores(run_dir: Path, when: str = "after") -> pd.Series:
    """Per task, 1.0 where it was answered exactly right (outcome >= 1): a training run's held-out scores at its
    first evaluation (``before``) or its last (``after``); a rollout's episodes (the mean over a task's)."""
    from workbench.store import RunReader

    with RunReader(run_dir) as reader:
        if reader.config.get("kind") == "rollout":
            episodes = reader.episodes()
            right = (episodes["reward"].fillna(0.0) >= 1.0).astype(float)
            return right.groupby(episodes["task_id"]).mean()
        events = reader.events(kind="eval")
    if events.empty:
        return pd.Series(dtype=float)
    events = events.sort_values("step", kind="stable")
    payload = events["payload"].iloc[0 if when == "before" else -1]
    return pd.Series(
        {
            task: float(scores.get("outcome", 0.0) >= 1.0)
            for task, scores in (payload.get("tasks") or {}).items()
        },
        dtype=float,
    )


def difference(a: pd.Series, b: pd.Series) -> Measured:
    """``a`` - ``b`` in mean: paired over the tasks both have where they share some, else of the two means."""
    shared = a.index.intersection(b.index)
    if len(shared):
        d = a[shared] - b[shared]
        se = float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.nan
        return Measured(float(d.mean()), se, len(d))
    if a.empty or b.empty:
        return Measured(math.nan)
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)) if min(len(a), len(b)) > 1 else math.nan
    return Measured(float(a.mean() - b.mean()), se, min(len(a), len(b)))


def gain(name: str) -> Callable[[Mapping[str, Path]], Measured]:
    """Run ``name``'s held-out exact accuracy after training minus before, paired by task."""
    return lambda runs: difference(exact_scores(runs[name], "after"), exact_scores(runs[name], "before"))


def compared(a: str, b: str) -> Callable[[Mapping[str, Path]], Measured]:
    """Run ``a``'s exact accuracy (after training) minus run ``b``'s, paired by task."""
    return lambda runs: difference(exact_scores(runs[a], "after"), exact_scores(runs[b], "after"))


def verdicts_right(run_dir: Path, last: int = LAST_STEPS) -> tuple[float, int]:
    """The share of the Verifiers' verdicts that were right over a run's ``last`` training steps (MarsRL Fig. 5's
    accuracy, pooled), and how many verdicts were asked for."""
    from workbench.analysis.verdicts import verdict_counts, verdict_measures, verifier_roles
    from workbench.reports.series import run_spec
    from workbench.topology import to_dict

    counts = verdict_counts(run_dir, verifier_roles(to_dict(run_spec(run_dir))))
    if counts.empty:
        return math.nan, 0
    measures = verdict_measures(counts.sort_index().tail(last))
    judged = int(measures["judged"].sum())
    return (float(measures["right"].sum()) / judged if judged else math.nan), judged


def verifier_gap(a: str, b: str) -> Callable[[Mapping[str, Path]], Measured]:
    """The Verifiers' verdicts right over the last training steps, run ``a`` minus run ``b`` (two proportions)."""

    def compute(runs: Mapping[str, Path]) -> Measured:
        (pa, na), (pb, nb) = verdicts_right(runs[a]), verdicts_right(runs[b])
        if not (na and nb) or math.isnan(pa) or math.isnan(pb):
            return Measured(math.nan)
        return Measured(pa - pb, math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb), min(na, nb))

    return compute


def degree_slope(name: str) -> Callable[[Mapping[str, Path]], Measured]:
    """MAS-Orchestra: sub-agents per unit of the task's depth (least squares over the episodes of the last third of
    training steps that declared sub-agents); 1.0: one sub-agent per step of the chain."""

    def compute(runs: Mapping[str, Path]) -> Measured:
        from workbench.reports.series import orchestration

        frame = orchestration({name: runs[name]})
        if frame.empty:
            return Measured(math.nan)
        steps = sorted(frame["step"].unique())
        late = frame[(frame["step"] >= steps[len(steps) * 2 // 3]) & (frame["degree"] > 0)]
        x = pd.to_numeric(late["value"], errors="coerce")
        y = late["degree"].astype(float)[x.notna()]
        x = x.dropna().astype(float)
        if len(x) < 3 or x.nunique() < 2:
            return Measured(math.nan, n=len(x))
        dx = x - x.mean()
        slope = float((dx * (y - y.mean())).sum() / (dx**2).sum())
        residuals = y - y.mean() - slope * dx
        se = math.sqrt(float((residuals**2).sum()) / (len(x) - 2) / float((dx**2).sum()))
        return Measured(slope, se, len(x))

    return compute


#: The gallery's claims, each positive where it holds.
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "marsrl",
        "training the Solver and Verifier raises the system's accuracy",
        "held-out exact accuracy, after - before (paired)",
        ("marsrl",),
        gain("marsrl"),
    ),
    Claim(
        "marsrl",
        "agent-specific rewards teach the Verifier to judge; one shared reward does not",
        f"Verifier's verdicts right over the last {LAST_STEPS} training steps (Fig. 5), agent-specific - shared",
        ("marsrl", "marsrl_shared_reward"),
        verifier_gap("marsrl", "marsrl_shared_reward"),
    ),
    Claim(
        "mars",
        "RL of System 1 and System 2 together improves tool-using answers",
        "held-out exact accuracy, after - before (paired)",
        ("mars",),
        gain("mars"),
    ),
    Claim(
        "mars",
        "the answers come from the tool (Table 3's ablation)",
        "held-out exact accuracy of the trained system - the same with its search finding nothing (paired)",
        ("mars", "mars_without_search"),
        compared("mars", "mars_without_search"),
    ),
    Claim(
        "mas_orchestra",
        "training the orchestrator raises the system's accuracy",
        "held-out exact accuracy, after - before (paired)",
        ("mas_orchestra",),
        gain("mas_orchestra"),
    ),
    Claim(
        "mas_orchestra",
        "the degree of the emitted system follows the task's depth",
        "sub-agents per unit of depth, last third of training (least squares)",
        ("mas_orchestra",),
        degree_slope("mas_orchestra"),
    ),
    Claim(
        "matpo",
        "training planner and worker together raises the system's accuracy",
        "held-out exact accuracy, after - before (paired)",
        ("matpo",),
        gain("matpo"),
    ),
    Claim(
        "matpo",
        "MATPO beats single-agent GRPO on the same budget",
        "held-out exact accuracy after training, MATPO - single agent (paired)",
        ("matpo", "matpo_single_agent"),
        compared("matpo", "matpo_single_agent"),
    ),
    Claim(
        "hira",
        "HiRA's hierarchy answers more than its flat ablation",
        "exact answers on the same tasks, HiRA - flat (paired)",
        ("hira", "hira_flat"),
        compared("hira", "hira_flat"),
    ),
)

PAPER_NAMES = {
    "marsrl": "MarsRL",
    "mars": "MARS",
    "mas_orchestra": "MAS-Orchestra",
    "matpo": "MATPO",
    "hira": "HiRA",
}


# --- the table -----------------------------------------------------------------------------------------------


def runs_by_seed(folder: str | Path) -> dict[int, dict[str, Path]]:
    """The plan's runs in ``folder`` by seed and name: ``<name>/`` is seed 0's, ``<name>-seed<k>/`` seed k's;
    each a summary, a run directory, or a folder of runs (its newest)."""
    from workbench.reports.series import newest_run
    from workbench.store.layout import DB_NAME
    from workbench.store.summary import is_summary

    planned = {run.name for run in PLAN}
    found: dict[int, dict[str, Path]] = {}
    folder = Path(folder)
    for child in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        name, seed = split_seed(child.name)
        if name not in planned:
            continue
        run = child if is_summary(child) or (child / DB_NAME).is_file() else newest_run(child)
        if run is not None:
            found.setdefault(seed, {})[name] = run
    return dict(sorted(found.items()))


def claims_table(folder: str | Path, claims: Sequence[Claim] = CLAIMS) -> list[ClaimRow]:
    """Each claim's measure for every seed of the runs in ``folder`` that has all of the claim's runs."""
    from workbench.reports.series import resolve_runs

    seeds = runs_by_seed(folder)
    readable: dict[tuple[int, str], Path] = {}

    def opened(seed: int, name: str) -> Path:
        if (seed, name) not in readable:  # a summary is opened (built into a run in the cache) once
            readable[seed, name] = resolve_runs({name: seeds[seed][name]})[name]
        return readable[seed, name]

    rows = []
    for claim in claims:
        by_seed = {
            seed: claim.compute({name: opened(seed, name) for name in claim.runs})
            for seed, runs in seeds.items()
            if all(name in runs for name in claim.runs)
        }
        rows.append(ClaimRow(claim, by_seed))
    return rows


def _signed(value: float, digits: int = 3) -> str:
    return "–" if not math.isfinite(value) else f"{value:+.{digits}f}"


def _cell(measured: Measured | None) -> str:
    if measured is None or not math.isfinite(measured.value):
        return "–"
    shown = _signed(measured.value)
    if math.isfinite(measured.se) and measured.se > 0:
        shown += f" ({measured.value / measured.se:+.1f} SE)"
    return shown


def markdown(rows: Sequence[ClaimRow], source: str = "") -> str:
    """The claims table in markdown: a column per seed (0, 1 and 2 always), the mean ± SE across seeds, the
    verdict; ``source`` (where the runs came from) in a line under it."""
    seeds = sorted(set(PLANNED_SEEDS).union(*(row.by_seed for row in rows)))
    head = ["claim", "measure", *(f"seed {s}" for s in seeds), "mean ± SE across seeds", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        mean, se = row.mean_se
        n = len(row.values)
        across = (
            "–"
            if n == 0
            else f"{_signed(mean)} (n = 1)"
            if n == 1
            else f"{_signed(mean)} ± {se:.3f} (n = {n})"
        )
        verdict_shown = f"**{row.verdict}**" if row.verdict == "holds" else row.verdict
        cells = [
            f"{PAPER_NAMES.get(row.claim.paper, row.claim.paper)}: {row.claim.claim}",
            row.claim.measure,
            *(_cell(row.by_seed.get(s)) for s in seeds),
            across,
            verdict_shown,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    found = sorted(set().union(*(row.by_seed for row in rows)))
    note = (
        f"Seeds found: {', '.join(map(str, found)) or 'none'}" + (f", in `{source}`" if source else "") + "."
    )
    return "\n".join([*lines, "", note])


def write_between_markers(doc: str | Path, text: str) -> Path:
    """Replace what ``doc`` holds between ``BEGIN`` and ``END`` with ``text`` (the markers kept)."""
    doc = Path(doc)
    content = doc.read_text()
    start, end = content.find(BEGIN), content.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} section for the claims table across seeds")
    doc.write_text(content[: start + len(BEGIN)] + "\n" + text.strip() + "\n" + content[end:])
    return doc


def write_seeds_table(folder: str | Path, doc: str | Path = GALLERY, source: str | None = None) -> str:
    """The claims table of the runs in ``folder``, written into ``doc`` between the markers; returns it."""
    text = markdown(claims_table(folder), source if source is not None else _shown(Path(folder)))
    write_between_markers(doc, text)
    return text


def _shown(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(REPORTS_DIR.parent))
    except ValueError:
        return str(folder)

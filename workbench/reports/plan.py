"""The runs behind the papers' reports, and the command that makes them: ``workbench reproduce all --train``.

``PLAN`` lists, per paper, the runs its report notebooks draw on: the system the paper trains and the runs of the
paper's own comparison (MarsRL's agent-specific rewards against one shared reward), each a ``PlannedRun``: a
training config, a change to its topology's spec where a comparison needs one, or a rollout for HiRA (which trains
nothing). ``make_runs`` makes them one after another, each in a folder of its own (``RUNS/<name>/``): a run that
finished is kept, one that was interrupted resumes from its last checkpoint, a rollout that did not finish is rolled
out again, so the command can be stopped and started again at any point. The notebooks then get the runs by name
(``runs="name=path,..."``).

Three scales of the same plan: ``full`` (SmolLM2-135M, the runs as documented), ``quick`` (a fifth of the steps and
fewer held-out tasks: the same pipeline in minutes) and ``sample`` (the tiny model, two or three steps: what the
tests and the notebooks' checks draw on).

Seeds: by default each run is made once, with its config's seed (0), in ``RUNS/<name>/``. ``seeds`` (``workbench
reproduce all --train --seeds 0,1,2``) makes every run once per seed, seed by seed: seed 0 in ``RUNS/<name>/`` as
before, seed k > 0 in ``RUNS/<name>-seed<k>/`` (``seed_folder``), and their summaries likewise; a training run's
seed draws its training tasks, data order and held-out tasks (``seed + 10,000``), a rollout's its tasks and sampling,
and a run that rolls out another's model (``model_of``) takes that run's of the same seed. The claims table across
seeds (``workbench.reports.seeds``) reads them all.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.reports.seed_folders import seed_folder, split_seed

SCALES = ("full", "quick", "sample")


@dataclass(frozen=True)
class Copied:
    """A change whose value is another part of the same spec, by dotted path (a subflow's node made the flow's)."""

    path: str


@dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: ``name`` is its folder and its label in the notebooks; ``fields`` are its
    ``TrainConfig`` fields at full scale (a rollout's: ``tasks``, ``task_options``, ``n_tasks``, ``task_seed``,
    ``max_tokens``, ``sampling``); ``changes`` replace parts of its topology's spec, by dotted path (a
    comparison's variant); a rollout with ``model_of`` rolls out the model that run of the plan trained."""

    name: str
    paper: str
    topology: str
    what: str
    fields: Mapping[str, Any]
    changes: Mapping[str, Any] = field(default_factory=dict)
    rollout: bool = False
    model_of: str | None = None


#: MarsRL's CPU system as ``make demo`` trains it (single-digit addition, 25 steps of 4 problems x 4 samples).
_MARSRL = dict(
    tasks="arithmetic",
    task_options={"level": 1, "format": "plain"},
    n_tasks=200,
    eval_tasks=64,
    steps=25,
    batch_size=4,
    group_size=4,
    learning_rate=1e-5,
)
#: MARS's CPU system as the tools learning test trains it (one-hop questions about a local knowledge base).
_MARS = dict(
    tasks="multihop",
    task_options={"hops": 1, "verifier": "f1", "n_entities": 200, "kb_seed": 0},
    n_tasks=300,
    eval_tasks=80,
    steps=12,
    batch_size=4,
    group_size=4,
    temperature=0.7,
    learning_rate=3e-5,
    warmup_steps=2,
    aggregation="token_mean",
    held_out_by="start",  # held-out questions about entities no training question mentions, as the test splits them
)
#: MATPO's CPU system and its single-agent baseline: the same questions and budget (one hop: the base model answers
#: no two-hop question, docs/experiments.md).
_MATPO = dict(_MARS)

#: HiRA's tasks (it trains nothing: rollouts of the base model), and the prompt of its flat ablation's reasoner.
_HIRA = dict(tasks="multihop", task_options={"hops": [1, 2]}, n_tasks=32)
_SEARCHING_REASONER = (
    "You are a reasoning assistant who can search documents to answer the user's task. To search, write "
    "<|begin_search_query|> your query <|end_search_query|>; the results arrive as <|begin_search_result|> ... "
    "<|end_search_result|>. Search as often as you need ({{ max_subtasks }} searches at most), then give the "
    "final answer in \\boxed{}.\nUser's Task: {{ question }}"
)


def _held_out_rollout(training: Mapping[str, Any]) -> dict[str, Any]:
    """A greedy rollout over the held-out tasks of a training run with ``training``'s fields (the training loop
    draws them from the seed 10,000 above the run's seed: 0 here, the run's seed added by ``make_run``)."""
    return dict(
        tasks=training["tasks"],
        task_options=training["task_options"],
        n_tasks=training["eval_tasks"],
        task_seed=10_000,
        sampling={"temperature": 0.0},
    )


PLAN: tuple[PlannedRun, ...] = (
    PlannedRun("marsrl", "marsrl", "marsrl_cpu", "Solver and Verifier, agent-specific rewards", _MARSRL),
    PlannedRun(
        "marsrl_shared_reward",
        "marsrl",
        "marsrl_cpu",
        "the same system, the Verifier rewarded with the system's outcome (one shared reward)",
        _MARSRL,
        changes={"roles.verifier1.reward": {"kind": "outcome"}},
    ),
    PlannedRun("mars", "mars", "mars_cpu", "System 2 searching, System 1 reading, trained together", _MARS),
    PlannedRun(
        "mars_without_search",
        "mars",
        "mars_cpu",
        "the trained system with its search finding nothing (Table 3's tool ablation: every document "
        "blocked), on the run's held-out questions, greedy",
        _held_out_rollout(_MARS),
        changes={"tools.search.options.blocklist": ["kb://"]},  # every document of the knowledge base blocked
        rollout=True,
        model_of="mars",
    ),
    PlannedRun(
        "matpo",
        "matpo",
        "matpo_cpu",
        "planner and worker of one model, the worker searching",
        _MATPO,
    ),
    PlannedRun(
        "matpo_single_agent",
        "matpo",
        "matpo_cpu",
        "single-agent GRPO on the same questions and budget: matpo_cpu's worker answers the question alone, "
        "searching (the paper's baseline)",
        _MATPO,
        changes={
            "flow.nodes.plan": Copied("subflows.work.nodes.research"),
            "roles.worker.prefill": "Question: {{ question }}\n",
            "roles.worker.reward": {"kind": "outcome", "verifier": "f1"},
        },
    ),
    PlannedRun(
        "mas_orchestra",
        "mas_orchestra",
        "mas_orchestra_cpu",
        "the orchestrator's sub-agent graphs over chains of depth 1 to 3 (MASBench's Depth axis in miniature)",
        dict(
            tasks="masbench_small",
            task_options={"values": [1, 2, 3]},
            n_tasks=120,
            eval_tasks=60,
            steps=12,
            batch_size=6,
            group_size=8,
            temperature=0.7,
            learning_rate=2e-5,
            warmup_steps=2,
            aggregation="token_mean",
        ),
    ),
    PlannedRun(
        "hira",
        "hira",
        "hira",
        "the hierarchical system's rollouts (HiRA trains nothing)",
        _HIRA,
        rollout=True,
    ),
    PlannedRun(
        "hira_flat",
        "hira",
        "hira",
        "the flat ablation: the meta planner searches by itself, no coordinator or experts (Fig. 1b, "
        "search-augmented reasoning), on the same tasks",
        _HIRA,
        changes={
            "roles.meta_planner.messages": [{"role": "user", "content": _SEARCHING_REASONER}],
            "flow.nodes.plan.tools": ["search"],
            "flow.nodes.plan.protocol_options": {
                "begin": "<|begin_search_query|>",
                "end": "<|end_search_query|>",
                "tool": "search",
                "argument": "query",
                "result_begin": "<|begin_search_result|>",
                "result_end": "<|end_search_result|>",
            },
            "flow.nodes.plan.refuse_duplicates": "You have already searched for this. Use what you found.",
            "flow.nodes.plan.final_prompt": "\n\n<warning>No more searches. Give your final answer in \\boxed{}."
            "</warning>\n\n",
        },
        rollout=True,
    ),
)


def scaled(run: PlannedRun, scale: str) -> dict[str, Any]:
    """``run``'s fields at ``scale``: ``full`` as planned, ``quick`` a fifth of the steps (at least 2) and at most
    16 held-out tasks, ``sample`` the tiny model for two or three steps (a rollout: 4 tasks of 8 tokens)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    fields = dict(run.fields)
    if scale == "full":
        return fields
    if run.rollout:
        n = {"quick": 8, "sample": 4}[scale]
        if run.model_of:  # the held-out tasks of the run that trained the model, at the same scale
            n = scaled(next(r for r in PLAN if r.name == run.model_of), scale)["eval_tasks"]
        return {**fields, "n_tasks": n, **({"max_tokens": 8} if scale == "sample" else {})}
    if scale == "quick":
        return {**fields, "steps": max(2, fields["steps"] // 5), "eval_tasks": min(16, fields["eval_tasks"])}
    steps = 3 if run.paper == "marsrl" else 2  # the MarsRL figures want a few points per curve
    return {
        **fields,
        "steps": steps,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 8,
        "eval_tasks": 4,
        "eval_every": 1,
        "n_tasks": 16,
        "learning_rate": 1e-4,
        "warmup_steps": 0,
    }


def planned(papers: str | Sequence[str] = "all") -> list[PlannedRun]:
    """The plan's runs for ``papers`` ("all", a paper, or several), in the plan's order."""
    from workbench.reports.reproduce import chosen_papers

    chosen = chosen_papers(papers)
    return [run for run in PLAN if run.paper in chosen]


def _changed(spec: dict, changes: Mapping[str, Any]) -> dict:
    """``spec`` with each dotted path of ``changes`` (``roles.verifier1.reward``) replaced by its value (a
    ``Copied`` value: the spec's part at that path, as it was before the changes)."""
    out = copy.deepcopy(spec)
    for path, value in changes.items():
        if isinstance(value, Copied):
            value = _at(spec, value.path)
        *parents, leaf = path.split(".")
        _at(out, ".".join(parents))[leaf] = copy.deepcopy(value)
    return out


def _at(spec: dict, path: str) -> Any:
    node = spec
    for key in filter(None, path.split(".")):
        node = node[key]
    return node


def _topology(run: PlannedRun) -> Any:
    from workbench.topology import from_dict, load, to_dict

    if not run.changes:
        return load(run.topology)
    return from_dict(_changed(to_dict(load(run.topology)), run.changes))


def make_run(
    run: PlannedRun,
    runs_dir: str | Path,
    scale: str = "full",
    model: str | None = None,
    log: Callable = print,
    seed: int | None = None,
) -> Path:
    """Make ``run`` in ``runs_dir/<name>/``, or finish it: kept if it finished, resumed if a training run
    stopped before its end, redone if a rollout did not finish. Returns its run directory. ``seed``: the run's
    seed (default: its config's, 0), in ``runs_dir/<name>-seed<k>/`` for k > 0 (``seed_folder``)."""
    from workbench.reports.series import newest_run
    from workbench.rl.config import TrainConfig
    from workbench.topology import to_yaml
    from workbench.training import TOPOLOGY_FILE, BackgroundRun, create, run_here

    folder = Path(runs_dir) / seed_folder(run.name, seed)
    label = folder.name
    fields = scaled(run, scale)
    if seed is not None and not run.rollout:
        fields["seed"] = int(seed)
    model = model or ("tiny" if scale == "sample" else "smollm2-135m")
    existing = newest_run(folder)  # an earlier attempt's, if any
    if existing is not None and BackgroundRun(existing).status == "finished":
        log(f"{label}: finished before, kept ({existing})")
        return existing
    if run.rollout:
        if existing is not None:
            shutil.rmtree(existing)
        if run.model_of:
            model = _trained_model(run, Path(runs_dir), folder, seed, log)
        return _rollout(run, folder, fields, model, log, seed)
    if existing is None:
        # one checkpoint a run (1.5 GB for SmolLM2-135M with its optimizer state): enough to resume, and the
        # plan's training runs would hold 20 GB with two each
        config = TrainConfig(
            topology=run.topology, model=model, runs_dir=str(folder), **{"keep_checkpoints": 1, **fields}
        )
        existing = create(config)
        if run.changes:  # the variant's spec, saved beside the run (training and the reports read it there)
            (existing / TOPOLOGY_FILE).write_text(to_yaml(_topology(run)))
        log(f"{label}: training {config.steps} steps of {run.topology} ({run.what}) in {existing}")
    else:
        log(f"{label}: resuming {existing} from its last checkpoint")
    status = run_here(existing, log=log)
    if status != "finished":
        raise RuntimeError(f"{label} ended {status}; run the command again to resume it ({existing})")
    return existing


def _trained_model(
    run: PlannedRun, runs_dir: Path, folder: Path, seed: int | None = None, log: Callable = print
) -> str:
    """The weights the plan's run ``run.model_of`` trained (its run of the same ``seed``), exported into
    ``folder`` (again each time: a few s)."""
    from workbench.reports.series import newest_run
    from workbench.rl.export import export_model
    from workbench.training import BackgroundRun

    source = seed_folder(str(run.model_of), seed)
    trained = newest_run(runs_dir / source)
    if trained is None or BackgroundRun(trained).status != "finished":
        raise RuntimeError(
            f"{folder.name} rolls out the model {source} trained, and {source} has not finished in "
            f"{runs_dir}; make it first (workbench reproduce {run.paper} --train makes both, in order)"
        )
    log(f"{folder.name}: rolling out the model {source} trained ({trained})")
    return str(export_model(trained, folder / "trained-model"))


def _rollout(
    run: PlannedRun, folder: Path, fields: dict, model: str, log: Callable, seed: int | None = None
) -> Path:
    import workbench as wb

    log(f"{folder.name}: rolling {run.topology} out over {fields['n_tasks']} tasks ({run.what})")
    tasks = wb.generate_tasks(
        fields["tasks"],
        n=fields["n_tasks"],
        seed=fields.get("task_seed", 0) + int(seed or 0),  # a seed's tasks, as a training run's held-out ones
        **fields.get("task_options", {}),
    )
    result = wb.rollout(
        _topology(run),
        tasks,
        model=model,
        max_tokens=fields.get("max_tokens"),
        sampling=fields.get("sampling"),
        runs_dir=str(folder),
        **({"seed": int(seed)} if seed is not None else {}),
    )
    return Path(result.run_dir)


def make_runs(
    runs_dir: str | Path,
    papers: str | Sequence[str] = "all",
    scale: str = "full",
    model: str | None = None,
    log: Callable = print,
    seeds: Sequence[int] | None = None,
) -> dict[str, Path]:
    """Every planned run of ``papers`` in ``runs_dir`` (``make_run`` each, in order): their directories by name.

    ``seeds``: every run once per seed, seed after seed (all of seed 0's runs, then seed 1's ...), named by their
    folders (``marsrl``, ``marsrl-seed1`` ...: ``seed_folder``); default: once, with the config's seed."""
    runs = planned(papers)
    order = [(run, None) for run in runs] if seeds is None else [(run, int(s)) for s in seeds for run in runs]
    made = {}
    for i, (run, seed) in enumerate(order, 1):
        shown = "" if seed is None else f", seed {seed}"
        log(f"[{i}/{len(order)}] {seed_folder(run.name, seed)} ({run.paper}{shown})")
        made[seed_folder(run.name, seed)] = make_run(run, runs_dir, scale, model, log, seed=seed)
    return made


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` as [0, 1, 2]: seeds of the plan's runs, each a non-negative integer, none twice."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"seeds are integers separated by commas, like 0,1,2: not {text!r}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds are distinct non-negative integers, like 0,1,2: not {text!r}")
    return seeds


def seed_runs(made: Mapping[str, Path], seed: int = 0) -> dict[str, Path]:
    """The runs of ``made`` (by folder name, as ``make_runs`` returns them) made with ``seed``, by the plan's
    names: what the notebooks draw (they find a comparison's runs by those names)."""
    return {split_seed(folder)[0]: path for folder, path in made.items() if split_seed(folder)[1] == seed}


def export_summaries(
    made: Mapping[str, Path], out_dir: str | Path, command: str, scale: str = "full"
) -> dict[str, Path]:
    """Each run of ``made`` summarised in ``out_dir/<name>/`` (``workbench.store.summary``: what the reports read,
    without the prompts and token ids), with the command, scale, seed and plan entry that made it; a run of
    seed k > 0 (``marsrl-seed1``) in ``out_dir/<name>-seed<k>/``."""
    from workbench.store import RunReader
    from workbench.store.summary import export_summary

    by_name = {run.name: run for run in PLAN}
    written = {}
    for name, run_dir in made.items():
        entry = by_name[name] if name in by_name else by_name[split_seed(name)[0]]
        with RunReader(run_dir) as reader:
            config = reader.config
        written[name] = export_summary(
            run_dir,
            Path(out_dir) / name,
            command=command,
            scale=scale,
            paper=entry.paper,
            topology=entry.topology,
            what=entry.what,
            changes=dict(entry.changes),
            model=config.get("model"),
            model_of=entry.model_of,
            seed=config.get("seed", 0),
        )
    return written


def runs_argument(made: Mapping[str, Path]) -> str:
    """The notebooks' ``runs`` parameter for ``made``: ``name=path,...``."""
    return ",".join(f"{name}={path}" for name, path in made.items())

"""The benchmarks of tests/perf as one suite: each runs in turn, one ``suite.json`` holds them all.

    python -m tests.perf --quick                    # CI size, into artifacts/perf/ (a few minutes on 2 cores)
    python -m tests.perf                            # full size, into tests/perf/results/ (the README's figures)
    python -m tests.perf --profile gpu              # vLLM on a GPU with Qwen2.5 (tests/perf/profiles/gpu.yaml)
    python -m tests.perf --quick --only engine,trainer
    python -m tests.perf.report                     # rewrites the README's performance section from the JSON

Every benchmark runs as its own subprocess, ``python -m tests.perf.<module> [--quick] <profile options>
--out <dir>/<name>.json``, exactly as users run it alone; its output goes to ``<dir>/logs/<name>.log``.
Then ``<dir>/suite.json`` gathers every benchmark's JSON with the headline ratios of each (``BENCHMARKS``
below says how each is read off), the wall seconds of each run, and what failed. Every ratio compares
two things measured side by side in the same benchmark run. A benchmark that fails is recorded with
the tail of its output and the suite goes on; it exits non-zero at the end. One whose required packages
are missing is recorded as "skipped". A benchmark writes its JSON after each measurement, so one stopped by its
time limit keeps what it measured: recorded as "partial", its figures kept.

A profile may order its runs and give each a time budget (``plan``, ``budget_s``, ``estimate_s``: the gpu profile
does, for a lent GPU's few minutes): ``--budgets`` stops each run at its budget and starts none past the
profile's deadline, ``--plan`` prints the plan with its time estimate and runs nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.perf.runner import REPO, machine, now, nvidia_smi, write_json

PERF = Path(__file__).resolve().parent
PROFILES = PERF / "profiles"
RESULTS = PERF / "results"
ARTIFACTS = REPO / "artifacts" / "perf"
ERROR_TAIL = 3000


def headline(measure: str, ratio: float, meaning: str) -> dict[str, Any]:
    """One figure of the headline table: a ratio of two things measured side by side."""
    return {"measure": measure, "ratio": round(float(ratio), 3), "meaning": meaning}


DECODE_GOAL = 15_000  # unprofiled decode tokens/s on one H100/H200 at 0.5B (issue 47)


def _engine(r: dict) -> list[dict]:
    out = []
    for kind, b in r["backends"].items():
        if "overhead_ratio" in b:
            out.append(
                headline(
                    f"engine overhead ({kind})",
                    b["overhead_ratio"],
                    "raw backend time / engine time on the same greedy requests (1.0 = no overhead; "
                    "target >= 0.90)",
                )
            )
        decode = b.get("decode")
        if decode and r.get("device") == "cuda":  # a goal for a GPU; a CPU's decode has none
            out.append(
                headline(
                    f"decode tokens/s / goal ({kind}, unprofiled)",
                    decode["tokens_per_s"] / DECODE_GOAL,
                    f"completion tokens/s of {decode['rows']} rows of varied prompt and completion lengths with "
                    f"stop strings, not profiled, over the {DECODE_GOAL:,} goal (>= 1 meets it)",
                )
            )
    return out


def _trainer(r: dict) -> list[dict]:
    if "trl_ckpt_step_s" not in r and "trl_gradient_checkpointing" not in r:  # results from before issue 47:
        return [  # TRL ran with its default gradient checkpointing (on), which favoured the workbench
            headline(
                "trainer step vs TRL (TRL ckpt on)",
                r["ratio"],
                "workbench step time / trl.GRPOTrainer step time, same batch, TRL with its default gradient "
                "checkpointing (target <= 1.0)",
            )
        ]
    out = []
    if r.get("ratio") is not None:
        out.append(
            headline(
                "trainer step vs TRL",
                r["ratio"],
                "workbench step time / trl.GRPOTrainer step time, same batch, neither checkpointing "
                f"(target <= {1.0 if r.get('device', 'cpu') == 'cpu' else 0.5})",
            )
        )
    if r.get("ratio_vs_trl_ckpt") is not None:
        out.append(
            headline(
                "trainer step vs TRL (TRL ckpt on)",
                r["ratio_vs_trl_ckpt"],
                "workbench step time (no checkpointing) / trl.GRPOTrainer step time with its default gradient "
                "checkpointing, same batch",
            )
        )
    return out


def _vs_sync(ratios: dict[str, float], measure: str, meaning: str) -> list[dict]:
    """One headline a scheduler: ``measure`` and ``meaning`` name it as ``{name}``."""
    names = {key: key.removesuffix("_vs_sync") for key in ratios}
    return [
        headline(measure.format(name=names[k]), v, meaning.format(name=names[k])) for k, v in ratios.items()
    ]


def _schedulers(r: dict) -> list[dict]:
    return _vs_sync(
        r["ratios"],
        "{name} vs sync",
        "samples/s of {name} / samples/s of sync in steady state, long-tail lengths (> 1 = faster)",
    )


def _schedulers_ray(r: dict) -> list[dict]:
    return _vs_sync(
        r["run_ratios"],
        "{name} vs sync on Ray",
        "whole-run samples/s of {name} / of sync, "
        + r["workload"]["topology"]
        + ", max_staleness 1 (> 1 = faster)",
    )


def _data_parallel(r: dict) -> list[dict]:
    return [
        headline(
            f"{size} trainer rank(s) ({g['backend']}) vs one process",
            g["step_s"] / r["alone"]["step_s"],
            f"step time of the group on {r['device']} / of a lone trainer, same batch; its update within "
            f"{g['update_max_rel_diff']:.1e} of the lone one's",
        )
        for size, g in r["groups"].items()
        if "error" not in g
    ]


def _binpack(r: dict) -> list[dict]:
    runs = r["distributions"]
    attainable = [d["ratio_max"] for d in runs.values() if d.get("ratio_to_optimum") is None]
    return [
        headline(
            "FFD speed-up (smallest)",
            min(d["speedup"] for d in runs.values()),
            f"plain two-loop FFD time / ffd_pack time, identical bins, smallest of {len(runs)} distributions",
        ),
        headline(
            "FFD bins / lower bound (worst)",
            max(attainable),
            "bins / ceil(sum/C) where that bound can be met (target <= 1.1)",
        ),
    ]


def _packing(r: dict) -> list[dict]:
    runs = r["strategies"]
    figures = [
        headline(
            f"{name} vs packed",
            runs[name]["time_vs_packed"],
            f"{name} fwd+bwd time / packed (padding-free) time, same samples and token budget",
        )
        for name in ("padded_sorted", "padded_unsorted", "packed_blocks")
        if runs.get(name, {}).get("time_vs_packed") is not None
    ]
    if "groups" in r:
        figures.append(
            headline(
                "shared prefixes (groups)",
                r["groups"]["blocks_vs_shared"],
                "per-sample blocks fwd+bwd time / shared-prefix rows time, 8 prompts x 4 samples sharing a "
                "few-shot transcript (> 1 = faster)",
            )
        )
    return figures


def _store(r: dict) -> list[dict]:
    return [
        headline(
            "store ingest overhead",
            r["ingest"]["overhead_ratio"],
            "raw sqlite3.executemany calls/s / RunStore calls/s, same rows (1.0 = no overhead)",
        )
    ]


def _dashboard_queries(r: dict) -> list[dict]:
    return [
        headline(
            "slowest dashboard query / target",
            r["slowest_ms"] / r["target_ms"],
            f"slowest trajectory-browser query / the {r['target_ms']:.0f} ms target (<= 1 = within)",
        )
    ]


def _dashboard_load(r: dict) -> list[dict]:
    target, n = r["target_s"], r["viewers"]
    figures = [  # (measure, value, meaning); a figure the run could not measure (0 or None) is left out
        (
            "first document p95 / target",
            r["first_doc_s"]["p95"] and r["first_doc_s"]["p95"] / target,
            f"p95 seconds for {n} viewers opening the dashboard during a training run to get "
            f"their document, over the {target:.0f} s target (<= 1 meets it)",
        ),
        (
            "update lag p95 / target",
            r["update_lag_s"]["p95"] and r["update_lag_s"]["p95"] / target,
            f"p95 seconds from a step committed to {n} viewers' documents showing it, over the "
            f"{target:.0f} s target (<= 1 meets it)",
        ),
        (
            "trainer watched / unwatched",
            r["train_ratio"],
            f"tiny training run's steps/s with {n} dashboard viewers / with none",
        ),
    ]
    c = r.get("compare")
    if c:  # the second phase: a share of the viewers on a comparison of the run with a gallery run
        k, unwatched = c["viewers_on_comparison"], r["train_steps_per_s_unwatched"]
        figures += [
            (
                "comparison open: first document p95 / target",
                c["first_doc_s"]["p95"] and c["first_doc_s"]["p95"] / target,
                f"p95 seconds for {n} viewers, {k} of them on a comparison of the run with a gallery run, to "
                f"get their document, over the {target:.0f} s target",
            ),
            (
                "comparison open: update lag p95 / target",
                c["update_lag_s"]["p95"] and c["update_lag_s"]["p95"] / target,
                f"p95 seconds from a step committed to {n} viewers' documents showing it, {k} of them in a "
                f"comparison, over the {target:.0f} s target",
            ),
            (
                "comparison open: trainer watched / unwatched",
                unwatched and c["train_steps_per_s_watched"] / unwatched,
                f"tiny training run's steps/s with {n} viewers, {k} on a comparison, / with none",
            ),
        ]
    return [headline(measure, value, meaning) for measure, value, meaning in figures if value]


def _replay(r: dict) -> list[dict]:
    on = " (vLLM)" if r.get("backend") == "vllm" else ""
    return [
        headline(
            f"replay vs fresh episodes{on}",
            r["ratio"],
            f"wb.replay time / wb.rollout time for {r['continuations']} continuations of one episode, the "
            f"prefix {r['prefix_share']:.0%} of its tokens (goal <= 0.6)",
        )
    ]


def _prefix(r: dict) -> list[dict]:
    return [
        headline(
            "shared-prefix prefill",
            r["ratio"],
            f"{r['topology']} rollout time with the prefix its prompts share prefilled once / with whole prompts, "
            f"hf backend, greedy ({r['same_completions']:.0%} of completions the same)",
        )
    ]


def _backends(r: dict) -> list[dict]:
    b = r["backends"]
    if "hf" not in b or "vllm" not in b:
        return []
    return [
        headline(
            "vLLM vs transformers",
            b["vllm"]["tokens_per_s"] / b["hf"]["tokens_per_s"],
            "vllm completion tokens/s / hf (transformers) tokens/s, same prompts",
        )
    ]


def _precision(r: dict) -> list[dict]:
    meanings = {
        "bf16_vs_fp32_step": ("bf16 step vs fp32", "bf16 autocast step time / fp32 step time, same batch"),
        "bf16+ckpt_memory_vs_without": (
            "checkpointing memory (bf16)",
            "peak memory with gradient checkpointing / without (< 1 = saves)",
        ),
        "bf16+ckpt_step_vs_without": (
            "checkpointing step time (bf16)",
            "step time with gradient checkpointing / without (the recompute's cost)",
        ),
    }
    out = [
        headline(*meanings[key][:1], value, meanings[key][1])
        for key, value in r["ratios"].items()
        if key in meanings
    ]
    v = r["variants"].get(
        "bf16", {}
    )  # full fine-tuning in bf16 on a GPU: MFU on the tokens the kernels compute
    if v.get("mfu_computed") is not None and not r.get("lora"):
        out.append(
            headline(
                f"MFU {r['model']} (bf16, computed tokens)",
                v["mfu_computed"],
                f"model FLOPs of the {v['tokens_computed']:,} tokens the kernels compute (shared prefixes "
                f"once; {v['tokens']:,} logical, MFU on those {v['mfu_logical']:.1%}) / step time / the "
                "chip's dense bf16 peak (goal >= 0.20 at 0.5B, >= 0.35 at 1.5B)",
            )
        )
    return out


def _train_step(r: dict) -> list[dict]:
    share = r["schedulers"]["sync"]["phase_share"]
    out = [
        headline(
            "rollout share of a step",
            share.get("rollout", 0.0),
            f"rollout seconds / step seconds, sync scheduler, {r['workload']['topology']} on {r['model']}, one "
            "device (update share: the rest, mostly)",
        )
    ]
    out += _vs_sync(
        r["ratios"],
        "{name} vs sync (one device)",
        "trained samples/s of {name} / of sync, whole training steps, "
        + f"{r['workload']['topology']} on {r['model']} (> 1 = faster)",
    )
    return out


def _launches(r: dict) -> list[dict]:
    after = r["after_vs_before"]
    return [
        headline(
            "launches: compute weights vs autocast",
            after["kernels"],
            f"kernel ops per {r['shape']} micro-batch (fwd+bwd, {after['path']} attention) under bf16 autocast / "
            "with bf16 compute weights (> 1 = fewer; the issue's target 2)",
        )
    ]


def _meta(r: dict) -> list[dict]:
    name, runs = next(iter(r["shapes"].items()))
    entry = runs.get("varlen") or next(iter(runs.values()))
    return [
        headline(
            f"computed vs logical FLOPs ({name})",
            entry["flops"]["counted_vs_logical"],
            f"FLOPs counted on the meta device over one update ({entry['path']} attention) / model_flops on "
            "the samples' logical tokens (< 1: MFU on logical tokens flatters)",
        )
    ]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the suite: its module, what it compares, and how to read its headline ratios."""

    module: str
    compares: str
    headline: Callable[[dict], list[dict]]
    needs: tuple[str, ...] = ()  # importable packages it cannot run without
    quick_timeout: int = 600  # seconds, in quick mode (full mode: no limit unless --timeout)


BENCHMARKS: dict[str, Benchmark] = {
    "engine": Benchmark(
        "bench_engine", "engine rollout against the raw backend; hf decode tokens/s", _engine
    ),
    "trainer": Benchmark(
        "bench_trainer", "trainer step against trl.GRPOTrainer, its checkpointing off and on", _trainer
    ),
    "precision": Benchmark("bench_precision", "bf16 and gradient checkpointing against fp32", _precision),
    "schedulers": Benchmark(
        "bench_schedulers", "pipeline and async schedulers against synchronous", _schedulers
    ),
    "schedulers_ray": Benchmark(
        "bench_schedulers", "the schedulers on 2 Ray rollout workers", _schedulers_ray, needs=("ray",)
    ),
    "data_parallel": Benchmark(
        "bench_data_parallel", "data-parallel trainer ranks against one process", _data_parallel
    ),
    "binpack": Benchmark("bench_binpack", "ffd_pack against plain FFD loops", _binpack),
    "packing": Benchmark("bench_packing", "padding-free packing against padded batches", _packing),
    "store": Benchmark("bench_store", "run store against raw sqlite3", _store, quick_timeout=300),
    "dashboard_queries": Benchmark(
        "bench_dashboard_queries",
        "dashboard queries against their target",
        _dashboard_queries,
        quick_timeout=300,
    ),
    "dashboard_load": Benchmark(
        "bench_dashboard_load", "dashboard viewers during a training run", _dashboard_load, quick_timeout=300
    ),
    "replay": Benchmark("bench_replay", "counterfactual replay against fresh episodes", _replay),
    "prefix": Benchmark("bench_prefix", "shared-prefix prefill against whole prompts", _prefix),
    "replay_vllm": Benchmark(
        "bench_replay", "counterfactual replay against fresh episodes on vLLM", _replay, needs=("vllm",)
    ),
    "backends": Benchmark("bench_backends", "vLLM against transformers", _backends, needs=("vllm",)),
    "train_step": Benchmark(
        "bench_train_step", "a whole training step: its phases, pipeline against sync", _train_step
    ),
    "launches": Benchmark(
        "bench_launches",
        "aten ops per micro-batch and decode step, autocast against compute weights",
        _launches,
    ),
    "meta": Benchmark("bench_meta", "FLOPs and memory on the meta device against the logical count", _meta),
}
"""The suite, in the order it runs. A name ``<benchmark>@<variant>`` (a profile's variant) reads as ``<benchmark>``."""


def base_name(name: str) -> str:
    return name.split("@", 1)[0]


def headlines(name: str, result: dict) -> list[dict]:
    """The headline ratios of benchmark ``name``'s JSON, each tagged with the benchmark's name."""
    return [{"benchmark": name, **h} for h in BENCHMARKS[base_name(name)].headline(result)]


# --- profiles ---

_ENV_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def expand(value: Any) -> Any:
    """``${VAR}`` and ``${VAR:-default}`` in a profile's strings, from the environment."""
    if isinstance(value, str):
        return _ENV_VAR.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand(v) for v in value]
    return value


def accepted_flags(module: str) -> set[str]:
    """The ``--flags`` a benchmark module's argparse defines (read from its source, nothing imported; none
    known for a module outside tests/perf)."""
    path = PERF / f"{module}.py"
    if not path.is_file():
        return set()
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", path.read_text()))


def module_name(module: str) -> str:
    """The importable name of a benchmark's module: ``bench_x`` is ``tests.perf.bench_x``; a dotted name is
    taken as it is (a module elsewhere, as the suite's own tests use)."""
    return module if "." in module else f"tests.perf.{module}"


def to_args(options: dict[str, Any]) -> list[str]:
    """Profile options as command-line arguments: ``{max_tokens: 8, backends: [hf, vllm]}`` ->
    ``--max-tokens 8 --backends hf vllm``; ``true`` is a bare flag, ``false``/``null`` leave it out."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        value = expand(value)
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args


@dataclass
class Run:
    """One benchmark run the suite makes: its name in suite.json, its options and environment, and where the
    profile gives them its time budget (the most seconds it may take) and estimate (what it should take)."""

    name: str
    benchmark: Benchmark
    args: list[str]
    env: dict[str, str]
    budget_s: float | None = None
    estimate_s: float | None = None
    what: str = ""


PLAN_KEYS = {"budget_s", "estimate_s", "what"}  # a run's plan, beside its options


def load_profile(profile: str | Path) -> dict[str, Any]:
    """A profile: ``tests/perf/profiles/<name>.yaml``, or a YAML file's path."""
    import yaml

    path = Path(profile)
    if not path.suffix:
        path = PROFILES / f"{profile}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise SystemExit(f"no profile {profile!r}: use one of {known} or a YAML file's path")
    data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("name", path.stem)
    unknown = set(data.get("benchmarks") or {}) - set(BENCHMARKS)
    if unknown:
        raise SystemExit(
            f"profile {path}: unknown benchmarks {sorted(unknown)}; the suite has {list(BENCHMARKS)}"
        )
    return data


def plan(profile: dict[str, Any], names: list[str], quick: bool) -> list[Run]:
    """The runs of ``names`` under ``profile``, in that order: one per benchmark, or one per variant the profile
    lists; a name ``<benchmark>@<variant>`` is that variant alone.

    A benchmark's entry in the profile may hold ``options`` (both modes), ``quick`` and ``full`` (options for
    that mode only, on top), ``env`` (environment variables) and ``variants`` (label -> options: the benchmark
    runs once per label, as ``<name>@<label>``), and ``budget_s``, ``estimate_s`` and ``what`` (its time budget,
    its estimate and a few words on what it measures; a variant may give its own). Options must be flags the
    module's argparse defines.
    """
    runs = []
    mode = "quick" if quick else "full"
    for wanted in names:
        name, _, only = wanted.partition("@")
        bench = BENCHMARKS[name]
        entry = (profile.get("benchmarks") or {}).get(name) or {}
        unknown = set(entry) - {"options", "quick", "full", "env", "variants", *PLAN_KEYS}
        if unknown:
            raise SystemExit(f"profile {profile['name']}, {name}: unknown keys {sorted(unknown)}")
        env = {**(profile.get("env") or {}), **(entry.get("env") or {})}
        env = {str(k): str(expand(v)) for k, v in env.items()}
        options = {**(entry.get("options") or {}), **(entry.get(mode) or {})}
        variants = entry.get("variants") or {"": {}}
        if only and only not in variants:
            raise SystemExit(
                f"profile {profile['name']}: {name} has no variant {only!r} ({', '.join(variants)})"
            )
        for label, extra in variants.items():
            if only and label != only:
                continue
            extra = dict(extra or {})
            timing = {k: extra.pop(k, entry.get(k)) for k in PLAN_KEYS}
            args = to_args({**options, **extra})
            if (PERF / f"{bench.module}.py").is_file():
                accepted = accepted_flags(bench.module)
                wrong = [a for a in args if a.startswith("--") and a not in accepted]
                if wrong:
                    raise SystemExit(
                        f"profile {profile['name']}, {name}: {bench.module} takes no {', '.join(wrong)} "
                        f"(it takes {', '.join(sorted(accepted))})"
                    )
            runs.append(
                Run(
                    f"{name}@{label}" if label else name,
                    bench,
                    args,
                    env,
                    budget_s=timing["budget_s"],
                    estimate_s=timing["estimate_s"],
                    what=timing["what"] or bench.compares,
                )
            )
    return runs


def plan_text(profile: dict[str, Any], runs: list[Run]) -> str:
    """The profile's plan as a table: each run's estimate, budget and the estimated time when it ends (from the
    command's start, after the start-up the profile names); runs the deadline cuts off are marked."""
    timing = profile.get("plan") or {}
    startup, deadline = float(timing.get("startup_s", 0)), timing.get("deadline_s")
    lines = [
        f"plan of profile {profile['name']}: start-up ~{startup:.0f} s ({timing.get('startup', 'before the runs')})",
        f"  {'#':>2}  {'run':<26} {'estimate':>8} {'budget':>7} {'ends by':>8}  what",
    ]
    clock = 0.0
    for i, run in enumerate(runs, 1):
        estimate = run.estimate_s or 0.0
        fits = deadline is None or clock + estimate <= float(deadline)
        clock += estimate if fits else 0.0
        budget = f"{run.budget_s:.0f} s" if run.budget_s else "-"
        ends = f"{startup + clock:.0f} s" if fits else "if time"
        lines.append(f"  {i:>2}  {run.name:<26} {estimate:>6.0f} s {budget:>7} {ends:>8}  {run.what}")
    total = startup + clock
    lines.append(
        f"estimate: {total:.0f} s ({total / 60:.1f} min) with the start-up"
        + (
            f"; bound: a run starts only with its estimate left before {deadline} s of runs and stops at its "
            f"budget or there, so all ends by ~{startup + float(deadline):.0f} s "
            f"({(startup + float(deadline)) / 60:.1f} min)"
            if deadline is not None
            else ""
        )
    )
    return "\n".join(lines)


def plan_estimate(profile: dict[str, Any], runs: list[Run]) -> dict[str, float]:
    """The plan's figures: start-up, the runs' estimated seconds within the deadline, the total, the bound."""
    timing = profile.get("plan") or {}
    startup, deadline = float(timing.get("startup_s", 0)), timing.get("deadline_s")
    clock = 0.0
    for run in runs:
        estimate = run.estimate_s or 0.0
        if deadline is None or clock + estimate <= float(deadline):
            clock += estimate
    return {
        "startup_s": startup,
        "runs_s": clock,
        "total_s": startup + clock,
        "bound_s": startup + float(deadline) if deadline is not None else float("inf"),
    }


# --- running ---


def run_one(run: Run, out_dir: Path, quick: bool, timeout: float | None, echo: bool) -> dict[str, Any]:
    """Run one benchmark as a subprocess; returns its record (status, seconds, args, log, error...).

    A run stopped by ``timeout`` (or failing) that wrote its JSON before is "partial": its figures are kept."""
    record: dict[str, Any] = {"module": module_name(run.benchmark.module)}
    missing = [p for p in run.benchmark.needs if importlib.util.find_spec(p) is None]
    if missing:
        return {**record, "status": "skipped", "reason": f"needs {', '.join(missing)} (not installed)"}
    out = out_dir / f"{run.name}.json"
    out.unlink(missing_ok=True)  # never mistake an earlier run's JSON for this one's
    log_path = out_dir / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = (["--quick"] if quick else []) + run.args + ["--out", str(out)]
    scratch = None
    if "--workdir" in accepted_flags(run.benchmark.module) and "--workdir" not in run.args:
        scratch = Path(tempfile.mkdtemp(prefix=f"perf-{run.name}-"))
        args += ["--workdir", str(scratch)]  # its temporary runs go here; what it leaves behind is recorded
    command = [sys.executable, "-m", record["module"], *args]
    record |= {"args": args, "log": str(log_path)}
    path = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )  # keep carried packages
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **run.env}
    started = time.perf_counter()
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: a timeout stops its servers and engines too
        )

        def copy() -> None:  # the benchmark's output into its log (and onto the console with --verbose)
            for line in process.stdout:
                log.write(line)
                if echo:
                    sys.stdout.write(f"  {line}")
                    sys.stdout.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            returncode: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
        except KeyboardInterrupt:  # its own session does not get the terminal's Ctrl-C: pass it on
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        reader.join(30)
        if returncode is None:
            log.write(f"\n[suite] stopped after {timeout:.0f} s (timeout)\n")
    record["seconds"] = round(time.perf_counter() - started, 1)
    if scratch is not None:
        record["leftovers"] = sorted(p.name for p in scratch.iterdir())
        shutil.rmtree(scratch, ignore_errors=True)
    tail = log_path.read_text()[-ERROR_TAIL:]
    error = None
    if returncode is None:
        error = f"timed out after {timeout:.0f} s\n{tail}"
    elif returncode != 0:
        record["returncode"] = returncode
        error = tail
    if not out.is_file():
        if error is None:
            return {**record, "status": "failed", "returncode": 0, "error": f"wrote no {out}\n{tail}"}
        return {**record, "status": "failed", "error": error}
    result = json.loads(out.read_text())
    try:
        record["headline"] = headlines(run.name, result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as missing_figure:
        if error is None:
            return {
                **record,
                "status": "failed",
                "error": f"its JSON lacks a headline figure: {missing_figure!r}\n{tail}",
            }
        record["headline"] = []
    if error is not None:  # stopped or failed after writing some figures: keep them
        return {**record, "status": "partial", "error": error, "result": result}
    return {**record, "status": "ok", "result": result}


def gpu_name() -> str | None:
    """The GPU(s) ``nvidia-smi`` reports, or None."""
    return nvidia_smi().get("gpu")


def run_suite(
    names: list[str],
    *,
    quick: bool,
    profile: str | Path = "cpu",
    out_dir: Path,
    timeout: float | None = None,
    echo: bool = False,
    log: Callable[[str], None] = print,
    budgets: bool = False,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Run ``names`` in turn into ``out_dir``; writes and returns ``suite.json``'s content.

    ``budgets``: each run stops at its profile budget (``budget_s``), and none starts when less time is left
    before ``deadline`` (seconds from now; default the profile's ``plan.deadline_s``) than its estimate: it is
    recorded as "skipped"; a run that starts gets at most the time left."""
    spec = load_profile(profile)
    os.environ["PERF_OUT"] = str(
        out_dir
    )  # ${PERF_OUT} in a profile: this suite's folder (one run reads another's)
    runs = plan(spec, names, quick)
    if budgets and deadline is None:
        deadline = (spec.get("plan") or {}).get("deadline_s")
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = "quick" if quick else "full"
    suite: dict[str, Any] = {
        "mode": mode,
        "profile": spec["name"],
        "machine": machine(gpu=gpu_name()),
        "when": now(),
        "benchmarks": {},
        "headline": [],
        "seconds": {},
        "status": {},
        "runs": {},
    }
    started = time.perf_counter()
    for i, run in enumerate(runs, 1):
        log(f"[{i}/{len(runs)}] {run.name} ({run.what}) ...")
        limit = timeout if timeout is not None else (run.benchmark.quick_timeout if quick else None)
        left = None if deadline is None else float(deadline) - (time.perf_counter() - started)
        if budgets and run.budget_s:
            limit = min(limit or run.budget_s, run.budget_s)
        if left is not None and left < max(run.estimate_s or 0.0, 1.0):
            record: dict[str, Any] = {
                "module": module_name(run.benchmark.module),
                "status": "skipped",
                "reason": f"out of time: {max(left, 0):.0f} s left of the {deadline} s deadline, its estimate "
                f"{run.estimate_s or 0:.0f} s",
            }
        else:
            if left is not None:
                limit = min(limit or left, left)
            record = run_one(run, out_dir, quick, limit, echo)
        result = record.pop("result", None)
        suite["status"][run.name] = record["status"]
        suite["runs"][run.name] = record
        if "seconds" in record:
            suite["seconds"][run.name] = record["seconds"]
        if result is not None:
            suite["benchmarks"][run.name] = result
            suite["headline"] += record.pop("headline")
        else:
            suite["benchmarks"][run.name] = {
                k: record[k] for k in ("status", "reason", "returncode", "error") if k in record
            }
        took = f" in {record['seconds']:.1f} s" if "seconds" in record else ""
        log(f"    {record['status']}{took}" + (f": {record['reason']}" if "reason" in record else ""))
        if record["status"] in ("failed", "partial"):
            log("    " + record["error"][-1500:].replace("\n", "\n    "))
        # written after every benchmark, so an interrupted suite still leaves what it measured
        suite["seconds"]["total"] = round(time.perf_counter() - started, 1)
        write_json(out_dir / "suite.json", suite)
    return suite


def table(suite: dict[str, Any]) -> str:
    """The headline ratios, one line a figure, then each benchmark's status and wall time."""
    rows = [(h["benchmark"], h["measure"], f"{h['ratio']:.2f}", h["meaning"]) for h in suite["headline"]]
    header = ("benchmark", "measure", "ratio", "compared")
    widths = [
        max(len(r[i]) for r in [header, *rows, *[(n, "", "") for n in suite["status"]]]) for i in range(3)
    ]
    lines = [
        f"\nheadline ratios ({suite['mode']} mode, profile {suite['profile']}, {suite['machine']['cpus']} CPUs):",
        f"  {header[0]:<{widths[0]}}  {header[1]:<{widths[1]}}  {header[2]:>{widths[2]}}  {header[3]}",
    ]
    lines += [f"  {b:<{widths[0]}}  {m:<{widths[1]}}  {r:>{widths[2]}}  {c}" for b, m, r, c in rows]
    lines.append("\nbenchmark runs:")
    for name, status in suite["status"].items():
        seconds = suite["seconds"].get(name)
        took = f"{seconds:7.1f} s" if seconds is not None else " " * 9
        reason = suite["runs"][name].get("reason") or (
            f"see {suite['runs'][name]['log']}" if status in ("failed", "partial") else ""
        )
        lines.append(f"  {name:<{widths[0]}}  {status:<11} {took}  {reason}".rstrip())
    lines.append(f"  {'total':<{widths[0]}}  {'':<11} {suite['seconds'].get('total', 0):7.1f} s")
    return "\n".join(lines)


def _names(value: str | None) -> list[str]:
    """Comma-separated benchmark names, each maybe with ``@<variant>`` (one variant of a profile's)."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    unknown = [n for n in names if base_name(n) not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmarks {unknown}: the suite has {', '.join(BENCHMARKS)}")
    return names


def default_out(quick: bool, profile: str) -> Path:
    """artifacts/perf/ for quick runs, tests/perf/results/ for full ones; a non-cpu profile in a sub-folder."""
    base = ARTIFACTS if quick else RESULTS
    return base if profile == "cpu" else base / Path(profile).stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.perf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="every benchmark's quick mode (CI)")
    parser.add_argument(
        "--profile", default="cpu", help="cpu, gpu (tests/perf/profiles/<name>.yaml) or a YAML file's path"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated benchmarks to run, in this order, of {','.join(BENCHMARKS)} (<name>@<variant>: one "
        "variant of the profile's); default: the profile's plan order, else all",
    )
    parser.add_argument("--skip", help="comma-separated benchmarks to leave out")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for the JSON (default: artifacts/perf/ with --quick, else tests/perf/results/)",
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds per benchmark (default: 300-600 in quick mode, none)"
    )
    parser.add_argument(
        "--budgets",
        action="store_true",
        help="stop each run at the profile's budget_s; start none past its plan's deadline_s",
    )
    parser.add_argument("--deadline", type=float, help="with --budgets: seconds for all the runs")
    parser.add_argument(
        "--plan", action="store_true", help="print the runs, their budgets and the estimate; run none"
    )
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="echo each benchmark's output as it runs"
    )
    args = parser.parse_args(argv)
    spec = load_profile(args.profile)
    names = _names(args.only) or list((spec.get("plan") or {}).get("order") or BENCHMARKS)
    skip = set(_names(args.skip))
    names = [n for n in names if n not in skip and base_name(n) not in skip]
    if args.plan:
        print(plan_text(spec, plan(spec, names, args.quick)))
        return 0
    out_dir = (args.out or default_out(args.quick, args.profile)).resolve()
    print(
        f"benchmark suite, {'quick' if args.quick else 'full'} mode, profile {args.profile}, into {out_dir}"
    )
    suite = run_suite(
        names,
        quick=args.quick,
        profile=args.profile,
        out_dir=out_dir,
        timeout=args.timeout,
        echo=args.verbose,
        budgets=args.budgets,
        deadline=args.deadline,
    )
    print(table(suite))
    print(f"\nwrote {out_dir / 'suite.json'}")
    failed = [n for n, s in suite["status"].items() if s in ("failed", "partial")]
    if failed:
        print(f"failed or cut short: {', '.join(failed)} (their logs: {out_dir / 'logs'})")
        return 1
    return 0

"""Writes docs/performance.md and the README's headline table from the benchmarks' JSON results (never by hand).

    python -m tests.perf.report                    # tests/perf/results/ (and results/gpu/): both files
    python -m tests.perf.report --print            # prints the section instead
    python -m tests.perf.report --results artifacts/perf --print   # a quick suite's figures

A results folder holds the suite's ``suite.json`` (``python -m tests.perf``) and one JSON per benchmark.
The suite's benchmarks are read from ``suite.json`` when it is there, any other benchmark from its own
file (one run alone with ``python -m tests.perf.bench_<name>``). The section opens with the headline
ratios (``tests.perf.suite.BENCHMARKS`` reads them off each benchmark's JSON), then each benchmark's
JSON is rendered by a function below; a ``gpu/`` sub-folder (``--profile gpu``) gets a part of its own.
It sits between the ``<!-- perf:begin -->`` and ``<!-- perf:end -->`` markers.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from tests.perf.suite import BENCHMARKS, base_name, headlines

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).parent / "results"
DOCS = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"


def render_store(r: dict) -> str:
    ingest = r["ingest"]
    m = r["machine"]
    lines = [
        f"**Run store** ({r['mode']} mode, {r['calls']:,} calls with {r['prompt_tokens']}-token prompts and "
        f"{r['completion_tokens']}-token completions, {m['cpus']} CPUs, SQLite {m['sqlite']}, {r['when']}):",
        "",
        "| measure | value |",
        "|---|---|",
        f"| ingest through `RunStore` | {ingest['store_calls_per_s']:,} calls/s |",
        f"| raw `sqlite3.executemany` of the same rows, same run | {ingest['raw_sqlite_calls_per_s']:,} calls/s |",
        f"| store overhead (raw rate / store rate) | {ingest['overhead_ratio']:.2f}x |",
        f"| database size | {ingest['db_mb']:.0f} MB |",
    ]
    lines += [f"| query: {name} | {q['ms']:.1f} ms |" for name, q in r["queries"].items()]
    return "\n".join(lines)


def render_binpack(r: dict) -> str:
    m = r["machine"]
    lines = [
        f"**First-Fit-Decreasing bin packing** ({r['mode']} mode, {r['items']:,} items an instance, "
        f"{r['seeds']} instance(s) per distribution, {m['cpus']} CPUs, Python {m['python']}, {r['when']}); "
        "`ffd_pack` against the plain two-loop FFD of the MARS sketch on the same instances (identical bins):",
        "",
        "| distribution | capacity | `ffd_pack` | plain loops | speed-up | bins | ceil(sum/C) | bins / bound (mean, max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in r["distributions"].values():
        ratio = f"{d['ratio_mean']:.3f}, {d['ratio_max']:.3f}"
        if d.get("ratio_to_optimum") is not None:
            ratio += f" (optimum reached: {d['ratio_to_optimum']:.3f} x OPT)"
        lines.append(
            f"| {d['description']} | {d['capacity']:,} | {d['ffd_ms']:.1f} ms | {d['naive_ms']:,.0f} ms | "
            f"{d['speedup']:.0f}x | {d['bins']:,.0f} | {d['lower_bound']:,.0f} | {ratio} |"
        )
    return "\n".join(lines)


def render_engine(r: dict) -> str:
    parts = []
    overhead = {kind: b for kind, b in r["backends"].items() if "overhead_ratio" in b}
    if overhead:
        lines = [
            f"**Engine overhead** ({r['mode']} mode, {r['topology']} on {r['model']}, {r['tasks']} problems at "
            f"once, <= {r['max_tokens']} tokens a call, {r['when']}): the same greedy requests sent straight to the "
            "backend wave by wave, against the engine running the topology (ratio = raw time / engine time).",
            "",
            "| backend | engine tokens/s | raw backend tokens/s | ratio | same token counts |",
            "|---|---|---|---|---|",
        ]
        for kind, b in overhead.items():
            lines.append(
                f"| {kind} | {b['engine_tokens_per_s']} | {b['raw_tokens_per_s']} | {b['overhead_ratio']:.2f} | "
                f"{'yes' if b['same_token_counts'] else 'no'} |"
            )
        parts.append("\n".join(lines))
    for kind, b in r["backends"].items():
        decode, profile = b.get("decode"), b.get("profile")
        if not decode and not profile:
            continue
        text = f"**Decode throughput** ({r['mode']} mode, {kind} backend, {r['model']}, {_where(r)}, {r['when']}):"
        if decode:
            text += (
                f" not profiled, {decode['rows']} rows at once, prompts of {decode['prompt_lengths'][0]}-"
                f"{decode['prompt_lengths'][1]} tokens, completions capped at {decode['max_tokens'][0]}-"
                f"{decode['max_tokens'][1]} tokens, sampled with stop strings and end-of-sequence honoured "
                f"({decode['finished_by_stop']} stopped by a string, {decode['finished_by_eos']} by "
                f"end-of-sequence), {decode['decode']} decode: **{decode['tokens_per_s']:,.0f} completion "
                f"tokens/s** ({decode['completion_tokens']:,} in {decode['wall_s']:.2f} s)."
            )
        if profile:
            busy = (
                f", the device busy {profile['device_busy']:.0%} of it" if profile.get("device_busy") else ""
            )
            text += (
                f" Under torch.profiler, {r['tasks']} identical prompts decoded to {r['max_tokens']} tokens "
                f"(`ignore_eos`): {profile['tokens_per_s']:,.0f} tokens/s, CPU {profile['cpu_s']:.2f} s and "
                f"device {profile['device_s']:.2f} s in {profile['wall_s']:.2f} s{busy}."
            )
        parts.append(text)
    return "\n\n".join(parts)


def render_backends(r: dict) -> str:
    lines = [
        f"**Raw backend throughput** ({r['mode']} mode, {r['model']}, {r['prompts']} prompts x <= {r['max_tokens']} "
        f"tokens submitted at once, {r['when']}):",
        "",
        "| backend | completion tokens/s | start-up |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {b['tokens_per_s']} | {b['startup_s']} s |" for k, b in r["backends"].items()]
    base = r["backends"].get("hf", {}).get("tokens_per_s")
    if base and "vllm" in r["backends"]:
        lines.append(f"\nvLLM / transformers: {r['backends']['vllm']['tokens_per_s'] / base:.2f}x.")
    return "\n".join(lines)


def _render_groups(groups: dict | None) -> str:
    if groups is None:  # results from before the grouped-samples measurement
        return ""
    seconds, tokens = groups["fwd_bwd_s"], groups["computed_tokens"]
    return (
        f"Grouped samples ({groups['description']}): per-sample blocks {seconds['packed_blocks']:.2f} s over "
        f"{tokens['packed_blocks']:,} tokens, shared prefixes {seconds['shared']:.2f} s over {tokens['shared']:,}: "
        f"{groups['blocks_vs_shared']:.2f}x. "
    )


def render_packing(r: dict) -> str:
    lengths, m = r["lengths"], r["machine"]
    lines = [
        f"**Padding-free packing** ({r['mode']} mode, {r['model']}, {r['samples']} samples of long-tailed length "
        f"({lengths['real_tokens']:,} tokens, median {lengths['median']}, max {lengths['max']}), "
        f"<= {r['token_budget']:,} tokens a micro-batch, forward+backward, median of {r['repeats']} rounds taken "
        f"side by side, {m['cpus']} CPUs, {r['when']}); attention scores = query-key pairs computed "
        "(sdpa fills a masked packed row's whole T x T; `packed_blocks` runs it per sample):",
        "",
        "| strategy | micro-batches | tokens computed | padding | peak tokens | attention scores | "
        "fwd+bwd | time / packed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, d in r["strategies"].items():
        timing = (
            f"{d['fwd_bwd_s']:.1f} s | {d['time_vs_packed']:.2f}x"
            if d["fwd_bwd_s"] is not None
            else f"not run (batch size {d.get('batch_size', '-')}) | -"
        )
        lines.append(
            f"| {name} | {d['micro_batches']} | {d['computed_tokens']:,} | {d['padding_fraction']:.1%} | "
            f"{d['peak_tokens']:,} | {d['attention_scores']:,} | {timing} |"
        )
    layout = r["layout"]
    lines.append(
        f"\nThe attention layout alone ({layout['description']}): masked row {layout['packed_row_s']:.2f} s "
        f"({layout['packed_row_vs_batch']:.2f}x the batch), per-sample blocks {layout['packed_row_blocks_s']:.2f} s "
        f"({layout['packed_row_blocks_vs_batch']:.2f}x), batch {layout['batch_s']:.2f} s. "
        + _render_groups(r.get("groups"))
        + f"Same log-probs on every path: {'yes' if r['same_logprobs'] else 'no'} "
        f"(max difference {r['max_logprob_difference']:.1e})."
    )
    return "\n".join(lines)


def _mfu(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render_trainer(r: dict) -> str:
    steps = r.get("steps_done", r.get("steps"))
    head = (
        f"**Trainer step against TRL** ({r['mode']} mode, {r['model']}, {r['samples']} samples, "
        f"{r['tokens']:,} tokens (TRL pads them to {r['padded_tokens_trl']:,}), mean of {steps} steps after "
        f"a warm-up, the trainers taking turns step by step, {r.get('dtype', 'float32')}, {_where(r)}, "
        f"{r['when']}):"
    )
    if (
        "trl_gradient_checkpointing" not in r
    ):  # before issue 47: one TRL run, its checkpointing on (its default)
        return "\n".join(
            [
                head,
                "",
                "| workbench step | `trl.GRPOTrainer` step (its default gradient checkpointing: on) | ratio |",
                "|---|---|---|",
                f"| {r['workbench_step_s']:.2f} s | {r['trl_step_s']:.2f} s | {r['ratio']:.2f} |",
            ]
        )
    lines = [
        head,
        "",
        "| trainer | gradient checkpointing | step | workbench step / this | MFU, computed tokens | MFU, logical tokens |",
        "|---|---|---|---|---|---|",
        f"| workbench | off | {r['workbench_step_s']:.2f} s | 1.00 | {_mfu(r.get('mfu_computed'))} | "
        f"{_mfu(r.get('mfu_logical'))} |",
    ]
    for setting, step, ratio in (
        ("off", "trl_step_s", "ratio"),
        ("on", "trl_ckpt_step_s", "ratio_vs_trl_ckpt"),
    ):
        if step in r:
            padded = r.get("trl_mfu_computed") if setting == "off" else None  # TRL computes its padding
            computed = f"{_mfu(padded)} (padded batch)" if padded is not None else "-"
            logical = _mfu(r.get("trl_mfu_logical")) if setting == "off" else "-"
            lines.append(
                f"| `trl.GRPOTrainer` | {setting} | {r[step]:.2f} s | {r[ratio]:.2f} | {computed} | {logical} |"
            )
    lines.append(
        "\nThe headline ratio is against TRL with its checkpointing off, as the workbench runs here (target <= 1.0 "
        "on a CPU, <= 0.5 on a GPU); TRL 1.16 turns it on by default, which costs it a recompute."
    )
    return "\n".join(lines)


def _where(r: dict) -> str:
    m = r["machine"]
    return m["gpu"] if m.get("gpu") else f"{m['cpus']} CPUs"


def versions(machine: dict) -> str:
    """The libraries and drivers a result ran with, in a line ("" for results from before they were recorded)."""
    v = machine.get("versions") or {}
    names = [
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("trl", "trl"),
        ("peft", "peft"),
        ("vllm", "vLLM"),
        ("cuda", "CUDA"),
        ("cudnn", "cuDNN"),
        ("driver", "driver"),
    ]
    return ", ".join(f"{label} {v[key]}" for key, label in names if v.get(key))


def render_precision(r: dict) -> str:
    lora = ", LoRA per role on the frozen base" if r.get("lora") else ", full fine-tuning"
    gpu = r["device"] != "cpu"  # MFU needs a chip's peak: on a GPU only
    columns = ["variant", "step", "trained tokens/s"]
    columns += ["peak GPU memory" if gpu else "peak memory (the process's RSS)", "tokens computed / logical"]
    columns += ["MFU, computed tokens", "MFU, logical tokens"] if gpu else []
    columns += ["attention path (layer calls)"]
    lines = [
        f"**Trainer precision and memory** ({r['mode']} mode, {r['model']}{lora}, {r['samples']} samples, prompts "
        f"~{r['prompt_tokens_median']} and completions ~{r['completion_tokens_median']} tokens, token budget "
        f"{r['token_budget']:,}, {r['device']}, {_where(r)}, {r['when']}"
        + ("" if r.get("complete", True) else "; cut short, the variants measured so far")
        + "):",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for name, v in r["variants"].items():
        if "error" in v:
            reason = v["error"].strip().splitlines()[-1][:100] if v["error"].strip() else "failed"
            lines.append(f"| {name} | failed: {reason} |" + " |" * (len(columns) - 2))
            continue
        cells = [name, f"{v['step_s']:.3f} s", f"{v['tokens_per_s']:,.0f}", f"{v['peak_memory_gb']:.2f} GB"]
        cells.append(f"{v['tokens_computed']:,} / {v['tokens']:,}" if "tokens_computed" in v else "-")
        if gpu:  # before issue 47 "mfu" was MFU on the logical tokens
            cells += [_mfu(v.get("mfu_computed")), _mfu(v.get("mfu_logical", v.get("mfu")))]
        cells.append(", ".join(f"{k} x{n}" for k, n in (v.get("attention_paths") or {}).items()) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    if r.get("ratios"):
        lines.append("\nRatios: " + ", ".join(f"{k} {v:.2f}" for k, v in r["ratios"].items()) + ".")
    for name, v in r["variants"].items():
        profile = v.get("profile") if "error" not in v else None
        if profile:
            busy = (
                f", the device busy {profile['device_busy']:.0%} of the wall"
                if profile.get("device_busy")
                else ""
            )
            kernels = "; attention kernels: " + ", ".join(
                f"`{k[:60]}` {t * 1e3:.1f} ms" for k, t in (profile.get("attention_kernels") or {}).items()
            )
            lines.append(
                f"\nOne {name} step profiled: wall {profile['wall_s']:.2f} s, CPU {profile['cpu_s']:.2f} s, device "
                f"{profile['device_s']:.2f} s{busy}, {profile['operators']:,} operators"
                + (kernels if profile.get("attention_kernels") else "")
                + "."
            )
    kernels = r.get("varlen_vs_padded")
    if kernels:
        lines.append(
            f"\nAttention paths compared on one packed micro-batch: failed, {kernels['error']}"
            if "error" in kernels
            else f"\nAttention paths compared on one packed micro-batch ({kernels['tokens']:,} tokens, "
            f"{kernels['shared_tokens']:,} shared): the device's own ({kernels['default_path']}) against the padded "
            f"sdpa path, log-probs within {kernels['max_logprob_difference']:.1e}, gradient norms within "
            f"{kernels['grad_norm_rel_diff']:.1e} (relative)."
        )
    same = r.get("cpu_vs_device_fp32")
    if same:
        lines.append(
            f"\nOne fp32 step on the CPU and on {r['device']}, same weights and batch: loss differs by "
            f"{same['loss_rel_diff']:.1e}, gradient norm by {same['grad_norm_rel_diff']:.1e} (relative)."
        )
    return "\n".join(lines)


def render_dashboard_queries(r: dict) -> str:
    m = r["machine"]
    training, rollout = r["runs"]["training"], r["runs"]["rollout"]
    lines = [
        f"**Dashboard queries** ({r['mode']} mode, two runs of {r['calls']:,} calls each, {r['calls_per_episode']} calls "
        f"an episode, median of {r['repeats']} runs, {m['cpus']} CPUs, {r['finished']}): every server-side query of "
        f"the trajectory browser on the run's last step; slowest {r['slowest_ms']:.0f} ms against the "
        f"{r['target_ms']:.0f} ms target.",
        "",
        f"| query | training run ({training['steps']} steps of {training['episodes_per_step']:,} episodes) "
        f"| rollout ({rollout['steps']} step of {rollout['episodes_per_step']:,} episodes) |",
        "|---|---|---|",
    ]
    for name, t in training["queries"].items():
        o = rollout["queries"].get(name, {})
        lines.append(f"| {name} | {t['median_ms']:.1f} ms | {o.get('median_ms', float('nan')):.1f} ms |")
    return "\n".join(lines)


def render_dashboard_load(r: dict) -> str:
    m, first, lag = r["machine"], r["first_doc_s"], r["update_lag_s"]

    def s(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f} s"

    ratio = "—" if r["train_ratio"] is None else f"{r['train_ratio']:.2f}"
    client = (
        "each signing in from its own address, then the page, the websocket, its document and the "
        "`document_ready` a browser sends"
        if "client" in r
        else "Bokeh client sessions from one address, without `document_ready`"
    )
    text = (
        f"**Dashboard under load** ({r['mode']} mode, {m['cpus']} CPUs, {r['finished']}): {r['viewers']} "
        f"viewers ({client}) opened the dashboard on a tiny `workbench train` run while it trained "
        f"({r['seconds_watched']:.0f} s watched). First document (page asked to document received): p50 "
        f"{s(first['p50'])}, p95 {s(first['p95'])}, max {s(first['max'])} ({first['within_target']} of "
        f"{r['viewers']} within {r['target_s']:.0f} s). Update lag (a step committed to a viewer's page "
        f"showing it): p50 {s(lag['p50'])}, p95 {s(lag['p95'])} over {lag['updates']} updates, {lag['missed']} "
        f"never shown (target p95 <= {r['target_s']:.0f} s). The trainer ran "
        f"{r['train_steps_per_s_unwatched']:.2f} steps/s unwatched and {r['train_steps_per_s_watched']:.2f} "
        f"watched (ratio {ratio}); {r['sessions_connected']} sessions connected, {len(r['session_failures'])} "
        f"failed, {r['server_tracebacks']} tracebacks in the server's log."
    )
    if "server_cpu_s" in r:
        load = r["load_average"]
        text += (
            f" Sign-in p50 {s(r['sign_in_s']['p50'])}, p95 {s(r['sign_in_s']['p95'])}; the server used "
            f"{r['server_cpu_s']['watched']:.1f} CPU seconds while watched; load average "
            f"{load['before']:.2f} before, {load['after']:.2f} after (other work on the machine)."
        )
    c = r.get("compare")
    if c:
        x = {key: "—" if value is None else f"{value:.2f}" for key, value in c["ratios"].items()}
        first, lag, mine = c["first_doc_s"], c["update_lag_s"], c["comparison"]
        text += (
            f" Then {r['viewers']} viewers again, {c['viewers_on_comparison']} of them on the run's comparison with "
            f"the gallery's (`{c['path'].split(',', 1)[1]}`; drawn once for all its sessions), the others on its "
            f"page: first document p95 {s(first['p95'])} (the comparisons' {s(mine['first_doc_s']['p95'])}; "
            f"{first['within_target']} of {r['viewers']} within {r['target_s']:.0f} s), update lag p95 "
            f"{s(lag['p95'])} over {lag['updates']} updates (the comparisons' {s(mine['update_lag_s']['p95'])}), "
            f"{lag['missed']} never shown, the trainer {c['train_steps_per_s_watched']:.2f} steps/s, "
            f"{len(c['session_failures'])} sessions failed. Against every viewer on the run's page, side by side "
            f"in the same run: first document p95 x{x['first_doc_p95']}, update lag p95 x{x['update_lag_p95']}, "
            f"server CPU x{x['server_cpu']}, trainer steps/s x{x['train_steps_per_s']}."
        )
    return text


def render_schedulers(r: dict) -> str:
    w, m = r["workload"], r["machine"]
    shape = ", ".join(
        f"{label} {w[key]}"
        for key, label in (
            ("steps", "steps"),
            ("batch_size", "batch"),
            ("group_size", "group"),
            ("rounds", "rounds"),
        )
        if key in w
    )
    lengths = (
        f"completion lengths {w.get('length_distribution', 'long-tailed')}, median {w['length_median']}, "
        f"at most {w['length_cap']} tokens"
        if "length_median" in w
        else w.get("length_distribution", "long-tailed completion lengths")
    )
    steady = w.get("steady_steps")
    window = (
        f"steps {steady[0]}-{steady[1]}, after the pipeline filled and before its last drain"
        if steady
        else ""
    )
    lines = [
        f"**Schedulers {'on Ray rollout workers' if r['mode'] == 'ray' else 'on a long-tail workload'}** ({r['mode']} mode, {r.get('model', '')}, "
        f"{w.get('topology', '')}; {shape}; {lengths}; {m['cpus']} CPUs, {r['when']}): samples trained per "
        "second of each scheduler, the schedulers taking turns in one run (ratio = its samples/s / sync's)"
        + (f"; steady: {window}; whole run: every step, fill and drain included." if steady else "."),
        "",
    ]
    runs = r.get("run_samples_per_s")

    def ratio(table: str, name: str) -> str:
        value = 1.0 if name == "sync" else r[table].get(f"{name}_vs_sync")
        return "-" if value is None else f"{value:.2f}x"

    if runs:
        lines += [
            "| scheduler | samples/s (steady) | vs sync | samples/s (whole run) | vs sync |",
            "|---|---|---|---|---|",
        ]
        for name, rate in r["samples_per_s"].items():
            lines.append(
                f"| {name} | {rate:.2f} | {ratio('ratios', name)} | {runs[name]:.2f} | {ratio('run_ratios', name)} |"
            )
    else:
        lines += ["| scheduler | samples/s | vs sync |", "|---|---|---|"]
        for name, rate in r["samples_per_s"].items():
            lines.append(f"| {name} | {rate:.2f} | {ratio('ratios', name)} |")
    tokens = r.get("token_ratios")
    if tokens:
        same = ", ".join(f"{k.removesuffix('_vs_sync')} {v:.2f}" for k, v in tokens.items())
        lines.append(f"\nCompletion tokens generated, against sync's: {same}.")
    return "\n".join(lines)


def render_replay(r: dict) -> str:
    return (
        f"**Replay cost** ({r['mode']} mode, {r['topology']} on {r['model']}, {r.get('backend', 'hf')} backend, "
        f"{r['when']}): "
        f"{r['continuations']} continuations of one stored episode from the call whose prefix holds "
        f"{r['prefix_share']:.0%} of its completion tokens (`wb.replay`, the prefix answered from the store), "
        f"against {r['continuations']} fresh episodes of its task (`wb.rollout`), <= {r['max_tokens']} tokens a "
        f"call, best of {len(r['times']['fresh'])}: replay {r['replay_s']:.2f} s, fresh {r['fresh_s']:.2f} s, "
        f"ratio {r['ratio']:.2f} (goal <= 0.6)."
    )


def render_prefix(r: dict) -> str:
    return (
        f"**Shared-prefix prefill** ({r['mode']} mode, {r['topology']} on {r['model']}, hf backend, {r['when']}): "
        f"{r['tasks']} problems rolled out greedily ({r['calls']} calls, {r['prompt_tokens']:,} prompt tokens), "
        f"with the prefix a decode batch's prompts share prefilled once against every prompt prefilled whole, "
        f"best of {len(r['times']['shared'])}: {r['shared_s']:.2f} s against {r['whole_s']:.2f} s, ratio "
        f"{r['ratio']:.2f}; {r['same_completions']:.0%} of the completions the same."
    )


RENDERERS = {
    "store": render_store,
    "binpack": render_binpack,
    "engine": render_engine,
    "backends": render_backends,
    "packing": render_packing,
    "trainer": render_trainer,
    "precision": render_precision,
    "dashboard_queries": render_dashboard_queries,
    "dashboard_load": render_dashboard_load,
    "schedulers": render_schedulers,
    "schedulers_ray": render_schedulers,
    "replay": render_replay,
    "replay_vllm": render_replay,
    "prefix": render_prefix,
}


def load_results(folder: Path) -> tuple[dict[str, dict], dict[str, Any] | None]:
    """The benchmarks' JSON in ``folder`` by name (``suite.json``'s first, then lone files), and ``suite.json``."""
    suite_path = folder / "suite.json"
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else None
    results: dict[str, dict] = {}
    if suite is not None:  # a run cut short by its time budget ("partial") keeps what it measured
        results = {
            name: r
            for name, r in suite["benchmarks"].items()
            if suite.get("status", {}).get(name, "ok") in ("ok", "partial")
        }
    for path in sorted(folder.glob("*.json")):
        if path.name == "suite.json":
            continue
        result = json.loads(path.read_text())
        name = path.stem if "@" in path.stem else result.get("benchmark", path.stem)
        results.setdefault(name, result)
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    return dict(
        sorted(results.items(), key=lambda kv: (order.get(base_name(kv[0]), len(order)), kv[0]))
    ), suite


def headline_table(results: dict[str, dict]) -> str:
    rows = []
    for name, result in results.items():
        if base_name(name) not in BENCHMARKS:
            continue
        try:
            figures = headlines(name, result)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        when = result.get("when") or result.get("finished") or ""
        rows += [
            f"| {name} | {h['measure']} | {h['ratio']:.2f} | {h['meaning']} | {result.get('mode', '')}, {when[:10]} |"
            for h in figures
        ]
    if not rows:
        return ""
    return "\n".join(
        ["| benchmark | figure | ratio | what is compared | run |", "|---|---|---|---|---|", *rows]
    )


def render_folder(folder: Path) -> str:
    results, suite = load_results(folder)
    parts = []
    if suite is not None:
        m = suite["machine"]
        on = f"{m['cpus']} CPUs" + (f", {m['gpu']}" if m.get("gpu") else "")
        others = sorted(set(results) - set(suite["benchmarks"]))
        cut = [n for n, status in suite.get("status", {}).items() if status == "partial"]
        skipped = [n for n, status in suite.get("status", {}).items() if status == "skipped"]
        parts.append(
            f"Suite run of {suite['when']} ({suite['mode']} mode, profile {suite['profile']}, {on})"
            + (f"; {', '.join(others)} from their own latest run" if others else "")
            + (f"; cut short by their time budget, figures so far: {', '.join(cut)}" if cut else "")
            + (f"; not run: {', '.join(skipped)}" if skipped else "")
            + "."
            + (f" Versions: {versions(m)}." if versions(m) else "")
        )
    table = headline_table(results)
    if table:
        parts.append(table)
    for name, result in results.items():
        render = RENDERERS.get(base_name(name))
        if render is not None:
            parts.append(render(result) if "@" not in name else f"_{name}:_ " + render(result))
    return "\n\n".join(parts)


def section(results: Path = RESULTS) -> str:
    parts = []
    cpu = render_folder(results)
    parts.append(cpu or "_No benchmark results yet: run `python -m tests.perf`._")
    gpu = render_folder(results / "gpu") if (results / "gpu").is_dir() else ""
    parts.append(
        "### GPU profile\n\n"
        + (gpu or "_No GPU figures yet: run `bash tests/perf/gpu_check.sh` on a GPU machine (above)._")
    )
    return "\n\n".join(parts)


def summary(results: Path = RESULTS) -> str:
    """The README's part: the headline ratios of the CPU run and of the GPU profile, and where the rest is."""
    cpu = headline_table(load_results(results)[0])
    parts = [cpu or "_No benchmark results yet: run `python -m tests.perf`._"]
    gpu_results = load_results(results / "gpu")[0] if (results / "gpu").is_dir() else {}
    gpu = headline_table(gpu_results)
    chips = sorted({r["machine"]["gpu"] for r in gpu_results.values() if r.get("machine", {}).get("gpu")})
    parts.append(
        f"GPU profile ({', '.join(chips) or 'GPU'}):\n\n{gpu}"
        if gpu
        else "_No GPU figures yet: run `bash tests/perf/gpu_check.sh` on a GPU machine._"
    )
    parts.append("Every benchmark's workload and tables: [docs/performance.md](docs/performance.md).")
    return "\n\n".join(parts)


def write_between_markers(path: Path, text: str) -> None:
    """Replace what ``path`` holds between the perf markers with ``text``."""
    content = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", content))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="results folder (default tests/perf/results)"
    )
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument(
        "--docs", type=Path, default=DOCS, help="the detailed page (default docs/performance.md)"
    )
    parser.add_argument(
        "--print", action="store_true", help="print the detailed section instead of writing the files"
    )
    args = parser.parse_args(argv)
    if args.print:
        print(section(args.results))
        return
    write_between_markers(args.docs, section(args.results))
    write_between_markers(args.readme, summary(args.results))
    print(f"updated {args.docs} and the headline table of {args.readme} from {args.results}")


if __name__ == "__main__":
    main()

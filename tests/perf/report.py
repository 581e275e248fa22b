"""Writes the README's performance section from the benchmarks' JSON results (never by hand).

    python -m tests.perf.report            # reads tests/perf/results/*.json, rewrites README.md

Each benchmark's JSON is rendered by a function below; the section sits between the
``<!-- perf:begin -->`` and ``<!-- perf:end -->`` markers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).parent / "results"
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
    lines = [
        f"**Engine overhead** ({r['mode']} mode, {r['topology']} on {r['model']}, {r['tasks']} problems at once, "
        f"<= {r['max_tokens']} tokens a call, {r['when']}): the same greedy requests sent straight to the "
        "backend wave by wave, against the engine running the topology (ratio = raw time / engine time).",
        "",
        "| backend | engine tokens/s | raw backend tokens/s | ratio | same token counts |",
        "|---|---|---|---|---|",
    ]
    for kind, b in r["backends"].items():
        lines.append(
            f"| {kind} | {b['engine_tokens_per_s']} | {b['raw_tokens_per_s']} | {b['overhead_ratio']:.2f} | "
            f"{'yes' if b['same_token_counts'] else 'no'} |"
        )
    return "\n".join(lines)


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
        lines.append(
            f"\nvLLM's CPU build / transformers: {r['backends']['vllm']['tokens_per_s'] / base:.2f}x."
        )
    return "\n".join(lines)


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
        f"Same log-probs on every path: {'yes' if r['same_logprobs'] else 'no'} "
        f"(max difference {r['max_logprob_difference']:.1e})."
    )
    return "\n".join(lines)


def render_trainer(r: dict) -> str:
    return "\n".join(
        [
            f"**Trainer step against TRL** ({r['mode']} mode, {r['model']}, {r['samples']} samples, "
            f"{r['tokens']:,} tokens (TRL pads them to {r['padded_tokens_trl']:,}), mean of {r['steps']} steps after "
            f"a warm-up, the two trainers alternating step by step, {r['machine']['cpus']} CPUs, {r['when']}):",
            "",
            "| workbench step | `trl.GRPOTrainer` step | ratio (target <= 1.0) |",
            "|---|---|---|",
            f"| {r['workbench_step_s']:.2f} s | {r['trl_step_s']:.2f} s | {r['ratio']:.2f} |",
        ]
    )


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
    m = r["machine"]
    return (
        f"**Dashboard under load** ({r['mode']} mode, {m['cpus']} CPUs, {r['finished']}): a run's writer stored "
        f"{r['calls_per_s_unwatched']:,.0f} calls/s unwatched and {r['calls_per_s_watched']:,.0f} calls/s while "
        f"{r['viewers']} dashboard sessions polled it for {r['seconds_per_phase']:.0f} s, a ratio of "
        f"{r['throughput_ratio']:.2f} (target >= 0.9); {r['sessions_connected']} sessions connected, "
        f"{len(r['session_failures'])} failed, {r['server_tracebacks']} tracebacks in the server's log."
    )


RENDERERS = {
    "store": render_store,
    "binpack": render_binpack,
    "engine": render_engine,
    "backends": render_backends,
    "packing": render_packing,
    "trainer": render_trainer,
    "dashboard_queries": render_dashboard_queries,
    "dashboard_load": render_dashboard_load,
}


def section() -> str:
    parts = []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        render = RENDERERS.get(result.get("benchmark", path.stem))
        if render is not None:
            parts.append(render(result))
    return (
        "\n\n".join(parts) if parts else "_No benchmark results yet: run `python -m tests.perf.bench_store`._"
    )


def update_readme(readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    readme.write_text(pattern.sub(lambda _: f"{BEGIN}\n{section()}\n{END}", text))


if __name__ == "__main__":
    update_readme()
    print(f"updated the performance section of {ROOT / 'README.md'}")

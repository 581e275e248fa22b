"""Padding-free packing benchmark: forward+backward time and tokens computed, packed against padded micro-batches.

    python -m tests.perf.bench_packing --quick    # the tiny model, well under a minute
    python -m tests.perf.bench_packing            # smollm2-135m, a few minutes; writes results/packing.json

One GRPO-like batch of samples with long-tailed lengths (prompt and completion token counts drawn
lognormal, fixed seed, random token ids) is scored and back-propagated four ways under the same
token budget per micro-batch, side by side in one run (the strategies take turns, ``--repeats``
rounds, medians reported):

- ``packed``: ``workbench.rl.packing``: First-Fit-Decreasing micro-batches of at most ``budget``
  real tokens, each one padding-free row (``collate`` + ``token_logprobs``), attention by sdpa with
  the block-diagonal mask transformers builds from the position ids;
- ``packed_blocks``: the same rows with ``use_block_attention`` (sdpa on each sample's own block);
- ``padded_sorted``: samples sorted by length, longest first, and cut greedily into right-padded
  batches of at most ``budget`` tokens counting the padding (rows x longest row);
- ``padded_unsorted``: the same in the samples' own order.

Every path computes logits only at the completion positions, so the differences are the padding and
the attention layout. A fifth row, ``padded_fixed``, is counted but not run: the samples in order in
as many fixed-size padded batches as ``packed`` has micro-batches (the usual trainer's fixed batch
size), to show its peak tokens per micro-batch (memory). ``attention_scores`` counts the query-key
pairs computed: sdpa fills a masked packed row's whole T x T, a padded batch rows x width^2,
per-sample blocks (like flash-attention's varlen kernels on a GPU) only each sample's L^2.
``layout`` isolates that cost: 8 equal samples as one packed row, masked or by blocks, against the
same tokens as an [8, budget/8] batch (no padding anywhere). The run also checks that all paths give
the same log-probs. Timings on a shared 2-core machine are noisy: each round's times are kept
(``fwd_bwd_s_all``) with their median and minimum.

``groups`` measures shared prefixes on what a grouped GRPO step holds: 8 prompts that open with the
same few-shot transcript (160 tokens) and differ in a 20-token question, each read by a group of 4
samples (completions lognormal, median 20): per-sample blocks with every prompt laid out for every
sample (``packed_blocks``) against rows that lay a shared prefix out once (``shared``), fwd+bwd side
by side under the same token budget.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.perf.runner import write_json
from workbench.rl.packing import (
    collate,
    plan_micro_batches,
    plan_shared_micro_batches,
    token_logprobs,
    use_block_attention,
)
from workbench.rl.samples import Sample

DEFAULT_OUT = Path(__file__).parent / "results" / "packing.json"
TIMED = ("packed", "packed_blocks", "padded_sorted", "padded_unsorted")


def make_samples(n: int, vocab: int, budget: int, seed: int = 0) -> list[Sample]:
    """``n`` samples: prompts lognormal (median 40, sigma 0.5), completions lognormal (median 48, sigma 1)."""
    rng = random.Random(f"packing:{seed}")
    samples = []
    for _ in range(n):
        n_prompt = min(budget // 2, max(1, round(rng.lognormvariate(math.log(40), 0.5))))
        n_completion = min(budget - n_prompt, max(1, round(rng.lognormvariate(math.log(48), 1.0))))
        samples.append(
            Sample(
                prompt_ids=[rng.randrange(vocab) for _ in range(n_prompt)],
                completion_ids=[rng.randrange(vocab) for _ in range(n_completion)],
                mask=[int(rng.random() < 0.9) for _ in range(n_completion)],
                old_logprobs=[0.0] * n_completion,
            )
        )
    return samples


def make_groups(vocab: int, prompts: int = 8, group: int = 4, seed: int = 0) -> list[Sample]:
    """``prompts`` x ``group`` samples: one 160-token transcript, a 20-token question per prompt, completions
    lognormal (median 20, sigma 0.5), in the order a rollout stores them (a group's samples together)."""
    rng = random.Random(f"packing:groups:{seed}")
    shot = [rng.randrange(vocab) for _ in range(160)]
    samples = []
    for _ in range(prompts):
        prompt = shot + [rng.randrange(vocab) for _ in range(20)]
        for _ in range(group):
            n = max(1, round(rng.lognormvariate(math.log(20), 0.5)))
            completion = [rng.randrange(vocab) for _ in range(n)]
            samples.append(Sample(list(prompt), completion, [1] * n, [0.0] * n))
    return samples


def _groups(model: Any, budget: int, repeats: int) -> dict[str, Any]:
    """Per-sample blocks against shared prefixes on grouped samples, side by side (see the module docstring)."""
    samples = make_groups(model.config.vocab_size)
    plans = {
        "packed_blocks": plan_micro_batches(samples, budget),
        "shared": plan_shared_micro_batches(samples, budget),
    }
    scorers = {"packed_blocks": _block_logprobs, "shared": functools.partial(_block_logprobs, share=True)}
    seconds: dict[str, list[float]] = {name: [] for name in plans}
    logprobs = {}
    for round_ in range(repeats):
        for name in list(plans)[round_ % 2 :] + list(plans)[: round_ % 2]:
            wall, logprobs[name] = _step(model, samples, plans[name], scorers[name])
            seconds[name].append(wall)
    model.zero_grad(set_to_none=True)
    computed = {
        name: sum(collate(samples, b, share_prefixes=name == "shared").n_tokens for b in plan)
        for name, plan in plans.items()
    }
    median = {name: statistics.median(times) for name, times in seconds.items()}
    return {
        "description": "8 prompts (a shared 160-token transcript + a 20-token question) x 4 samples each",
        "real_tokens": sum(s.n_tokens for s in samples),
        "computed_tokens": computed,
        "micro_batches": {name: len(plan) for name, plan in plans.items()},
        "fwd_bwd_s": {name: round(m, 3) for name, m in median.items()},
        "fwd_bwd_s_all": {name: [round(x, 3) for x in times] for name, times in seconds.items()},
        "blocks_vs_shared": round(median["packed_blocks"] / median["shared"], 3),
        "max_logprob_difference": (logprobs["shared"] - logprobs["packed_blocks"]).abs().max().item(),
    }


def padded_batches(lengths: list[int], budget: int, order: list[int]) -> list[list[int]]:
    """Cut ``order`` greedily into batches whose rows x longest row stays within ``budget``."""
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        if current and (len(current) + 1) * max(width, lengths[i]) > budget:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, lengths[i])
    if current:
        batches.append(current)
    return batches


def _padded_logprobs(
    model: Any, samples: list[Sample], indices: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The classic path: right-padded rows with an attention mask; logits at the completion positions only."""
    rows = [samples[i].prompt_ids + samples[i].completion_ids for i in indices]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    hidden = model.model(input_ids=ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    row, position, target, mask = [], [], [], []
    for k, i in enumerate(indices):
        s = samples[i]
        n_prompt = len(s.prompt_ids)
        row += [k] * len(s.completion_ids)
        position += range(n_prompt - 1, n_prompt - 1 + len(s.completion_ids))
        target += s.completion_ids
        mask += s.mask
    logits = model.lm_head(hidden[torch.tensor(row), torch.tensor(position)])
    targets = torch.tensor(target)
    logprobs = logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, -1)
    return logprobs, torch.tensor(mask, dtype=torch.bool)


def _block_logprobs(
    model: Any, samples: list[Sample], indices: list[int], share: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    use_block_attention(model)
    try:
        return _packed_logprobs(model, samples, indices, share)
    finally:
        model.set_attn_implementation("sdpa")


def _packed_logprobs(
    model: Any, samples: list[Sample], indices: list[int], share: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate(samples, indices, share_prefixes=share)
    logprobs, _ = token_logprobs(model, batch)
    return logprobs, batch.mask


def _counts(samples: list[Sample], batches: list[list[int]], packed: str) -> dict[str, Any]:
    lengths = [s.n_tokens for s in samples]
    real = sum(lengths)
    if packed:
        per_batch = [sum(lengths[i] for i in b) for b in batches]
        attention = sum(t * t for t in per_batch) if packed == "row" else sum(n * n for n in lengths)
    else:
        per_batch = [len(b) * max(lengths[i] for i in b) for b in batches]
        attention = sum(len(b) * max(lengths[i] for i in b) ** 2 for b in batches)
    computed = sum(per_batch)
    return {
        "micro_batches": len(batches),
        "computed_tokens": computed,
        "padding_tokens": computed - real,
        "padding_fraction": round((computed - real) / computed, 4),
        "peak_tokens": max(per_batch),
        "attention_scores": attention,
    }


def _step(
    model: Any,
    samples: list[Sample],
    batches: list[list[int]],
    score: Callable[[Any, list[Sample], list[int]], tuple[torch.Tensor, torch.Tensor]],
) -> tuple[float, torch.Tensor]:
    """Forward+backward over all micro-batches (gradients accumulate); seconds and the detached log-probs."""
    model.zero_grad(set_to_none=True)
    n_trained = sum(s.n_trained for s in samples)
    pieces = {}
    t0 = time.perf_counter()
    for batch in batches:
        logprobs, mask = score(model, samples, batch)
        (-(logprobs * mask).sum() / n_trained).backward()
        pieces.update(
            zip(batch, logprobs.detach().split([len(samples[i].completion_ids) for i in batch]), strict=True)
        )
    seconds = time.perf_counter() - t0
    return seconds, torch.cat([pieces[i] for i in sorted(pieces)])


def run(model_name: str, n_samples: int, budget: int, repeats: int) -> dict[str, Any]:
    """Run the comparison; returns the results written as JSON."""
    from workbench.models import load

    torch.manual_seed(0)
    model, _ = load(model_name)
    model.train()
    samples = make_samples(n_samples, model.config.vocab_size, budget)
    lengths = [s.n_tokens for s in samples]
    plans = {
        "packed": plan_micro_batches(samples, budget),
        "packed_blocks": plan_micro_batches(samples, budget),
        "padded_sorted": padded_batches(
            lengths, budget, sorted(range(len(samples)), key=lengths.__getitem__, reverse=True)
        ),
        "padded_unsorted": padded_batches(lengths, budget, list(range(len(samples)))),
    }
    size = -(-len(samples) // len(plans["packed"]))
    fixed = [list(range(i, min(i + size, len(samples)))) for i in range(0, len(samples), size)]
    scorers = {
        "packed": _packed_logprobs,
        "packed_blocks": _block_logprobs,
        "padded_sorted": _padded_logprobs,
        "padded_unsorted": _padded_logprobs,
    }

    # warm-up (first-call allocations, kernel selection), then the strategies take turns
    warm = [sorted(range(len(samples)), key=lengths.__getitem__)[:2]]
    for name in ("packed", "padded_sorted"):
        _step(model, samples, warm, scorers[name])
    seconds: dict[str, list[float]] = {name: [] for name in TIMED}
    logprobs: dict[str, torch.Tensor] = {}
    # the attention layout alone: 8 samples of budget/8 tokens as one packed row against an [8, budget/8]
    # batch (equal lengths, so no padding): same tokens, same matmuls, only the attention differs
    width = budget // 8
    rng, half = random.Random("packing:layout"), width // 2
    equal = [
        Sample(
            prompt_ids=[rng.randrange(model.config.vocab_size) for _ in range(half)],
            completion_ids=[rng.randrange(model.config.vocab_size) for _ in range(width - half)],
            mask=[1] * (width - half),
            old_logprobs=[0.0] * (width - half),
        )
        for _ in range(8)
    ]
    layout: dict[str, list[float]] = {"packed_row": [], "packed_row_blocks": [], "batch": []}
    for round_ in range(repeats):
        for name in TIMED[round_ % len(TIMED) :] + TIMED[: round_ % len(TIMED)]:
            wall, logprobs[name] = _step(model, samples, plans[name], scorers[name])
            seconds[name].append(wall)
        layout["packed_row"].append(_step(model, equal, [list(range(8))], _packed_logprobs)[0])
        layout["packed_row_blocks"].append(_step(model, equal, [list(range(8))], _block_logprobs)[0])
        layout["batch"].append(_step(model, equal, [list(range(8))], _padded_logprobs)[0])
    model.zero_grad(set_to_none=True)
    difference = max((logprobs[n] - logprobs["packed"]).abs().max().item() for n in TIMED)

    groups = _groups(model, budget, repeats)
    real = sum(lengths)
    packed_s = statistics.median(seconds["packed"])
    strategies: dict[str, Any] = {}
    for name in (*TIMED, "padded_fixed"):
        packed = {"packed": "row", "packed_blocks": "blocks"}.get(name, "")
        counts = _counts(samples, fixed if name == "padded_fixed" else plans[name], packed)
        entry: dict[str, Any] = dict(counts)
        if name in seconds:
            median = statistics.median(seconds[name])
            entry.update(
                fwd_bwd_s=round(median, 3),
                fwd_bwd_s_min=round(min(seconds[name]), 3),
                fwd_bwd_s_all=[round(x, 3) for x in seconds[name]],
                real_tokens_per_s=round(real / median, 1),
                time_vs_packed=round(median / packed_s, 3),
                min_time_vs_packed=round(min(seconds[name]) / min(seconds["packed"]), 3),
            )
        else:
            entry.update(
                fwd_bwd_s=None,
                fwd_bwd_s_min=None,
                fwd_bwd_s_all=[],
                real_tokens_per_s=None,
                time_vs_packed=None,
                min_time_vs_packed=None,
            )
        entry["computed_tokens_vs_packed"] = round(counts["computed_tokens"] / real, 3)
        entry["peak_tokens_vs_packed"] = None  # filled below
        strategies[name] = entry
    for entry in strategies.values():
        entry["peak_tokens_vs_packed"] = round(entry["peak_tokens"] / strategies["packed"]["peak_tokens"], 3)
    strategies["padded_fixed"]["batch_size"] = size

    return {
        "benchmark": "packing",
        "model": model_name,
        "samples": n_samples,
        "token_budget": budget,
        "repeats": repeats,
        "lengths": {
            "distribution": "prompt lognormal(median 40, sigma 0.5), completion lognormal(median 48, sigma 1)",
            "real_tokens": real,
            "completion_tokens": sum(len(s.completion_ids) for s in samples),
            "mean": round(real / len(samples), 1),
            "median": statistics.median(lengths),
            "max": max(lengths),
        },
        "strategies": strategies,
        "layout": {
            "description": f"8 samples of {width} tokens: one packed row against an [8, {width}] batch",
            "packed_row_s": round(statistics.median(layout["packed_row"]), 3),
            "packed_row_blocks_s": round(statistics.median(layout["packed_row_blocks"]), 3),
            "batch_s": round(statistics.median(layout["batch"]), 3),
            "packed_row_vs_batch": round(
                statistics.median(layout["packed_row"]) / statistics.median(layout["batch"]), 3
            ),
            "packed_row_blocks_vs_batch": round(
                statistics.median(layout["packed_row_blocks"]) / statistics.median(layout["batch"]), 3
            ),
            "attention_scores_packed_row": (8 * width) ** 2,
            "attention_scores_batch": 8 * width**2,
        },
        "groups": groups,
        "max_logprob_difference": difference,
        "same_logprobs": difference < 1e-3 and groups["max_logprob_difference"] < 1e-3,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def table(results: dict[str, Any]) -> str:
    """The results as a small plain-text table."""
    lengths = results["lengths"]
    lines = [
        f"{results['model']}: {results['samples']} samples, {lengths['real_tokens']:,} tokens "
        f"(median {lengths['median']}, max {lengths['max']}), budget {results['token_budget']:,} tokens "
        f"a micro-batch, median of {results['repeats']} round(s)",
        f"  {'strategy':<16} {'batches':>7} {'computed':>9} {'padding':>8} {'peak':>6} {'attn scores':>12} "
        f"{'fwd+bwd s':>10} {'vs packed':>9} {'min s':>7} {'vs packed':>9}",
    ]
    for name, r in results["strategies"].items():
        timing = (
            f"{r['fwd_bwd_s']:>10.2f} {r['time_vs_packed']:>8.2f}x {r['fwd_bwd_s_min']:>7.2f} {r['min_time_vs_packed']:>8.2f}x"
            if r["fwd_bwd_s"] is not None
            else ""
        )
        lines.append(
            f"  {name:<16} {r['micro_batches']:>7} {r['computed_tokens']:>9,} {r['padding_fraction']:>8.1%} "
            f"{r['peak_tokens']:>6,} {r['attention_scores']:>12,} {timing}"
        )
    lay = results["layout"]
    lines.append(
        f"  attention layout alone, {lay['description']}: {lay['packed_row_s']:.2f} s "
        f"({lay['packed_row_vs_batch']:.2f}x), per-sample blocks {lay['packed_row_blocks_s']:.2f} s "
        f"({lay['packed_row_blocks_vs_batch']:.2f}x), batch {lay['batch_s']:.2f} s"
    )
    groups = results["groups"]
    lines.append(
        f"  grouped samples, {groups['description']}: per-sample blocks {groups['fwd_bwd_s']['packed_blocks']:.2f} s "
        f"({groups['computed_tokens']['packed_blocks']:,} tokens), shared prefixes {groups['fwd_bwd_s']['shared']:.2f} s "
        f"({groups['computed_tokens']['shared']:,} tokens): {groups['blocks_vs_shared']:.2f}x"
    )
    lines.append(
        f"  same log-probs on every path: {results['same_logprobs']} (max diff {results['max_logprob_difference']:.1e})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model instead of smollm2-135m")
    parser.add_argument(
        "--samples", type=int, default=None, help="samples in the batch (default 64 quick, 20 full)"
    )
    parser.add_argument("--budget", type=int, default=1024, help="tokens a micro-batch (default 1,024)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3)")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON results path (default {DEFAULT_OUT} in full mode)"
    )
    args = parser.parse_args(argv)
    results = run(
        "tiny" if args.quick else "smollm2-135m",
        args.samples or (64 if args.quick else 20),
        args.budget,
        args.repeats or 3,
    )
    results["mode"] = "quick" if args.quick else "full"
    out = args.out or (None if args.quick else DEFAULT_OUT)
    print(table(results))
    if out is not None:
        write_json(out, results)
        print(f"results written to {out}")
    return results


if __name__ == "__main__":
    main()

"""Runs the packing benchmark (`python -m tests.perf.bench_packing --quick`) as users run it.

Timings on 2 shared cores are too noisy to assert on; this checks the results' shape, that the
packed path computes no padding and stays within the budget, and that every path gives the same log-probs.
"""

from __future__ import annotations

import json

import pytest

from tests.perf.runner import run_bench

TIMED = ("packed", "packed_blocks", "padded_sorted", "padded_unsorted")


@pytest.mark.perf
def test_bench_packing_quick(tmp_path):
    out = tmp_path / "packing.json"
    result = run_bench("bench_packing", "--quick", "--out", str(out))
    figures = json.loads(out.read_text())
    assert figures["benchmark"] == "packing" and figures["mode"] == "quick" and figures["model"] == "tiny"
    assert figures["samples"] == 64 and figures["repeats"] == 3 and figures["token_budget"] == 1024
    runs = figures["strategies"]
    assert set(runs) == {*TIMED, "padded_fixed"}
    real = figures["lengths"]["real_tokens"]
    assert real > 0 and figures["lengths"]["max"] <= figures["token_budget"]

    for name in ("packed", "packed_blocks"):
        packed = runs[name]
        assert packed["padding_tokens"] == 0 and packed["padding_fraction"] == 0, name
        assert packed["computed_tokens"] == real and packed["computed_tokens_vs_packed"] == 1, name
        assert packed["peak_tokens"] <= figures["token_budget"], name
    # per-sample blocks compute only each sample's own attention, less than any other layout
    assert runs["packed_blocks"]["attention_scores"] < min(
        r["attention_scores"] for n, r in runs.items() if n != "packed_blocks"
    )
    layout = figures["layout"]
    assert layout["attention_scores_packed_row"] == 8 * layout["attention_scores_batch"]
    assert min(layout["packed_row_s"], layout["packed_row_blocks_s"], layout["batch_s"]) > 0
    for name, r in runs.items():
        assert r["computed_tokens"] == real + r["padding_tokens"], name
        assert r["micro_batches"] >= -(-real // figures["token_budget"]), name
        if name in TIMED:
            assert (
                len(r["fwd_bwd_s_all"]) == figures["repeats"]
                and r["fwd_bwd_s"] > 0
                and r["real_tokens_per_s"] > 0
            ), name
            assert r["peak_tokens"] <= figures["token_budget"], name
        else:
            assert r["fwd_bwd_s"] is None and r["batch_size"] >= 1
    # long-tailed lengths: padding in order wastes tokens, and fixed-size batches blow up the peak
    assert runs["padded_unsorted"]["padding_tokens"] > runs["padded_sorted"]["padding_tokens"] > 0
    assert runs["padded_fixed"]["peak_tokens"] > figures["token_budget"]
    assert figures["same_logprobs"] and figures["max_logprob_difference"] < 1e-3
    assert "same log-probs on every path: True" in result.stdout and str(out) in result.stdout
    assert list(tmp_path.iterdir()) == [out]

"""The launch counter and the meta-device accounting (``bench_launches``, ``bench_meta``) at a tiny shape, in CI.

The full runs (the 0.5B shape; 0.5B, 1.5B and 7B-LoRA) are ``python -m tests.perf.bench_launches`` and
``python -m tests.perf.bench_meta``; here their claims are checked where they are cheap: ops per micro-batch do
not grow with the number of samples, grow linearly with layers, equal on fake and real tensors, and fall with
the compute weights and again with the compiled layers (counted from inductor's code as it runs); the packed rows
compute fewer tokens than the samples hold when prompts are shared.
"""

from __future__ import annotations

import pytest

from tests.perf import bench_launches, bench_meta
from tests.perf.bench_launches import GENERATED
from tests.perf.bench_precision import workload

SHAPE = "qwen2-mini"  # Qwen2: biased q/k/v, GQA, tied head; width 128, vocabulary 4,096


@pytest.fixture(scope="module")
def workloads():
    return {n: bench_launches.grouped_samples(4096, n, 128) for n in (8, 16)}


@pytest.fixture(scope="module")
def counts(workloads):
    """Ops of a micro-batch on real CPU tensors (faster than fake ones at this size; the same count, below)."""
    wanted = {"bf16": [(8, 1), (8, 2), (8, 3), (16, 1)], "bf16+compute_weights": [(8, 1), (8, 2), (16, 1)]}
    return {
        (variant, n, layers): bench_launches.micro_batch_ops(
            SHAPE, layers, variant, "padded", workloads[n], 4096, fake=False
        )
        for variant, points in wanted.items()
        for n, layers in points
    }


def test_ops_per_micro_batch_do_not_grow_with_samples_and_grow_linearly_with_layers(counts):
    for variant in ("bf16", "bf16+compute_weights"):
        assert counts[(variant, 8, 1)]["by_op"] == counts[(variant, 16, 1)]["by_op"]
    per_layer = [counts[("bf16", 8, k + 1)]["total"] - counts[("bf16", 8, k)]["total"] for k in (1, 2)]
    assert per_layer[0] == per_layer[1] > 0


def test_compute_weights_dispatch_fewer_ops_than_autocast(counts):
    before, after = counts[("bf16", 8, 1)], counts[("bf16+compute_weights", 8, 1)]
    assert after["kernels"] < before["kernels"] and after["total"] < before["total"]
    assert after["by_op"]["aten._to_copy.default"] < before["by_op"]["aten._to_copy.default"]


def test_fake_tensors_count_what_real_ones_dispatch(workloads, counts):
    fake = bench_launches.micro_batch_ops(SHAPE, 1, "bf16", "padded", workloads[8], 4096)
    assert fake["by_op"] == counts[("bf16", 8, 1)]["by_op"]


def test_compiled_layers_launch_fewer_kernels_a_layer_and_the_same_outside(workloads, counts):
    compiled = {
        (n, layers): bench_launches.micro_batch_ops(
            SHAPE, layers, bench_launches.COMPILED, "padded", workloads[n], 4096, fake=False
        )
        for n, layers in [(8, 1), (8, 2), (16, 1)]
    }
    assert compiled[(8, 1)]["by_op"] == compiled[(16, 1)]["by_op"]  # no growth with samples
    generated = [compiled[(8, layers)]["by_op"][GENERATED] for layers in (1, 2)]
    assert generated[1] > generated[0] > 0  # inductor's kernels ran, and were counted
    eager = {layers: counts[("bf16+compute_weights", 8, layers)] for layers in (1, 2)}
    per_layer = compiled[(8, 2)]["kernels"] - compiled[(8, 1)]["kernels"]
    eager_per_layer = eager[2]["kernels"] - eager[1]["kernels"]
    # at this shape on the padded path ~2x fewer (its attention is eager: ~20 ops); the 0.5B varlen row: 2.4x
    assert 0 < per_layer < 0.6 * eager_per_layer
    # outside the layers the same eager code: the same kernels
    assert compiled[(8, 1)]["kernels"] - per_layer == eager[1]["kernels"] - eager_per_layer


def test_shared_prefixes_compute_fewer_tokens_and_flops_than_the_logical_ones():
    samples = workload(4096, 16, 16, 4)
    entry = bench_meta.account(SHAPE, False, "padded", samples, 128, fake=False)
    tokens, flops, memory = entry["tokens"], entry["flops"], entry["memory"]
    assert tokens["computed"] < tokens["logical"]
    assert 0 < flops["counted"] < flops["model_flops_logical"]
    assert flops["attention_counted"] > 0  # the CPU sdpa formula counted
    assert memory["activations"] > 0 and memory["adamw_state"] == 2 * memory["gradients"]

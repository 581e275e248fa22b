"""The update's two kernels against plain references: packed attention in one call, and the chunked LM head.

``packed_attention`` is compared with sdpa run segment by segment (each segment's shared context and its
own tokens, causal), in float64, with grouped-query heads and shared prefixes; ``chunked_logprobs`` with
the full ``[N, V]`` log-softmax, values and gradients, in float64. ``tests/test_packing.py`` checks both
inside whole models; ``tests/perf/gpu_check.sh`` checks the varlen kernel against the padded path on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from workbench.rl.logprob_head import chunked_logprobs
from workbench.rl.packed_attention import RowLayout, attention_path, forced_path, packed_attention

# --- RowLayout ------------------------------------------------------------------------------------


def test_layout_of_independent_samples_reads_the_row_itself():
    layout = RowLayout.from_positions([0, 1, 2, 0, 1, 0, 1, 2, 3])
    assert layout.cu_q.tolist() == [0, 3, 5, 9]
    assert layout.kv_index is None and layout.cu_k is layout.cu_q
    assert (layout.max_q, layout.max_k) == (4, 4)


def test_layout_of_shared_prefixes_reads_the_path_before_each_segment():
    # sample A: positions 0..4 (rows 0-4); B shares A's first 3 positions (rows 5-6 hold its positions 3, 4);
    # C shares B's path's first 4 positions: A's rows 0-2, then B's row 5, then its own rows 7-8
    layout = RowLayout.from_positions([0, 1, 2, 3, 4, 3, 4, 4, 5])
    assert layout.cu_q.tolist() == [0, 5, 7, 9]
    assert layout.kv_index.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 1, 2, 5, 7, 8]
    assert layout.cu_k.tolist() == [0, 5, 10, 16]
    assert (layout.max_q, layout.max_k) == (5, 6)


def test_a_cpu_takes_the_loop_and_a_path_must_exist():
    assert attention_path(torch.zeros(1, 2, 3, 4)) == "loop"
    with pytest.raises(ValueError, match="one of varlen, padded, loop"), forced_path("flash"):
        pass


def test_layout_refuses_a_segment_longer_than_its_path():
    with pytest.raises(ValueError, match="starts at position 4 but the path before it has only 2"):
        RowLayout.from_positions([0, 1, 4, 5])


# --- packed_attention -----------------------------------------------------------------------------


def _reference(query, key, value, layout: RowLayout, scale: float) -> torch.Tensor:
    """sdpa segment by segment: a segment's queries against its keys, causal aligned to the bottom right."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D]
    rows = layout.kv_index if layout.kv_index is not None else torch.arange(q.shape[0])
    out = []
    for s in range(layout.segments):
        a, b = int(layout.cu_q[s]), int(layout.cu_q[s + 1])
        keys = rows[int(layout.cu_k[s]) : int(layout.cu_k[s + 1])]
        visible = torch.ones(b - a, len(keys), dtype=torch.bool).tril(len(keys) - (b - a))
        groups = q.shape[1] // k.shape[1]
        piece = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1),
            k[keys].repeat_interleave(groups, 1).transpose(0, 1),
            v[keys].repeat_interleave(groups, 1).transpose(0, 1),
            attn_mask=visible,
            scale=scale,
        )
        out.append(piece.transpose(0, 1))
    return torch.cat(out)[None]


@pytest.mark.parametrize(
    "positions",
    [
        [0, 1, 2, 3, 4, 5, 6],  # one sequence: plain causal attention
        [0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0],  # independent samples, one of a single token
        [0, 1, 2, 3, 4, 3, 4, 4, 5, 0, 1, 2, 2, 3],  # shared prefixes, then a new tree
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])  # grouped-query heads too
@pytest.mark.parametrize("path", ["loop", "padded"])  # varlen needs a GPU: tests/perf/gpu_check.sh
def test_packed_attention_equals_attention_segment_by_segment(positions, heads, path):
    torch.manual_seed(0)
    layout = RowLayout.from_positions(positions)
    n_q, n_kv = heads
    query = torch.randn(1, n_q, len(positions), 8, dtype=torch.float64, requires_grad=True)
    key = torch.randn(1, n_kv, len(positions), 8, dtype=torch.float64, requires_grad=True)
    value = torch.randn(1, n_kv, len(positions), 8, dtype=torch.float64, requires_grad=True)
    with forced_path(path):
        assert attention_path(query) == path
        out = packed_attention(query, key, value, layout, scale=0.3)
    expected = _reference(query, key, value, layout, scale=0.3)
    assert out.shape == (1, len(positions), n_q, 8)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (query, key, value))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- chunked_logprobs -----------------------------------------------------------------------------


@pytest.mark.parametrize("recompute", [True, False])  # the GPU's way and the CPU's
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_head_equals_the_full_log_softmax_and_its_gradients(temperature, bias, recompute):
    torch.manual_seed(1)
    n, width, vocab = 37, 16, 101
    hidden = torch.randn(n, width, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, width, dtype=torch.float64, requires_grad=True)
    b = torch.randn(vocab, dtype=torch.float64, requires_grad=True) if bias else None
    targets = torch.randint(0, vocab, (n,))
    logp, entropy = chunked_logprobs(
        hidden, weight, targets, bias=b, temperature=temperature, rows=8, recompute=recompute
    )
    full = torch.log_softmax(torch.nn.functional.linear(hidden, weight, b) / temperature, -1)
    expected_logp = full.gather(-1, targets[:, None])[:, 0]
    expected_entropy = -(full.exp() * full).sum(-1)
    torch.testing.assert_close(logp, expected_logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-12, atol=1e-12)
    g_logp, g_entropy = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    inputs = (hidden, weight) + ((b,) if bias else ())
    grads = torch.autograd.grad((logp * g_logp + entropy * g_entropy).sum(), inputs)
    expected = torch.autograd.grad((expected_logp * g_logp + expected_entropy * g_entropy).sum(), inputs)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_chunked_head_keeps_no_logits_for_the_backward_pass():
    """Recomputing (a GPU's default), what autograd keeps is the hidden states, the weight and the targets:
    nothing of size N x V."""
    n, width, vocab = 64, 8, 5000
    hidden = torch.randn(n, width, requires_grad=True)
    weight = torch.randn(vocab, width, requires_grad=True)
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        logp, entropy = chunked_logprobs(
            hidden, weight, torch.randint(0, vocab, (n,)), rows=16, recompute=True
        )
        (logp.sum() + entropy.sum()).backward()
    assert saved and max(saved) <= vocab * width  # the weight itself is the largest
    # the plain path saves full logits or their softmax: the check above would see it
    plain: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: plain.append(t.numel()) or t, lambda t: t):
        torch.log_softmax(hidden @ weight.t(), -1).sum().backward()
    assert max(plain) >= n * vocab


def test_chunked_head_refuses_what_would_be_wrong():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        chunked_logprobs(
            torch.zeros(2, 3), torch.zeros(5, 3), torch.zeros(2, dtype=torch.long), temperature=0
        )
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\]"):
        chunked_logprobs(torch.zeros(1, 2, 3), torch.zeros(5, 3), torch.zeros(2, dtype=torch.long))

"""The update's two kernels against plain references: packed attention in one call, and the chunked LM head.

``packed_attention`` is compared with sdpa run segment by segment (each segment's shared context and its
own tokens, causal), in float64, with grouped-query heads and shared prefixes, on each of its three paths:
the varlen path through the CPU stand-in of torch 2.11's ``varlen_attn`` (``varlen_on_cpu``), whose
signature is checked here against the GPU image's, and the counters say which path each call really ran.
The path choice is a pure function of device type, dtypes and autocast dtype, tabled here; the casts the
varlen kernel needs (fp32 query and key beside a bf16 value under autocast) are checked on the stand-in,
which refuses mixed dtypes as the kernel does. ``chunked_logprobs`` is compared with the full ``[N, V]``
log-softmax, values and gradients, in float64. ``tests/test_packing.py`` checks both inside whole models;
``tests/perf/gpu_check.sh`` checks the real varlen kernel against the padded path on a GPU.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from workbench.rl import packed_attention as pa
from workbench.rl.logprob_head import chunked_logprobs
from workbench.rl.packed_attention import (
    RowLayout,
    attention_path,
    compute_dtype,
    counting_paths,
    forced_path,
    kernel_counts,
    packed_attention,
    path_for,
    varlen_attn_standin,
    varlen_on_cpu,
)

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


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.mark.parametrize(
    ("device", "dtypes", "autocast", "head_dim", "has_varlen", "expected"),
    [
        ("cpu", (BF16, BF16, BF16), None, 64, True, "loop"),  # a CPU: the loop, whatever the dtype
        ("cpu", (F32, F32, BF16), BF16, 64, True, "loop"),
        # a trained model: fp32 master weights under bf16 autocast (Qwen2's rotary: fp32 q, k beside a bf16 v)
        ("cuda", (F32, F32, BF16), BF16, 64, True, "varlen"),
        ("cuda", (F32, F32, F32), F16, 128, True, "varlen"),  # fp16 autocast
        (
            "cuda",
            (BF16, BF16, BF16),
            None,
            64,
            True,
            "varlen",
        ),  # a frozen bf16 copy (KL reference, LoRA base)
        ("cuda", (F32, F32, F32), None, 64, True, "padded"),  # fp32 training: the kernel has no fp32
        ("cuda", (F32, F32, BF16), None, 64, True, "padded"),  # no autocast, no one half dtype
        ("cuda", (F32, F32, F32), F32, 64, True, "padded"),  # autocast to fp32 is no half precision
        ("cuda", (BF16, BF16, BF16), None, 512, True, "padded"),  # a head larger than the kernel's
        ("cuda", (BF16, BF16, BF16), None, 64, False, "padded"),  # a torch without varlen_attn
    ],
)
def test_the_path_is_a_function_of_device_dtypes_and_autocast(
    device, dtypes, autocast, head_dim, has_varlen, expected
):
    assert attention_path(device, *dtypes, autocast, head_dim, has_varlen=has_varlen) == expected


def test_the_compute_dtype_is_the_autocast_one_else_the_shared_half_one():
    assert compute_dtype(F32, F32, BF16, BF16) == BF16
    assert compute_dtype(BF16, BF16, BF16, F16) == F16  # autocast decides, as it would for sdpa
    assert compute_dtype(F16, F16, F16, None) == F16
    assert compute_dtype(F32, F32, BF16, None) is None and compute_dtype(F32, F32, F32, None) is None


def test_a_cpu_takes_the_loop_and_a_path_must_exist():
    x = torch.zeros(1, 2, 3, 4)
    assert path_for(x, x, x) == "loop"
    with varlen_on_cpu():  # a CPU tensor counts as on CUDA: fp32 takes the padded path, bf16 the varlen one
        assert path_for(x, x, x) == "padded" and path_for(*(x.bfloat16(),) * 3) == "varlen"
    assert path_for(x, x, x) == "loop"
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
@pytest.mark.parametrize("path", ["loop", "padded", "varlen"])  # varlen: the CPU stand-in
def test_packed_attention_equals_attention_segment_by_segment(positions, heads, path):
    torch.manual_seed(0)
    layout = RowLayout.from_positions(positions)
    n_q, n_kv = heads
    query = torch.randn(1, n_q, len(positions), 8, dtype=torch.float64, requires_grad=True)
    key = torch.randn(1, n_kv, len(positions), 8, dtype=torch.float64, requires_grad=True)
    value = torch.randn(1, n_kv, len(positions), 8, dtype=torch.float64, requires_grad=True)
    before = kernel_counts()
    with varlen_on_cpu(), forced_path(path), counting_paths() as taken:
        assert path_for(query, key, value) == path
        out = packed_attention(query, key, value, layout, scale=0.3)
    assert taken == {path: 1} and kernel_counts() - before == taken  # what ran, not what was meant to
    expected = _reference(query, key, value, layout, scale=0.3)
    assert out.shape == (1, len(positions), n_q, 8)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (query, key, value))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- the varlen stand-in and the casts ------------------------------------------------------------

# torch 2.11.0's varlen_attn (the GPU image's torch), read from torch/nn/attention/varlen.py in the PyPI wheel
# torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl (2.11.0+cu130), annotations left out
TORCH_2_11_VARLEN = (
    "(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, "
    "return_aux=None, scale=None, window_size=(-1, -1))"
)


def _parameters(fn) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter of ``fn``."""
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def _installed_varlen_parameters() -> list[tuple[str, str, object]]:
    """The same of this torch's ``varlen_attn``, read from its source (importing it loads torch._dynamo)."""
    origin = importlib.util.find_spec("torch.nn.attention.varlen").origin
    tree = ast.parse(Path(origin).read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "varlen_attn"]
    args = fn.args
    empty = inspect.Parameter.empty
    positional = [empty] * (len(args.args) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    keyword = [empty if d is None else ast.literal_eval(d) for d in args.kw_defaults]
    return [(a.arg, "POSITIONAL_OR_KEYWORD", d) for a, d in zip(args.args, positional, strict=True)] + [
        (a.arg, "KEYWORD_ONLY", d) for a, d in zip(args.kwonlyargs, keyword, strict=True)
    ]


def test_the_stand_in_has_the_gpu_torch_signature_and_this_torch_takes_its_calls():
    plain = inspect.signature(varlen_attn_standin).parameters.values()
    bare = inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in plain])
    assert str(bare) == TORCH_2_11_VARLEN
    ours, theirs = _parameters(varlen_attn_standin), _installed_varlen_parameters()
    assert theirs[: len(ours)] == ours  # the same names, kinds and defaults in the same order, then more
    assert all(default is not inspect.Parameter.empty for _, _, default in theirs[len(ours) :])


def test_causal_masking_and_grouping_are_bound_the_way_the_kernel_takes_them():
    def windowed(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        pass  # torch 2.11 (the GPU image's)

    def grouped(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False
    ):
        pass  # torch 2.13 (this project's pin)

    def causal(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
        pass  # the first release of varlen_attn

    assert pa._bind(windowed).keywords == {"window_size": (-1, 0)}
    assert pa._bind(grouped).keywords == {"window_size": (-1, 0), "enable_gqa": True}
    assert pa._bind(causal).keywords == {"is_causal": True}
    assert pa._bind(varlen_attn_standin).keywords == {"window_size": (-1, 0)}


def test_the_stand_in_refuses_what_the_kernel_refuses_and_masks_as_it_does():
    q, k = torch.randn(5, 4, 8), torch.randn(5, 2, 8)
    bounds = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="same dtype"):  # a missing cast: fp32 q, k beside a bf16 v
        varlen_attn_standin(q, k, k.bfloat16(), bounds, bounds, 3, 3, window_size=(-1, 0))
    with pytest.raises(RuntimeError, match="int32"):
        varlen_attn_standin(q, k, k, bounds.long(), bounds.long(), 3, 3)
    with pytest.raises(RuntimeError, match="do not divide"):
        varlen_attn_standin(torch.randn(5, 3, 8), k, k, bounds, bounds, 3, 3)
    with pytest.raises(RuntimeError, match="exceeds max_q"):
        varlen_attn_standin(q, k, k, bounds, bounds, 2, 2)
    full = varlen_attn_standin(q, k, k, bounds, bounds, 3, 3)  # window (-1, -1): every key of the segment
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[2:].transpose(0, 1), k[2:].transpose(0, 1), k[2:].transpose(0, 1), enable_gqa=True
    )
    torch.testing.assert_close(full[2:], expected.transpose(0, 1))
    # bottom-right causal with fewer keys than queries: the first queries see nothing and get zeros
    short = torch.tensor([0, 1, 3], dtype=torch.int32)
    out = varlen_attn_standin(q, k[:3], k[:3], bounds, short, 3, 3, window_size=(-1, 0))
    assert out[2].abs().sum() == 0 and out[3:].abs().sum() > 0


@pytest.mark.parametrize("autocast", [True, False])
def test_the_varlen_path_casts_to_the_compute_dtype_the_layer_gets_back(autocast):
    """Under bf16 autocast a trained model hands attention fp32 query and key beside a bf16 value: the varlen
    path casts all three to bf16 (the stand-in refuses anything else, as the kernel does) and returns bf16,
    the dtype sdpa under autocast returns on the other paths, close to theirs; the gradients flow back to the
    fp32 query and key. Without autocast a frozen bf16 copy's tensors go in as they are."""
    torch.manual_seed(0)
    layout = RowLayout.from_positions([0, 1, 2, 3, 4, 3, 4, 4, 5, 0, 1, 2])
    dtypes = (F32, F32, BF16) if autocast else (BF16, BF16, BF16)
    tensors = [
        torch.randn(1, n, 12, 32, dtype=dtype, requires_grad=True)
        for n, dtype in zip((4, 2, 2), dtypes, strict=True)
    ]
    context = torch.autocast("cpu", dtype=BF16) if autocast else contextlib.nullcontext()
    with varlen_on_cpu(), context, counting_paths() as taken:
        assert path_for(*tensors) == "varlen"
        out = packed_attention(*tensors, layout, scale=0.2)
        with forced_path("padded"):
            padded = packed_attention(*tensors, layout, scale=0.2)
    assert taken == {"varlen": 1, "padded": 1}
    assert out.dtype == padded.dtype == BF16 and out.shape == (1, 12, 4, 32)
    torch.testing.assert_close(out.float(), padded.float(), rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(out.float().sum(), tensors)
    assert [g.dtype for g in grads] == list(dtypes) and all(g.abs().sum() > 0 for g in grads)


def test_the_counters_nest_and_add_up():
    layout = RowLayout.from_positions([0, 1, 2, 0, 1])
    x = torch.randn(1, 2, 5, 4)
    before = kernel_counts()
    with counting_paths() as outer:
        with counting_paths() as empty:  # leaving it (equal to outer, both empty) leaves outer counting
            pass
        packed_attention(x, x, x, layout)
        with counting_paths() as inner, forced_path("padded"):
            packed_attention(x, x, x, layout)
    assert outer == {"loop": 1, "padded": 1} and inner == {"padded": 1} and not empty
    assert kernel_counts() - before == outer


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

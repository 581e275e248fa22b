"""Attention over a packed row in one call per layer: variable-length attention, never a loop over samples.

A packed row (``workbench.rl.packing``) holds several samples one after another, and with shared prefixes
a sample's segment also reads the first positions of the path laid out before it. :class:`RowLayout`
describes that once per micro-batch, on the host, before the forward:

- ``cu_q`` the segments' row bounds (the queries are the row itself, in order);
- ``kv_index`` the row positions each segment reads as keys (the path's first positions it shares, then
  its own), concatenated segment by segment, and ``cu_k`` their bounds; ``None`` when no segment shares a
  prefix, so the keys are the row itself and ``cu_k`` is ``cu_q``.

Each segment's attention is causal aligned to the bottom right: query ``i`` of a segment of ``q`` queries
and ``k`` keys sees keys ``0 .. k - q + i`` (its shared context, then its own tokens up to itself).

:func:`packed_attention` runs a layer's attention from that layout by one of three paths. Which one is a
pure function of the device type, the query/key/value dtypes and the autocast dtype (:func:`attention_path`):

- ``varlen``, on CUDA when the attention computes in half precision: under fp16/bf16 autocast (a trained
  model: fp32 master weights, whose rotary embedding hands attention fp32 query and key beside a bf16 value),
  or with query, key and value all in one half dtype (a frozen bf16 copy: the KL reference, a LoRA base).
  ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's variable-length kernel; torch 2.11 on the GPU
  image, 2.13 pinned here), one call a layer, no padding, nothing masked out computed. It is a custom op
  that autocast does not cast and that takes one dtype for query, key and value, so they are cast here
  first: to the autocast dtype when autocast is on for their device, else to the half dtype they share. Its
  output stays in that dtype, what sdpa under autocast returns to the layer's output projection. Grouped
  key/value heads go in as they are: torch 2.11 groups them implicitly, 2.13 is told ``enable_gqa``.
- ``padded``, elsewhere on CUDA (full precision, a head over 256, a torch without the kernel): one
  ``scaled_dot_product_attention`` over the segments gathered into a padded ``[segments, heads, longest,
  head_dim]`` batch with the bottom-right causal mask, scattered back to the row (the padded batch's indices
  and mask are built on first use and kept for the other layers);
- ``loop``, on a CPU: sdpa segment by segment from the layout's host-side spans. A CPU has no kernel
  launches to save, and this path computes no padding (the padded batch costs segments x longest^2).

None of them reads anything back from the device per layer. Every path counts each call it actually ran
(:func:`kernel_counts`, :func:`counting_paths`): benchmarks and tests read which kernel ran rather than which
one was meant to, and :func:`forced_path` makes every call take one path, to compare them.

On a CPU the varlen branch runs against :func:`varlen_attn_standin`, sdpa segment by segment behind the exact
signature of torch 2.11's ``varlen_attn``, installed with :func:`varlen_on_cpu` (which also lets CPU tensors
count as on CUDA for the path choice). ``tests/test_packed_kernels.py`` checks the three paths against
attention computed segment by segment in float64 (varlen through the stand-in), ``tests/test_packing.py``
whole models, each path against one-sample-at-a-time forwards, in fp32 and under bf16 autocast, with and
without gradient checkpointing; the real kernel's tests stay the ground truth: ``tests/perf/gpu_check.sh``
compares it with the padded path on a GPU (``bench_precision --compare-kernels``, which fails when both of its
runs took the same path).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RowLayout:
    """Where each segment of a packed row starts, and which row positions it reads as keys."""

    cu_q: torch.Tensor  # [S + 1] int32: segment bounds in the row
    cu_k: (
        torch.Tensor
    )  # [S + 1] int32: bounds of each segment's keys in kv_index (cu_q when kv_index is None)
    kv_index: torch.Tensor | None  # [Tk] int64 row positions of the keys, segment by segment; None: the row
    max_q: int  # the longest segment
    max_k: int  # the most keys a segment reads
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # each segment's key spans, then its own
    _padded: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    @property
    def segments(self) -> int:
        return int(self.cu_q.shape[0]) - 1

    @classmethod
    def from_positions(cls, positions: Sequence[int]) -> RowLayout:
        """The layout of a row from its position ids (a Python sequence, on the host).

        A new segment starts wherever the position does not go up by one (transformers' rule); a segment
        whose first position p is above 0 continues the path laid out before it and reads that path's first
        p positions (shared prefixes). Raises ``ValueError`` if the path before it is shorter than p.
        """
        positions = list(positions)
        bounds = [0] + [t for t in range(1, len(positions)) if positions[t] != positions[t - 1] + 1]
        bounds.append(len(positions))
        keys: list[int] = []
        cu_k = [0]
        shares = False
        spans = []
        path: list[tuple[int, int]] = []  # row spans holding positions 0, 1, ... of the path before
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            context = _first_positions(path, positions[a]) if b > a else []
            shares = shares or bool(context)
            for x, y in [*context, (a, b)]:
                keys.extend(range(x, y))
            cu_k.append(len(keys))
            path = [*context, (a, b)]
            spans.append(path)
        lengths_q = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        lengths_k = [b - a for a, b in zip(cu_k[:-1], cu_k[1:], strict=True)]
        cu_q = torch.tensor(bounds, dtype=torch.int32)
        return cls(
            cu_q=cu_q,
            cu_k=torch.tensor(cu_k, dtype=torch.int32) if shares else cu_q,
            kv_index=torch.tensor(keys, dtype=torch.long) if shares else None,
            max_q=max(lengths_q, default=0),
            max_k=max(lengths_k, default=0),
            spans=spans,
        )

    def to(self, device: torch.device | str) -> RowLayout:
        """The same layout with its tensors on ``device`` (the padded indices are rebuilt there)."""
        moved = {"cu_q": self.cu_q.to(device), "cu_k": self.cu_k.to(device)}
        if self.kv_index is None:
            moved["cu_k"] = moved["cu_q"]
        return RowLayout(
            **moved,
            kv_index=None if self.kv_index is None else self.kv_index.to(device),
            max_q=self.max_q,
            max_k=self.max_k,
            spans=self.spans,
        )

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Indices for the padded path, built once on the layout's device: ``q_rows [S, Lq]`` and
        ``k_rows [S, Lk]`` (row or key positions, the padding pointing one past the end), ``visible
        [S, 1, Lq, Lk]`` (bottom-right causal, padding hidden) and ``back [T]`` (each row position's place
        in the flattened ``[S * Lq]`` output)."""
        if self._padded is None:
            device = self.cu_q.device
            starts_q, starts_k = self.cu_q[:-1].long(), self.cu_k[:-1].long()
            lengths_q = self.cu_q[1:].long() - starts_q
            lengths_k = self.cu_k[1:].long() - starts_k
            # the row's and the keys' lengths from the host-side spans: no read of cu_q/cu_k back from the device
            total_q = self.spans[-1][-1][1] if self.spans else int(self.cu_q[-1])
            total_k = sum(y - x for path in self.spans for x, y in path) if self.spans else int(self.cu_k[-1])
            i = torch.arange(self.max_q, device=device)
            j = torch.arange(self.max_k, device=device)
            valid_q = i[None] < lengths_q[:, None]
            valid_k = j[None] < lengths_k[:, None]
            q_rows = torch.where(valid_q, starts_q[:, None] + i[None], total_q)
            k_rows = torch.where(valid_k, starts_k[:, None] + j[None], total_k)
            offset = (lengths_k - lengths_q)[:, None, None]  # bottom-right alignment
            visible = (j[None, None, :] <= i[None, :, None] + offset) & valid_k[:, None, :]
            visible &= valid_q[:, :, None]
            visible |= ~valid_q[:, :, None]  # padded queries see everything: no all-masked softmax rows
            segment = torch.repeat_interleave(
                torch.arange(self.segments, device=device), lengths_q, output_size=total_q
            )
            back = segment * self.max_q + (torch.arange(total_q, device=device) - starts_q[segment])
            self._padded = (q_rows, k_rows, visible[:, None], back)
        return self._padded  # type: ignore[return-value]


def _first_positions(path: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The row spans of ``path`` that hold its first ``n`` positions."""
    out, left = [], n
    for x, y in path:
        if left <= 0:
            break
        out.append((x, min(y, x + left)))
        left -= y - x
    if left > 0:
        raise ValueError(
            f"a packed segment starts at position {n} but the path before it has only {n - left}"
        )
    return out


# --- the varlen kernel ------------------------------------------------------------------------------

HALF = (torch.float16, torch.bfloat16)
MAX_VARLEN_HEAD_DIM = 256  # FlashAttention's largest head size


def _bind(kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``kernel`` (a ``varlen_attn``) with bottom-right causal masking bound in the way its signature takes it
    (``window_size=(-1, 0)`` in torch 2.11 and 2.13, ``is_causal`` in its first release), and ``enable_gqa``
    where it has one (torch 2.13 refuses grouped key/value heads without it; 2.11 has no such parameter and
    groups them implicitly)."""
    parameters = inspect.signature(kernel).parameters
    bound: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
    if "enable_gqa" in parameters:
        bound["enable_gqa"] = True
    return functools.partial(kernel, **bound)


@functools.cache
def _varlen() -> Callable[..., torch.Tensor] | None:
    """torch's variable-length attention with causal masking bound, or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return _bind(varlen_attn)


_STANDIN: Callable[..., torch.Tensor] | None = None  # a kernel in the varlen slot (varlen_on_cpu), bound
_FAKE_CUDA = False  # inside varlen_on_cpu: CPU tensors count as on CUDA for the path choice


def _varlen_kernel() -> Callable[..., torch.Tensor] | None:
    return _STANDIN if _STANDIN is not None else _varlen()


# --- which path -------------------------------------------------------------------------------------

PATHS = ("varlen", "padded", "loop")
_FORCED: str | None = None


def compute_dtype(
    q_dtype: torch.dtype, k_dtype: torch.dtype, v_dtype: torch.dtype, autocast_dtype: torch.dtype | None
) -> torch.dtype | None:
    """The half dtype attention computes in: the autocast dtype when autocast (fp16/bf16) is on, else the
    half dtype query, key and value share; None when it computes in full precision."""
    if autocast_dtype in HALF:
        return autocast_dtype
    if q_dtype == k_dtype == v_dtype and q_dtype in HALF:
        return q_dtype
    return None


def attention_path(
    device_type: str,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
    v_dtype: torch.dtype,
    autocast_dtype: torch.dtype | None,
    head_dim: int,
    *,
    has_varlen: bool = True,
) -> str:
    """The path :func:`packed_attention` takes, from these alone: ``varlen`` on CUDA when attention computes
    in half precision (:func:`compute_dtype`: under fp16/bf16 autocast whatever the dtypes reaching it, or
    all three in one half dtype), the head fits the kernel and this torch has it (``has_varlen``);
    ``padded`` elsewhere on CUDA (one launch); ``loop`` on any other device (no launches to save, no padding
    computed). ``autocast_dtype``: None when autocast is off for that device."""
    if device_type != "cuda":
        return "loop"
    half = compute_dtype(q_dtype, k_dtype, v_dtype, autocast_dtype) is not None
    return "varlen" if half and has_varlen and head_dim <= MAX_VARLEN_HEAD_DIM else "padded"


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _device_type(tensor: torch.Tensor) -> str:
    kind = tensor.device.type
    return "cuda" if _FAKE_CUDA and kind == "cpu" else kind


def path_for(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> str:
    """The path :func:`packed_attention` takes for these tensors here and now: the forced one inside
    :func:`forced_path`, else :func:`attention_path` of their device, dtypes and the autocast state of their
    device."""
    if _FORCED is not None:
        return _FORCED
    kind, autocast = _device_type(query), _autocast_dtype(query.device.type)
    path = attention_path(kind, query.dtype, key.dtype, value.dtype, autocast, query.shape[-1])
    if path == "varlen" and _varlen_kernel() is None:  # looked up only when wanted: it imports torch._dynamo
        path = attention_path(
            kind, query.dtype, key.dtype, value.dtype, autocast, query.shape[-1], has_varlen=False
        )
    return path


@contextlib.contextmanager
def forced_path(name: str) -> Iterator[None]:
    """Inside, :func:`packed_attention` takes path ``name`` (one of ``PATHS``) everywhere: to compare them."""
    global _FORCED
    if name not in PATHS:
        raise ValueError(f"an attention path is one of {', '.join(PATHS)}, got {name!r}")
    before, _FORCED = _FORCED, name
    try:
        yield
    finally:
        _FORCED = before


# --- which path ran ---------------------------------------------------------------------------------

_TOTAL: Counter[str] = Counter()
_COUNTING: list[Counter[str]] = []


def _ran(path: str) -> None:
    _TOTAL[path] += 1
    for counts in _COUNTING:
        counts[path] += 1


def kernel_counts() -> Counter[str]:
    """Calls of each path that actually ran in this process so far, from every thread (a copy)."""
    return Counter(_TOTAL)


@contextlib.contextmanager
def counting_paths() -> Iterator[Counter[str]]:
    """Yields a Counter of the paths :func:`packed_attention` runs inside (one count a layer call; a
    checkpointed layer's recompute in the backward pass counts again; calls from other threads count too).
    Nests."""
    counts: Counter[str] = Counter()
    _COUNTING.append(counts)
    try:
        yield counts
    finally:
        # by identity: an equal Counter (two empty ones) is not this one
        _COUNTING[:] = [c for c in _COUNTING if c is not counts]


# --- the CPU stand-in -------------------------------------------------------------------------------


def varlen_attn_standin(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    return_aux: Any = None,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
) -> torch.Tensor:
    """``torch.nn.attention.varlen.varlen_attn`` of torch 2.11 on any device: sdpa segment by segment.

    The signature is torch 2.11.0's (parameter names, order, kinds and defaults), the GPU image's torch, read
    from ``torch/nn/attention/varlen.py`` in the PyPI wheel ``torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64``
    (2.11.0+cu130). ``tests/test_packed_kernels.py`` holds it as text, checks this function against it, and
    checks that the installed torch's ``varlen_attn`` takes every parameter of it the same way. torch 2.13
    (this project's pin) has the same parameters, then ``enable_gqa=False``, ``seqused_k``, ``block_table``
    and ``num_splits``, and refuses fewer key/value heads than query heads unless ``enable_gqa``; 2.11 has no
    ``enable_gqa`` and hands grouped heads to FlashAttention, which groups them (implicit GQA, as here).

    Semantics, as the kernel's: ``query [Tq, H, D]``, ``key``/``value [Tk, Hkv, D]`` (H a multiple of Hkv);
    segment ``s``'s queries ``cu_seq_q[s]:cu_seq_q[s + 1]`` attend to keys ``cu_seq_k[s]:cu_seq_k[s + 1]``;
    ``window_size=(left, right)``, aligned to the bottom right (``(-1, -1)`` full attention, ``(-1, 0)``
    causal: query ``i`` of a segment of ``q`` queries and ``k`` keys sees keys up to ``k - q + i``); a query
    that sees no key gets zeros. Computed in the dtype given (autocast off inside), returned in it. Like the
    kernel it refuses query, key and value of different dtypes and bounds that are not int32, so a missing
    cast fails here as it would on the GPU; unlike it, it also takes fp32 and fp64 (the real kernel only fp16
    and bf16), so whole-model comparisons can check the varlen path's plumbing in fp32. It reads the bounds
    on the host and does not return the log-sum-exp (``return_aux``). The real kernel's tests on a GPU
    (``tests/perf/gpu_check.sh``) stay the ground truth.
    """
    if return_aux is not None and getattr(return_aux, "lse", False):
        raise NotImplementedError("the varlen stand-in does not return the log-sum-exp")
    if not query.dtype == key.dtype == value.dtype:
        raise RuntimeError(
            "varlen_attn: query, key and value must have the same dtype, got "
            f"{query.dtype}, {key.dtype} and {value.dtype} (autocast does not cast this custom op)"
        )
    if cu_seq_q.dtype != torch.int32 or cu_seq_k.dtype != torch.int32:
        raise RuntimeError("varlen_attn: cu_seq_q and cu_seq_k must have dtype int32")
    if query.dim() != 3 or key.dim() != 3 or key.shape != value.shape or query.shape[2] != key.shape[2]:
        raise RuntimeError(
            f"varlen_attn: query [Tq, H, D] and key, value [Tk, Hkv, D] expected, got "
            f"{list(query.shape)}, {list(key.shape)} and {list(value.shape)}"
        )
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads:
        raise RuntimeError(f"varlen_attn: {kv_heads} key/value heads do not divide {heads} query heads")
    bounds_q, bounds_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    if len(bounds_q) != len(bounds_k) or bounds_q[-1] != query.shape[0] or bounds_k[-1] != key.shape[0]:
        raise RuntimeError("varlen_attn: cu_seq_q and cu_seq_k must bound the same segments of query and key")
    left, right = window_size
    pieces = []
    with torch.autocast(query.device.type, enabled=False):
        for (a, b), (c, d) in zip(
            zip(bounds_q[:-1], bounds_q[1:], strict=True),
            zip(bounds_k[:-1], bounds_k[1:], strict=True),
            strict=True,
        ):
            n_q, n_k = b - a, d - c
            if n_q > max_q or n_k > max_k:
                raise RuntimeError(
                    f"varlen_attn: a segment of {n_q} queries, {n_k} keys exceeds max_q, max_k"
                )
            if n_q == 0:
                continue
            i = torch.arange(n_q, device=query.device)[:, None] + (n_k - n_q)  # bottom-right alignment
            j = torch.arange(n_k, device=query.device)[None, :]
            visible = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device)
            if right >= 0:
                visible &= j <= i + right
            if left >= 0:
                visible &= j >= i - left
            sees = visible.any(-1, keepdim=True)  # [n_q, 1]
            out = torch.nn.functional.scaled_dot_product_attention(
                query[a:b].transpose(0, 1),
                key[c:d].transpose(0, 1),
                value[c:d].transpose(0, 1),
                attn_mask=visible | ~sees,  # a query that sees nothing attends to all, then gets zeros
                scale=scale,
                enable_gqa=heads != kv_heads,
            ).transpose(0, 1)
            pieces.append(torch.where(sees[:, :, None], out, out.new_zeros(())))
    if not pieces:
        return query.new_zeros(query.shape)
    return torch.cat(pieces)


@contextlib.contextmanager
def varlen_on_cpu(kernel: Callable[..., torch.Tensor] = varlen_attn_standin) -> Iterator[None]:
    """Inside, ``kernel`` (a function with ``varlen_attn``'s signature; default the stand-in) sits in the
    varlen slot, bound as torch's own would be, and tensors on the CPU count as on CUDA for the path choice:
    the GPU branch of :func:`packed_attention` (dtypes, casts, the kernel call) runs on a CPU. For tests."""
    global _STANDIN, _FAKE_CUDA
    before = _STANDIN, _FAKE_CUDA
    _STANDIN, _FAKE_CUDA = _bind(kernel), True
    try:
        yield
    finally:
        _STANDIN, _FAKE_CUDA = before


# --- the attention ----------------------------------------------------------------------------------


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: RowLayout,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of one packed row: ``query [1, H, T, D]``, ``key``/``value [1, Hkv, T, D]`` (transformers'
    layout, after the rotary embedding) -> ``[1, T, H, D]``, each segment attending as ``layout`` says.
    The path is :func:`path_for`'s; the varlen path returns the dtype it computed in."""
    path = path_for(query, key, value)
    if path == "loop":
        out = _looped_attention(query, key, value, layout, scale)
        _ran(path)
        return out
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    if path == "varlen":
        kernel = _varlen_kernel()
        if kernel is None:
            raise RuntimeError("the varlen path needs torch.nn.attention.varlen (torch >= 2.10)")
        # the kernel takes one dtype and autocast does not cast it: cast here (module docstring)
        dtype = compute_dtype(q.dtype, k.dtype, v.dtype, _autocast_dtype(query.device.type))
        dtype = dtype or torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
        contiguous = torch.contiguous_format
        q = q.to(dtype=dtype, memory_format=contiguous)
        if layout.kv_index is not None:  # each segment's keys: its shared context, then its own
            k = k.to(dtype).index_select(0, layout.kv_index)
            v = v.to(dtype).index_select(0, layout.kv_index)
        else:
            k = k.to(dtype=dtype, memory_format=contiguous)
            v = v.to(dtype=dtype, memory_format=contiguous)
        out = kernel(q, k, v, layout.cu_q, layout.cu_k, layout.max_q, layout.max_k, scale=scale)
        _ran(path)
        return out.unsqueeze(0)
    if layout.kv_index is not None:
        k = k.index_select(0, layout.kv_index)
        v = v.index_select(0, layout.kv_index)
    out = _padded_attention(q, k, v, layout, scale).unsqueeze(0)
    _ran(path)
    return out


def _looped_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: RowLayout, scale: float | None
) -> torch.Tensor:
    """sdpa segment by segment from the layout's host-side spans (a CPU's path: no device to wait for)."""
    grouped = key.shape[1] != query.shape[1]
    pieces = []
    for spans in layout.spans:
        a, b = spans[-1]  # its own tokens; before them, the spans of the path it continues
        if len(spans) == 1:  # its own tokens only: plain causal attention
            keys, values, mask, causal = key[:, :, a:b], value[:, :, a:b], None, True
        else:  # a shared prefix: the path's first positions, then its own causal block
            keys = torch.cat([key[:, :, x:y] for x, y in spans], dim=2)
            values = torch.cat([value[:, :, x:y] for x, y in spans], dim=2)
            context = keys.shape[2] - (b - a)
            mask = torch.ones(b - a, keys.shape[2], dtype=torch.bool, device=query.device).tril(context)
            causal = False
        pieces.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, a:b],
                keys,
                values,
                attn_mask=mask,
                is_causal=causal,
                scale=scale,
                enable_gqa=grouped,
            )
        )
    return torch.cat(pieces, dim=2).transpose(1, 2)  # [1, T, H, D]


def _padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: RowLayout, scale: float | None
) -> torch.Tensor:
    """The varlen kernel's result from one sdpa over the segments gathered into a padded batch."""
    q_rows, k_rows, visible, back = layout.padded()
    pad_q = torch.cat([q, q.new_zeros(1, *q.shape[1:])])[q_rows]  # [S, Lq, H, D]
    pad_k = torch.cat([k, k.new_zeros(1, *k.shape[1:])])[k_rows]  # [S, Lk, Hkv, D]
    pad_v = torch.cat([v, v.new_zeros(1, *v.shape[1:])])[k_rows]
    out = torch.nn.functional.scaled_dot_product_attention(
        pad_q.transpose(1, 2),
        pad_k.transpose(1, 2),
        pad_v.transpose(1, 2),
        attn_mask=visible,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )  # [S, H, Lq, D]
    return out.transpose(1, 2).reshape(-1, *q.shape[1:])[back]  # [T, H, D]

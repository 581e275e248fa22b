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

:func:`packed_attention` runs a layer's attention from that layout by one of three paths
(:func:`attention_path`):

- ``varlen``, on CUDA in half precision: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's
  variable-length kernel, torch >= 2.10), one call a layer, no padding, nothing masked out computed;
- ``padded``, elsewhere on a GPU (fp32): one ``scaled_dot_product_attention`` over the segments gathered into
  a padded ``[segments, heads, longest, head_dim]`` batch with the bottom-right causal mask, scattered back
  to the row (the padded batch's indices and mask are built on first use and kept for the other layers);
- ``loop``, on a CPU: sdpa segment by segment from the layout's host-side spans. A CPU has no kernel
  launches to save, and this path computes no padding (the padded batch costs segments x longest^2).

None of them reads anything back from the device per layer. ``tests/test_packed_kernels.py`` checks the three
against attention computed segment by segment in float64 (varlen only where a GPU runs it),
``tests/test_packing.py`` whole models against one-sample-at-a-time forwards, and ``tests/perf/gpu_check.sh``
the varlen kernel against the padded path on a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Sequence
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
            total_q, total_k = int(self.cu_q[-1]), int(self.cu_k[-1])
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
            segment = torch.repeat_interleave(torch.arange(self.segments, device=device), lengths_q)
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


@functools.cache
def _varlen() -> Any:
    """torch's variable-length attention with causal masking bound, or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
    if "enable_gqa" in parameters:
        causal["enable_gqa"] = True
    return functools.partial(varlen_attn, **causal)


PATHS = ("varlen", "padded", "loop")
_FORCED: str | None = None


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


def attention_path(query: torch.Tensor) -> str:
    """The path :func:`packed_attention` takes for ``query``: ``varlen`` on CUDA in half precision (where this
    torch has the kernel), ``padded`` elsewhere on a GPU (one launch), ``loop`` on a CPU (no launches to save,
    and no padding computed)."""
    if _FORCED is not None:
        return _FORCED
    if not query.is_cuda:
        return "loop"
    half = query.dtype in (torch.float16, torch.bfloat16)
    return "varlen" if half and query.shape[-1] <= 256 and _varlen() is not None else "padded"


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: RowLayout,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of one packed row: ``query [1, H, T, D]``, ``key``/``value [1, Hkv, T, D]`` (transformers'
    layout, after the rotary embedding) -> ``[1, T, H, D]``, each segment attending as ``layout`` says."""
    path = attention_path(query)
    if path == "loop":
        return _looped_attention(query, key, value, layout, scale)
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    if layout.kv_index is not None:  # each segment's keys: its shared context, then its own
        k = k.index_select(0, layout.kv_index)
        v = v.index_select(0, layout.kv_index)
    if path == "varlen":
        out = _varlen()(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            layout.cu_q,
            layout.cu_k,
            layout.max_q,
            layout.max_k,
            scale=scale,
        )
        return out.unsqueeze(0)
    return _padded_attention(q, k, v, layout, scale).unsqueeze(0)


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

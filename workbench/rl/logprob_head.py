"""The completion tokens' log-probs and entropies straight from hidden states, a chunk of rows at a time.

The LM head's logits are the largest tensor of a policy update: ``[N, V]`` for N completion tokens and a
vocabulary of V (Qwen2.5: 152k, so 8k tokens make 5 GB in fp32), and autograd keeps them, their softmax
and their fp32 copy for the backward pass. What the loss needs is two numbers a token: the target's
log-prob and the entropy. :func:`chunked_logprobs` computes them ``chunk`` rows at a time and, on a GPU,
keeps only the hidden states; the backward pass recomputes each chunk's logits and turns them into the
hidden states' and the head's gradients at once (the recompute costs one more head matmul in four, as
Liger-Kernel's and prime-rl's fused heads do). On a CPU, where that matmul is the cost and memory is
plenty, the chunks' log-softmax is kept instead (``recompute=False``).

Numerics are those of the plain path: logits in the compute dtype (the hidden states' and, under
autocast, autocast's), half precision upcast to fp32, divided by the temperature; ``log p = z - logsumexp(z)``; entropy
``-sum p log p``. Gradients (``d log p_t / dz = onehot_t - p``, ``d H / dz = -p (log p + H)``) accumulate
into the head's weight in its own dtype (fp32 master weights). ``tests/test_packing.py`` compares it with
the full-logits path in float64.
"""

from __future__ import annotations

from typing import Any

import torch

# elements of one chunk's fp32 logits (2^26: 256 MB; 440 rows of a 152k vocabulary, 1,360 of a 49k one)
CHUNK_ELEMENTS = 2**26


def chunk_rows(vocab: int) -> int:
    """Rows per chunk for a vocabulary of ``vocab``: about ``CHUNK_ELEMENTS`` fp32 logits, at least 16."""
    return max(16, CHUNK_ELEMENTS // max(vocab, 1))


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


def _log_softmax(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """fp32 log-softmax of the tempered logits of ``hidden``'s rows (the logits' own buffer, reused)."""
    z = torch.nn.functional.linear(hidden, weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))  # half-precision logits upcast, float64 kept
    if temperature != 1.0:
        z /= temperature
    return z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))


def _entropy(log_p: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return -(p * log_p).sum(-1)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        rows: int,
        with_entropy: bool,
        recompute: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(hidden)
        h, w = hidden.to(dtype), weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        logps, entropies, kept = [], [], []
        for start in range(0, h.shape[0], rows):
            log_p = _log_softmax(h[start : start + rows], w, b, temperature)
            logps.append(log_p.gather(-1, targets[start : start + rows, None])[:, 0])
            if with_entropy:
                entropies.append(_entropy(log_p, log_p.exp()))
            if not recompute:
                kept.append(log_p)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.rows, ctx.dtype, ctx.with_entropy = temperature, rows, dtype, with_entropy
        ctx.kept = kept if not recompute else None
        empty = hidden.new_empty(0, dtype=torch.promote_types(dtype, torch.float32))
        logp = torch.cat(logps) if logps else empty
        return logp, (torch.cat(entropies) if entropies else torch.zeros_like(logp))

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple:  # type: ignore[override]
        hidden, weight, bias, targets = ctx.saved_tensors
        dtype, rows, temperature = ctx.dtype, ctx.rows, ctx.temperature
        h, w = hidden.to(dtype), weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        for chunk, start in enumerate(range(0, h.shape[0], rows)):
            piece = slice(start, start + rows)
            with torch.no_grad():
                if ctx.kept is None:
                    log_p = _log_softmax(h[piece], w, b, temperature)
                else:  # kept from the forward: used out of place, so a second backward reads it unchanged
                    log_p = ctx.kept[chunk].clone()
                p = log_p.exp()
                # d log p_t / dz = onehot_t - p;  d H / dz = -p (log p + H)
                if grad_entropy is not None and ctx.with_entropy:
                    g = grad_entropy[piece].to(log_p.dtype)[:, None]
                    grad_z = log_p.add_(_entropy(log_p, p)[:, None]).mul_(p).mul_(-g)
                else:
                    grad_z = log_p.zero_()
                if grad_logp is not None:
                    g = grad_logp[piece].to(log_p.dtype)[:, None]
                    grad_z.addcmul_(p, g, value=-1.0).scatter_add_(-1, targets[piece, None], g)
                if temperature != 1.0:
                    grad_z /= temperature
                grad_logits = grad_z.to(dtype)
                if grad_h is not None:
                    grad_h[piece] = (grad_logits @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += (grad_logits.t() @ h[piece]).to(weight.dtype)
                if grad_b is not None:
                    grad_b += grad_z.sum(0).to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    rows: int | None = None,
    with_entropy: bool = True,
    recompute: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies ``[N]`` (fp32, or float64 for float64 inputs) of ``targets [N]`` under the head ``weight [V, H]`` (+ ``bias``)
    applied to ``hidden [N, H]``, logits divided by ``temperature``; differentiable in ``hidden``, ``weight``
    and ``bias``, never holding more than ``rows`` rows of logits (default: :func:`chunk_rows`). Without
    ``with_entropy`` the entropies are not computed (zeros are returned in their place).

    ``recompute`` (default: on a GPU) recomputes each chunk's logits in the backward pass; without it the
    chunks' fp32 log-softmax is kept from the forward (the memory of the plain path, one head matmul less:
    the CPU's trade, where the matmul is the cost and memory is plenty)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}"
        )
    rows = rows or chunk_rows(weight.shape[0])
    recompute = hidden.is_cuda if recompute is None else recompute
    if not torch.is_grad_enabled():
        recompute = True  # nothing to keep for
    return _ChunkedLogprobs.apply(
        hidden, weight, bias, targets, float(temperature), rows, with_entropy, recompute
    )

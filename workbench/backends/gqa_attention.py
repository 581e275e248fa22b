"""sdpa attention that keeps grouped-query key/value heads grouped when there is a mask.

transformers' ``sdpa`` repeats every key and value head ``num_key_value_groups`` times (a full copy of
the KV cache, per layer, per decode step) whenever an attention mask is given, because CUDA's fused
kernels fall back to the math kernel with a mask anyway. A left-padded decode batch always has a mask,
and on a CPU the copy costs more than the attention itself. Here PyTorch's ``enable_gqa`` reads the
grouped heads directly; the result is the same (``tests/test_decode_kernels.py``). On a GPU, where a mask
sends ``enable_gqa`` to the slow math kernel, a decode step (one query a row) is two batched matrix
products over each key/value head's group of query heads (:func:`grouped_decode_attention`): the cache is
read once, never copied. Anything else (no mask, no grouped heads, a position bias, a GPU prefill) goes to
transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

GQA_ATTENTION = "gqa_sdpa"


def gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ``[batch, q_len, heads, head_dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = key.shape[1] != query.shape[1]
    on_cpu = query.device.type == "cpu"  # on CUDA a mask sends enable_gqa to the math kernel: keep sdpa's way
    plain = attention_mask is None or not grouped or kwargs.get("position_bias") is not None or dropout
    if not plain and not on_cpu and query.shape[2] == 1 and attention_mask.dtype == torch.bool:
        return grouped_decode_attention(query, key, value, attention_mask, scaling), None
    if plain or not on_cpu:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def grouped_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """One query a row (``[b, heads, 1, d]``) against grouped keys and values (``[b, kv heads, L, d]``) under
    a boolean ``mask`` broadcastable to ``[b, 1, 1, L]``; returns ``[b, 1, heads, d]``. Half-precision scores are
    upcast to fp32 for the softmax."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # each key/value head's group of query heads
    scores = torch.matmul(q, key.transpose(-1, -2))
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * (
        scale if scale is not None else dim**-0.5
    )
    scores = scores.masked_fill(~mask.reshape(mask.shape[0], 1, 1, -1), float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # [b, kv heads, group, d]
    return out.reshape(batch, 1, heads, dim)


def use_gqa_attention(model: Any) -> Any:
    """Switch ``model`` (in place; returned) from ``sdpa`` to ``gqa_sdpa``; other implementations stay."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(GQA_ATTENTION)
    return model

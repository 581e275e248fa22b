"""sdpa attention that keeps grouped-query key/value heads grouped when there is a mask.

transformers' ``sdpa`` repeats every key and value head ``num_key_value_groups`` times (a full copy of
the KV cache, per layer, per decode step) whenever an attention mask is given, because CUDA's fused
kernels fall back to the math kernel with a mask anyway. A left-padded decode batch always has a mask,
and on a CPU the copy costs more than the attention itself. Here PyTorch's ``enable_gqa`` reads the
grouped heads directly; the result is the same (``tests/test_decode_kernels.py``). Anything else (no
mask, no grouped heads, a position bias, a GPU, where the masked grouped kernel is the slow one) goes to
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
    if attention_mask is None or not grouped or not on_cpu or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


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

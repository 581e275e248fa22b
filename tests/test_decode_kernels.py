"""The hf backend's decode pieces against the plain versions they replace: grouped-query attention
without copying key/value heads, and token draws by inverse CDF instead of ``torch.multinomial``."""

from __future__ import annotations

import pytest
import torch

from workbench.backends.gqa_attention import gqa_sdpa, grouped_decode_attention, use_gqa_attention
from workbench.backends.hf_decode import _draw


class _Attention(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def test_grouped_attention_with_a_padding_mask_equals_sdpa_on_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, kv_heads, length, dim = 5, 2, 37, 16
    query = torch.randn(batch, kv_heads * 3, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    for row in range(batch):
        mask[row, ..., : 4 * row] = False  # left padding of each row's own width
    expected, _ = sdpa_attention_forward(_Attention(), query, key, value, mask, scaling=0.25)
    got, _ = gqa_sdpa(_Attention(), query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (batch, 1, kv_heads * 3, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # a prefill without a mask is transformers' own path
    query = torch.randn(batch, kv_heads * 3, length, dim)
    expected, _ = sdpa_attention_forward(_Attention(), query, key, value, None)
    torch.testing.assert_close(gqa_sdpa(_Attention(), query, key, value, None)[0], expected)


def test_grouped_decode_attention_equals_sdpa_on_repeated_heads():
    """The GPU decode step's attention (one query a row, the cache read in place), checked on the CPU."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(1)
    batch, kv_heads, length, dim = 4, 2, 29, 8
    query = torch.randn(batch, kv_heads * 3, 1, dim, dtype=torch.float64)
    key, value = (torch.randn(batch, kv_heads, length, dim, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    for row in range(batch):
        mask[row, ..., : 5 * row] = False
        mask[row, ..., length - row :] = False  # columns a static cache has not written yet
    expected, _ = sdpa_attention_forward(_Attention(), query, key, value, mask, scaling=0.3)
    got = grouped_decode_attention(query, key, value, mask, 0.3)
    assert got.shape == expected.shape == (batch, 1, kv_heads * 3, dim)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_only_a_model_on_plain_sdpa_is_switched(tmp_path):
    from workbench.models import load

    model, _ = load("tiny")
    model.set_attn_implementation("sdpa")
    assert use_gqa_attention(model).config._attn_implementation == "gqa_sdpa"
    model.set_attn_implementation("eager")
    assert use_gqa_attention(model).config._attn_implementation == "eager"


def test_draws_follow_the_distribution_and_never_pick_a_token_of_probability_zero():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 1e-3, 0.0])
    probs = (probs / probs.sum()).expand(200_000, -1).contiguous()
    counts = torch.bincount(_draw(probs), minlength=probs.shape[1]).double() / probs.shape[0]
    assert counts[[0, 2, 6]].sum() == 0
    # within 5 standard errors of each share
    tolerance = 5 * (probs[0] * (1 - probs[0]) / probs.shape[0]).sqrt()
    assert ((counts - probs[0].double()).abs() <= tolerance + 1e-12).all(), counts
    assert counts[5] > 0, "a token of probability 1e-3 is drawn about 200 times"
    with pytest.raises(ValueError, match="not finite"):
        _draw(torch.tensor([[0.5, float("nan")]]))


def test_a_shared_prefix_prefilled_once_decodes_what_whole_prompts_do(monkeypatch):
    """Prompts of one batch that repeat a long prefix (a few-shot transcript) before rests of different lengths,
    a prompt twice, and one prompt with its own start: the prefix is run once, and every row's greedy tokens
    and log-probs are those of whole-prompt prefills (float32 rounding of other matrix shapes aside)."""
    from workbench.backends import hf_decode
    from workbench.backends.base import GenerationRequest
    from workbench.models import load

    model, tokenizer = load("tiny")
    use_gqa_attention(model).eval()
    shot = list(range(100, 140))  # 40 shared tokens
    prompts = [shot + [7, 8, 9], shot + [11], shot + list(range(20, 31)), shot + [11]]
    rows = [GenerationRequest(prompt_ids=p, max_tokens=6, temperature=0.0, ignore_eos=True) for p in prompts]

    def run(batch_prompts):
        width = max(len(p) for p in batch_prompts)
        ids = torch.zeros((len(batch_prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch_prompts):
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
        calls = []
        original = model.forward

        def counted(*args, **kwargs):
            calls.append(kwargs["input_ids"].shape)
            return original(*args, **kwargs)

        monkeypatch.setattr(model, "forward", counted)
        try:
            return hf_decode.decode(model, tokenizer, ids, mask, rows[: len(batch_prompts)], []), calls
        finally:
            monkeypatch.setattr(model, "forward", original)

    (shared_ids, shared_lp), calls = run(prompts)
    assert calls[0] == (1, 40) and calls[1] == (3, 11), "the prefix once, then each distinct prompt's rest"
    monkeypatch.setattr(hf_decode, "SHARED_PREFIX_MIN", 10_000)
    (whole_ids, whole_lp), calls = run(prompts)
    assert calls[0] == (3, 51), "each distinct prompt whole"
    assert shared_ids == whole_ids and shared_ids[1] == shared_ids[3]
    torch.testing.assert_close(torch.tensor(shared_lp), torch.tensor(whole_lp), rtol=0, atol=1e-4)
    monkeypatch.undo()
    (own_ids, _), calls = run([list(range(200, 243)), *prompts[:2]])  # nothing shared by all: prompts whole
    assert calls[0] == (3, 43) and own_ids[1:] == shared_ids[:2]


def test_the_static_decode_refuses_an_attention_that_cannot_read_its_mask():
    from workbench.backends.hf import HFBackend
    from workbench.models import load

    model, tokenizer = load("tiny", attn_implementation="eager")
    with pytest.raises(ValueError, match="attention 'eager' does not"):
        HFBackend(model, tokenizer, decode="static")
    # auto: dynamic on a CPU (and for eager anywhere)
    assert HFBackend(model, tokenizer).decode_mode == "dynamic"


def test_the_static_decode_of_a_trained_fp32_model_under_bf16_autocast_writes_its_cache():
    """A trainer's fp32 master weights decoded with bf16 compute (the GPU's training rollouts): under
    autocast the rotary keys come out fp32 and the values bf16, and the static cache takes both."""
    import time

    from workbench.backends.base import GenerationRequest
    from workbench.backends.hf import HFBackend
    from workbench.models import load
    from workbench.models.placement import Placement

    model, tokenizer = load("tiny")
    bf16 = Placement(torch.device("cpu"), torch.bfloat16)
    prompt = tokenizer("1+2=")["input_ids"]
    rows = [GenerationRequest(prompt_ids=prompt, max_tokens=8, temperature=0.0, ignore_eos=True)]
    decoded = {}
    for mode in ("static", "dynamic"):
        backend = HFBackend(model, tokenizer, placement=bf16, decode=mode)
        (generation,) = backend._generate_rows(rows, time.perf_counter())[0]
        decoded[mode] = generation
    static, dynamic = decoded["static"], decoded["dynamic"]
    assert len(static.completion_ids) == 8 and all(lp <= 0 for lp in static.logprobs)
    assert static.completion_ids[:2] == dynamic.completion_ids[:2]  # bf16 rounding may part them later

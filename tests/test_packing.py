"""Padding-free packing: micro-batch plans, the packed row's layout, and numerical proof that packing is exact.

The packed log-probs, entropies and gradients of several samples in one row are compared with two
references that share no code with ``workbench.rl.packing``: one plain unpadded forward per sample,
and one right-padded batch forward with an attention mask (the classic path). Both models are
checked (``tiny`` is a Qwen2, ``smollm2-135m`` a Llama), with sdpa and eager attention, and with
``use_block_attention`` (``packed``: one attention call over the row; the references then run through its
fallback to plain sdpa, so they check that too).

Packed attention's three paths (``workbench.rl.packed_attention``: loop, padded, and varlen through the CPU
stand-in of torch 2.11's kernel on a CPU taken for CUDA) each give the loss and gradients of the samples
computed one at a time, on a shared-prefix row, in fp32 and under bf16 autocast over fp32 weights, with and
without gradient checkpointing, on ``tiny`` and on SmolLM2-135M's decoder shape (random weights, 2 layers, a
4096-token vocabulary: see ``SMOLLM2_SHAPE``); the counters say which path each forward really took, a
trained model under bf16 autocast on (faked) CUDA takes varlen with bf16 inputs, and the GPU check's kernel
comparison (``bench_precision --compare-kernels``) fails when its two runs took the same path.

Tolerances. In float64 packing is exact: log-probs and entropies agree to 1e-10 (measured 1e-14 on
smollm2), gradients to 1e-7 of the largest entry (measured 1e-14 on one machine, 5e-9 on an AMD EPYC
with the same packages: its float64 kernels round differently; a leak between samples moves gradients
by far more). In float32, the training dtype, the matmuls of one 200-token row and of a 20-token
sequence round differently, and on smollm2 (log-probs down to -30, vocabulary 49k) that is visible:
log-probs within ``1e-5 * (1 + |ref|)`` (measured up to 4e-6 relative), entropies within
``1e-4 + 1e-5 * ref`` (measured up to 6e-5), gradients within 5e-4 of the largest entry (measured up
to 1.1e-4). The two references differ from each other by as much; on ``tiny`` everything is within 1e-6.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engine.binpack import BinPackingError
from workbench.rl.packed_attention import counting_paths, forced_path, varlen_on_cpu
from workbench.rl.packing import (
    BLOCK_ATTENTION,
    PackedBatch,
    collate,
    plan_micro_batches,
    plan_shared_micro_batches,
    token_logprobs,
    use_block_attention,
)
from workbench.rl.samples import Sample

TEMPERATURE = 0.7


def _sample(n_prompt: int, n_completion: int, mask: list[int] | None = None, start: int = 0) -> Sample:
    completion = list(range(start + n_prompt, start + n_prompt + n_completion))
    return Sample(
        prompt_ids=list(range(start, start + n_prompt)),
        completion_ids=completion,
        mask=[1] * n_completion if mask is None else mask,
        old_logprobs=[0.0] * n_completion,
    )


# --- plan_micro_batches -------------------------------------------------------------------------


def _check_plan(lengths: list[tuple[int, int]], budget: int) -> list[list[int]]:
    samples = [_sample(p, c) for p, c in lengths]
    plan = plan_micro_batches(samples, budget)
    assert sorted(i for batch in plan for i in batch) == list(range(len(samples)))  # each exactly once
    for batch in plan:
        assert batch and batch == sorted(batch)
        tokens = sum(samples[i].n_tokens for i in batch)
        if tokens > budget:  # only a lone oversize sample may exceed the budget
            assert len(batch) == 1, (batch, tokens, budget)
    for i, s in enumerate(samples):
        if s.n_tokens > budget:
            assert [i] in plan
    fitting = [s.n_tokens for s in samples if s.n_tokens <= budget]
    packed = [b for b in plan if sum(samples[i].n_tokens for i in b) <= budget]
    assert len(packed) <= 2 * sum(fitting) / budget + 1  # first fit leaves at most one bin half empty
    assert plan_micro_batches(samples, budget) == plan  # deterministic
    return plan


def test_plan_packs_by_total_tokens_and_isolates_oversize_samples():
    # n_tokens: 10, 60, 25, 100 (> budget), 5, 40, 0
    lengths = [(4, 6), (30, 30), (20, 5), (50, 50), (5, 0), (10, 30), (0, 0)]
    plan = _check_plan(lengths, 64)
    assert plan[0] == [3]  # the oversize sample first, alone
    assert sum(len(b) for b in plan[1:]) == 6 and len(plan) == 1 + 3  # 140 tokens fit in 3 bins of 64
    assert plan_micro_batches([], 64) == []
    with pytest.raises(BinPackingError, match="positive int"):
        plan_micro_batches([_sample(1, 1)], 0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 200).flatmap(
        lambda budget: st.tuples(
            st.lists(st.tuples(st.integers(0, budget), st.integers(0, budget)), max_size=80),
            st.just(budget),
        )
    )
)
def test_plan_property(instance):
    lengths, budget = instance
    _check_plan(lengths, budget)


# --- collate ------------------------------------------------------------------------------------


def test_collate_layout():
    samples = [_sample(3, 2, start=100), _sample(2, 0, start=200), _sample(1, 3, [0, 1, 0], start=300)]
    batch = collate(samples, [2, 0, 1])
    assert batch.indices == [2, 0, 1]
    assert batch.input_ids.tolist() == [[300, 301, 302, 303, 100, 101, 102, 103, 104, 200, 201]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1]]
    assert batch.target_ids.tolist() == [301, 302, 303, 103, 104]
    assert batch.completion_positions.tolist() == [0, 1, 2, 6, 7]
    assert (batch.input_ids[0, batch.completion_positions + 1] == batch.target_ids).all()
    assert batch.sample_index.tolist() == [0, 0, 0, 1, 1]
    assert batch.mask.tolist() == [False, True, False, True, True]
    assert batch.n_tokens == 11 and batch.input_ids.dtype == torch.long


def test_collate_rejects_what_it_cannot_pack():
    with pytest.raises(ValueError, match="empty prompt"):
        collate([_sample(0, 3)], [0])
    with pytest.raises(ValueError, match="2 mask entries and 3 log-probs for 3"):
        collate([_sample(2, 3, [1, 1])], [0])
    with pytest.raises(ValueError, match="at least one"):
        collate([_sample(2, 3)], [])
    with pytest.raises(ValueError, match="no tokens"):
        collate([_sample(0, 0)], [0])


def _prefixed(prompt: list[int], n_completion: int, start: int) -> Sample:
    return Sample(prompt, list(range(start, start + n_completion)), [1] * n_completion, [0.0] * n_completion)


def test_collate_shares_the_prefix_a_sample_has_with_the_one_before():
    shot = [7, 8, 9, 10]
    samples = [
        _prefixed(shot + [1, 2], 2, 100),  # a root: positions from 0
        _prefixed(shot + [1, 2], 1, 200),  # the same prompt: only its last prompt token is laid out again
        _prefixed(shot + [3], 2, 300),  # the same examples, another question: shares 4 tokens
        _prefixed([5, 6], 1, 400),  # nothing in common: a new root
    ]
    batch = collate(samples, [0, 1, 2, 3], share_prefixes=True)
    assert batch.input_ids.tolist() == [[7, 8, 9, 10, 1, 2, 100, 101, 2, 200, 3, 300, 301, 5, 6, 400]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 4, 5, 6, 0, 1, 2]]
    assert batch.shared_tokens == 5 + 4 and batch.n_tokens == sum(s.n_tokens for s in samples) - 9
    assert (batch.input_ids[0, batch.completion_positions + 1] == batch.target_ids).all()
    assert batch.sample_index.tolist() == [0, 0, 1, 2, 2, 3]
    assert collate(samples, [0, 1, 2, 3]).shared_tokens == 0  # off unless asked for


def _check_shared_plan(samples: list[Sample], budget: int) -> list[list[int]]:
    plan = plan_shared_micro_batches(samples, budget)
    assert sorted(i for batch in plan for i in batch) == list(range(len(samples)))  # each exactly once
    for batch in plan:
        row = collate(samples, batch, share_prefixes=True).n_tokens if batch else 0
        assert batch and (row <= budget or len(batch) == 1), (batch, row, budget)
    assert plan_shared_micro_batches(samples, budget) == plan  # deterministic
    return plan


def test_shared_plan_puts_equal_prompts_together_within_the_budget():
    rng = random.Random(0)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, q] for q in range(4)]
    samples = [_prefixed(prompts[i % 4], rng.randint(1, 6), 1000 * i) for i in range(16)]
    plan = _check_shared_plan(samples, 40)
    for batch in plan:  # ordered by prompt: a group's samples are consecutive
        keys = [samples[i].prompt_ids[-1] for i in batch]
        assert keys == sorted(keys)
    rows = sum(collate(samples, b, share_prefixes=True).n_tokens for b in plan)
    assert rows < sum(s.n_tokens for s in samples) / 2  # each group's 9-token prompt laid out about once
    with pytest.raises(BinPackingError, match="positive int"):
        plan_shared_micro_batches(samples, 0)
    assert plan_shared_micro_batches([], 8) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(0, 6)), max_size=40),
    st.integers(1, 30),
)
def test_shared_plan_property(shapes, budget):
    samples = [
        _prefixed([9, 9, 9, q][: max(1, p % 5)] + [q] * p, c, 100 * k) for k, (q, p, c) in enumerate(shapes)
    ]
    _check_shared_plan(samples, budget)


# --- numerical equality on real models ----------------------------------------------------------


FLOAT32 = [
    "tiny:sdpa:float32",
    "tiny:eager:float32",
    pytest.param("smollm2-135m:sdpa:float32", marks=pytest.mark.slow),
    pytest.param("smollm2-135m:eager:float32", marks=pytest.mark.slow),
]
FLOAT64 = ["tiny:sdpa:float64", pytest.param("smollm2-135m:sdpa:float64", marks=pytest.mark.slow)]
# use_block_attention: sdpa per sample's block in a packed row, plain sdpa for everything else
# (smollm2's packed attention: test_every_attention_path_gives_the_per_sample_loss_and_gradients, every path)
BLOCKS = ["tiny:packed:float32", "tiny:packed:float64"]


@pytest.fixture(scope="module", params=FLOAT32 + FLOAT64 + BLOCKS)
def model(request):
    from workbench.models import load

    name, attention, dtype = request.param.split(":")
    blocks = attention == BLOCK_ATTENTION
    model, _ = load(name, attn_implementation="sdpa" if blocks else attention, dtype=getattr(torch, dtype))
    if blocks:
        assert use_block_attention(model) is model
    assert model.config._attn_implementation == attention
    assert model.get_input_embeddings().weight.dtype == getattr(torch, dtype)
    return model


def _random_samples(vocab: int, seed: int, n: int = 6) -> list[Sample]:
    """Random token sequences of 5..60 tokens; some completion tokens masked."""
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        total = rng.randint(5, 60)
        n_prompt = rng.randint(1, total - 1)
        n_completion = total - n_prompt
        mask = [int(rng.random() < 0.8) for _ in range(n_completion)]
        samples.append(
            Sample(
                prompt_ids=[rng.randrange(vocab) for _ in range(n_prompt)],
                completion_ids=[rng.randrange(vocab) for _ in range(n_completion)],
                mask=mask,
                old_logprobs=[0.0] * n_completion,
            )
        )
    return samples


def _from_logits(logits: torch.Tensor, sample: Sample) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of a sample's completion from its own [L, V] logits (full log-softmax)."""
    n_prompt, n_completion = len(sample.prompt_ids), len(sample.completion_ids)
    logp = torch.log_softmax(logits[n_prompt - 1 : n_prompt - 1 + n_completion] / TEMPERATURE, -1)
    target = torch.tensor(sample.completion_ids)
    return logp.gather(-1, target[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def _plain(model, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """One unpadded forward per sample, the model called the ordinary way."""
    out = []
    for s in samples:
        logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0]
        out.append(_from_logits(logits, s))
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def _padded(model, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """One right-padded batch forward with an attention mask (the classic, padded path)."""
    rows = [s.prompt_ids + s.completion_ids for s in samples]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    logits = model(ids, attention_mask=attention_mask).logits
    out = [_from_logits(logits[k, : len(r)], s) for k, (r, s) in enumerate(zip(rows, samples, strict=True))]
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def _close(actual: torch.Tensor, expected: torch.Tensor, entropy: bool = False) -> None:
    """Equal up to rounding: exact to 1e-10 in float64; in float32 see the module docstring."""
    if actual.dtype == torch.float64:
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4 if entropy else 1e-5)


def test_packed_logprobs_equal_unpadded_and_padded_forwards(model):
    samples = _random_samples(model.config.vocab_size, seed=1)
    order = [3, 0, 5, 1, 4, 2]  # any order: sample_index maps back
    batch = collate(samples, order)
    assert batch.n_tokens == sum(s.n_tokens for s in samples)  # no padding in the row
    with torch.no_grad():
        logp, entropy = token_logprobs(model, batch, temperature=TEMPERATURE, with_entropy=True)
        plain_logp, plain_entropy = _plain(model, [samples[i] for i in order])
        padded_logp, padded_entropy = _padded(model, [samples[i] for i in order])
    assert logp.shape == entropy.shape == (sum(len(s.completion_ids) for s in samples),)
    assert (logp < 0).all() and (entropy > 0).all()
    _close(logp, plain_logp)
    _close(entropy, plain_entropy, entropy=True)
    _close(logp, padded_logp)
    _close(entropy, padded_entropy, entropy=True)
    _close(padded_logp, plain_logp)  # the two references agree to the same tolerance
    # per sample, through sample_index
    lengths = [len(samples[i].completion_ids) for i in order]
    for k, alone in enumerate(plain_logp.split(lengths)):
        _close(logp[batch.sample_index == k], alone)


@pytest.mark.parametrize("model", FLOAT32, indirect=True)
def test_packing_without_the_boundaries_would_be_caught(model):
    """The same row with a cache (the config default): transformers skips packed detection and the
    samples attend to each other. The comparison above would see it. (``packed`` attention splits the row
    by its position ids whatever the cache, so it is not checked here.)"""
    samples = _random_samples(model.config.vocab_size, seed=2)
    batch = collate(samples, list(range(len(samples))))
    with torch.no_grad():
        logits = model(batch.input_ids, position_ids=batch.position_ids).logits[0]  # use_cache from config
        logp = torch.log_softmax(logits[batch.completion_positions] / TEMPERATURE, -1)
        leaked = logp.gather(-1, batch.target_ids[:, None])[:, 0]
        plain_logp, _ = _plain(model, samples)
    first = batch.sample_index == 0
    _close(leaked[first], plain_logp[first])  # the first sample sees nothing before it either way
    assert (leaked[~first] - plain_logp[~first]).abs().max() > 1e-3


def test_packed_gradients_equal_the_sum_of_per_sample_gradients(model):
    samples = _random_samples(model.config.vocab_size, seed=3)
    generator = torch.Generator().manual_seed(0)
    n = sum(len(s.completion_ids) for s in samples)
    weights = torch.randn(
        n, generator=generator, dtype=model.dtype
    )  # stands in for advantages / normalisation
    mask = torch.tensor([m for s in samples for m in s.mask], dtype=torch.bool)
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        f"model.layers.{model.config.num_hidden_layers - 1}.mlp.down_proj.weight",
        "model.norm.weight",
    ]
    params = dict(model.named_parameters())

    def loss_of(logp: torch.Tensor, entropy: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (w * logp)[m].sum() + 0.1 * entropy[m].sum()

    model.zero_grad(set_to_none=True)
    batch = collate(samples, list(range(len(samples))))
    assert torch.equal(batch.mask, mask)
    logp, entropy = token_logprobs(model, batch, temperature=TEMPERATURE, with_entropy=True)
    loss_of(logp, entropy, weights, batch.mask).backward()
    packed = {name: params[name].grad.clone() for name in names}

    model.zero_grad(set_to_none=True)
    start = 0
    for s in samples:  # backward adds up into .grad
        logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0]
        lp, ent = _from_logits(logits, s)
        end = start + len(s.completion_ids)
        loss_of(lp, ent, weights[start:end], mask[start:end]).backward()
        start = end
    summed = {name: params[name].grad.clone() for name in names}
    model.zero_grad(set_to_none=True)

    for name in names:
        scale = summed[name].abs().max()
        assert scale > 0, name
        error = (packed[name] - summed[name]).abs().max()
        tolerance = 1e-7 if scale.dtype == torch.float64 else 5e-4
        assert error <= tolerance * scale, (name, error.item(), scale.item())


def _group_samples(vocab: int, seed: int) -> list[Sample]:
    """What a GRPO step holds: groups sharing a prompt, prompts sharing few-shot examples, a later turn
    that continues an earlier sample's whole sequence, an unrelated prompt and an empty completion."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    shot = tokens(30)
    first, second = shot + tokens(5), shot + tokens(7)
    samples = [_prefixed(first, 0, 0) for _ in range(3)] + [_prefixed(second, 0, 0) for _ in range(2)]
    for s in samples:
        s.completion_ids = tokens(rng.randint(2, 6))
        s.mask = [int(rng.random() < 0.8) for _ in s.completion_ids]
        s.old_logprobs = [0.0] * len(s.completion_ids)
    later = samples[-1].prompt_ids + samples[-1].completion_ids + tokens(3)
    samples.append(Sample(later, tokens(4), [1] * 4, [0.0] * 4))
    samples.append(Sample(tokens(9), tokens(3), [1, 0, 1], [0.0] * 3))
    samples.append(Sample(list(first), [], [], []))
    return samples


@pytest.mark.parametrize("model", BLOCKS, indirect=True)
def test_shared_prefixes_give_the_log_probs_and_gradients_of_samples_computed_alone(model):
    """A shared-prefix row equals each sample computed alone. Log-probs exactly (1e-10 in float64); the
    gradient of the prefix, which adds up several samples' gradients, within 1e-6 of the largest entry in
    float64 (RMSNorm computes in float32 whatever the model's dtype, so a sum of two samples' gradients
    rounds once there where computed apart it rounds twice: measured up to 1e-7) and 5e-4 in float32."""
    samples = _group_samples(model.config.vocab_size, seed=7)
    order = list(range(len(samples)))
    batch = collate(samples, order, share_prefixes=True)
    assert (
        batch.shared_tokens > 100 and batch.n_tokens == sum(s.n_tokens for s in samples) - batch.shared_tokens
    )
    logp, entropy = token_logprobs(model, batch, temperature=TEMPERATURE, with_entropy=True)
    with torch.no_grad():
        plain_logp, plain_entropy = _plain(model, [s for s in samples if s.completion_ids])
    _close(logp.detach(), plain_logp)
    _close(entropy.detach(), plain_entropy, entropy=True)

    weights = torch.randn(len(logp), generator=torch.Generator().manual_seed(0), dtype=model.dtype)
    model.zero_grad(set_to_none=True)
    ((weights * logp)[batch.mask].sum() + 0.1 * entropy[batch.mask].sum()).backward()
    shared = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    alone = collate(samples, order)  # the same samples, every token laid out (checked above against _plain)
    logp, entropy = token_logprobs(model, alone, temperature=TEMPERATURE, with_entropy=True)
    ((weights * logp)[alone.mask].sum() + 0.1 * entropy[alone.mask].sum()).backward()
    for name, p in model.named_parameters():
        scale = p.grad.abs().max()
        tolerance = 1e-6 if scale.dtype == torch.float64 else 5e-4
        assert (shared[name] - p.grad).abs().max() <= tolerance * scale, name
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("model", ["tiny:sdpa:float32"], indirect=True)
def test_a_shared_row_needs_block_attention(model):
    """Plain sdpa reads each segment as a sequence of its own: a shared row would lose its prefixes."""
    batch = collate(_group_samples(model.config.vocab_size, seed=8), list(range(8)), share_prefixes=True)
    with pytest.raises(ValueError, match="shares .* prefix tokens"):
        token_logprobs(model, batch)


@pytest.mark.parametrize("model", [*FLOAT32, "tiny:packed:float32"], indirect=True)
def test_empty_and_fully_masked_completions(model):
    vocab = model.config.vocab_size
    samples = _random_samples(vocab, seed=4, n=3)
    samples.insert(1, Sample(prompt_ids=[5, 6, 7], completion_ids=[], mask=[], old_logprobs=[]))
    masked = _random_samples(vocab, seed=5, n=1)[0]
    masked.mask = [0] * len(masked.completion_ids)
    samples.append(masked)
    batch = collate(samples, list(range(len(samples))))
    n = sum(len(s.completion_ids) for s in samples)
    assert batch.target_ids.shape == (n,) and 1 not in batch.sample_index.tolist()
    assert not batch.mask[batch.sample_index == 4].any()
    logp, entropy = token_logprobs(model, batch, temperature=TEMPERATURE, with_entropy=True)
    with torch.no_grad():
        plain_logp, plain_entropy = _plain(model, [s for s in samples if s.completion_ids])
    _close(logp.detach(), plain_logp)
    _close(entropy.detach(), plain_entropy, entropy=True)
    model.zero_grad(set_to_none=True)
    (logp * batch.mask).sum().backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0

    # a micro-batch with no completion token at all: empty outputs that still backpropagate (zeros)
    model.zero_grad(set_to_none=True)
    nothing = collate(samples, [1])
    logp, entropy = token_logprobs(model, nothing, with_entropy=True)
    assert logp.shape == entropy.shape == (0,)
    logp.sum().backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() == 0
    model.zero_grad(set_to_none=True)


def test_token_logprobs_refuses_what_would_be_wrong():
    batch = collate([_sample(2, 2)], [0])
    unsupported = SimpleNamespace(config=SimpleNamespace(_attn_implementation="paged|sdpa"))
    with pytest.raises(ValueError, match="does not separate packed sequences"):
        token_logprobs(unsupported, batch)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(unsupported, batch, temperature=0.0)


def test_packed_batch_to_device_keeps_everything():
    batch = collate([_sample(2, 2), _sample(3, 1)], [1, 0])
    moved = batch.to("cpu")
    assert isinstance(moved, PackedBatch) and moved.indices == [1, 0]
    assert torch.equal(moved.input_ids, batch.input_ids) and torch.equal(moved.mask, batch.mask)


def test_block_attention_generates_like_sdpa():
    """Generation (a cache, left padding) takes packed attention's fallback: the same tokens as plain sdpa."""
    from workbench.models import load

    model, tokenizer = load("tiny")
    prompts = tokenizer(
        ["3 + 4 =", "what is the capital of"], return_tensors="pt", padding=True, padding_side="left"
    )
    settings_ = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": model.config.pad_token_id}
    with torch.no_grad():
        expected = model.generate(**prompts, **settings_)
        use_block_attention(model)
        assert model.config._attn_implementation == BLOCK_ATTENTION
        assert torch.equal(model.generate(**prompts, **settings_), expected)


def test_block_attention_splits_the_row_by_itself():
    """packed attention really takes its per-sample path: even with a cache, where transformers' own packed
    detection is off and plain sdpa leaks across samples, the packed row's log-probs stay exact."""
    from workbench.models import load

    model, _ = load("tiny")
    use_block_attention(model)
    samples = _random_samples(model.config.vocab_size, seed=6)
    batch = collate(samples, list(range(len(samples))))
    with torch.no_grad():
        logits = model(batch.input_ids, position_ids=batch.position_ids, use_cache=True).logits[0]
        logp = torch.log_softmax(logits[batch.completion_positions] / TEMPERATURE, -1)
        plain_logp, _ = _plain(model, samples)
    _close(logp.gather(-1, batch.target_ids[:, None])[:, 0], plain_logp)


# --- the three attention paths in whole models ----------------------------------------------------

# SmolLM2-135M's decoder (HuggingFaceTB/SmolLM2-135M-Instruct's config: Llama, width 576, 9 query heads over 3
# key/value heads of 64) with random weights, cut for time to 2 of its 30 layers and 4096 of its 49152 tokens
# of vocabulary: attention sees SmolLM2's tensors; the LM head, the same on every path, took 80% of the time.
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 2,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
# bf16 autocast over fp32 master weights, packed row against each sample alone under the same autocast: the
# matmuls round in bf16 (8 bits of mantissa) in another order. Measured on both shapes, every path, with and
# without checkpointing: loss within 2.1e-4 relative, gradients within 2.0e-2 of each parameter's largest
# entry (fp32: 1e-7 and 1.1e-6). A sample reading another's tokens moves them by far more.
BF16_LOSS_RTOL, BF16_GRAD_TOL = 2e-3, 5e-2


@pytest.fixture(scope="module", params=["tiny", "smollm2-shape"])
def trained(request):
    """A trained model's setting: fp32 weights, packed attention, train mode; a GRPO micro-batch with shared
    prefixes (each model has grouped-query heads); the per-sample references, made on first use."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from workbench.models import load

    if request.param == "tiny":
        model, _ = load("tiny")
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(**SMOLLM2_SHAPE), dtype=torch.float32, attn_implementation="sdpa"
        )
    model = use_block_attention(model).train()
    samples = _group_samples(model.config.vocab_size, seed=7)
    batch = collate(samples, list(range(len(samples))), share_prefixes=True)
    weights = torch.randn(len(batch.target_ids), generator=torch.Generator().manual_seed(0))
    assert model.config.num_key_value_heads < model.config.num_attention_heads and batch.shared_tokens > 100
    return SimpleNamespace(model=model, samples=samples, batch=batch, weights=weights, references={})


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def _loss(logp: torch.Tensor, entropy: torch.Tensor, setting) -> torch.Tensor:
    mask = setting.batch.mask
    return (setting.weights * logp.float())[mask].sum() + 0.1 * entropy.float()[mask].sum()


def _per_sample_reference(setting, precision: str) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and gradients of the samples each computed alone (plain sdpa, the model called as usual)."""
    if precision not in setting.references:
        model = setting.model
        model.zero_grad(set_to_none=True)
        logps, entropies = [], []
        with _autocast(precision):
            for s in setting.samples:
                if s.completion_ids:
                    logits = model(torch.tensor([s.prompt_ids + s.completion_ids]), use_cache=False).logits
                    logp, entropy = _from_logits(logits[0].float(), s)
                    logps.append(logp)
                    entropies.append(entropy)
        loss = _loss(torch.cat(logps), torch.cat(entropies), setting)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        setting.references[precision] = (loss.item(), grads)
    return setting.references[precision]


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_attention_path_gives_the_per_sample_loss_and_gradients(trained, precision, checkpointing):
    """loop, padded and varlen (the CPU stand-in of torch 2.11's kernel, on a CPU taken for CUDA) on a
    shared-prefix row: the loss within 1e-5 relative and every gradient within 1e-4 of its parameter's largest
    entry of the samples computed alone in fp32 (bf16: module constants). The path each forward took is read
    from the counters: one call a layer, twice with checkpointing (the backward's recompute takes it again).
    Not forced, the device's choice is read too: on CUDA a trained model (fp32 weights) takes varlen under
    bf16 autocast, although Qwen2's rotary hands attention fp32 query and key, and padded in fp32."""
    model, layers = trained.model, trained.model.config.num_hidden_layers
    ref_loss, ref_grads = _per_sample_reference(trained, precision)
    chosen = "varlen" if precision == "bf16" else "padded"  # on CUDA, not forced
    loss_rtol, grad_tol = (1e-5, 1e-4) if precision == "fp32" else (BF16_LOSS_RTOL, BF16_GRAD_TOL)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        for path in ("loop", "padded", "varlen"):
            model.zero_grad(set_to_none=True)
            forcing = contextlib.nullcontext() if path == chosen else forced_path(path)
            with varlen_on_cpu(), forcing, counting_paths() as taken:
                with _autocast(precision):
                    logp, entropy = token_logprobs(model, trained.batch, TEMPERATURE, with_entropy=True)
                loss = _loss(logp, entropy, trained)
                loss.backward()
            assert taken == {path: layers * (2 if checkpointing else 1)}, path
            assert abs(loss.item() - ref_loss) <= loss_rtol * abs(ref_loss), (path, loss.item(), ref_loss)
            for name, p in model.named_parameters():
                scale = ref_grads[name].abs().max()
                assert scale > 0 and (p.grad - ref_grads[name]).abs().max() <= grad_tol * scale, (path, name)
    finally:
        model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)


def test_a_trained_model_under_bf16_autocast_takes_varlen_with_bf16_inputs(monkeypatch):
    """The path test on a real forward: ``tiny`` (Qwen2) with fp32 weights under bf16 autocast on a (faked)
    CUDA device. Attention receives fp32 query and key (the rotary's fp32 cos/sin) beside a bf16 value,
    which a choice made from the query's dtype sent to the padded path; it takes varlen, and the kernel
    receives three bf16 tensors."""
    from workbench.models import load
    from workbench.rl import packing
    from workbench.rl.packed_attention import packed_attention, varlen_attn_standin

    model, _ = load("tiny")
    use_block_attention(model)
    reached, kernel_got = [], []

    def recording_attention(query, key, value, layout, scale=None):
        reached.append((query.dtype, key.dtype, value.dtype))
        return packed_attention(query, key, value, layout, scale)

    @functools.wraps(varlen_attn_standin)  # the stand-in's signature, so it is bound as the kernel would be
    def recording_kernel(query, key, value, *args, **kwargs):
        kernel_got.append((query.dtype, key.dtype, value.dtype))
        return varlen_attn_standin(query, key, value, *args, **kwargs)

    monkeypatch.setattr(packing, "packed_attention", recording_attention)
    batch = collate(_group_samples(model.config.vocab_size, seed=9), list(range(8)), share_prefixes=True)
    with (
        varlen_on_cpu(recording_kernel),
        counting_paths() as taken,
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        logp, _ = token_logprobs(model, batch, TEMPERATURE)
    layers = model.config.num_hidden_layers
    assert taken == {"varlen": layers} and logp.dtype == torch.float32
    assert reached == [(torch.float32, torch.float32, torch.bfloat16)] * layers
    assert kernel_got == [(torch.bfloat16,) * 3] * layers


# --- the kernel comparison of the GPU check --------------------------------------------------------


def test_the_kernel_comparison_fails_when_both_runs_take_one_path():
    """``bench_precision --compare-kernels`` reads the path each run took from the counters: planted on one
    path, the two runs compare nothing and it says so (before the fix, a GPU's two runs both took padded)."""
    from tests.perf.bench_precision import compare_kernels

    args = argparse.Namespace(device="cpu", model="qwen2-mini")
    with pytest.raises(RuntimeError, match=r"compared nothing: both runs took padded .*'padded': 4"):
        compare_kernels(args, forcing={"default": "padded", "padded": "padded"})

"""Host syncs in the hot loops, counted on the CPU: a trainer step and a static-decode step.

On a GPU every sync (a scalar read, a data-dependent shape, a device-to-host copy) makes the CPU wait for
the device and leaves the GPU idle while the CPU catches up. ``tests/sync_counter.py`` counts what the code
asks for under a torch dispatch mode, so a CPU run shows the syncs a GPU run would make: here, a trainer step
(old-policy and reference passes, forward, backward, fused AdamW) and the static decode (``capture=False``,
the code a CUDA graph records) must make a fixed number, the same for 8 and for 64 samples or rows.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import random
from typing import Any

import pytest
import torch

from tests.grpo_samples import grpo_groups
from tests.sync_counter import SyncCounter
from workbench.backends.base import GenerationRequest
from workbench.backends.gqa_attention import use_gqa_attention
from workbench.backends.hf_static_decode import StaticDecoder
from workbench.models import load
from workbench.rl.config_sections import LossConfig
from workbench.rl.packed_attention import counting_paths, forced_path, varlen_attn_standin, varlen_on_cpu
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def test_the_counter_sees_reads_masks_and_copies_and_nothing_else():
    x = torch.arange(6.0)
    with SyncCounter() as syncs:
        float(x[1]), bool(x[2] > 1), x[x > 2], x.nonzero(), x.tolist(), x.cpu(), x.numpy()
        torch.repeat_interleave(x.long())
    assert dict(syncs.by_op) == {
        "item": 2,
        "mask_index": 1,
        "nonzero": 1,
        "tolist": 1,
        "cpu": 1,
        "numpy": 1,
        "repeat_interleave": 1,
    }
    with SyncCounter() as syncs:  # shapes known on the host: no syncs
        x.split([2, 4]), x.index_select(0, torch.tensor([1, 3])), x.masked_fill(x > 2, 0.0), x.sum()
        torch.repeat_interleave(x.long(), output_size=15)
    assert syncs.total == 0
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the Python-level reads are restored on exit


def _samples(n: int, vocab: int, seed: int = 0) -> list[Sample]:
    """GRPO groups of 8 samples (one prompt each), two roles, completions of 3 to 10 tokens."""
    return grpo_groups(vocab, n // 8, 8, seed, engine_logprob=-2.0, roles=("verifier", "solver"))


def _trainer_syncs(model: torch.nn.Module, n: int, path: str | None = None) -> tuple[SyncCounter, dict]:
    config = OptimConfig(
        learning_rate=1e-3,
        warmup_steps=3,
        mini_batch_size=n // 2,  # two optimizer steps a trainer step
        token_budget=32,  # micro-batches of two to four samples (a shared prompt counted once)
        loss=LossConfig(kl_coef=0.05, engine_ratio_cap=2.0),  # the old-policy and the reference passes
    )
    trainer = PolicyTrainer({"p": copy.deepcopy(model)}, config, ref_model=model, fused=True)
    assert trainer.optimizer.param_groups[0]["fused"]
    samples = _samples(n, model.config.vocab_size)
    with forced_path(path) if path else contextlib.nullcontext():
        trainer.step(samples[:8], 0)  # AdamW's state made
        with SyncCounter(where=True) as syncs:
            metrics = trainer.step(samples, 1)
    assert metrics["optimizer_steps"] == 2 and math.isfinite(metrics["loss"])
    return syncs, metrics


def test_a_trainer_step_reads_the_device_once_whatever_the_number_of_samples(tiny):
    """Two roles, old-policy and reference passes, two fused AdamW steps, micro-batches of a few samples (4
    of them a scoring pass for 8 samples, 31 for 64): the step's metrics are its one read."""
    model, _ = tiny
    for n in (8, 64):
        syncs, _ = _trainer_syncs(model, n)
        assert dict(syncs.by_op) == {"tolist": 1}, (n, syncs.sites)


def test_the_padded_attention_path_reads_nothing_back_either(tiny):
    """The GPU's full-precision path (forced on the CPU) builds its padded indices once per micro-batch forward,
    from sizes known on the host."""
    model, _ = tiny
    syncs, _ = _trainer_syncs(model, 64, "padded")
    assert dict(syncs.by_op) == {"tolist": 1}, syncs.sites


def test_the_varlen_path_under_bf16_autocast_reads_nothing_back_either(tiny):
    """The GPU's path for a trained model under bf16 autocast: the branch around the kernel (dtypes, casts, the
    call) runs on the CPU against the stand-in of torch's ``varlen_attn``, whose own reads the kernel does not
    make and are left out."""
    model, _ = tiny
    counter = SyncCounter(where=True)

    @functools.wraps(varlen_attn_standin)
    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        with counter.paused():
            return varlen_attn_standin(*args, **kwargs)

    config = OptimConfig(
        learning_rate=1e-3,
        mini_batch_size=32,
        token_budget=32,
        compute_dtype="bfloat16",
        loss=LossConfig(kl_coef=0.05, engine_ratio_cap=2.0),
    )
    trainer = PolicyTrainer({"p": copy.deepcopy(model)}, config, ref_model=model, fused=True)
    samples = _samples(64, model.config.vocab_size)
    with varlen_on_cpu(kernel), counting_paths() as paths:
        trainer.step(samples[:8], 0)
        with counter:
            trainer.step(samples, 1)
    assert set(paths) == {"varlen"}
    assert dict(counter.by_op) == {"tolist": 1}, counter.sites


def test_the_host_counts_adamw_steps_as_adamw_does_and_reads_them_again_after_a_load(tiny):
    """A model per policy, one of them left out of a step: each parameter's count is AdamW's own, so the
    warm-up is that of AdamW's state (as before the count moved to the host); a loaded state is read again."""
    model, _ = tiny
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    config = OptimConfig(learning_rate=1e-3, warmup_steps=5)
    trainer = PolicyTrainer({"a": a, "b": b}, config, fused=True)
    samples = _samples(8, model.config.vocab_size)
    only_a = [dataclasses.replace(s, policy="a") for s in samples]
    both = [dataclasses.replace(s, policy="ab"[i % 2]) for i, s in enumerate(samples)]
    for step, batch in enumerate([only_a, both, only_a]):
        trainer.step(batch, step)

    def adamw_counts(optimizer: torch.optim.Optimizer) -> list[int]:
        return [int(optimizer.state[p]["step"]) if p in optimizer.state else 0 for p in trainer.parameters]

    assert trainer._optimizer_steps() == adamw_counts(trainer.optimizer)
    assert max(trainer._optimizer_steps()) == 3 and min(trainer._optimizer_steps()) == 1
    assert trainer.learning_rate() == pytest.approx(1e-3 * 4 / 6)
    resumed = PolicyTrainer({"a": copy.deepcopy(a), "b": copy.deepcopy(b)}, config, fused=True)
    assert resumed.learning_rate() == pytest.approx(1e-3 / 6)
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())
    assert resumed._optimizer_steps() == adamw_counts(trainer.optimizer)
    assert resumed.learning_rate() == trainer.learning_rate()


def _batch(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    return ids, mask


@pytest.fixture(scope="module")
def decoding(tiny):
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    use_gqa_attention(model).eval()
    return model, tokenizer


def _decode_syncs(
    decoding, decoder: StaticDecoder, n: int, max_tokens: int, stop: tuple[str, ...]
) -> SyncCounter:
    model, tokenizer = decoding
    rng = random.Random(n)
    prompts = [[rng.randrange(10, 300) for _ in range(rng.randint(3, 9))] for _ in range(n)]
    ids, mask = _batch(prompts)
    rows = [
        GenerationRequest(p, max_tokens=max_tokens, temperature=1.0, ignore_eos=True, stop=stop)
        for p in prompts
    ]
    with SyncCounter(where=True) as syncs:
        out, _ = decoder.decode(tokenizer, ids, mask, rows, [], list(range(n)))
    assert [len(o) for o in out] == [max_tokens] * n
    return syncs


def test_the_static_decode_reads_the_device_every_k_steps_whatever_the_number_of_rows(decoding):
    """16 more tokens a row cost two reads (k = 8), for 8 rows as for 64, with a stop string or without;
    the prompts' prefill reads a fixed few (the batch's ids and mask, transformers' mask checks)."""
    counts = {}
    for n in (8, 64):
        decoder = StaticDecoder(decoding[0], 64, capture=False, check_every=8)
        for stop in ((), ("@@never@@",)):
            short = _decode_syncs(decoding, decoder, n, 9, stop)
            long = _decode_syncs(decoding, decoder, n, 25, stop)
            assert long.total - short.total == 2, (n, stop, short.sites, long.sites)
            counts[(n, stop)] = short.total
    assert len(set(counts.values())) == 1, counts
    reads = sum(v for (_, site), v in short.sites.items() if "hf_static_decode" in site)
    assert reads == math.ceil(9 / 8), short.sites  # the first token and 8 steps, read 8 at a time
    assert short.total - reads <= 6, (
        short.sites
    )  # the prefill: the batch's ids and mask, transformers' checks


def test_reading_every_k_steps_decodes_what_reading_every_step_decodes(decoding):
    """Rows ending by their own limits, by end-of-sequence and by stop strings, sampled and greedy, in batches
    that shrink to smaller buckets: the same ids and log-probs (bit for bit) whatever ``check_every``."""
    model, tokenizer = decoding
    rng = random.Random(0)
    n = 12
    prompts = [[rng.randrange(10, 300) for _ in range(rng.randint(3, 9))] for _ in range(n)]
    ids, mask = _batch(prompts)
    stops = ["e", "a", " t", "@@never@@", "in", ""]
    batches = [
        # sampled, stop strings, per-row limits, end-of-sequence on a few common tokens
        [
            GenerationRequest(p, max_tokens=5 + 3 * i, temperature=1.0, stop=(stops[i % 6],))
            for i, p in enumerate(prompts)
        ],
        # greedy, limits only
        [
            GenerationRequest(p, max_tokens=2 + 2 * i, temperature=0.0, ignore_eos=True)
            for i, p in enumerate(prompts)
        ],
    ]
    # one thread, as the suite runs: the batch shrinks at other steps with another ``check_every``, and with
    # more threads a matmul of another shape splits its sums otherwise (the log-probs' last bits differ)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rows in batches:
            results = []
            for k in (1, 3, 8):
                torch.manual_seed(0)
                decoder = StaticDecoder(model, 16, capture=False, check_every=k)
                results.append(
                    decoder.decode(
                        tokenizer, ids, mask, rows, list(range(10, 3000, 97)), [None] * 4 + [7] * 8
                    )
                )
            assert results[0] == results[1] == results[2]
            assert len({len(c) for c in results[0][0]}) > 3  # rows end at many different steps
    finally:
        torch.set_num_threads(threads)

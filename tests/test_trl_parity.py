"""Parity with TRL: one workbench update and one real ``trl.GRPOTrainer`` update of the same model on the
same batch, advantages and hyperparameters give the same pre-clip gradient norm, the same gradients and the
same parameters, in fp32 and in bf16 mixed precision (CPU).

TRL generates its own completions; here its ``_prepare_inputs`` hands it our fixed batch instead, and
everything after that (loss, backward, clipping, AdamW step) is TRL's own ``train()``.

Why gradients, not only the loss and the parameters: on one on-policy step the PPO loss is 0 by
construction whatever the advantages, and Adam's first step moves every parameter by about the learning
rate whatever the gradient's size, so "same loss, parameters within 1e-5" passes with every advantage
doubled (a 2x gradient error). The gradients and their pre-clip norm do not: ``test_a_doubled_advantage_fails``
keeps the criterion honest.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.trl_fixed_batch import Update, named_grads, named_params, trl_update
from workbench.models import load
from workbench.rl.loss import LossConfig
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer

LR = 1e-4  # 100x TRL's default: Adam's first step moves every parameter with a real gradient by about LR
# Adam's first step is g / (|g| + eps): for gradients that are pure fp32 rounding (~1e-9, from summing in
# another order: packed here, padded in TRL) the default eps=1e-8 turns noise into steps of LR size. Both
# sides use eps=1e-6, so only gradients well above rounding move parameters.
ADAM_EPS = 1e-6
ADVANTAGES = [1.0, -0.5, 0.8, -0.9]
MAX_GRAD_NORM = 1.0
# fp32: the relative gradient gap ||ours - TRL|| / ||TRL|| allowed. The two sides sum the same products in
# another order (one packed row here, a left-padded batch in TRL): ~1e-7 (tiny) to ~7e-6 (smollm2-135m).
FP32_GAP = 1e-5
# bf16: both autocast the matrix products to bf16 (8 significant bits) but round different intermediate
# tensors (a packed row against padded rows, per-block attention against sdpa's masked kernel), so no fixed
# number fits every model. The yardstick is TRL's own bf16 error: ours may differ from TRL's bf16 gradient,
# and from the fp32 gradient, by at most 1.5x what TRL's bf16 gradient differs from TRL's fp32 one (measured:
# tiny 4.6e-3, smollm2-135m 8.7e-2; a 2x gradient error is a gap of 1.0).
BF16_SLACK = 1.5


@pytest.fixture(scope="module", params=["tiny", "smollm2-135m"])
def model(request):
    model, _ = load(request.param)
    return model


@pytest.fixture(scope="module")
def trl_runs(tmp_path_factory):
    """TRL's update per (model, loss type, dtype), made once and shared by the tests of this module."""
    cache: dict[tuple, Update] = {}

    def run(model, loss_type: str, dtype: str) -> Update:
        key = (id(model), loss_type, dtype)
        if key not in cache:
            out = tmp_path_factory.mktemp("trl")
            samples = _batch(model.config.vocab_size)
            cache[key] = trl_update(
                copy.deepcopy(model), samples, loss_type, out, LR, ADAM_EPS, bf16=dtype == "bfloat16"
            )
        return cache[key]

    return run


def _batch(vocab: int, seed: int = 0, scale: float = 1.0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for i in range(4):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(3, 9))]
        completion = [rng.randrange(10, vocab) for _ in range(rng.randint(2, 7))]
        samples.append(
            Sample(
                prompt,
                completion,
                [1] * len(completion),
                [0.0] * len(completion),
                advantage=scale * ADVANTAGES[i],
            )
        )
    return samples


def _our_update(model, aggregation: str, dtype: str, scale: float = 1.0) -> Update:
    ours = copy.deepcopy(model)
    config = OptimConfig(
        learning_rate=LR,
        eps=ADAM_EPS,
        max_grad_norm=MAX_GRAD_NORM,
        token_budget=10_000,
        compute_dtype=dtype,
        loss=LossConfig(aggregation=aggregation),
    )
    trainer = PolicyTrainer({"base": ours}, config)
    grads: dict[str, torch.Tensor] = {}
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.update(named_grads(ours)))  # after clipping
    metrics = trainer.step(_batch(model.config.vocab_size, scale=scale))
    return Update(metrics["loss"], metrics["grad_norm"], grads, named_params(ours))


def gradient_gap(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    """||ours - theirs|| / ||theirs|| over every parameter (a parameter one side left without a gradient
    counts as zeros there)."""
    diff = total = 0.0
    for name in set(ours) | set(theirs):
        b = theirs.get(name)
        a = ours.get(name, torch.zeros_like(b) if b is not None else None)
        b = b if b is not None else torch.zeros_like(a)
        diff += float((a.double() - b.double()).pow(2).sum())
        total += float(b.double().pow(2).sum())
    return (diff / total) ** 0.5


def unclipped(update: Update) -> dict[str, torch.Tensor]:
    """The gradients before clipping: both sides clip with torch's rule (scale max / (norm + 1e-6) when the
    norm is above max), so clipped gradients alone would hide a gradient that is too large."""
    scale = max(1.0, (update.grad_norm + 1e-6) / MAX_GRAD_NORM)
    return {name: g * scale for name, g in update.grads.items()}


@pytest.mark.parametrize(
    ("loss_type", "aggregation"), [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean")]
)
def test_one_fp32_update_matches_trl(model, trl_runs, loss_type, aggregation):
    theirs = trl_runs(model, loss_type, "float32")
    ours = _our_update(model, aggregation, "float32")

    assert ours.grad_norm == pytest.approx(theirs.grad_norm, rel=FP32_GAP)
    gap = gradient_gap(unclipped(ours), unclipped(theirs))
    assert gap <= FP32_GAP, f"gradients differ by {gap:.2e} (relative), allowed {FP32_GAP:.0e}"
    assert ours.loss == pytest.approx(theirs.loss, abs=1e-5)
    moved = 0
    for name, before in named_params(model).items():
        torch.testing.assert_close(ours.params[name], theirs.params[name], atol=1e-5, rtol=0, msg=name)
        moved += int(not torch.equal(ours.params[name], before))
    assert moved > 0.9 * len(list(model.parameters())), "the update should move (nearly) every parameter"


def test_one_bf16_update_matches_trl_within_trls_own_bf16_error(model, trl_runs):
    trl_bf16, trl_fp32 = trl_runs(model, "grpo", "bfloat16"), trl_runs(model, "grpo", "float32")
    ours = _our_update(model, "seq_mean_token_mean", "bfloat16")

    trl_error = gradient_gap(unclipped(trl_bf16), unclipped(trl_fp32))
    allowed = BF16_SLACK * trl_error
    assert gradient_gap(unclipped(ours), unclipped(trl_bf16)) <= allowed
    assert gradient_gap(unclipped(ours), unclipped(trl_fp32)) <= allowed
    assert ours.grad_norm == pytest.approx(trl_bf16.grad_norm, rel=allowed)
    assert trl_error < 0.2, f"TRL's own bf16 step is off by {trl_error:.2f}: a broken yardstick"


def test_a_doubled_advantage_fails(model, trl_runs):
    """The criterion catches a 2x gradient error that "same loss, parameters within 1e-5" let through."""
    theirs = trl_runs(model, "grpo", "float32")
    doubled = _our_update(model, "seq_mean_token_mean", "float32", scale=2.0)

    for name, param in doubled.params.items():  # the old criterion, parameters within 1e-5: blind to it
        torch.testing.assert_close(param, theirs.params[name], atol=1e-5, rtol=0, msg=name)
    assert gradient_gap(unclipped(doubled), unclipped(theirs)) == pytest.approx(1.0, rel=1e-3)
    assert doubled.grad_norm == pytest.approx(2 * theirs.grad_norm, rel=1e-4)

"""Parity with TRL: one workbench update and one real ``trl.GRPOTrainer`` update of the same model on the
same batch, advantages and hyperparameters give the same loss and the same parameters (fp32, CPU).

TRL generates its own completions; here its ``_prepare_inputs`` hands it our fixed batch instead, and
everything after that (loss, backward, clipping, AdamW step) is TRL's own ``train()``.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.trl_fixed_batch import trl_update
from workbench.models import load
from workbench.rl.loss import LossConfig
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer

LR = 1e-4  # 100x TRL's default: Adam's first step moves every parameter with a real gradient by about LR
# Adam's first step is g / (|g| + eps): for gradients that are pure fp32 rounding (~1e-9, from summing in
# another order: packed here, padded in TRL) the default eps=1e-8 turns noise into steps of LR size. Both
# sides use eps=1e-6, so only gradients well above rounding move parameters.
ADAM_EPS = 1e-6


@pytest.fixture(scope="module", params=["tiny", "smollm2-135m"])
def model(request):
    model, _ = load(request.param)
    return model


def _batch(vocab: int, seed: int = 0) -> list[Sample]:
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
                advantage=[1.0, -0.5, 0.8, -0.9][i],
            )
        )
    return samples


@pytest.mark.parametrize(
    ("loss_type", "aggregation"), [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean")]
)
def test_one_update_matches_trl(model, loss_type, aggregation, tmp_path):
    samples = _batch(model.config.vocab_size)
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    config = OptimConfig(
        learning_rate=LR,
        eps=ADAM_EPS,
        max_grad_norm=1.0,
        token_budget=10_000,
        loss=LossConfig(aggregation=aggregation),
    )
    metrics = PolicyTrainer({"base": ours}, config).step(samples)
    trl_loss = trl_update(theirs, samples, loss_type, tmp_path / "trl", LR, ADAM_EPS)

    assert metrics["loss"] == pytest.approx(trl_loss, abs=1e-5)
    moved = 0
    for (name, a), (_, b), (_, before) in zip(
        ours.named_parameters(), theirs.named_parameters(), model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
        moved += int(not torch.equal(a, before))
    assert moved > 0.9 * len(list(model.parameters())), "the update should move (nearly) every parameter"

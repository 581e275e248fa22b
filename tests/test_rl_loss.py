"""The policy loss against hand-computed values: clipping, dual clip, aggregation, masking, importance weights."""

import math

import pytest
import torch

from workbench.rl.loss import LossConfig, policy_loss


def _loss(logps, old, adv, mask, index, n, denominator, **cfg):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return policy_loss(
        t(logps), t(old), t(adv), t(mask), torch.tensor(index), n, denominator, LossConfig(**cfg)
    )


def test_unclipped_tokens_give_minus_ratio_times_advantage():
    terms = _loss([math.log(1.1)], [0.0], [2.0], [1], [0], 1, 1, aggregation="token_mean")
    assert terms.loss.item() == pytest.approx(-1.1 * 2.0)
    assert (terms.clipped_low, terms.clipped_high) == (0, 0)


@pytest.mark.parametrize(
    ("ratio", "adv", "expected", "low", "high"),
    [
        (1.5, 1.0, -1.2, 0, 1),  # positive advantage: capped at 1 + clip_high
        (0.5, 1.0, -0.5, 0, 0),  # below the range with A > 0: the unclipped (smaller) objective
        (0.5, -1.0, 0.8, 1, 0),  # negative advantage: floored at 1 - clip_low
        (1.5, -1.0, 1.5, 0, 0),
    ],
)
def test_ppo_clip_with_separate_low_and_high_ranges(ratio, adv, expected, low, high):
    terms = _loss(
        [math.log(ratio)], [0.0], [adv], [1], [0], 1, 1, clip_low=0.2, clip_high=0.2, aggregation="token_mean"
    )
    assert terms.loss.item() == pytest.approx(expected)
    assert (terms.clipped_low, terms.clipped_high) == (low, high)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    plain = _loss([math.log(10.0)], [0.0], [-1.0], [1], [0], 1, 1, aggregation="token_mean")
    dual = _loss([math.log(10.0)], [0.0], [-1.0], [1], [0], 1, 1, aggregation="token_mean", dual_clip=3.0)
    assert plain.loss.item() == pytest.approx(10.0)
    assert dual.loss.item() == pytest.approx(3.0)


def test_seq_mean_token_mean_weighs_samples_equally_and_token_mean_weighs_tokens():
    # sample 0 has one token with loss -1 (A=1), sample 1 three tokens with loss -3 (A=3); ratio 1
    logps = [0.0, 0.0, 0.0, 0.0]
    adv = [1.0, 3.0, 3.0, 3.0]
    index = [0, 1, 1, 1]
    seq = _loss(logps, logps, adv, [1, 1, 1, 1], index, 2, 2, aggregation="seq_mean_token_mean")
    tok = _loss(logps, logps, adv, [1, 1, 1, 1], index, 2, 4, aggregation="token_mean")
    assert seq.loss.item() == pytest.approx((-1 - 3) / 2)
    assert tok.loss.item() == pytest.approx((-1 - 9) / 4)


def test_masked_tokens_do_not_count():
    terms = _loss([0.0, 5.0], [0.0, 0.0], [1.0, 1.0], [1, 0], [0, 0], 1, 1, aggregation="seq_mean_token_mean")
    assert terms.loss.item() == pytest.approx(-1.0) and terms.tokens == 1


def test_ulorl_masks_mastered_positive_tokens_only():
    old = [math.log(0.995), math.log(0.995), math.log(0.5)]
    terms = _loss(
        old, old, [1.0, -1.0, 1.0], [1, 1, 1], [0, 0, 0], 1, 3, aggregation="token_mean", mastered_prob=0.99
    )
    assert terms.masked_mastered == 1 and terms.tokens == 2
    assert terms.loss.item() == pytest.approx((1.0 - 1.0) / 3)


def test_engine_mismatch_weights_are_truncated_and_detached():
    logps = torch.tensor([0.0], requires_grad=True)
    old = torch.tensor([0.0])
    engine = torch.tensor([math.log(0.1)])  # the engine gave 0.1, the trainer 1.0: weight 10, capped at 2
    cfg = LossConfig(aggregation="token_mean", engine_ratio_cap=2.0)
    terms = policy_loss(
        logps,
        old,
        torch.tensor([1.0]),
        torch.tensor([1.0]),
        torch.tensor([0]),
        1,
        1,
        cfg,
        engine_logps=engine,
    )
    assert terms.loss.item() == pytest.approx(-2.0)
    terms.loss.backward()
    assert logps.grad.item() == pytest.approx(-2.0)  # d/dlogp of -w * exp(logp - old) * A


def test_kl_is_the_k3_estimate_and_zero_at_the_reference():
    same = _loss([-1.0], [-1.0], [0.0], [1], [0], 1, 1, aggregation="token_mean", kl_coef=0.5)
    cfg = LossConfig(aggregation="token_mean", kl_coef=0.5)
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    apart = policy_loss(
        t([-1.0]), t([-1.0]), t([0.0]), t([1.0]), torch.tensor([0]), 1, 1, cfg, ref_logps=t([-2.0])
    )
    delta = -2.0 - -1.0
    assert same.loss.item() == pytest.approx(0.0)
    assert apart.kl_sum == pytest.approx(math.exp(delta) - delta - 1)
    assert apart.loss.item() == pytest.approx(0.5 * (math.exp(delta) - delta - 1))

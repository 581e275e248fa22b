"""The policy loss: PPO-clip over the trained tokens of packed samples, with the knobs the papers use.

Inputs are flat per-token tensors over the completion tokens of one micro-batch (see
``workbench.rl.packing``): log-probs under the current policy (with grad), the old policy's
log-probs, each token's advantage, its loss mask and the sample it belongs to.

- ratio r = exp(logp - old); PPO-clip with separate ``clip_low`` / ``clip_high`` (DAPO's clip-higher);
  ``dual_clip`` c caps the loss of negative-advantage tokens at ``-c * A`` (dual-clip PPO).
- aggregation: ``token_mean`` (every trained token of the mini-batch weighs the same; TRL's dapo/bnpo)
  or ``seq_mean_token_mean`` (mean over each sample's tokens, then over samples; TRL's grpo, MARS).
  The caller passes the mini-batch's denominator, so micro-batches sum to the exact mini-batch mean.
- ``kl_coef``: k3 estimate of KL(pi || ref) per token, added to the per-token loss (as TRL does).
- ``entropy_coef``: an entropy bonus (coef x entropy subtracted from each trained token's loss).
- ``engine_ratio_cap``: truncated importance sampling for the mismatch between the engine that sampled
  (vLLM) and the trainer: tokens are weighted by min(exp(old - engine), cap), detached.
- ``old_from_engine``: the ratio's old policy is the engine's log-probs (the behaviour policy that sampled,
  for samples from older policies: async, pipeline, segment rollout), not the trainer's recomputation.
- ``mastered_prob``: UloRL's dynamic masking: positive-advantage tokens the old policy already gives
  probability above this are left out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.rl.config_sections import LossConfig  # the config's loss section, as the loss reads it

__all__ = ["LossConfig", "LossTerms", "policy_loss"]


@dataclass
class LossTerms:
    """One micro-batch's loss and the sums the step's metrics are made of.

    ``stats`` holds the sums as one detached tensor on the loss's device, in ``STATS`` order, so a trainer
    adds them up over its micro-batches without waiting for the device; the named properties read them
    (each read is a host synchronisation on a GPU).
    """

    loss: torch.Tensor  # this micro-batch's share of the mini-batch loss (sums to the mini-batch loss)
    stats: torch.Tensor  # [len(STATS)] float64, detached

    STATS = ("tokens", "clipped_low", "clipped_high", "kl_sum", "entropy_sum", "masked_mastered", "ratio_sum")

    def _stat(self, name: str) -> float:
        return float(self.stats[self.STATS.index(name)])

    @property
    def tokens(self) -> int:
        return int(self._stat("tokens"))

    @property
    def clipped_low(self) -> int:
        return int(self._stat("clipped_low"))

    @property
    def clipped_high(self) -> int:
        return int(self._stat("clipped_high"))

    @property
    def kl_sum(self) -> float:
        return self._stat("kl_sum")

    @property
    def entropy_sum(self) -> float:
        return self._stat("entropy_sum")

    @property
    def masked_mastered(self) -> int:
        return int(self._stat("masked_mastered"))

    @property
    def ratio_sum(self) -> float:
        return self._stat("ratio_sum")


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    sample_index: torch.Tensor,
    n_samples: int,
    denominator: float,
    config: LossConfig,
    ref_logps: torch.Tensor | None = None,
    engine_logps: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossTerms:
    """Loss of one micro-batch; ``denominator`` is the mini-batch's trained-token count (token_mean) or
    sample count (seq_mean_token_mean). All tensors are flat [N] over completion tokens."""
    mask = mask.to(logps.dtype)
    if config.mastered_prob is not None:
        mastered = (advantages > 0) & (old_logps.exp() > config.mastered_prob) & (mask > 0)
        mask = mask * (~mastered).to(mask.dtype)
        n_mastered = mastered.sum()
    else:
        n_mastered = torch.zeros((), device=logps.device)
    log_ratio = logps - old_logps
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if config.dual_clip is not None:
        capped = torch.min(per_token, -config.dual_clip * advantages)
        per_token = torch.where(advantages < 0, capped, per_token)
    if config.engine_ratio_cap is not None and engine_logps is not None:
        weight = torch.exp(old_logps - engine_logps).clamp(max=config.engine_ratio_cap).detach()
        per_token = per_token * weight
    kl = None
    if config.kl_coef and ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + config.kl_coef * kl
    if config.entropy_coef and entropy is not None:
        per_token = per_token - config.entropy_coef * entropy
    if config.aggregation == "token_mean":
        loss = (per_token * mask).sum() / max(denominator, 1.0)
    else:
        sums = torch.zeros(n_samples, dtype=per_token.dtype, device=per_token.device)
        counts = torch.zeros(n_samples, dtype=per_token.dtype, device=per_token.device)
        sums = sums.index_add(0, sample_index, per_token * mask)
        counts = counts.index_add(0, sample_index, mask)
        loss = (sums / counts.clamp(min=1.0)).sum() / max(denominator, 1.0)
    with torch.no_grad():
        trained = mask > 0
        low = (ratio < 1 - config.clip_low) & (advantages < 0) & trained
        high = (ratio > 1 + config.clip_high) & (advantages > 0) & trained
        zero = torch.zeros((), dtype=torch.float64, device=logps.device)
        sums = [
            trained.sum(),
            low.sum(),
            high.sum(),
            (kl * mask).sum() if kl is not None else zero,
            (entropy * mask).sum() if entropy is not None else zero,
            n_mastered,
            (ratio * mask).sum(),
        ]
        return LossTerms(loss=loss, stats=torch.stack([v.to(torch.float64) for v in sums]))

"""bf16 compute weights (``workbench.rl.compute_weights``) train exactly as autocast over fp32 masters does.

The copies hold autocast's casts, made once per optimizer step, and each copy's gradient is accumulated into
its master in fp32; so with several micro-batches per optimizer step, with and without gradient checkpointing,
the loss, every master's gradient and the updated weights equal the autocast path's (to bf16 rounding order,
in practice exactly), and the model outside the forward still holds its fp32 masters.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.grpo_samples import grpo_groups
from tests.perf import shapes
from workbench.rl.compute_weights import ComputeWeights, make_compute_weights
from workbench.rl.samples import Sample
from workbench.rl.trainer import OptimConfig, PolicyTrainer


@pytest.fixture(scope="module")
def tiny():
    return shapes.build("qwen2-mini")  # Qwen2 (biased q/k/v, GQA, tied head), 4 layers of width 128


def _samples(vocab: int, n: int = 8, seed: int = 0) -> list[Sample]:
    """Two GRPO groups sharing their prompts."""
    return grpo_groups(vocab, 2, n // 2, seed, prompt=10, longest=9, prompt_growth=1)


def _train(model, compute_weights: bool, checkpointing: bool):
    config = OptimConfig(
        learning_rate=1e-3,
        token_budget=40,  # several micro-batches per optimizer step
        compute_dtype="bfloat16",
        compute_weights=compute_weights,
        gradient_checkpointing=checkpointing,
    )
    trainer = PolicyTrainer({"p": model}, config)
    grads = {}

    def keep(optimizer, args, kwargs):
        grads.update({i: p.grad.clone() for i, p in enumerate(trainer.parameters) if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(keep)
    samples = _samples(model.config.vocab_size)
    assert len(trainer._plan(samples, list(range(len(samples))))) > 1
    metrics = trainer.step(samples)
    return trainer, metrics, grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compute_weights_train_as_autocast_does(tiny, checkpointing):
    reference, ref_metrics, ref_grads = _train(copy.deepcopy(tiny), False, checkpointing)
    trainer, metrics, grads = _train(copy.deepcopy(tiny), True, checkpointing)
    assert reference.compute_weights is None and len(trainer.compute_weights) > 0
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-5)
    assert grads.keys() == ref_grads.keys()
    for k, g in grads.items():
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, ref_grads[k], rtol=1e-3, atol=1e-6)  # bf16 rounding order at most
    for p, q in zip(trainer.parameters, reference.parameters, strict=True):
        assert p.dtype == torch.float32  # the model outside the forward: its fp32 masters
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert all(c.grad is None for c in trainer.compute_weights.copies.values())


def test_copies_hold_autocasts_cast_after_refresh_and_are_off_where_they_save_nothing(tiny):
    model = copy.deepcopy(tiny)
    weights = ComputeWeights([model])
    linear = model.model.layers[0].self_attn.q_proj
    copy_ = weights.copies[id(linear.weight)]
    assert copy_.dtype == torch.bfloat16 and torch.equal(copy_, linear.weight.to(torch.bfloat16))
    with torch.no_grad():
        linear.weight.add_(1.0)
    weights.refresh()
    assert torch.equal(copy_, linear.weight.to(torch.bfloat16))
    with weights.forward():
        assert linear.weight is copy_
    assert linear.weight.dtype == torch.float32
    assert id(model.get_output_embeddings().weight) not in weights.copies  # the tied head stays fp32
    cpu = torch.device("cpu")
    assert make_compute_weights(None, [model], cpu, torch.bfloat16) is None  # default: CUDA only
    assert make_compute_weights(True, [model], cpu, torch.float32) is None  # fp32: nothing to cast
    assert make_compute_weights(True, [model], cpu, torch.bfloat16) is not None

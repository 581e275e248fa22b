"""Decoder layers compiled by inductor (``workbench.rl.compiled_layers``) train as the eager layers do.

On the CPU's inductor (generated C++ kernels; on a GPU, Triton's), fp32, with and without gradient checkpointing:
one optimizer step over several packed micro-batches (shared prefixes, packed attention running eagerly between
the compiled parts) gives the eager path's loss, gradients and updated weights, and one compiled code serves
every layer and every micro-batch (dynamic shapes: no recompile when the token count changes).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.grpo_samples import grpo_groups
from workbench.models import load
from workbench.rl.compiled_layers import compile_layers, decoder_layers
from workbench.rl.loss import LossConfig
from workbench.rl.trainer import OptimConfig, PolicyTrainer


@pytest.fixture(scope="module")
def tiny():
    model, _ = load("tiny")  # Qwen2: 2 layers of width 64, GQA
    return model


@pytest.fixture(scope="module", autouse=True)
def fresh_dynamo():
    """Dynamo's caches from this module only (checkpointing on and off share the compiled layer)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train(model, compiled: bool, checkpointing: bool):
    config = OptimConfig(
        learning_rate=1e-3,
        token_budget=40,  # several micro-batches of different token counts
        mini_batch_size=4,  # two optimizer steps
        compile_layers=compiled,
        gradient_checkpointing=checkpointing,
        loss=LossConfig(old_from_engine=True),  # the engine's log-probs are old: ratios that are not 1
    )
    trainer = PolicyTrainer({"p": model}, config)
    grads = []

    def keep(optimizer, args, kwargs):
        grads.append({i: p.grad.clone() for i, p in enumerate(trainer.parameters) if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(keep)
    samples = grpo_groups(
        model.config.vocab_size, 2, 4, 0, prompt=10, longest=9, engine_logprob=-6.0, prompt_growth=1
    )
    assert len(trainer._plan(samples, list(range(len(samples))))) > 1
    metrics = trainer.step(samples)
    return trainer, metrics, grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_train_as_eager_layers_do(tiny, checkpointing):
    from torch._dynamo.utils import counters

    reference, ref_metrics, ref_grads = _train(copy.deepcopy(tiny), False, checkpointing)
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, metrics, grads = _train(copy.deepcopy(tiny), True, checkpointing)
    assert not [w for w in caught if "compile_layers" in str(w.message)]  # no fallback to eager
    layer = decoder_layers(trainer.models["p"])[0]
    variants = torch._dynamo.eval_frame._debug_get_cache_entry_list(type(layer).forward.__code__)
    # compiled once for every layer and micro-batch (token count), with and without checkpointing
    assert len(variants) == 1
    assert all("compiler.disable" in k for k in counters["graph_break"])  # around packed attention only
    assert metrics["loss"] != 0 and metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-5, abs=1e-7)
    assert len(grads) == len(ref_grads) == 2
    for step, ref_step in zip(grads, ref_grads, strict=True):
        assert step.keys() == ref_step.keys()
        for k, g in step.items():
            torch.testing.assert_close(g, ref_step[k], rtol=1e-4, atol=1e-6)
    for p, q in zip(trainer.parameters, reference.parameters, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # AdamW: a tiny gradient's sign


def test_generation_stays_eager_and_models_without_layers_are_left_alone(tiny):
    model = copy.deepcopy(tiny).eval()
    assert compile_layers([model, model]) == len(decoder_layers(model)) == 2  # each model once
    prompt = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=3, do_sample=False)  # a KV cache: eager layers
        ref = tiny.generate(prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, ref)
    assert decoder_layers(model)[0]._compiled_call_impl.layer is decoder_layers(model)[0]
    clone = copy.deepcopy(model)  # a copy (a rollout backend's own weights): torch drops the compiled call
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(clone))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compile_layers([torch.nn.Linear(2, 2)]) == 0
        assert compile_layers([model], sharded=True) == 0
    assert len(caught) == 2 and "stays eager" in str(caught[0].message)

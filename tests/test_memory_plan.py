"""The memory plan (issue 48): its terms on paper, and its total against the peak measured on the CPU.

The peak is the most bytes of tensor storage alive at once during an optimizer step of two micro-batches (forward
through the chunked LM head, backward, fused AdamW) of ``qwen2-mini`` (a Qwen2.5 shape scaled down) in fp32 on one
rank, tracked storage by storage under a dispatch mode; the plan is for the same shape and settings. Measured
here: 42.5 MB against the plan's 41.7 without checkpointing, 22.8 MB against 22.0 with it.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.models import shapes
from workbench.rl.logprob_head import chunked_logprobs
from workbench.rl.memory_plan import GIB, plan

TOKENS = 512


def scaled() -> Any:
    """``qwen2-mini`` with a vocabulary of 1,024: parameters, activations and logits each a good share."""
    config = shapes.config("qwen2-mini")
    config.vocab_size = 1024
    return config


class LiveBytes(TorchDispatchMode):
    """Bytes of the distinct storages alive, and their peak: each op's outputs counted when made, let go when
    their storage is freed (a weak reference); ``tensors`` alive before the mode are counted from the start."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.live: dict[int, tuple[int, Any]] = {}
        self.now = self.peak = 0
        for tensor in tensors:
            self._add(tensor)

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.live and storage.nbytes():
            self.live[key] = (storage.nbytes(), weakref.ref(storage, lambda _, key=key: self._drop(key)))
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)

    def _drop(self, key: int) -> None:
        self.now -= self.live.pop(key)[0]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._add(tensor)
        return out


def measured_peak(checkpointing: bool) -> int:
    """Peak live bytes of an AdamW step of two micro-batches of ``TOKENS`` tokens, after a first step (so
    AdamW's state is there, as in every step but the first)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(scaled(), attn_implementation="sdpa").train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 1, TOKENS))

    def step() -> None:
        for micro in ids:
            hidden = model.model(input_ids=micro, use_cache=False).last_hidden_state[0]
            logp, entropy = chunked_logprobs(hidden, model.lm_head.weight, micro[0], recompute=True)
            (-(logp.mean() + 0.01 * entropy.mean())).backward()
            del hidden, logp, entropy
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    with LiveBytes([*model.parameters(), *state]) as tracker:
        step()
    return tracker.peak


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_plan_agrees_with_the_peak_measured_on_the_cpu_within_15_percent(checkpointing):
    planned = plan(
        scaled(), gpus=1, mixed_precision=False, token_budget=TOKENS, gradient_checkpointing=checkpointing
    )
    peak = measured_peak(checkpointing)
    assert planned.terms["unsharded_layers"] == 0  # one rank in fp32: the weights are used as they are
    assert abs(planned.total - peak) <= 0.15 * peak, (planned.terms, planned.total, peak)


def test_shards_divide_over_the_ranks_and_lora_trains_only_its_adapters():
    one, eight = plan("qwen2.5-7b", gpus=1), plan("qwen2.5-7b", gpus=8)
    assert one.terms["adamw_state"] == 8 * one.measured.parameters and not one.fits  # the issue's ~112 GB
    assert eight.terms["adamw_state"] == one.terms["adamw_state"] // 8 and eight.fits
    assert eight.terms["activations"] == one.terms["activations"]  # a rank's micro-batch is its own
    lora = plan("qwen2.5-7b", policies="lora", roles=2)
    assert lora.terms["gradients"] == 4 * 2 * lora.measured.adapter_parameters and lora.fits
    assert lora.terms["parameters"] < one.terms["parameters"] // 1.9  # the frozen base in bf16
    with_ref = plan("qwen2.5-7b", policies="lora", roles=2, reference=True)
    assert with_ref.total - lora.total == 2 * lora.measured.parameters
    assert (
        plan("qwen2.5-7b", gradient_checkpointing=False).terms["activations"] > 4 * one.terms["activations"]
    )
    assert one.total / GIB > 100 and "does not fit in 72.0 GiB" in one.summary()


def test_the_command_prints_a_table_and_fails_when_a_plan_does_not_fit(capsys):
    from workbench.cli import main

    assert main(["memory-plan", "qwen2.5-0.5b", "--gpus", "1", "2"]) == 0
    assert "total_gib" in capsys.readouterr().out
    assert main(["memory-plan", "qwen2.5-7b", "--markdown"]) == 0
    assert "| qwen2.5-7b | shared | 1 |" in capsys.readouterr().out
    assert main(["memory-plan", "qwen2.5-7b"]) == 1

"""A real ``trl.GRPOTrainer`` fed a fixed batch: the reference for the parity test and the trainer benchmark.

TRL generates its own completions; here its ``_prepare_inputs`` hands it our batch instead, and everything
after that (loss, backward, clipping, AdamW step) is TRL's own ``train()``.

Gradient checkpointing is set explicitly (``gradient_checkpointing``, off unless asked): TRL 1.16's
``GRPOConfig`` turns it on by default, which would make TRL recompute every layer's forward while the
workbench, by default, does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.rl.samples import Sample


def trl_inputs(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """``samples`` as TRL's GRPO inputs: left-padded prompts, right-padded completions, their masks."""
    p_len = max(len(s.prompt_ids) for s in samples)
    c_len = max(len(s.completion_ids) for s in samples)
    prompt_ids = torch.zeros(len(samples), p_len, dtype=torch.long)
    prompt_mask = torch.zeros(len(samples), p_len, dtype=torch.long)
    completion_ids = torch.zeros(len(samples), c_len, dtype=torch.long)
    completion_mask = torch.zeros(len(samples), c_len, dtype=torch.long)
    for i, s in enumerate(samples):
        prompt_ids[i, p_len - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)  # left padding, as TRL does
        prompt_mask[i, p_len - len(s.prompt_ids) :] = 1
        completion_ids[i, : len(s.completion_ids)] = torch.tensor(s.completion_ids)
        completion_mask[i, : len(s.completion_ids)] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([s.advantage for s in samples]),
        "num_items_in_batch": completion_mask.sum(),
    }


def trl_trainer(
    model,
    samples: list[Sample],
    loss_type: str,
    out_dir,
    lr: float,
    adam_eps: float,
    steps: int = 1,
    callbacks=(),
    bf16: bool = False,
    gradient_checkpointing: bool = False,
) -> Any:
    """A real ``trl.GRPOTrainer`` whose every step trains on ``samples`` (no generation); ``bf16``: TRL's mixed
    precision (accelerate's autocast over fp32 weights); ``gradient_checkpointing``: TRL's (its config's
    default is on; here it is off unless asked)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    inputs = trl_inputs(samples)

    class FixedBatch(GRPOTrainer):
        def _prepare_inputs(self, generation_batch):  # on the model's device, as TRL's own inputs are
            return {k: v.to(self.accelerator.device) for k, v in inputs.items()}

    args = GRPOConfig(
        output_dir=str(out_dir),
        loss_type=loss_type,
        beta=0.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=adam_eps,
        max_grad_norm=1.0,
        per_device_train_batch_size=len(samples),
        num_generations=len(samples),
        gradient_accumulation_steps=1,
        max_steps=steps,
        max_completion_length=max(len(s.completion_ids) for s in samples),
        temperature=1.0,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=next(model.parameters()).device.type == "cpu",
        bf16=bf16,
        gradient_checkpointing=gradient_checkpointing,
        seed=0,
    )
    processing_class = None
    if not getattr(model.config, "_name_or_path", ""):  # a model made from a config (a perf shape): no files
        from workbench.models.tiny import build_tokenizer

        processing_class = build_tokenizer()
    trainer = FixedBatch(
        model=model,
        processing_class=processing_class,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["unused"] * len(samples) * steps}),
        callbacks=list(callbacks),
    )
    return trainer


@dataclass
class Update:
    """What one update did: the logged loss, the pre-clip gradient norm, the (clipped) gradients the optimizer
    stepped with, and the parameters after the step, by parameter name."""

    loss: float
    grad_norm: float
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]


def named_grads(model) -> dict[str, torch.Tensor]:
    """Each parameter's gradient (fp32 copies), by name."""
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def named_params(model) -> dict[str, torch.Tensor]:
    """Each parameter (fp32 copies), by name."""
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def trl_update(
    model,
    samples: list[Sample],
    loss_type: str,
    out_dir,
    lr: float,
    adam_eps: float,
    bf16: bool = False,
    gradient_checkpointing: bool = False,
) -> Update:
    """One TRL update of ``model`` on ``samples`` (TRL's gradient checkpointing off unless asked)."""
    from transformers import TrainerCallback

    grads: dict[str, torch.Tensor] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # after clipping
            grads.update(named_grads(model))

    trainer = trl_trainer(
        model,
        samples,
        loss_type,
        out_dir,
        lr,
        adam_eps,
        callbacks=[Capture()],
        bf16=bf16,
        gradient_checkpointing=gradient_checkpointing,
    )
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "loss" in e)
    return Update(float(logged["loss"]), float(logged["grad_norm"]), grads, named_params(model))

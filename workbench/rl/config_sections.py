"""The sections of the training configuration, and the trainer's configs made of them.

Each section is a plain dataclass whose fields carry their help text (``metadata["help"]``, TRL's config
style); a field whose flat name (the key of a flat config file, of ``--set``, and of ``TrainConfig``'s
attributes) differs from its name in the section gives it in ``metadata["flat"]``. ``OptimConfig`` and
``LossConfig`` are what ``PolicyTrainer`` and the policy loss read: the optimizer and loss sections, with
what ``TrainConfig.optim()`` fills in from the rest of the config (precision, sampling temperature, seed,
the ratio of stale samples). Plain data: this module imports no model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _f(default: Any, help: str, flat: str | None = None) -> Any:  # noqa: A002 - "help" is the natural name
    metadata = {"help": help, **({"flat": flat} if flat else {})}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RolloutSection:
    """rollout: how many steps, of how many tasks and samples, sampled how."""

    steps: int = _f(10, "Training steps (each: roll out, score, update, sync weights).")
    batch_size: int = _f(8, "Tasks per step.")
    group_size: int = _f(4, "Samples per task (GRPO's G); grouped topologies also use it per selected input.")
    max_tokens: int | None = _f(64, "Cap on tokens per call (below each role's own limit); None: the role's.")
    temperature: float = _f(1.0, "Sampling temperature of every role during training rollouts.")
    judge_model: str | None = _f(
        None,
        "Model that scores rewards whose rule names an LLM judge (reward.judge in the spec); loaded as a frozen "
        "copy. None: no judge (a topology that needs one fails to start).",
    )
    judge_backend: str = _f(
        "hf", "Backend of the judge: hf, vllm, or the base URL of an OpenAI-compatible server."
    )
    train_roles: list | None = _f(
        None, "Roles whose samples enter the loss (MarsRL-S: [solver]); None: every trainable role."
    )


@dataclass
class OptimSection:
    """optimizer: AdamW, and how a step's samples are split into its updates."""

    learning_rate: float = _f(1e-6, "AdamW learning rate (after the warm-up, constant).")
    warmup_steps: int = _f(
        0,
        "Optimizer steps over which the learning rate rises linearly to learning_rate (step k < warmup_steps "
        "takes (k + 1) / (warmup_steps + 1) of it; AdamW's first step moves every weight by about the rate).",
    )
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    beta1: float = _f(0.9, "AdamW beta1.", flat="adam_beta1")
    beta2: float = _f(0.999, "AdamW beta2.", flat="adam_beta2")
    eps: float = _f(1e-8, "AdamW epsilon.", flat="adam_eps")
    max_grad_norm: float | None = _f(1.0, "Gradient clipping norm; None: no clipping.")
    mini_batch_size: int | None = _f(None, "Samples per optimizer step; None: one step per rollout step.")
    ppo_epochs: int = _f(1, "Passes over the step's samples.")
    token_budget: int = _f(
        4096,
        "Tokens per packed (padding-free) micro-batch: what bounds the update's activation memory (a sample "
        "longer than the budget gets a micro-batch of its own).",
    )


@dataclass
class LossSection:
    """loss: the PPO-clip objective and the group advantages it weighs."""

    clip_low: float = _f(0.2, "PPO clip range below 1 (epsilon low).")
    clip_high: float = _f(0.2, "PPO clip range above 1 (epsilon high; DAPO's clip-higher uses 0.28).")
    dual_clip: float | None = _f(None, "Dual-clip constant c > 1 for negative advantages; None: off.")
    aggregation: str = _f(
        "seq_mean_token_mean", "Loss aggregation: seq_mean_token_mean (GRPO, MARS) or token_mean (DAPO)."
    )
    kl_coef: float = _f(0.0, "Coefficient of the k3 KL to the initial model (needs a reference copy).")
    entropy_coef: float = _f(0.0, "Entropy bonus coefficient.")
    engine_ratio_cap: float | None = _f(
        None, "Truncated importance weight cap for engine-vs-trainer log-prob mismatch; None: off."
    )
    mastered_prob: float | None = _f(
        None, "UloRL dynamic masking: drop positive-advantage tokens with old probability above this."
    )
    advantage_eps: float = _f(
        1e-4,
        "Epsilon added to the group std: TRL's default, so a TRL config's advantages carry over unchanged (with "
        "0/1 rewards the std of a mixed group of G is at least 1/sqrt(G), so eps moves an advantage by under "
        "1e-4 * sqrt(G): 0.04% at G = 16).",
    )
    scale_advantages: bool = _f(True, "Divide by the group std (False: Dr. GRPO's plain centring).")


@dataclass
class SchedulingSection:
    """scheduling: how rollout and training take turns (workbench.rl.scheduling)."""

    scheduler: str = _f(
        "sync",
        "How rollout and training take turns: sync (roll out, then train), async (rollout runs ahead by at most "
        "max_staleness versions), pipeline (MarsRL's agent-level pipeline: new problems' first agents and earlier "
        "problems' next agents in one batch; grouped flows).",
    )
    max_staleness: int = _f(
        1,
        "async: most policy versions between the policy that generated a sample and the one that trains on it; "
        "pipeline: 1 rolls the next step's level out during the update, 0 keeps them apart; pipeline with "
        "segment_len: most steps a call is carried over, one segment a step (no rollout during the update).",
    )
    segment_len: int | None = _f(
        None,
        "Decode at most this many tokens of a request before it queues again (segment rollout); None: off.",
    )
    stale_ratio: str = _f(
        "recompute",
        "Importance ratio of samples from older policies: recompute (old log-probs from the trainer's weights "
        "before the update), behaviour (the engine's log-probs of the policy that sampled them), truncated "
        "(recompute, weighted by min(old/engine, engine_ratio_cap or 2)).",
    )


@dataclass
class ClusterSection:
    """scale_out: rollout workers and trainer ranks on a Ray cluster (workbench.cluster; the ray extra)."""

    cluster: str | None = _f(
        None,
        "Where rollouts run: None (this process), local (a Ray cluster started on this machine), or the address "
        "of a running Ray cluster (ray://host:10001, or auto for the one `ray start` made here); any scheduler.",
    )
    cluster_workers: int = _f(2, "Rollout workers (Ray actors, each with its own copy of the policies).")
    cluster_cpus_per_worker: float = _f(1.0, "CPUs Ray reserves for each rollout worker.")
    cluster_gpus_per_worker: float = _f(0.0, "GPUs Ray reserves for each rollout worker (vllm backend: 1).")
    cluster_max_restarts: int = _f(
        3, "Rollout workers a step may replace (a lost worker's tasks are rolled out again) before it fails."
    )
    cluster_trainers: int = _f(
        0,
        "Trainer ranks as Ray actors (data parallel: each trains on its share of a mini-batch, gradients summed "
        "over the ranks); 0: the update runs in the driver.",
    )
    cluster_cpus_per_trainer: float = _f(1.0, "CPUs Ray reserves for each trainer rank.")
    cluster_gpus_per_trainer: float = _f(
        0.0,
        "GPUs Ray reserves for each trainer rank (1: each rank trains on its GPU and sums gradients over NCCL).",
    )
    cluster_gpu_memory_gib: float | None = _f(
        None,
        "GiB of each trainer rank's GPU, for the memory plan checked before start (None: the cluster's GPU type, or "
        "this machine's GPU with cluster: local; unknown: not checked).",
    )


@dataclass
class EvaluationSection:
    """evaluation: held-out tasks scored greedily during training."""

    eval_tasks: int = _f(0, "Held-out tasks (another seed) scored greedily every eval_every steps; 0: none.")
    eval_every: int = _f(
        0, "Steps between held-out evaluations; 0: only before the first and after the last."
    )
    held_out_by: str | None = _f(
        None,
        "A task metadata key whose values the held-out tasks share with no training task (multihop's `start`: "
        "the entity a question asks about): training tasks with a held-out value are left out. None: no split.",
    )


@dataclass
class LossConfig(LossSection):
    """The loss section as the policy loss reads it."""

    old_from_engine: bool = False  # the old policy's log-probs are the engine's (behaviour policy's)


@dataclass
class OptimConfig(OptimSection):
    """What ``PolicyTrainer`` takes: the optimizer section and what the trainer takes from the others."""

    temperature: float = 1.0  # logits are divided by the sampling temperature, as the engine did
    measure_role_gradients: bool = True
    block_attention: bool = True  # attention per sample inside packed rows (no masked-out blocks computed)
    share_prefixes: bool = True  # with block_attention: a prompt shared by several samples is computed once
    compute_dtype: str = "float32"  # bfloat16: forward/backward under autocast, fp32 weights and AdamW state
    gradient_checkpointing: bool = False  # recompute each layer's activations in the backward pass
    compute_weights: bool | None = _f(
        None,
        "bfloat16 only: the forward reads bf16 copies of the linear layers' fp32 weights, made once per optimizer "
        "step, instead of autocast casting every weight in every micro-batch (gradients still accumulate into "
        "the fp32 master weights; workbench.rl.compute_weights). None: on CUDA only.",
    )
    compile_layers: bool = _f(
        False,
        "Compile each decoder layer with torch.compile (regional, dynamic shapes: one graph for every layer and "
        "token count), fusing the norms, rotary embedding, SwiGLU and casts between the matmuls; packed "
        "attention runs eagerly between the compiled parts (workbench.rl.compiled_layers). Off by default: "
        "counted (tests/perf/bench_launches.py), not yet timed on a GPU.",
    )
    seed: int = 0
    loss: LossConfig = field(default_factory=LossConfig)

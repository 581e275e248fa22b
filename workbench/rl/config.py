"""The training configuration: one flat dataclass with help text on every field, round-tripping to YAML.

``TrainConfig.help()`` prints every field with its default and meaning (TRL's config style); a run
stores its config in the run store, and ``workbench train config.yaml`` reads the same file.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.api_keys import url_hides_secrets
from workbench.models.placement import Placement, device_problem, dtype_problem
from workbench.rl.config_checks import field_problems
from workbench.rl.loss import LossConfig
from workbench.rl.trainer import OptimConfig
from workbench.yaml_dumper import SafeDumper


class _YamlLoader(yaml.SafeLoader):
    """YAML as written by hand: ``1e-5`` is a number (PyYAML's YAML 1.1 reads it as a string)."""


class _YamlDumper(SafeDumper):
    """Writes what ``_YamlLoader`` reads back the same: a string such as '1e-5' is quoted (NEL too)."""


for _yaml in (_YamlLoader, _YamlDumper):
    _yaml.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"
        ),  # a digit before e
        list("-+0123456789."),
    )


def load_yaml(text: str) -> Any:
    """``text`` read as YAML the way a config file means it (``1e-5`` is a float)."""
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader with one more resolver


def _f(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - "help" is the natural name here
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class TrainConfig:
    # ---- what to train
    topology: str = _f("marsrl", "Built-in topology name or path to a YAML/JSON spec.")
    model: str = _f("smollm2-135m", "Model name from the local registry, a local path or a HF checkpoint.")
    backend: str = _f("hf", "Rollout backend: hf (shares the trained model object) or vllm (weights synced).")
    device: str = _f(
        "auto",
        "Where the policies, KL reference, optimizer state, packed batches and the hf backend live: auto (cuda "
        "where a GPU exists, else cpu), cpu, cuda or cuda:N.",
    )
    dtype: str = _f(
        "auto",
        "Compute precision: auto (bfloat16 on a GPU, float32 on a CPU), float32 or bfloat16. bfloat16 runs the "
        "forward and backward under autocast with fp32 master weights and fp32 AdamW state; frozen copies (the KL "
        "reference, a LoRA base) are stored in bfloat16.",
    )
    gradient_checkpointing: bool = _f(
        False,
        "Recompute each layer's activations during the backward pass: activation memory of one layer per micro-batch "
        "instead of all of them (with token_budget, this bounds peak memory), for about one more forward of compute.",
    )
    tasks: str = _f("arithmetic", "Task generator name (workbench tasks) or a JSONL/Parquet file of tasks.")
    task_options: dict = _f({}, "Keyword options of the task generator (e.g. {level: 1, format: plain}).")
    n_tasks: int = _f(256, "Training tasks to generate (ignored for a file).")
    eval_tasks: int = _f(0, "Held-out tasks (another seed) scored greedily every eval_every steps; 0: none.")
    eval_every: int = _f(
        0, "Steps between held-out evaluations; 0: only before the first and after the last."
    )
    policies: str = _f(
        "shared", "How policies map to weights: shared (one model), lora (an adapter per policy), separate."
    )
    policy_per_role: bool = _f(
        False, "Give every trainable role its own policy (with lora: an adapter per role)."
    )
    lora_rank: int = _f(8, "LoRA rank (policies: lora).")
    lora_alpha: int = _f(16, "LoRA alpha (policies: lora).")
    lora_targets: str | list = _f("all-linear", "LoRA target modules (policies: lora).")
    plugins: list = _f(
        [],
        "Modules imported first in every process of the run (background, resume, CLI, Ray workers): importing them "
        "registers their tool kinds, verifiers, parsers. What a notebook registers travels by value without this.",
    )
    # ---- rollout
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
    # ---- scheduling (workbench.rl.scheduling)
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
    # ---- scale-out (workbench.cluster; needs the ray extra)
    cluster: str | None = _f(
        None,
        "Where rollouts run: None (this process), local (a Ray cluster started on this machine), or the address "
        "of a running Ray cluster (ray://host:10001, or auto for the one `ray start` made here). sync scheduler.",
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
    # ---- optimisation
    learning_rate: float = _f(1e-6, "AdamW learning rate (constant).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_eps: float = _f(1e-8, "AdamW epsilon.")
    max_grad_norm: float | None = _f(1.0, "Gradient clipping norm; None: no clipping.")
    mini_batch_size: int | None = _f(None, "Samples per optimizer step; None: one step per rollout step.")
    ppo_epochs: int = _f(1, "Passes over the step's samples.")
    token_budget: int = _f(
        4096,
        "Tokens per packed (padding-free) micro-batch: what bounds the update's activation memory (a sample "
        "longer than the budget gets a micro-batch of its own).",
    )
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
    # ---- bookkeeping
    seed: int = _f(0, "Seed of task generation, data order and update shuffling.")
    checkpoint_every: int = _f(5, "Steps between checkpoints (model, optimizer, data position).")
    keep_checkpoints: int = _f(2, "Checkpoints kept on disk (older ones are deleted).")
    sync_timeout_s: float = _f(300.0, "Seconds a weight sync may take before the run fails with an error.")
    runs_dir: str = _f("runs", "Directory holding the runs.")
    run_id: str | None = _f(None, "Run id (default: generated from the time and topology).")

    def __post_init__(self) -> None:
        problems = field_problems(self)  # types and ranges, field by field; the checks below need no type
        if self.aggregation not in ("seq_mean_token_mean", "token_mean"):
            problems.append(
                f"aggregation must be seq_mean_token_mean or token_mean, got {self.aggregation!r}"
            )
        if self.policies not in ("shared", "lora", "separate"):
            problems.append(f"policies must be shared, lora or separate, got {self.policies!r}")
        if self.scheduler not in ("sync", "async", "pipeline"):
            problems.append(f"scheduler must be sync, async or pipeline, got {self.scheduler!r}")
        if self.scheduler == "pipeline" and not self.segment_len and self.max_staleness > 1:
            problems.append(
                f"max_staleness of the pipeline is 0 or 1 without segment_len (set segment_len to carry long calls "
                f"over several steps), got {self.max_staleness}"
            )
        if self.stale_ratio not in ("recompute", "behaviour", "truncated"):
            problems.append(
                f"stale_ratio must be recompute, behaviour or truncated, got {self.stale_ratio!r}"
            )
        problems += [p for p in (device_problem(self.device), dtype_problem(self.dtype)) if p]
        if self.backend not in ("hf", "vllm"):
            problems.append(f"backend must be hf or vllm, got {self.backend!r}")
        judge = self.judge_backend
        if isinstance(judge, str) and judge.startswith(("http://", "https://")) and url_hides_secrets(judge):
            problems.append(  # not quoted: it may hold a key, and this config is stored with the run
                "judge_backend carries credentials, a query or a fragment; give scheme://host:port[/path] and "
                "the key in $OPENAI_API_KEY"
            )
        if self.cluster is not None and self.scheduler != "sync":
            problems.append(f"cluster runs use the sync scheduler, got scheduler {self.scheduler!r}")
        if self.cluster_trainers and self.cluster is None:
            problems.append("cluster_trainers needs a cluster (set cluster: local or a Ray address)")
        if isinstance(self.eval_every, int) and self.eval_every > 0 and self.eval_tasks == 0:
            problems.append("eval_every needs held-out tasks to score: set eval_tasks > 0, or eval_every: 0")
        if isinstance(self.run_id, str):
            from workbench.store import StoreError
            from workbench.store.layout import check_run_id

            try:
                check_run_id(self.run_id)  # the run store's own rule, checked before anything is written
            except StoreError as error:
                problems.append(f"run_id: {error}")
        if problems:
            raise ValueError("invalid training config:\n  - " + "\n  - ".join(problems))

    # ---- conversions

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from a mapping of field: value; a ``ValueError`` listing every problem, fields it does not
        have (with the nearest known name) among them."""
        if not isinstance(data, dict):
            raise ValueError(f"a training config is a mapping of field: value, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(key) for key in data if key not in known)
        if not unknown:
            return cls(**data)
        near = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
        hints = "".join(f"; {name!r} may be {close[0]!r}" for name, close in near.items() if close)
        problems = [f"unknown training config field(s) {unknown}{hints}; see TrainConfig.help()"]
        try:  # what is wrong with the known fields too, so that one error lists everything
            cls(**{key: value for key, value in data.items() if key in known})
        except ValueError as error:
            problems += str(error).split("\n  - ")[1:]
        raise ValueError("invalid training config:\n  - " + "\n  - ".join(problems))

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.dump(self.to_dict(), Dumper=_YamlDumper, sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, source: str | Path) -> TrainConfig:
        """A config from a ``.yaml``/``.yml`` file or from YAML text; a file that cannot be read as one is a
        ``ValueError`` naming it (a missing file stays a ``FileNotFoundError``)."""
        is_file = Path(str(source)).suffix in {".yaml", ".yml"}
        where = f"training config {str(source)!r}" if is_file else "training config"
        try:
            text = Path(source).read_text(encoding="utf-8") if is_file else str(source)
            data = load_yaml(text) or {}
        except IsADirectoryError:
            raise ValueError(f"{where} is a directory, not a YAML file") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"{where} is not UTF-8 text: {error}") from None
        except yaml.YAMLError as error:
            raise ValueError(f"{where} is not valid YAML: {error}") from None
        except RecursionError:
            raise ValueError(f"{where} is not valid YAML: nested too deeply") from None
        if not isinstance(data, dict):
            raise ValueError(f"{where} is a mapping of field: value, got {type(data).__name__}")
        return cls.from_dict(data)

    @classmethod
    def help(cls) -> str:
        """Every field, its default and what it does."""
        lines = []
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"{f.name} = {default!r}\n    {f.metadata['help']}")
        return "\n".join(lines)

    def make_judge(self) -> Any:
        """The judge backend ``judge_model`` / ``judge_backend`` name, or None."""
        if not self.judge_model:
            return None
        from workbench.backends import make_backend

        if self.judge_backend.startswith(("http://", "https://")):
            return make_backend("openai", self.judge_model, base_url=self.judge_backend)
        return make_backend(self.judge_backend, self.judge_model)

    def optim(self) -> OptimConfig:
        return OptimConfig(
            learning_rate=self.learning_rate,
            beta1=self.adam_beta1,
            beta2=self.adam_beta2,
            eps=self.adam_eps,
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            mini_batch_size=self.mini_batch_size,
            ppo_epochs=self.ppo_epochs,
            token_budget=self.token_budget,
            compute_dtype=str(Placement.resolve(self.device, self.dtype).dtype).removeprefix("torch."),
            gradient_checkpointing=self.gradient_checkpointing,
            temperature=self.temperature if self.temperature > 0 else 1.0,
            seed=self.seed,
            loss=LossConfig(
                clip_low=self.clip_low,
                clip_high=self.clip_high,
                dual_clip=self.dual_clip,
                aggregation=self.aggregation,  # type: ignore[arg-type]
                kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef,
                engine_ratio_cap=(self.engine_ratio_cap or 2.0)
                if self.stale_ratio == "truncated"
                else self.engine_ratio_cap,
                old_from_engine=self.stale_ratio == "behaviour",
                mastered_prob=self.mastered_prob,
            ),
        )

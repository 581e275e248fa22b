"""The training configuration: a few top-level fields and six sections, round-tripping to YAML.

``TrainConfig`` holds what to train and the run's bookkeeping at the top, and the sections of
``workbench.rl.config_sections`` (rollout, optimizer, loss, scheduling, scale_out, evaluation) beside them;
every field carries its help text, and ``TrainConfig.help()`` prints them by section with their defaults
(TRL's config style). Each field also has a flat name, unique over the sections (today's and older
versions' keys): ``TrainConfig(learning_rate=1e-5)``, ``config.learning_rate``, a flat YAML file and
``--set learning_rate=1e-5`` all reach ``config.optimizer.learning_rate``, as does ``optimizer.learning_rate``
and a nested ``optimizer: {learning_rate: 1e-5}``. ``to_dict()`` is flat (the record a run stores, the
form older versions wrote), ``to_yaml()`` nested by section; ``from_dict``/``from_yaml`` read both.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.api_keys import url_hides_secrets
from workbench.models.placement import Placement, device_problem, dtype_problem
from workbench.rl.config_checks import field_problems
from workbench.rl.config_sections import (
    ClusterSection,
    EvaluationSection,
    LossConfig,
    LossSection,
    OptimConfig,
    OptimSection,
    RolloutSection,
    SchedulingSection,
    _f,
)
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


#: The sections: attribute of ``TrainConfig`` and key of a nested config -> its dataclass.
SECTIONS: dict[str, type] = {
    "rollout": RolloutSection,
    "optimizer": OptimSection,
    "loss": LossSection,
    "scheduling": SchedulingSection,
    "scale_out": ClusterSection,
    "evaluation": EvaluationSection,
}


def _section(name: str, value: Any) -> Any:
    """``value`` (a mapping, an instance, or None for the defaults) as a new ``SECTIONS[name]``."""
    kind = SECTIONS[name]
    if value is None:
        return kind()
    if isinstance(value, kind):
        return kind(**{f.name: getattr(value, f.name) for f in dataclasses.fields(kind)})
    if isinstance(value, Mapping):
        return kind(**value)
    raise ValueError(f"{name} must be a mapping of field: value, got {type(value).__name__}")


@dataclass(init=False)
class TrainConfig:
    """What to train and the run's bookkeeping (top level), and the sections.

    ``TrainConfig(**fields)`` takes top-level fields, sections (mappings or section objects) and section
    fields by flat name or as ``section.name``; section fields are set after the sections, so
    ``dataclasses.replace(config, learning_rate=1e-5)`` changes one field.
    """

    # ---- what to train
    topology: str = _f("marsrl", "Built-in topology name or path to a YAML/JSON spec.")
    model: str = _f("smollm2-135m", "Model name from the local registry, a local path or a HF checkpoint.")
    backend: str = _f("hf", "Rollout backend: hf (shares the trained model object) or vllm (weights synced).")
    vllm_options: dict = _f(
        {},
        "Options of the vllm backend's engine (backend: vllm), e.g. {gpu_memory_utilization: 0.3, "
        "enable_sleep_mode: true}: with sleep mode the engine releases its GPU memory (weights to host memory, KV "
        "cache dropped) during each update and takes it back before the weight sync, so trainer and engine share "
        "one GPU (a GPU only; sync scheduler).",
    )
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
    tasks: str = _f(
        "arithmetic",
        "Task generator name (workbench tasks) or a JSONL/Parquet file of tasks (tasks.jsonl: the tasks given to "
        "wb.train, kept in the run's directory).",
    )
    task_options: dict = _f({}, "Keyword options of the task generator (e.g. {level: 1, format: plain}).")
    n_tasks: int = _f(256, "Training tasks to generate (ignored for a file).")
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
    # ---- bookkeeping
    seed: int = _f(0, "Seed of task generation, data order and update shuffling.")
    checkpoint_every: int = _f(5, "Steps between checkpoints (model, optimizer, data position).")
    keep_checkpoints: int = _f(2, "Checkpoints kept on disk (older ones are deleted).")
    sync_timeout_s: float = _f(300.0, "Seconds a weight sync may take before the run fails with an error.")
    runs_dir: str = _f("runs", "Directory holding the runs.")
    run_id: str | None = _f(None, "Run id (default: generated from the time and topology).")
    # ---- the sections
    rollout: RolloutSection = field(default_factory=RolloutSection)
    optimizer: OptimSection = field(default_factory=OptimSection)
    loss: LossSection = field(default_factory=LossSection)
    scheduling: SchedulingSection = field(default_factory=SchedulingSection)
    scale_out: ClusterSection = field(default_factory=ClusterSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)

    def __init__(self, **values: Any) -> None:
        for spec in dataclasses.fields(self):
            default = spec.default_factory if spec.default_factory is not dataclasses.MISSING else None
            setattr(self, spec.name, default() if default else spec.default)
        problems, flat = [], {}
        for key, value in values.items():
            if key in SECTIONS:
                try:
                    setattr(self, key, _section(key, value))
                except ValueError as error:
                    problems.append(str(error))
            elif key in _TOP:
                setattr(self, key, value)
            elif key in _PATHS:
                flat[key] = value
            else:
                raise TypeError(f"TrainConfig() got an unexpected keyword argument {key!r}")
        for key, value in flat.items():
            section, name = _PATHS[key]
            setattr(getattr(self, section), name, value)
        self._check(problems)

    def __copy__(self) -> TrainConfig:
        return dataclasses.replace(self)  # sections copied too: a copy's fields are its own

    def _check(self, problems: list[str]) -> None:
        problems += field_problems(self)  # types and ranges, field by field; the checks below need no type
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
        if not isinstance(self.vllm_options, dict):
            problems.append(f"vllm_options must be a mapping of engine options, got {self.vllm_options!r}")
        elif self.vllm_options.get("enable_sleep_mode") and self.scheduler != "sync":
            problems.append(
                f"vllm_options.enable_sleep_mode needs the sync scheduler (scheduler {self.scheduler!r} rolls out "
                "while the update runs, when the engine would be asleep)"
            )
        judge = self.judge_backend
        if isinstance(judge, str) and judge.startswith(("http://", "https://")) and url_hides_secrets(judge):
            problems.append(  # not quoted: it may hold a key, and this config is stored with the run
                "judge_backend carries credentials, a query or a fragment; give scheme://host:port[/path] and "
                "the key in $OPENAI_API_KEY"
            )
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

    def to_dict(self, nested: bool = False) -> dict[str, Any]:
        """Every field by its flat name (the record a run stores); ``nested``: the sections as mappings."""
        if nested:
            return dataclasses.asdict(self)
        return {name: copy.deepcopy(getattr(self, name)) for name in FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from a mapping of field: value, flat, nested by section or both; a ``ValueError`` listing
        every problem, fields it does not have (with the nearest known name) among them."""
        if not isinstance(data, dict):
            raise ValueError(f"a training config is a mapping of field: value, got {type(data).__name__}")
        unknown, known = [], {}
        for key, value in data.items():
            if key in SECTIONS and isinstance(value, Mapping):
                names = {f.name for f in dataclasses.fields(SECTIONS[key])}
                unknown += [f"{key}.{name}" for name in value if name not in names]
                known[key] = {name: v for name, v in value.items() if name in names}
            elif key in _TOP or key in _PATHS or key in SECTIONS:
                known[key] = value
            else:
                unknown.append(str(key))
        if not unknown:
            return cls(**data)
        names = [*FIELDS, *SECTIONS, *(p for p in _PATHS if "." in p)]
        near = {name: difflib.get_close_matches(name, names, n=1) for name in sorted(unknown)}
        hints = "".join(f"; {name!r} may be {close[0]!r}" for name, close in near.items() if close)
        problems = [f"unknown training config field(s) {sorted(unknown)}{hints}; see TrainConfig.help()"]
        try:  # what is wrong with the known fields too, so that one error lists everything
            cls(**known)
        except ValueError as error:
            problems += str(error).split("\n  - ")[1:]
        raise ValueError("invalid training config:\n  - " + "\n  - ".join(problems))

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The config as YAML, one block per section (``path``: also written there)."""
        text = yaml.dump(self.to_dict(nested=True), Dumper=_YamlDumper, sort_keys=False)
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
        """Every field by section: its flat name, default and what it does."""
        lines = []
        for section, kind in [(None, cls), *SECTIONS.items()]:
            title = "top level: what to train, and the run's bookkeeping" if section is None else kind.__doc__
            lines.append(f"[{title}]")
            for spec in dataclasses.fields(kind):
                if spec.name in SECTIONS:
                    continue
                default = (
                    spec.default_factory()
                    if spec.default_factory is not dataclasses.MISSING
                    else spec.default
                )
                flat = spec.metadata.get("flat", spec.name)
                nested = f"  ({section}.{spec.name})" if flat != spec.name else ""
                lines.append(f"{flat} = {default!r}{nested}\n    {spec.metadata['help']}")
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
        """What the trainer takes: the optimizer and loss sections, with the precision, sampling temperature,
        seed and stale-sample ratio the rest of the config sets."""
        loss = dataclasses.asdict(self.loss)
        if self.stale_ratio == "truncated":
            loss["engine_ratio_cap"] = self.engine_ratio_cap or 2.0
        return OptimConfig(
            **dataclasses.asdict(self.optimizer),
            compute_dtype=str(Placement.resolve(self.device, self.dtype).dtype).removeprefix("torch."),
            gradient_checkpointing=self.gradient_checkpointing,
            temperature=self.temperature if self.temperature > 0 else 1.0,
            seed=self.seed,
            loss=LossConfig(**loss, old_from_engine=self.stale_ratio == "behaviour"),
        )


#: Top-level fields (not sections) by name.
_TOP = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS]
#: Section fields by flat name and by ``section.name`` -> (section, name in the section).
_PATHS = {
    path: (section, spec.name)
    for section, kind in SECTIONS.items()
    for spec in dataclasses.fields(kind)
    for path in (spec.metadata.get("flat", spec.name), f"{section}.{spec.name}")
}
#: Every field's flat name, top level first, then section by section.
FIELDS = [*_TOP, *(path for path in _PATHS if "." not in path)]
assert len(set(FIELDS)) == len(FIELDS), "a flat name belongs to one field"


def _flat(section: str, name: str, help: str) -> property:  # noqa: A002
    def get(config: TrainConfig) -> Any:
        return getattr(getattr(config, section), name)

    def set_(config: TrainConfig, value: Any) -> None:
        setattr(getattr(config, section), name, value)

    return property(get, set_, doc=help)


for _name in FIELDS[len(_TOP) :]:  # config.learning_rate reads and writes config.optimizer.learning_rate
    _section_name, _field = _PATHS[_name]
    _help = SECTIONS[_section_name].__dataclass_fields__[_field].metadata["help"]
    setattr(TrainConfig, _name, _flat(_section_name, _field, _help))

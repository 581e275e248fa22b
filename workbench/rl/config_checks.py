"""What each training-config field accepts: its type (from the annotation) and its range.

``field_problems(config)`` returns one line per bad field, naming the field, what it must be and what it
got, so a YAML file with a string for ``steps``, a list for ``learning_rate``, NaN or a negative clip range
fails at once with every problem listed, instead of deep inside a run. Checks of values that depend on each
other stay in ``TrainConfig``'s own checks.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "dict": (dict,),
    "list": (list,),
}

#: Integer fields and their least value.
INT_AT_LEAST = {
    **dict.fromkeys(
        (
            "steps",
            "batch_size",
            "group_size",
            "n_tasks",
            "ppo_epochs",
            "token_budget",
            "max_tokens",
            "lora_rank",
            "lora_alpha",
            "mini_batch_size",
            "segment_len",
            "cluster_workers",
            "checkpoint_every",
        ),
        1,
    ),
    **dict.fromkeys(
        (
            "eval_tasks",
            "eval_every",
            "max_staleness",
            "cluster_max_restarts",
            "cluster_trainers",
            "keep_checkpoints",
            "warmup_steps",
        ),
        0,
    ),
}
#: Number fields and the interval they must fall in: (low, high, low included, high included).
IN_RANGE = {
    "temperature": (0.0, math.inf, True, False),
    "learning_rate": (0.0, math.inf, False, False),
    "weight_decay": (0.0, math.inf, True, False),
    "adam_beta1": (0.0, 1.0, True, False),
    "adam_beta2": (0.0, 1.0, True, False),
    "adam_eps": (0.0, math.inf, False, False),
    "max_grad_norm": (0.0, math.inf, False, True),
    "clip_low": (0.0, 1.0, True, False),
    "clip_high": (0.0, math.inf, True, False),
    "dual_clip": (1.0, math.inf, False, False),
    "kl_coef": (0.0, math.inf, True, False),
    "engine_ratio_cap": (0.0, math.inf, False, False),
    "mastered_prob": (0.0, 1.0, False, True),
    "advantage_eps": (0.0, math.inf, True, False),
    "sync_timeout_s": (0.0, math.inf, False, False),
    "cluster_cpus_per_worker": (0.0, math.inf, True, False),
    "cluster_gpus_per_worker": (0.0, math.inf, True, False),
    "cluster_cpus_per_trainer": (0.0, math.inf, True, False),
    "cluster_gpus_per_trainer": (0.0, math.inf, True, False),
}


#: Seeds feed ``torch.manual_seed``, which takes at most 64 bits (and held-out tasks use ``seed + 10_000``).
SEED_LIMIT = 2**63
#: Fields naming something (a file, a model, a generator): an empty string names nothing.
NAMES = ("topology", "model", "tasks", "runs_dir", "cluster")
#: Fields holding a list of names.
NAME_LISTS = ("lora_targets", "train_roles")


def _content_problem(name: str, value: Any) -> str | None:
    """What is wrong inside a value of the right type: an empty name, a list of non-strings."""
    if name in NAMES and isinstance(value, str) and not value.strip():
        return f"{name} must not be empty"
    if name in NAME_LISTS and isinstance(value, list):
        if not value:
            all_of_them = (
                "all-linear for every linear layer" if name == "lora_targets" else "None for every role"
            )
            return f"{name} must not be an empty list (use {all_of_them})"
        wrong = [item for item in value if not isinstance(item, str) or not item.strip()]
        if wrong:
            return f"{name} must be a list of names (strings), got {wrong[0]!r} in it"
    if name == "task_options" and isinstance(value, dict):
        wrong = [key for key in value if not isinstance(key, str) or not key.isidentifier()]
        if wrong:
            return f"task_options keys are keyword arguments of the task generator, got {wrong[0]!r}"
    return None


def _type_problem(name: str, annotation: str, value: Any) -> str | None:
    options = [part.strip() for part in annotation.split("|")]
    if value is None:
        return None if "None" in options else f"{name} must be {annotation}, got None"
    for option in options:
        if option == "None":
            continue  # the value is not None: one of the other options must hold
        kinds = _KINDS.get(option.split("[")[0])
        if kinds is None:
            return None  # an annotation this check does not know: left to the code that reads it
        if isinstance(value, bool) and bool not in kinds:
            continue  # YAML's true/false are not numbers here
        if isinstance(value, kinds) and not (isinstance(value, float) and not math.isfinite(value)):
            return None
    return f"{name} must be {annotation}, got {value!r}"


def _range_problem(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if name in INT_AT_LEAST:
        least = INT_AT_LEAST[name]
        if value < least:
            wanted = "a positive integer" if least == 1 else f"an integer >= {least}"
            return f"{name} must be {wanted}, got {value!r}"
    if name == "seed" and not 0 <= value < SEED_LIMIT:
        return f"seed must be an integer in [0, 2**63), got {value!r}"
    if name in IN_RANGE:
        low, high, low_in, high_in = IN_RANGE[name]
        below = value < low or (value == low and not low_in)
        above = value > high or (value == high and not high_in)
        if below or above:
            interval = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            return f"{name} must be in {interval}, got {value!r}"
    return None


def field_problems(config: Any) -> list[str]:
    """One line per field of the dataclass ``config`` whose value has the wrong type or is out of range,
    named by its flat name (``metadata["flat"]``, else its own); the fields of a section inside it too."""
    problems = []
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if dataclasses.is_dataclass(value):
            problems += field_problems(value)
            continue
        name = spec.metadata.get("flat", spec.name)
        problem = (
            _type_problem(name, str(spec.type), value)
            or _range_problem(name, value)
            or _content_problem(name, value)
        )
        if problem:
            problems.append(problem)
    return problems

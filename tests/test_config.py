"""The sectioned training config: flat and nested input, flat reads and writes, and every config in the
repository (the notebooks', the tests', the docs', runs stored by older versions) loading and round-tripping."""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import json
import pickle
import re
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.rl.config import FIELDS, SECTIONS, TrainConfig, load_yaml
from workbench.rl.trainer import OptimConfig

ROOT = Path(__file__).resolve().parents[1]

#: A train_config.yaml as an older version wrote it: one flat mapping.
OLD_FLAT = """\
topology: marsrl
model: tiny
backend: hf
vllm_options: {}
device: auto
dtype: auto
gradient_checkpointing: false
tasks: arithmetic
task_options: {level: 1, format: plain}
n_tasks: 256
eval_tasks: 8
eval_every: 0
held_out_by: null
policies: shared
policy_per_role: false
lora_rank: 8
lora_alpha: 16
lora_targets: all-linear
plugins: []
steps: 2
batch_size: 2
group_size: 4
max_tokens: null
temperature: 1.0
judge_model: null
judge_backend: hf
train_roles: [solver]
scheduler: async
max_staleness: 1
segment_len: null
stale_ratio: truncated
cluster: null
cluster_workers: 2
cluster_cpus_per_worker: 1.0
cluster_gpus_per_worker: 0.0
cluster_max_restarts: 3
cluster_trainers: 0
cluster_cpus_per_trainer: 1.0
cluster_gpus_per_trainer: 0.0
cluster_gpu_memory_gib: null
learning_rate: 1.0e-05
warmup_steps: 0
weight_decay: 0.0
adam_beta1: 0.9
adam_beta2: 0.999
adam_eps: 1.0e-08
max_grad_norm: 1.0
mini_batch_size: null
ppo_epochs: 1
token_budget: 4096
clip_low: 0.2
clip_high: 0.28
dual_clip: null
aggregation: token_mean
kl_coef: 0.0
entropy_coef: 0.0
engine_ratio_cap: null
mastered_prob: null
advantage_eps: 0.0001
scale_advantages: true
seed: 0
checkpoint_every: 1
keep_checkpoints: 2
sync_timeout_s: 300.0
runs_dir: runs
run_id: null
"""


def _round_trips(config: TrainConfig) -> None:
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict(config.to_dict(nested=True)) == config
    assert TrainConfig.from_yaml(config.to_yaml()) == config


def test_an_old_flat_config_loads_unchanged_and_is_stored_flat_as_before():
    flat = load_yaml(OLD_FLAT)
    config = TrainConfig.from_yaml(OLD_FLAT)
    assert config.to_dict() == flat and set(flat) == set(FIELDS), "the stored record keeps the flat keys"
    assert (config.optimizer.learning_rate, config.optimizer.eps, config.loss.clip_high) == (1e-5, 1e-8, 0.28)
    assert (config.rollout.train_roles, config.evaluation.eval_tasks, config.scheduling.scheduler) == (
        ["solver"],
        8,
        "async",
    )
    _round_trips(config)


def test_the_yaml_file_is_nested_by_section_and_reads_back():
    config = TrainConfig.from_yaml(OLD_FLAT)
    data = load_yaml(config.to_yaml())
    assert list(SECTIONS) == [
        key for key in data if isinstance(data[key], dict) and key not in ("task_options", "vllm_options")
    ]
    assert data["optimizer"]["eps"] == 1e-8 and data["rollout"]["steps"] == 2 and data["seed"] == 0
    assert "learning_rate" not in data


def test_flat_nested_and_dotted_input_make_the_same_config():
    flat = TrainConfig(learning_rate=1e-5, adam_eps=1e-7, steps=3, cluster_workers=4)
    nested = TrainConfig.from_dict(
        {
            "optimizer": {"learning_rate": 1e-5, "eps": 1e-7},
            "rollout": {"steps": 3},
            "scale_out": {"cluster_workers": 4},
        }
    )
    dotted = TrainConfig(
        **{"optimizer.learning_rate": 1e-5, "optimizer.eps": 1e-7, "rollout.steps": 3}, cluster_workers=4
    )
    assert flat == nested == dotted
    # a flat field given beside its section wins over it: a stored config with an override merged in
    merged = TrainConfig.from_dict({**flat.to_dict(nested=True), "learning_rate": 2e-5})
    assert merged.learning_rate == 2e-5 and merged.adam_eps == 1e-7


def test_flat_reads_and_writes_reach_the_sections_and_copies_are_their_own():
    config = TrainConfig(steps=3)
    config.steps = 4  # as tests and callers still write
    assert config.rollout.steps == 4 and config.steps == 4
    config.optimizer.learning_rate = 3e-5
    assert config.learning_rate == 3e-5
    changed = dataclasses.replace(config, learning_rate=1e-4)
    assert (changed.learning_rate, config.learning_rate, changed.steps) == (1e-4, 3e-5, 4)
    for twin in (copy.copy(config), copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert twin == config
        twin.steps = 9
        assert config.steps == 4


def test_a_section_given_whole_is_copied_not_shared():
    config = TrainConfig(steps=3)
    other = TrainConfig(rollout=config.rollout, batch_size=2)
    assert (other.steps, other.batch_size, config.batch_size) == (3, 2, 8)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"optimizer": {"learnin_rate": 1}}, "'optimizer.learnin_rate' may be 'optimizer.learning_rate'"),
        ({"rollout": 5}, "rollout must be a mapping of field: value, got int"),
        ({"optimizer": {"learning_rate": -1.0}}, r"learning_rate must be in \(0, inf\)"),
        ({"loss.clip_low": 2.0}, r"clip_low must be in \[0, 1\)"),
        ({"evaluation": {"eval_every": 2}}, "eval_every needs held-out tasks"),
        (
            {
                "backend": "vllm",
                "vllm_options": {"enable_sleep_mode": True},
                "scheduling": {"scheduler": "pipeline"},
            },
            "enable_sleep_mode needs the sync scheduler",
        ),
        ({"vllm_options": "0.3"}, "vllm_options must be a mapping"),
    ],
)
def test_a_bad_nested_config_is_refused_with_the_field_named(data, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(data)


def test_the_trainer_config_is_the_sections_with_what_the_rest_sets():
    config = TrainConfig(learning_rate=1e-5, adam_beta1=0.8, clip_high=0.28, stale_ratio="truncated", seed=7)
    optim = config.optim()
    assert isinstance(optim, OptimConfig)
    assert (optim.learning_rate, optim.beta1, optim.seed, optim.compute_dtype) == (1e-5, 0.8, 7, "float32")
    assert (optim.loss.clip_high, optim.loss.engine_ratio_cap, optim.loss.old_from_engine) == (
        0.28,
        2.0,
        False,
    )
    assert TrainConfig(stale_ratio="behaviour", temperature=0.0).optim().loss.old_from_engine
    assert TrainConfig(temperature=0.0).optim().temperature == 1.0


def test_the_help_lists_every_field_by_section(capsys):
    listed = TrainConfig.help()
    assert all(
        f"\n{name} = " in listed or listed.startswith(f"{name} = ") for name in FIELDS if name != "topology"
    )
    for section, kind in SECTIONS.items():
        assert f"[{kind.__doc__}]" in listed and kind.__doc__.startswith(f"{section}:")
    assert listed.index("[loss:") < listed.index("clip_high = 0.2") < listed.index("[scheduling:")
    assert "adam_eps = 1e-08  (optimizer.eps)" in listed
    assert main(["train", "--help-config"]) == 0
    assert capsys.readouterr().out.strip() == listed.strip()


def test_set_takes_flat_names_section_names_and_a_section(tmp_path, capsys):
    runs = tmp_path / "runs"
    base = ["train", "--set", f"runs_dir={runs}", "--set", "model=tiny"]
    assert main([*base, "--set", "optimizer.learning_rate=0", "--set", "steps=0"]) == 2
    assert "learning_rate must be in (0, inf), got 0" in capsys.readouterr().err
    assert main([*base, "--set", "optimizer={learning_rate: 0, eps: 1e-7}", "--set", "rollout.steps=0"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate must be in (0, inf), got 0" in err and "steps must be a positive integer" in err
    assert main([*base, "--set", "optimizer.learnin_rate=1"]) == 2
    assert "'optimizer.learnin_rate' may be 'optimizer.learning_rate'" in capsys.readouterr().err


# ---- every config in the repository


def _literal(node: ast.expr, names: dict) -> object:
    """The value of a keyword argument: a literal, or a name the notebook's parameters cell sets."""
    if isinstance(node, ast.Name) and names.get(node.id, "") != "":  # "": filled in when the notebook runs
        return names[node.id]
    return ast.literal_eval(node)


def _calls(source: str, names: dict) -> list[tuple[list[str], dict]]:
    """Per ``TrainConfig(...)`` call in ``source``: its keyword names and those whose values are known."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and getattr(func, "attr", getattr(func, "id", None)) == "TrainConfig":
            keywords, known = [k.arg for k in node.keywords if k.arg], {}
            for keyword in node.keywords:
                if keyword.arg:
                    with contextlib.suppress(
                        ValueError, TypeError, SyntaxError
                    ):  # computed: the default stands in
                        known[keyword.arg] = _literal(keyword.value, names)
            found.append((keywords, known))
    return found


def _notebook_calls(path: Path) -> list[tuple[list[str], dict]]:
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    names: dict = {}
    for cell in cells:  # papermill's parameters: plain assignments
        if "parameters" in cell.get("metadata", {}).get("tags", []) or "# Parameters" in "".join(
            cell["source"]
        ):
            with contextlib.suppress(Exception):  # a parameters cell that needs more than literals
                exec("".join(cell["source"]), {}, names)  # noqa: S102 - the repository's own notebooks
    return [call for cell in cells for call in _calls("".join(cell["source"]), names)]


def _sources() -> dict[str, list[tuple[list[str], dict]]]:
    found = {}
    for path in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("reports/*/*.ipynb")]):
        found[str(path.relative_to(ROOT))] = _notebook_calls(path)
    for path in sorted(
        [*ROOT.glob("tests/**/*.py"), *ROOT.glob("workbench/**/*.py"), *ROOT.glob("widgets/*.py")]
    ):
        found[str(path.relative_to(ROOT))] = _calls(path.read_text(encoding="utf-8"), {})
    for path in sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")]):
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
        calls = [call for block in blocks for call in _calls(block, {})]
        for command in re.findall(r"workbench train[^\n]*(?:\\\n[^\n]*)*", text):
            sets = dict(item.split("=", 1) for item in re.findall(r"--set (\S+=\S+)", command))
            calls.append((list(sets), {key: load_yaml(value) for key, value in sets.items()}))
        found[str(path.relative_to(ROOT))] = calls
    return {where: calls for where, calls in found.items() if calls}


SOURCES = _sources()


def test_the_repository_has_configs_to_load():
    assert {
        "notebooks/training.ipynb",
        "notebooks/own_model_and_data.ipynb",
        "tests/test_training.py",
    } <= set(SOURCES)
    assert "README.md" in SOURCES and "docs/cluster.md" in SOURCES


@pytest.mark.parametrize("where", sorted(SOURCES))
def test_every_training_config_in_the_repository_loads_and_round_trips(where):
    bad_on_purpose = where.startswith("tests/")  # a test may build a bad config to see it refused
    for keywords, known in SOURCES[where]:
        unknown = set(keywords) - {*FIELDS, *SECTIONS}
        if unknown and bad_on_purpose:  # a test of the refusal itself
            with pytest.raises(TypeError, match="unexpected keyword argument"):
                TrainConfig(**dict.fromkeys(unknown))
            continue
        assert not unknown, f"{where}: {sorted(unknown)}"
        try:
            config = TrainConfig(**known)
        except ValueError as error:
            assert bad_on_purpose and "unknown" not in str(error), f"{where}: {known}: {error}"
            continue
        _round_trips(config)


# A train run's config as an earlier version stored it: its train_config.yaml and its store's config.yaml
# (kind: train), both flat, kept in tests/data; runs made here since are checked too where they exist.
STORED = [
    *sorted((ROOT / "tests" / "data" / "stored_configs").glob("*.yaml")),
    *sorted(
        path
        for pattern in ("runs/*/*config.yaml", "notebooks/runs/*/*config.yaml")
        for path in ROOT.glob(pattern)
        if path.name == "train_config.yaml" or "kind: train" in path.read_text(encoding="utf-8")
    ),
]


@pytest.mark.parametrize("path", STORED, ids=[str(p.relative_to(ROOT)) for p in STORED])
def test_a_config_a_run_stored_loads(path):
    data = load_yaml(path.read_text())
    config = TrainConfig.from_dict({k: v for k, v in data.items() if k != "kind"})
    _round_trips(config)


def test_held_out_by_keeps_every_held_out_entity_out_of_training():
    from workbench.rl.loop import load_tasks_for

    fields = dict(tasks="multihop", task_options={"hops": 1, "n_entities": 60, "kb_seed": 0}, n_tasks=100)
    mixed, held = load_tasks_for(TrainConfig(**fields, eval_tasks=20))
    assert {t.metadata["start"] for t in mixed} & {t.metadata["start"] for t in held}  # shared without it
    train, held_out = load_tasks_for(TrainConfig(**fields, eval_tasks=20, held_out_by="start"))
    assert [t.id for t in held_out] == [t.id for t in held] and 0 < len(train) < len(mixed)
    assert not {t.metadata["start"] for t in train} & {t.metadata["start"] for t in held_out}
    assert {t.id for t in train} < {t.id for t in mixed}  # the others, kept in their order
    with pytest.raises(ValueError, match="held_out_by='source': every training task shares its source"):
        load_tasks_for(TrainConfig(**fields, eval_tasks=20, held_out_by="source"))

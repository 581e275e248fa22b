"""Bad inputs to a run: invalid training configs, prompts longer than the context, empty task sets.

Each gives one clear error naming what is wrong and how to fix it, before anything is written, or (a prompt
that does not fit) an error recorded on its episode while the rest of the batch completes: never a
traceback from deep inside the workbench.

- Configs: 40 hand-picked bad fields and combinations, each refused with a ``ValueError`` naming the field;
  300 configs of random fields set to random values of every type, each built or refused with a
  ``ValueError`` naming the field (never a ``TypeError`` or anything else); YAML files that are not YAML,
  not UTF-8 or not files; ``workbench train bad.yaml`` exits with the messages and no traceback.
- A prompt longer than the context of the tiny model (2,048 positions) in a batch of three, through the hf
  backend and vLLM's CPU engine: that episode is an error naming the fix, the other two complete, and a
  completion that would overflow the window is cut to fit; in a two-step training run with such a task
  every step completes.
- Empty task sets: ``wb.rollout``, ``wb.train``, ``run_training`` and an empty JSONL file are refused with
  what to do, before a run is created where the check can be made up front.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.backends.base import GenerationRequest
from workbench.engine import Rollout
from workbench.models import load as load_model
from workbench.rl.config import FIELDS as CONFIG_FIELDS
from workbench.rl.config import SECTIONS, TrainConfig
from workbench.rl.loop import run_training
from workbench.tasks import load_tasks
from workbench.training import create

BAD_FIELDS = [
    ({"steps": "ten"}, "steps must be int, got 'ten'"),
    ({"steps": 2.5}, "steps must be int"),
    ({"steps": True}, "steps must be int"),
    ({"steps": None}, "steps must be int, got None"),
    ({"steps": -1}, "steps must be a positive integer"),
    ({"group_size": 0}, "group_size must be a positive integer"),
    ({"n_tasks": 0}, "n_tasks must be a positive integer"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"max_tokens": "64k"}, "max_tokens must be int | None, got '64k'"),
    ({"mini_batch_size": 0}, "mini_batch_size must be a positive integer"),
    ({"keep_checkpoints": -1}, "keep_checkpoints must be an integer >= 0"),
    ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
    ({"learning_rate": [1e-5]}, "learning_rate must be float"),
    ({"learning_rate": math.nan}, "learning_rate must be float, got nan"),
    ({"learning_rate": 0.0}, r"learning_rate must be in \(0, inf\)"),
    ({"temperature": -1.0}, r"temperature must be in \[0, inf\)"),
    ({"clip_low": -0.1}, r"clip_low must be in \[0, 1\)"),
    ({"clip_low": 1.5}, r"clip_low must be in \[0, 1\)"),
    ({"clip_high": -0.2}, r"clip_high must be in \[0, inf\)"),
    ({"adam_beta2": 1.0}, r"adam_beta2 must be in \[0, 1\)"),
    ({"max_grad_norm": -1.0}, r"max_grad_norm must be in \(0, inf\]"),
    ({"dual_clip": 0.5}, r"dual_clip must be in \(1, inf\)"),
    ({"dual_clip": "off"}, "dual_clip must be float | None, got 'off'"),
    ({"mastered_prob": 2.0}, r"mastered_prob must be in \(0, 1\]"),
    ({"sync_timeout_s": 0}, r"sync_timeout_s must be in \(0, inf\)"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ({"seed": 2**64}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ({"task_options": "level=1"}, "task_options must be dict"),
    ({"task_options": {1: "x"}}, "task_options keys are keyword arguments"),
    ({"judge_backend": 5}, "judge_backend must be str, got 5"),
    ({"cluster": 5}, "cluster must be str | None, got 5"),
    ({"cluster": ""}, "cluster must not be empty"),
    ({"model": " "}, "model must not be empty"),
    ({"train_roles": "solver"}, "train_roles must be list | None, got 'solver'"),
    ({"train_roles": []}, "train_roles must not be an empty list"),
    ({"lora_targets": ["q_proj", 3]}, "lora_targets must be a list of names"),
    ({"run_id": "../elsewhere"}, "run_id: run id '../elsewhere' is not usable as a directory name"),
    ({"policies": "weird"}, "policies must be shared, lora or separate"),
    ({"scheduler": "fast"}, "scheduler must be sync, async or pipeline"),
    ({"cluster_trainers": 2}, "cluster_trainers needs a cluster"),
    ({"eval_every": 5}, "eval_every needs held-out tasks to score: set eval_tasks > 0"),
    ({"bogus": 1}, r"unknown training config field\(s\) \['bogus'\]"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    BAD_FIELDS,
    ids=[next(iter(f)) + "-" + str(i) for i, (f, _) in enumerate(BAD_FIELDS)],
)
def test_an_invalid_config_field_is_refused_with_its_name_and_what_it_must_be(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(fields)
    if "bogus" not in fields:  # the constructor refuses an unknown keyword as Python does (a TypeError)
        with pytest.raises(ValueError, match=message):
            TrainConfig(**fields)


def test_every_problem_of_a_config_is_listed_at_once():
    with pytest.raises(ValueError) as error:
        TrainConfig.from_dict(
            {"steps": "ten", "learning_rate": -1.0, "clip_high": math.inf, "judge_backend": 5}
        )
    lines = str(error.value).splitlines()
    assert lines[0] == "invalid training config:" and len(lines) == 5, lines


def test_the_defaults_and_the_shipped_example_values_are_accepted():
    TrainConfig()
    TrainConfig(temperature=0.0, max_tokens=None, mini_batch_size=None, max_grad_norm=None, dual_clip=3.0)
    TrainConfig(train_roles=["solver"], lora_targets=["q_proj"], eval_tasks=4, eval_every=2, run_id="a-1.b")


def test_an_unknown_field_names_the_nearest_known_one_beside_the_other_problems():
    with pytest.raises(ValueError) as error:
        TrainConfig.from_dict({"learning_rte": 1e-5, "stepz": 3, "zzz": 1, "clip_low": 2.0})
    assert str(error.value).splitlines() == [
        "invalid training config:",
        "  - unknown training config field(s) ['learning_rte', 'stepz', 'zzz']; 'learning_rte' may be "
        "'learning_rate'; 'stepz' may be 'steps'; see TrainConfig.help()",
        "  - clip_low must be in [0, 1), got 2.0",
    ]
    with pytest.raises(TypeError, match="learning_rte"):
        TrainConfig(learning_rte=1e-5)


@pytest.mark.parametrize("data", [5, ["steps"], "steps: 3", None])
def test_a_config_that_is_not_a_mapping_is_refused(data):
    with pytest.raises(ValueError, match="a training config is a mapping of field: value"):
        TrainConfig.from_dict(data)


def test_keys_that_are_not_names_are_reported_not_sorted_into_a_type_error():
    with pytest.raises(ValueError, match=r"unknown training config field\(s\) \['1', 'None'\]"):
        TrainConfig.from_dict({1: 2, None: 3, "steps": 2})


def test_numbers_in_exponent_form_are_numbers_in_a_yaml_config():
    # PyYAML reads YAML 1.1, where 1e-5 is a string: "learning_rate must be float, got '1e-5'" was the result
    config = TrainConfig.from_yaml("learning_rate: 1e-5\nadam_eps: 1E-8\nclip_high: .28\n")
    assert config.learning_rate == 1e-5 and config.adam_eps == 1e-8 and config.clip_high == 0.28
    assert TrainConfig.from_yaml(config.to_yaml()) == config
    # an exponent without a digit before it is a word, not a float that fails to convert
    config = TrainConfig.from_yaml("model: -e5\ntopology: .e1\n")
    assert (config.model, config.topology) == ("-e5", ".e1")
    assert TrainConfig.from_yaml(config.to_yaml()) == config


def test_text_with_a_next_line_character_survives_the_config_file():
    # PyYAML writes U+0085 raw and reads it back as a line break folded into a space
    config = TrainConfig(model="a\x85b", task_options={"name": "c\x85"})
    assert TrainConfig.from_yaml(config.to_yaml()) == config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("steps: [\n", "is not valid YAML"),
        ("!!python/object/apply:os.system [echo hi]", "is not valid YAML: could not determine a constructor"),
        ("[" * 100_000, "is not valid YAML: nested too deeply"),
        ("- steps\n", "is a mapping of field: value, got list"),
    ],
    ids=["unclosed", "python-tag", "deep", "list"],
)
def test_a_config_that_is_not_yaml_is_a_value_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"training config '{path}' {message}")):
        TrainConfig.from_yaml(path)


def test_a_config_file_that_is_not_utf8_or_is_a_directory_is_a_value_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.yaml' is not UTF-8 text"):
        TrainConfig.from_yaml(path)
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ValueError, match="folder.yaml' is a directory"):
        TrainConfig.from_yaml(tmp_path / "folder.yaml")


FIELDS = [*CONFIG_FIELDS, *SECTIONS]  # every flat name, and each section as a whole
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            "sync",
            "lora",
            "vllm",
            "local",
            "1e-5",
            "-e5",
            ".e1",
            "1_0e1",
            "a\x85b",
            "all-linear",
            "../x",
            "http://u:p@h/?k=1",
        ]
    ),
    st.lists(st.integers() | st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5) | st.integers(), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), VALUES, min_size=1, max_size=4))
def test_random_config_values_build_a_config_or_raise_one_value_error_naming_a_field(fields):
    try:
        config = TrainConfig.from_dict(fields)
    except ValueError as error:
        assert any(repr(str(name))[1:-1] in str(error) for name in fields), (fields, str(error))
        return
    except Exception as error:  # noqa: BLE001 - the assertion below is the test
        pytest.fail(f"{type(error).__name__} for {fields!r}: {error}")
    assert TrainConfig.from_yaml(config.to_yaml()) == config  # what was accepted is stored and read back


def test_a_bad_config_file_fails_the_cli_with_the_message_and_no_traceback(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(f"model: tiny\nsteps: ten\nclip_low: -1\nruns_dir: {tmp_path / 'runs'}\n")
    good = tmp_path / "good.yaml"
    good.write_text(f"model: tiny\nlearning_rate: 1e-5\nruns_dir: {tmp_path / 'runs'}\n")
    for args, messages in [
        ([str(config)], ["steps must be int, got 'ten'", "clip_low must be in [0, 1), got -1"]),
        ([str(good), "--set", "max_tokens=64k"], ["max_tokens must be int | None, got '64k'"]),
        ([str(tmp_path / "missing.yaml")], ["No such file or directory"]),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "workbench.cli", "train", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode != 0
        assert all(message in done.stderr for message in messages), done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing was created"


# ---------------------------------------------------------------- a prompt longer than the context


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny")
    return model, tokenizer, model.config.max_position_embeddings


# the vllm case runs in the vLLM phase, on the shared tiny engine (512 tokens of context; tests/conftest.py)
@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.shared_vllm)])
def test_a_prompt_longer_than_the_context_is_an_episode_error_and_the_batch_completes(kind, tiny, request):
    model, tokenizer, context = tiny
    if kind == "hf":
        from workbench.backends.hf import HFBackend

        backend = HFBackend(model, tokenizer)
    else:
        backend = request.getfixturevalue("shared_vllm").get()
        context = backend.max_model_len
    try:
        tasks = wb.generate_tasks("arithmetic", n=3, seed=0, level=1)
        tasks[1] = dataclasses.replace(tasks[1], question="1 + 1 " * context)  # several tokens per repeat
        episodes = asyncio.run(Rollout(wb.load_topology("marsrl"), backend, max_tokens=4).run(tasks))
        assert [e.status for e in episodes] == ["complete", "error", "complete"]
        assert f"context window holds {context}" in episodes[1].error and "shorten" in episodes[1].error
        assert all(e.calls for e in (episodes[0], episodes[2]))

        # a completion that would run past the window is cut to what the window leaves
        prompt = tokenizer("7 " * 4000)["input_ids"][: context - 3]
        request = GenerationRequest(prompt_ids=prompt, max_tokens=50, temperature=1.0, ignore_eos=True)
        (out,) = asyncio.run(backend.generate(request))
        assert len(out.completion_ids) == 3 and out.finish_reason == "length"
    finally:
        if kind == "hf":
            backend.close()


def test_a_training_step_with_a_task_longer_than_the_context_completes(tmp_path, tiny):
    context = tiny[2]
    tasks = wb.generate_tasks("arithmetic", n=4, seed=0, level=1)
    tasks[1] = dataclasses.replace(tasks[1], question="1 + 1 " * context)
    config = TrainConfig(
        model="tiny", steps=2, batch_size=4, group_size=2, max_tokens=4, runs_dir=str(tmp_path / "runs")
    )
    run_dir = create(config)
    assert run_training(config, run_dir, tasks=tasks, log=lambda _: None) == "finished"
    with wb.RunReader(run_dir) as reader:
        assert list(reader.steps()["status"]) == ["complete", "complete"]
        episodes = reader.episodes()
    failed = episodes[episodes.status == "error"]
    assert set(failed.task_id) == {tasks[1].id} and failed.error.str.contains("context window").all()
    assert (episodes[episodes.task_id != tasks[1].id].status == "complete").all()


# ---------------------------------------------------------------- empty task sets


def test_empty_task_sets_are_refused_with_what_to_do(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(ValueError, match="no tasks to roll out"):
        wb.rollout("marsrl", [], model="tiny", runs_dir=runs)
    with pytest.raises(ValueError, match="no training tasks: pass a non-empty list"):
        wb.train("marsrl", tasks=[], config={"model": "tiny", "runs_dir": str(runs)})
    assert not runs.exists() or not any(runs.iterdir()), "a refused run leaves no run directory"
    with pytest.raises(ValueError, match="n_tasks must be a positive integer, got 0"):
        wb.train("marsrl", config={"model": "tiny", "n_tasks": 0, "runs_dir": str(runs)})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no records; add one JSON object per line"):
        load_tasks(empty)
    config = TrainConfig(model="tiny", tasks=str(empty), runs_dir=str(runs))
    with pytest.raises(ValueError, match="holds no records"):
        run_training(config, create(config), log=lambda _: None)
    config = TrainConfig(model="tiny", runs_dir=str(runs))
    with pytest.raises(ValueError, match="no training tasks"):
        run_training(config, create(config), tasks=[], log=lambda _: None)
    assert wb.generate_tasks("arithmetic", n=0, seed=0) == []
    assert asyncio.run(Rollout(wb.load_topology("marsrl"), _NoBackend()).run([])) == []


class _NoBackend:
    """A backend that must not be called: an empty batch generates nothing."""

    name = "none"
    policy_version = 0

    async def generate(self, request):
        raise AssertionError("an empty batch asked for a generation")

"""Bad inputs to a run: invalid training configs, prompts longer than the context, empty task sets.

Each gives one clear error naming what is wrong and how to fix it, before anything is written, or (a prompt
that does not fit) an error recorded on its episode while the rest of the batch completes: never a
traceback from deep inside the workbench.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import subprocess
import sys

import pytest

import workbench as wb
from workbench.backends.hf import HFBackend
from workbench.engine import Rollout
from workbench.models import load as load_model
from workbench.rl.config import TrainConfig
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
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"mini_batch_size": 0}, "mini_batch_size must be a positive integer"),
    ({"keep_checkpoints": -1}, "keep_checkpoints must be an integer >= 0"),
    ({"learning_rate": [1e-5]}, "learning_rate must be float"),
    ({"learning_rate": math.nan}, "learning_rate must be float, got nan"),
    ({"learning_rate": 0.0}, r"learning_rate must be in \(0, inf\)"),
    ({"temperature": -1.0}, r"temperature must be in \[0, inf\)"),
    ({"clip_low": -0.1}, r"clip_low must be in \[0, 1\)"),
    ({"clip_low": 1.5}, r"clip_low must be in \[0, 1\)"),
    ({"adam_beta2": 1.0}, r"adam_beta2 must be in \[0, 1\)"),
    ({"max_grad_norm": -1.0}, r"max_grad_norm must be in \(0, inf\]"),
    ({"dual_clip": 0.5}, r"dual_clip must be in \(1, inf\)"),
    ({"mastered_prob": 2.0}, r"mastered_prob must be in \(0, 1\]"),
    ({"sync_timeout_s": 0}, r"sync_timeout_s must be in \(0, inf\)"),
    ({"task_options": "level=1"}, "task_options must be dict"),
    ({"judge_backend": 5}, "judge_backend must be str, got 5"),
    ({"policies": "weird"}, "policies must be shared, lora or separate"),
    ({"scheduler": "fast"}, "scheduler must be sync, async or pipeline"),
    ({"scheduler": "async", "cluster": "local"}, "cluster runs use the sync scheduler"),
    ({"bogus": 1}, "bogus"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    BAD_FIELDS,
    ids=[next(iter(f)) + "-" + str(i) for i, (f, _) in enumerate(BAD_FIELDS)],
)
def test_an_invalid_config_field_is_refused_with_its_name_and_what_it_must_be(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(fields)


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


def test_a_bad_config_file_fails_the_cli_with_the_message_and_no_traceback(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(f"model: tiny\nsteps: ten\nclip_low: -1\nruns_dir: {tmp_path / 'runs'}\n")
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "steps must be int, got 'ten'" in done.stderr and "clip_low must be in [0, 1)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing was created"


# ---------------------------------------------------------------- a prompt longer than the context


def test_a_prompt_longer_than_the_context_is_an_episode_error_and_the_batch_completes():
    model, tokenizer = load_model("tiny")
    context = model.config.max_position_embeddings
    backend = HFBackend(model, tokenizer)
    tasks = wb.generate_tasks("arithmetic", n=3, seed=0, level=1)
    tasks[1] = dataclasses.replace(tasks[1], question="1 + 1 " * context)  # several tokens per repeat
    episodes = asyncio.run(Rollout(wb.load_topology("marsrl"), backend, max_tokens=4).run(tasks))
    assert [e.status for e in episodes] == ["complete", "error", "complete"]
    assert f"context window holds {context}" in episodes[1].error and "shorten" in episodes[1].error
    assert all(e.calls for e in (episodes[0], episodes[2]))


def test_a_completion_that_would_overflow_the_context_is_cut_to_fit():
    model, tokenizer = load_model("tiny")
    context = model.config.max_position_embeddings
    backend = HFBackend(model, tokenizer)
    from workbench.backends.base import GenerationRequest

    prompt = tokenizer("7 " * 4000)["input_ids"][: context - 3]
    request = GenerationRequest(prompt_ids=prompt, max_tokens=50, temperature=1.0, ignore_eos=True)
    (out,) = asyncio.run(backend.generate(request))
    assert len(out.completion_ids) == 3 and out.finish_reason == "length"


# ---------------------------------------------------------------- empty task sets


def test_empty_task_sets_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="no tasks to roll out"):
        wb.rollout("marsrl", [], model="tiny", runs_dir=tmp_path / "runs")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no records; add one JSON object per line"):
        load_tasks(empty)
    config = TrainConfig(model="tiny", tasks=str(empty), runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="holds no records"):
        run_training(config, create(config), log=lambda _: None)
    config = TrainConfig(model="tiny", runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="no training tasks"):
        run_training(config, create(config), tasks=[], log=lambda _: None)
    assert wb.generate_tasks("arithmetic", n=0, seed=0) == []

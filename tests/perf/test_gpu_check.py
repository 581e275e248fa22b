"""The GPU script rehearsed on the CPU: ``bash tests/perf/gpu_check.sh --device cpu`` runs every step of the GPU
profile (full and LoRA fine-tuning in fp32/bf16/checkpointed, the CPU-vs-device step, TRL side by side, hf decode
through the engine) on small shapes, so the script a GPU slot of a few minutes depends on never rots between
slots. What each step must show is asserted; its timings on 2 shared cores mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.perf.runner import REPO

pytestmark = pytest.mark.perf


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-rehearsal")
    packed = tmp_path_factory.mktemp("device-out")
    done = subprocess.run(
        ["bash", "tests/perf/gpu_check.sh", "--device", "cpu"],
        cwd=REPO,
        env={**os.environ, "GPU_REHEARSAL_OUT": str(out), "OUT": str(packed), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (packed / "gpu-results.tgz").stat().st_size > 0  # what comes back from the device machine
    return {
        name: json.loads((out / f"{name}.json").read_text())
        for name in json.loads((out / "suite.json").read_text())["status"]
    }


def test_every_gpu_step_ran(rehearsal):
    assert sorted(rehearsal) == [
        "data_parallel",
        "engine",
        "precision@full-mid",
        "precision@full-small",
        "precision@lora-big",
        "train_step",
        "trainer",
    ]


def test_precision_steps_report_every_variant_and_the_cpu_device_comparison(rehearsal):
    small = rehearsal["precision@full-small"]
    assert list(small["variants"]) == ["fp32", "bf16", "bf16+ckpt"]
    for figures in small["variants"].values():
        assert "error" not in figures and figures["tokens_per_s"] > 0 and figures["peak_memory_gb"] > 0
    assert set(small["ratios"]) >= {"bf16_vs_fp32_step", "bf16+ckpt_memory_vs_without"}
    same = small["cpu_vs_device_fp32"]
    assert same["grad_norm_rel_diff"] == 0.0  # the CPU against itself: a rehearsal of the code path
    for figures in small["variants"].values():  # one profiled step each: CPU and device time
        profile = figures["profile"]
        assert profile["wall_s"] > 0 and profile["cpu_s"] > 0 and profile["operators"] > 0
    kernels = small["varlen_vs_padded"]  # on a CPU the loop against the padded path: the same up to rounding
    assert kernels["default_path"] == "loop" and kernels["shared_tokens"] > 0
    assert kernels["max_logprob_difference"] < 1e-4 and kernels["grad_norm_rel_diff"] < 1e-4
    lora = rehearsal["precision@lora-big"]
    assert lora["lora"] and all("error" not in v for v in lora["variants"].values())
    full = rehearsal["precision@full-mid"]["variants"]["bf16"]["trainable_parameters"]
    assert lora["variants"]["bf16+ckpt"]["trainable_parameters"] < full  # adapters only (with checkpointing)


def test_two_trainer_ranks_apply_the_update_one_process_would(rehearsal):
    run = rehearsal["data_parallel"]
    group = run["groups"]["2"]  # on a GPU: also one rank over NCCL
    assert group["backend"] == "gloo" and group["ranks_agree"]
    assert group["loss_rel_diff"] < 1e-5 and group["grad_norm_rel_diff"] < 1e-4
    assert group["update_max_rel_diff"] < 1e-2  # AdamW's first step is about lr * sign(gradient)


def test_a_whole_training_step_reports_its_phases_under_both_schedulers(rehearsal):
    step = rehearsal["train_step"]
    assert set(step["schedulers"]) == {"sync", "pipeline"} and "pipeline_vs_sync" in step["ratios"]
    for figures in step["schedulers"].values():
        share = figures["phase_share"]
        assert share["rollout"] > 0 and share["update"] > 0 and figures["samples_per_s"] > 0
        assert sum(share.values()) >= 0.99  # the phases and the rest make the step (phases may overlap)


def test_trl_and_decode_steps(rehearsal):
    trainer = rehearsal["trainer"]
    assert trainer["dtype"] == "bfloat16" and trainer["workbench_step_s"] > 0 and trainer["trl_step_s"] > 0
    assert trainer["ratio"] == pytest.approx(trainer["workbench_step_s"] / trainer["trl_step_s"], rel=0.05)
    assert trainer["padded_tokens_trl"] >= trainer["tokens"], "TRL pads; the workbench packs"
    engine = rehearsal["engine"]["backends"]["hf"]
    assert engine["same_token_counts"] and engine["engine_tokens"] == engine["raw_tokens"] > 0
    assert engine["warmup_s"] > 0 and engine["calls"] >= 2 * engine["episodes"]  # a multi-role topology
    assert engine["profile"]["decode"] == "static" and engine["profile"]["tokens_per_s"] > 0

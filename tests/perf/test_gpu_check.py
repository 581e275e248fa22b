"""The GPU script rehearsed on the CPU: ``bash tests/perf/gpu_check.sh --device cpu`` runs every run of the GPU
profile's plan (full and LoRA fine-tuning in fp32/bf16/checkpointed with MFU counted both ways, the CPU-vs-device
step, TRL side by side with its checkpointing off and on, hf decode unprofiled and profiled, the engine's overhead,
whole training steps, trainer ranks) on small shapes, so the one call a lent GPU's few minutes allow never rots
between loans. What each run must show is asserted; its timings on 2 shared cores mean nothing. The plan itself
(order, budgets, the 9-minute estimate) and the suite's budget enforcement are checked without a GPU too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.perf import suite
from tests.perf.runner import REPO

pytestmark = pytest.mark.perf

SCRIPT = REPO / "tests" / "perf" / "gpu_check.sh"
LENT_S = 9 * 60  # what the GPU check may take on a lent device, start-up included


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-rehearsal")
    packed = tmp_path_factory.mktemp("device-out")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--device", "cpu"],
        cwd=REPO,
        env={**os.environ, "GPU_REHEARSAL_OUT": str(out), "OUT": str(packed), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (packed / "gpu-results.tgz").stat().st_size > 0  # what comes back from the device machine
    assert "estimate:" in (out / "plan.txt").read_text()  # the plan, printed before the runs
    return {
        name: json.loads((out / f"{name}.json").read_text())
        for name in json.loads((out / "suite.json").read_text())["status"]
    }


def test_every_gpu_step_ran_in_the_plans_order(rehearsal):
    assert list(rehearsal) == suite.load_profile("gpu")["plan"]["order"]
    for name, result in rehearsal.items():  # the versions every figure is read with
        versions = result["machine"]["versions"]
        assert versions["torch"] and versions["transformers"] and versions["trl"], name
        assert result.get("complete", True), name


def test_precision_steps_report_mfu_both_ways_and_the_path_taken(rehearsal):
    small = rehearsal["precision@full-small"]
    assert list(small["variants"]) == ["bf16"]
    bf16 = small["variants"]["bf16"]
    assert "error" not in bf16 and bf16["tokens_per_s"] > 0 and bf16["peak_memory_gb"] > 0
    # GRPO groups share their prompts: fewer tokens computed than logical ones, and fewer FLOPs
    assert 0 < bf16["tokens_computed"] < bf16["tokens"]
    assert 0 < bf16["tflops_computed"] < bf16["tflops_logical"]
    assert bf16["mfu_computed"] is None and bf16["mfu_logical"] is None  # no peak known for a CPU
    assert set(bf16["attention_paths"]) == {"loop"} and bf16["attention_paths"]["loop"] > 0
    profile = bf16["profile"]  # one profiled step: CPU and device time
    assert profile["wall_s"] > 0 and profile["cpu_s"] > 0 and profile["operators"] > 0
    assert "attention_kernels" in profile
    kernels = small["varlen_vs_padded"]  # on a CPU the loop against the padded path: the same up to rounding
    assert "error" not in kernels, kernels["error"]  # e.g. both runs on one path: a comparison of nothing
    assert kernels["default_path"] == "loop" and kernels["shared_tokens"] > 0
    # what ran, from the counters: each layer once a run (no checkpointing), the two runs on different paths
    layers = kernels["paths"]["padded"]["padded"]
    assert kernels["paths"] == {"default": {"loop": layers}, "padded": {"padded": layers}} and layers > 0
    assert kernels["max_logprob_difference"] < 1e-4 and kernels["grad_norm_rel_diff"] < 1e-4
    more = rehearsal["precision@full-small-more"]
    assert list(more["variants"]) == ["fp32", "bf16+ckpt"]
    assert all("error" not in v and v["tokens_computed"] < v["tokens"] for v in more["variants"].values())
    assert more["ratios_with"]["variants"] == ["bf16"]  # full-small's bf16, for the ratios
    assert set(more["ratios"]) >= {"bf16_vs_fp32_step", "bf16+ckpt_memory_vs_without"}
    assert more["cpu_vs_device_fp32"]["grad_norm_rel_diff"] == 0.0  # the CPU against itself: the code path
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


def test_trl_runs_with_its_checkpointing_off_and_on(rehearsal):
    trainer = rehearsal["trainer"]
    assert trainer["dtype"] == "bfloat16" and trainer["trl_gradient_checkpointing"] == ["off", "on"]
    ours, off, on = trainer["workbench_step_s"], trainer["trl_step_s"], trainer["trl_ckpt_step_s"]
    assert ours > 0 and off > 0 and on > 0
    assert trainer["ratio"] == pytest.approx(ours / off, rel=0.05)  # the headline: TRL's checkpointing off
    assert trainer["ratio_vs_trl_ckpt"] == pytest.approx(ours / on, rel=0.05)
    assert trainer["padded_tokens_trl"] >= trainer["tokens"] >= trainer["tokens_computed"] > 0
    assert trainer["tflops_computed"] > 0 and trainer["trl_tflops_logical"] > 0
    headline = {h["measure"] for h in suite.headlines("trainer", trainer)}
    assert headline == {"trainer step vs TRL", "trainer step vs TRL (TRL ckpt on)"}


def test_decode_unprofiled_on_varied_requests_and_profiled(rehearsal):
    hf = rehearsal["engine@decode"]["backends"]["hf"]
    assert "overhead_ratio" not in hf  # the engine's overhead is its own run, last in the plan
    decode, profile = hf["decode"], hf["profile"]
    assert decode["decode"] == profile["decode"] == "static"
    assert decode["prompt_lengths"][0] < decode["prompt_lengths"][1] and decode["stop"]
    assert decode["max_tokens"][0] < decode["max_tokens"][1] and decode["tokens_per_s"] > 0
    assert 0 < decode["completion_tokens"] <= sum(decode["max_tokens"]) * decode["rows"]
    assert profile["tokens_per_s"] > 0 and profile["cpu_s"] > 0
    engine = rehearsal["engine@overhead"]["backends"]["hf"]
    assert engine["same_token_counts"] and engine["engine_tokens"] == engine["raw_tokens"] > 0
    assert engine["warmup_s"] > 0 and engine["calls"] >= 2 * engine["episodes"]  # a multi-role topology


# --- the plan and its time limits, without running the GPU's benchmarks ---


def test_the_plan_fits_a_lent_device_and_puts_the_valuable_figures_first():
    profile = suite.load_profile("gpu")
    runs = suite.plan(profile, profile["plan"]["order"], quick=False)  # exits on a wrong name or flag
    figures = suite.plan_estimate(profile, runs)
    assert figures["total_s"] <= LENT_S and figures["bound_s"] <= LENT_S
    assert all(r.budget_s and r.estimate_s and r.estimate_s <= r.budget_s for r in runs)
    within = [r.name for r in runs][:4]  # MFU at 0.5B and 1.5B, the TRL ratio, decode tokens/s
    assert within == ["precision@full-small", "precision@full-mid", "trainer", "engine@decode"]
    assert figures["startup_s"] + sum(r.estimate_s for r in runs[:4]) <= figures["bound_s"]
    header = SCRIPT.read_text()
    timeout = int(re.search(r"run\(command=\"bash tests/perf/gpu_check.sh\".*timeout_s=(\d+)\)", header)[1])
    command = int(re.search(r"GPU_COMMAND_S:-(\d+)", header)[1])
    # the script's own time: the runs' deadline and the wheels and plan before them; the call's limit above it
    assert profile["plan"]["deadline_s"] < command < timeout <= 600
    printed = subprocess.run(
        ["bash", str(SCRIPT), "--plan"],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"estimate: {figures['total_s']:.0f} s" in printed and "if time" in printed


def test_budgets_stop_a_run_keep_what_it_wrote_and_skip_what_cannot_fit(tmp_path, monkeypatch):
    package = tmp_path / "fakebench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "slow.py").write_text(
        textwrap.dedent(
            """
            import json, sys, time
            out = sys.argv[sys.argv.index("--out") + 1]
            with open(out, "w") as f:
                json.dump({"benchmark": "slow", "figure": 1}, f)
            time.sleep(60)  # never ends by itself: stopped by its budget
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("PERF_OUT", raising=False)  # the suite sets it; restored after
    fixture = suite.Benchmark("fakebench.slow", "a fixture", lambda r: [])
    monkeypatch.setitem(suite.BENCHMARKS, "slow", fixture)
    monkeypatch.setitem(suite.BENCHMARKS, "late", fixture)
    profile = tmp_path / "plan.yaml"
    profile.write_text(
        "plan: {deadline_s: 8}\n"
        "benchmarks:\n"
        "  slow: {budget_s: 2, estimate_s: 1}\n"
        "  late: {budget_s: 60, estimate_s: 30}\n"
    )
    result = suite.run_suite(
        ["slow", "late"],
        quick=False,
        profile=profile,
        out_dir=tmp_path / "out",
        budgets=True,
        log=lambda m: None,
    )
    assert result["status"] == {"slow": "partial", "late": "skipped"}
    assert result["benchmarks"]["slow"] == {"benchmark": "slow", "figure": 1}  # what it wrote, kept
    assert result["seconds"]["slow"] < 30 and "timed out after 2 s" in result["runs"]["slow"]["error"]
    assert "out of time" in result["runs"]["late"]["reason"]

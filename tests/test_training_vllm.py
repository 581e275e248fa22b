"""Training with vLLM's CPU build as the rollout engine: weights (or LoRA adapters) reach the engine after
every step, and each call records the policy version that generated it."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training
from workbench.tasks import generate
from workbench.training import create


@pytest.mark.parametrize("layout", ["shared", "lora"])
def test_new_weights_reach_the_vllm_engine_every_step(layout, tmp_path):
    config = TrainConfig(
        model="tiny",
        backend="vllm",
        policies=layout,
        steps=3,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        learning_rate=1e-3,
        runs_dir=str(tmp_path),
        checkpoint_every=10,
        task_options={"level": 1},
    )
    run_dir = create(config)
    assert (
        run_training(config, run_dir, tasks=generate("arithmetic", n=8, seed=0, level=1), log=print)
        == "finished"
    )
    reader = wb.RunReader(run_dir)
    calls = reader.calls(columns=["step", "policy_version"])
    assert calls.groupby("step")["policy_version"].unique().map(list).to_dict() == {0: [0], 1: [1], 2: [2]}
    sync = reader.metrics_wide()["time/weight_sync_s"]
    assert (sync > 0).all(), "every step saved the weights and reloaded them in the engine"

"""Exporting a run's trained model: the newest checkpoint's weights as a transformers checkpoint directory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import workbench as wb
from workbench.cli import main
from workbench.models import load as load_model
from workbench.rl import checkpoint
from workbench.rl.config import TrainConfig
from workbench.rl.export import export_model
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.training import create


def trained_run(tmp_path, policies: str = "shared"):
    """A run whose checkpoint holds weights no model starts from (each trained tensor moved at random)."""
    config = TrainConfig(
        model="tiny",
        topology="marsrl",
        policies=policies,
        policy_per_role=policies == "lora",
        runs_dir=str(tmp_path),
    )
    run_dir = create(config)
    topology = wb.load_topology("marsrl")
    if config.policy_per_role:
        topology = per_role_policies(topology)
    model, tokenizer = load_model("tiny")
    policy_set = PolicySet.from_config(topology, model, tokenizer, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model in policy_set.unique_models().values():
            for name, parameter in model.named_parameters():
                if policies != "lora" or "lora_" in name:
                    parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    optimizer = torch.optim.AdamW([p for m in policy_set.unique_models().values() for p in m.parameters()])
    trainer = SimpleNamespace(models=policy_set.models, optimizer=optimizer)
    checkpoint.save(run_dir, 4, trainer, {"policy_version": 5, "updates": 5})
    return run_dir, policy_set


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_writes_the_checkpoints_weights_as_a_model_every_backend_loads(tmp_path):
    run_dir, policy_set = trained_run(tmp_path / "runs")
    out = export_model(run_dir, tmp_path / "model")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    trained = policy_set.models["base"]
    base, _ = load_model("tiny")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    assert torch.equal(logits(exported, ids), logits(trained, ids))
    assert not torch.allclose(logits(exported, ids), logits(base, ids))  # not the model the run started from
    assert (out / "tokenizer_config.json").exists()
    result = wb.rollout(
        "marsrl",
        wb.generate_tasks("arithmetic", n=1, seed=0),
        model=str(out),
        max_tokens=4,
        runs_dir=tmp_path / "rollouts",
    )
    assert result.episodes[0].calls, "the exported directory serves as a model"


def test_a_lora_policy_is_exported_merged_into_its_base(tmp_path):
    run_dir, policy_set = trained_run(tmp_path / "runs", policies="lora")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    outs = {}
    for policy in ("solver", "verifier1"):
        out = export_model(run_dir, tmp_path / policy, policy=policy)
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        assert not any("lora_" in name for name, _ in exported.named_parameters())
        outs[policy] = logits(exported, ids)
        torch.testing.assert_close(
            outs[policy], logits(policy_set.activate(policy), ids), rtol=1e-4, atol=1e-4
        )
    assert not torch.allclose(outs["solver"], outs["verifier1"])  # each policy its own adapter


def test_export_refuses_a_run_without_a_checkpoint_and_an_unknown_policy(tmp_path):
    run_dir = create(TrainConfig(model="tiny", topology="marsrl", runs_dir=str(tmp_path / "runs")))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        export_model(run_dir, tmp_path / "model")
    run_dir, _ = trained_run(tmp_path / "more")
    with pytest.raises(ValueError, match="no policy 'critic'; its policies are base"):
        export_model(run_dir, tmp_path / "model", policy="critic")


def test_workbench_export_from_the_command_line(tmp_path, capsys):
    run_dir, _ = trained_run(tmp_path / "runs")
    assert main(["export", str(run_dir), str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "model.safetensors").exists()
    assert main(["export", str(run_dir), str(tmp_path / "other"), "--policy", "critic"]) == 2
    assert "no policy 'critic'" in capsys.readouterr().err

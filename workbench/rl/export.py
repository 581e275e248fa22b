"""Take a trained model out of a run: the newest checkpoint's weights as a plain transformers checkpoint.

The directory written loads with ``AutoModelForCausalLM.from_pretrained`` and serves on every backend
(``wb.rollout(..., model=directory)``, vLLM, another run's ``model``). A LoRA policy is merged into a copy
of its base model, so the directory holds full weights either way; the tokenizer is saved beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.rl import checkpoint
from workbench.rl.policies import PolicySet, per_role_policies
from workbench.rl.run_files import TOPOLOGY_FILE, run_config


def export_model(
    run_dir: str | Path, out_dir: str | Path, policy: str | None = None, topology: Any = None
) -> Path:
    """Write the trained weights of ``policy`` (default: the run's only or first policy) to ``out_dir``.

    ``topology`` is needed only for a run trained on a spec passed in memory and not stored with the run
    (its policies are read from it). Raises ``FileNotFoundError`` for a run without a complete checkpoint
    and ``ValueError`` naming the run's policies for an unknown ``policy``.
    """
    from workbench.models import load as load_model
    from workbench.topology import load as load_topology

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    latest = checkpoint.latest(run_dir)
    if latest is None:
        raise FileNotFoundError(f"{run_dir} has no complete checkpoint to export; train it for a step first")
    config = run_config(run_dir)
    if topology is None:
        stored = run_dir / TOPOLOGY_FILE
        topology = load_topology(stored if stored.exists() else config.topology)
    if config.policy_per_role:
        topology = per_role_policies(topology)
    names = list(topology.policies)
    policy = names[0] if policy is None else policy
    if policy not in names:
        raise ValueError(f"run {run_dir.name} has no policy {policy!r}; its policies are {', '.join(names)}")
    model, tokenizer = load_model(config.model)
    policies = PolicySet.from_config(topology, model, tokenizer, config)
    policies.load_state(checkpoint.trained_weights(latest))
    trained = policies.activate(policy)
    if config.policies == "lora":
        trained = trained.merge_and_unload(adapter_names=[policies.adapters[policy]])  # folded into the base
    out_dir.mkdir(parents=True, exist_ok=True)
    trained.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir

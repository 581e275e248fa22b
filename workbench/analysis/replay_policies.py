"""What plays each policy in a replay: a model by name or path, a run's checkpoint at a step, or a backend.

A replay answers "what if another policy had played this role": each policy of the topology is served
by the source run's model unless ``policies`` names something else for it. ``"step:K"`` is the source
run's checkpoint at step K; ``Checkpoint(run_dir, step)`` any training run's. A checkpoint's trained
weights are loaded into its run's base model as ``wb.export_model`` does (a LoRA policy merged in), and
served on transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from workbench.backends import Backend, make_backend


@dataclass(frozen=True)
class Checkpoint:
    """The trained weights of a training run at ``step`` (one of the checkpoints the run kept)."""

    run_dir: str | Path
    step: int
    policy: str | None = None  # the run's policy to take; default: the one of the same name, else its first


PolicySpec = Union[str, Checkpoint, Backend]  # noqa: UP007 - a runtime alias


def describe(spec: PolicySpec) -> Any:
    """A policy spec as the replay run's config stores it."""
    if isinstance(spec, Checkpoint):
        return {"run_dir": str(spec.run_dir), "step": spec.step, "policy": spec.policy}
    return spec if isinstance(spec, str) else type(spec).__name__


def backends_for(
    topology: Any,
    source: Any,
    policies: dict[str, PolicySpec],
    backend: str | Backend,
    device: str = "auto",
    dtype: str = "auto",
) -> tuple[dict[str, Backend], list[Backend]]:
    """A backend per policy of ``topology``, and those started here (to close after the replay)."""
    served: dict[str, Backend] = {}
    owned: list[Backend] = []
    started: dict[Any, Backend] = {}
    for name in topology.policies:
        spec = policies.get(name)
        if spec is None and not isinstance(backend, str):
            served[name] = backend
            continue
        spec = _checkpoint_of(spec, source, name) if spec is not None else source.config.get("model")
        if spec is None:
            raise ValueError(f"the source run names no model: say what plays policy '{name}' (policies=...)")
        if not isinstance(spec, str | Checkpoint):
            served[name] = spec
            continue
        key = (str(spec.run_dir), spec.step, spec.policy or name) if isinstance(spec, Checkpoint) else spec
        if key not in started:
            started[key] = _start(spec, name, backend if isinstance(backend, str) else "hf", device, dtype)
            owned.append(started[key])
        served[name] = started[key]
    return served, owned


def check_policies(topology: Any, source: Any, policies: dict[str, PolicySpec]) -> None:
    """Refuse policies the topology lacks and checkpoints the run did not keep, before anything starts."""
    unknown = sorted(set(policies) - set(topology.policies))
    if unknown:
        raise ValueError(
            f"no policies {unknown} in {topology.name}; its policies are {', '.join(topology.policies)}"
        )
    for name, spec in policies.items():
        spec = _checkpoint_of(spec, source, name)
        if isinstance(spec, Checkpoint):
            _checkpoint_dir(spec)


def kept_steps(run_dir: str | Path) -> list[int]:
    """The steps whose checkpoints the training run in ``run_dir`` kept, oldest first."""
    if not (Path(run_dir) / "checkpoints").is_dir():  # no torch import for a run without checkpoints
        return []
    from workbench.rl import checkpoint

    return [int(p.name.split("-")[1]) for p in checkpoint.complete(Path(run_dir))]


def _checkpoint_dir(spec: Checkpoint) -> Path:
    run_dir = Path(spec.run_dir)
    kept = kept_steps(run_dir)
    if spec.step not in kept:
        raise FileNotFoundError(
            f"{run_dir.name} kept no checkpoint of step {spec.step}; it kept steps {kept or 'none'}"
        )
    return run_dir / "checkpoints" / f"step-{spec.step:06d}"


def _checkpoint_of(spec: PolicySpec, source: Any, policy: str) -> PolicySpec:
    if isinstance(spec, str) and spec.startswith("step:"):
        step = spec.split(":", 1)[1]
        if not step.isdigit():
            raise ValueError(
                f"policy '{policy}': {spec!r} names no step; write step:K with K a checkpoint's step"
            )
        return Checkpoint(source.run_dir, int(step), policy)
    return spec


def _start(spec: str | Checkpoint, policy: str, kind: str, device: str, dtype: str) -> Backend:
    if isinstance(spec, str):
        placed = {
            "hf": {"device": device, "dtype": dtype},
            "vllm": {"dtype": None if dtype == "auto" else dtype},
        }
        return make_backend(kind, spec, **placed.get(kind, {}))
    from workbench.backends.hf import HFBackend

    model, tokenizer = checkpoint_model(spec, policy)
    return HFBackend(model, tokenizer)


def checkpoint_model(spec: Checkpoint, policy: str) -> tuple[Any, Any]:
    """The model and tokenizer of a training run's policy at a kept checkpoint step."""
    from workbench.models import load as load_model
    from workbench.rl import checkpoint
    from workbench.rl.policies import PolicySet, per_role_policies
    from workbench.rl.run_files import TOPOLOGY_FILE, run_config
    from workbench.topology import load as load_topology

    run_dir = Path(spec.run_dir)
    path = _checkpoint_dir(spec)
    config = run_config(run_dir)
    stored = run_dir / TOPOLOGY_FILE
    topology = load_topology(stored if stored.exists() else config.topology)
    if config.policy_per_role:
        topology = per_role_policies(topology)
    names = list(topology.policies)
    chosen = spec.policy if spec.policy in names else (policy if policy in names else names[0])
    model, tokenizer = load_model(config.model)
    policies = PolicySet.from_config(topology, model, tokenizer, config)
    policies.load_state(checkpoint.trained_weights(path))
    trained = policies.activate(chosen)
    if config.policies == "lora":
        trained = trained.merge_and_unload(adapter_names=[policies.adapters[chosen]])
    return trained.eval(), tokenizer

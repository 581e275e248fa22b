"""The trainable models behind a topology's policies, and how their weights reach the rollout backend.

Three layouts (``TrainConfig.policies``):

- ``shared``: one model plays every policy (MARS, MarsRL: one set of weights for all roles);
- ``lora``: one LoRA adapter per policy on a shared frozen base (peft); the adapters are trained and
  served by name (vLLM multi-LoRA, or the same peft object in the hf backend);
- ``separate``: a full copy of the model per policy.

``per_role_policies`` gives every trainable role its own policy, so ``lora`` becomes one adapter per role.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch

from workbench.backends.wrapper import unwrap
from workbench.models.placement import Placement
from workbench.topology import Topology
from workbench.topology.spec import Policy


class WeightSyncError(RuntimeError):
    """New weights could not reach the rollout backend in time."""


def per_role_policies(topology: Topology) -> Topology:
    """A copy of ``topology`` where each trainable role has a policy of its own (named after the role)."""
    policies = dict(topology.policies)
    roles = {}
    for name, role in topology.roles.items():
        if role.trainable and topology.policies[role.policy].model is None:
            policies[name] = Policy()
            role = role.model_copy(update={"policy": name})
        roles[name] = role
    used = {r.policy for r in roles.values()}
    return topology.model_copy(
        update={"policies": {k: v for k, v in policies.items() if k in used}, "roles": roles}
    )


class PolicySet:
    @classmethod
    def from_config(cls, topology: Topology, model: Any, tokenizer: Any, config: Any) -> PolicySet:
        """The policy set a ``TrainConfig`` asks for: its layout and its LoRA settings."""
        lora = {"r": config.lora_rank, "lora_alpha": config.lora_alpha, "target_modules": config.lora_targets}
        return cls(topology, model, tokenizer, config.policies, lora)

    @classmethod
    def load(cls, topology: Topology, config: Any, with_reference: bool = False) -> tuple[PolicySet, Any]:
        """Load ``config.model`` where ``config.device``/``config.dtype`` say and build its policy set; with
        ``with_reference`` also the frozen KL reference (else None).

        Trained weights stay fp32 on the device (master weights); the reference and a LoRA base are stored
        in the compute dtype (``workbench.models.placement``).
        """
        from workbench.models import load as load_model

        placement = Placement.resolve(config.device, config.dtype)
        frozen_base = config.policies == "lora"  # loaded in the compute dtype: a 7B base is 15 GB, not 30
        options: dict[str, Any] = {"dtype": placement.dtype if frozen_base else torch.float32}
        if placement.device.type == "cuda":
            options["device_map"] = str(placement.device)  # straight onto the GPU, not through host memory
        model, tokenizer = load_model(config.model, **options)
        if not frozen_base:
            placement.place_trained(model)
        reference = placement.place_frozen(copy.deepcopy(model)).eval() if with_reference else None
        policies = cls.from_config(topology, model, tokenizer, config)
        policies.placement = placement
        if policies.mode == "lora":
            for peft_model in policies.unique_models().values():
                placement.freeze_untrained(peft_model)
        return policies, reference

    def __init__(
        self, topology: Topology, model: Any, tokenizer: Any, mode: str = "shared", lora: dict | None = None
    ):
        if mode not in {"shared", "lora", "separate"}:
            raise ValueError(f"policies must be shared, lora or separate, got {mode!r}")
        self.mode, self.tokenizer, self.names = mode, tokenizer, list(topology.policies)
        self.placement = Placement(model.get_input_embeddings().weight.device, torch.float32)
        self._copies: dict[int, Any] = {}  # id of an hf backend serving a copy -> the trained model
        self.adapters: dict[str, str | None] = dict.fromkeys(self.names)
        if mode == "shared":
            self.models = dict.fromkeys(self.names, model)
        elif mode == "separate":
            self.models = {
                name: (model if i == 0 else copy.deepcopy(model)) for i, name in enumerate(self.names)
            }
        else:
            from peft import LoraConfig, get_peft_model

            options = {
                "r": 8,
                "lora_alpha": 16,
                "lora_dropout": 0.0,
                "target_modules": "all-linear",
                **(lora or {}),
            }
            self.lora_rank = options["r"]
            first, *rest = self.names
            peft_model = get_peft_model(model, LoraConfig(**options), adapter_name=first)
            for name in rest:
                peft_model.add_adapter(name, LoraConfig(**options))
            for param_name, param in peft_model.named_parameters():
                param.requires_grad = "lora_" in param_name
            self.models = dict.fromkeys(self.names, peft_model)
            self.adapters = {name: name for name in self.names}

    # ------------------------------------------------------------------ rollout side

    def backends(
        self, kind: str, model_name: str, own_weights: bool = False, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A rollout backend per policy (the same object where policies share one).

        hf backends generate with the trained model objects themselves, unless ``own_weights``: then
        each serves a copy that ``sync`` refreshes between batches (a rollout running beside the
        trainer must never see an update half-applied). ``options`` go to the vllm backend's engine.
        """
        if kind == "hf":
            from workbench.backends.hf import HFBackend

            made = {}
            for model in self.unique_models().values():
                served = copy.deepcopy(model).eval() if own_weights else model
                made[id(model)] = HFBackend(served, self.tokenizer, placement=self.placement)
                if own_weights:
                    self._copies[id(made[id(model)])] = model
            return {name: made[id(self.models[name])] for name in self.names}
        from workbench.backends import make_backend

        if self.mode == "separate":
            raise ValueError(
                "separate models per policy are served by the hf backend here; use policies: lora"
            )
        lora = {"max_loras": len(self.names), "max_lora_rank": self.lora_rank} if self.mode == "lora" else {}
        engine = make_backend("vllm", model_name, enable_lora=self.mode == "lora", **lora, **(options or {}))
        return dict.fromkeys(self.names, engine)

    def sync(self, backends: dict[str, Any], run_dir: Path, version: int, timeout: float) -> None:
        """Make the current weights reach every backend (the training step times it, as its sync phase)."""
        for backend in {id(unwrap(b)): unwrap(b) for b in backends.values()}.values():
            if id(backend) in self._copies:  # an hf copy: only the trained tensors (the adapters for lora)
                state = self._copies[id(backend)].state_dict()
                trained = {k: v for k, v in state.items() if self.mode != "lora" or "lora_" in k}
                backend.load_state(trained, policy_version=version)
                continue
            if getattr(backend, "model", None) in list(self.models.values()):
                backend.policy_version = version  # hf: generates with the trained object itself
                continue
            # an engine holding updates for its scheduler (``hold_weights``) gets each in files of its own
            holding = getattr(backend, "holding", False)
            if self.mode == "lora":
                base = Path(run_dir) / "sync" / "adapters"
                base = backend.update_directory(base, version) if holding else base
                paths = {}
                for name in self.names:
                    self.models[name].save_pretrained(base, selected_adapters=[name])
                    paths[name] = base if name == "default" else base / name
                update = partial(backend.update_adapters, paths, policy_version=version)
                _with_timeout(update, timeout, backend.name)
            elif version > 0 or backend.policy_version != 0:
                directory = Path(run_dir) / "sync" / "model"
                directory = backend.update_directory(directory, version) if holding else directory
                self.models[self.names[0]].save_pretrained(directory, safe_serialization=True)
                reload = partial(backend.load_weights, directory, policy_version=version)
                _with_timeout(reload, timeout, backend.name)

    # ------------------------------------------------------------------ checkpoints

    def unique_models(self) -> dict[str, Any]:
        seen: dict[int, str] = {}
        for name, model in self.models.items():
            seen.setdefault(id(model), name)
        return {name: self.models[name] for name in seen.values()}

    def state(self) -> dict[str, torch.Tensor]:
        """The trained weights (only the adapters for lora), keyed ``policy/parameter``, on the CPU (they go to
        checkpoints and to other processes, which may have no GPU)."""
        out = {}
        for name, model in self.unique_models().items():
            for key, value in model.state_dict().items():
                if self.mode != "lora" or "lora_" in key:
                    out[f"{name}/{key}"] = value.detach().to("cpu").contiguous()
        return out

    def load_state(self, weights: dict[str, torch.Tensor]) -> None:
        for name, model in self.unique_models().items():
            prefix = f"{name}/"
            mine = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
            missing, unexpected = model.load_state_dict(mine, strict=False)
            expected_missing = [k for k in missing if self.mode == "lora" and "lora_" not in k]
            expected_missing += [k for k in missing if "lm_head" in k]  # tied to the embeddings
            if set(missing) - set(expected_missing) or unexpected:
                raise RuntimeError(
                    f"checkpoint does not fit policy '{name}': missing {missing[:5]}, unexpected {unexpected[:5]}"
                )

    def activate(self, policy: str) -> Any:
        """The model of ``policy``, with its adapter switched on."""
        model = self.models[policy]
        if self.adapters.get(policy) is not None:
            model.set_adapter(self.adapters[policy])
        return model


def _with_timeout(action: Any, timeout: float, what: str) -> None:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            action()
        except BaseException as error:  # noqa: BLE001 - reported in the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise WeightSyncError(f"weight sync to the {what} backend did not finish within {timeout:.0f} s")
    if "error" in outcome:
        raise WeightSyncError(f"weight sync to the {what} backend failed: {outcome['error']}")


@contextmanager
def asleep(backends: dict[str, Any]) -> Iterator[None]:
    """Inside, the backends that can sleep (a vllm engine started with ``enable_sleep_mode``) have released
    their device memory (weights to host memory, KV cache dropped); they take it back on the way out, before
    the weight sync. Backends that cannot sleep are left alone."""
    sleepers = [
        b
        for b in {id(unwrap(b)): unwrap(b) for b in backends.values()}.values()
        if getattr(b, "can_sleep", False)
    ]
    woken = []
    try:
        for backend in sleepers:
            backend.sleep()
            woken.append(backend)
        yield
    finally:
        for backend in woken:
            backend.wake_up()

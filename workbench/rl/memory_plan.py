"""A memory plan on paper: the bytes each trainer rank holds for a model, counted on the meta device.

``plan(model, gpus=..., ...)`` says, before anything is loaded, whether an update fits each GPU and what
takes the room, per rank:

- **parameters**: fp32 master weights of what is trained, sharded over the ranks (FSDP2's ``fully_shard``);
  a frozen LoRA base is stored in the compute dtype, sharded too; ``separate`` policies are one model each;
- **gradients** and **AdamW state** (two fp32 moments) of what is trained, sharded;
- **reference**: the frozen KL reference (``kl_coef > 0``), a copy in the compute dtype, sharded;
- **unsharded layers**: what FSDP2 all-gathers for compute, in the compute dtype (``MixedPrecisionPolicy``:
  bf16 parameters, fp32 reduction): the root's parameters (embeddings, final norm, head: not resharded
  between forward and backward), ``unsharded_layers`` decoder layers at a time (the one computing and the one
  prefetched), and one unit's unsharded fp32 gradients on their way to the reduce-scatter. None on one
  rank in fp32, where the weights are used as they are;
- **unsharded gradients**: on several ranks, when the trainer defers the gradients' reduce-scatter to the
  last micro-batch of an optimizer step (``defers_gradient_sync``: while the trained parameters' full fp32
  gradient takes at most ``DEFER_SYNC_SHARE`` of the GPU), each rank accumulates the whole gradient
  unsharded in fp32 between micro-batches (FSDP2's ``set_requires_gradient_sync(False)``); the one unit's
  gradients above are then part of it;
- **activations** of one micro-batch of ``token_budget`` tokens, measured, not modelled: the model is built
  on fake tensors (``FakeTensorMode``: meta storage presented as CPU tensors, so attention takes the fused
  kernel that saves O(tokens), as FlashAttention on a GPU) and one forward, through the workbench's chunked
  LM head, runs under ``saved_tensors_hooks`` summing the distinct storages it saves for the backward,
  parameters left out. With gradient checkpointing: what is saved outside the decoder layers and each
  layer's inputs (what the checkpoint keeps), and apart, as **recomputed layer**, the largest layer's saved
  bytes (the backward recomputes one layer at a time);
- **logits**: the chunked head's working set (``workbench.rl.logprob_head``): a chunk's fp32 log-probs,
  probabilities and their product (plus the compute-dtype logits under mixed precision), never ``[tokens,
  vocabulary]``.

The total is the plan's peak: the second micro-batch of an update meets every term at once (gradients
accumulated, AdamW state from the last step, the forward's activations), except that the head's chunks and
a recomputed layer never meet (the head runs before the backward recomputes any layer): the larger of the
two counts. AdamW is the fused one (the trainer's choice on a GPU): its step allocates nothing the size of
the model. ``fits`` keeps ``headroom`` of the GPU free (CUDA context, allocator fragmentation). Sizes are in GiB (2^30 bytes): an "80 GB" GPU
has about 79.6 GiB.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

import torch

GIB = 2**30
#: The attention the plan measures with: sdpa, causal without a mask tensor, as the fused kernels run it.
ATTENTION = "memory_plan_causal"
POLICIES = ("shared", "separate", "lora")
#: The per-rank terms, in the order the tables show them.
TERMS = (
    "parameters",
    "gradients",
    "adamw_state",
    "reference",
    "unsharded_layers",
    "unsharded_gradients",
    "activations",
    "recomputed_layer",
    "logits",
)


#: The share of a GPU's memory the trained parameters' full fp32 gradient may take for the trainer to defer the
#: gradients' reduce-scatter to an optimizer step's last micro-batch (``defers_gradient_sync``).
DEFER_SYNC_SHARE = 0.1


def defers_gradient_sync(trained_parameters: int, gpu_memory_bytes: float | None) -> bool:
    """Whether FSDP trainer ranks accumulate an optimizer step's gradients unsharded and reduce-scatter them
    once, on its last micro-batch (per role when each role's gradient is measured), rather than after every
    micro-batch: one collective of the gradient's size a step instead of one a micro-batch, for 4 bytes a
    trained parameter held unsharded on every rank between micro-batches (FSDP2's two flavours of gradient
    accumulation; torchtitan keeps the default, a reduce-scatter every micro-batch, hidden behind the
    backward on GPUs, and PyTorch advises it where memory is tight). Yes while that full fp32 gradient takes at
    most ``DEFER_SYNC_SHARE`` of the GPU (on an 80 GB GPU: full fine-tunes up to ~2B parameters, every LoRA);
    always off a GPU (``gpu_memory_bytes`` None), where memory is the host's."""
    return gpu_memory_bytes is None or 4 * trained_parameters <= DEFER_SYNC_SHARE * gpu_memory_bytes


@dataclass(frozen=True)
class PlanSettings:
    """What a plan depends on besides the model. ``policies``: shared (one trained model), separate (one
    trained model per role) or lora (one frozen base, an adapter of ``lora_rank`` on ``lora_targets`` per
    role); ``roles``: how many policies; ``mixed_precision``: bf16 compute over fp32 masters (else fp32)."""

    gpus: int = 1
    gpu_memory_gib: float = 80.0
    policies: str = "shared"
    roles: int = 1
    lora_rank: int = 16
    lora_targets: str | tuple[str, ...] = "all-linear"
    gradient_checkpointing: bool = True
    token_budget: int = 8192
    mixed_precision: bool = True
    reference: bool = False
    headroom: float = 0.1
    unsharded_layers: int = 2

    def __post_init__(self) -> None:
        if self.policies not in POLICIES:
            raise ValueError(f"policies must be one of {', '.join(POLICIES)}, got {self.policies!r}")
        if self.gpus < 1 or self.roles < 1 or self.token_budget < 1:
            raise ValueError("gpus, roles and token_budget must be at least 1")


@dataclass(frozen=True)
class Measured:
    """Counts of one model on fake tensors: parameters (the base model; the largest decoder layer; outside the
    layers), one LoRA adapter's (0 without), and the saved bytes of one micro-batch's forward."""

    parameters: int
    layer_parameters: int
    root_parameters: int
    adapter_parameters: int
    layer_adapter_parameters: int
    vocab: int
    saved_all: int  # every saved storage of the forward
    saved_outside: int  # saved outside the decoder layers (embedding, final norm, LM head)
    layer_inputs: int  # the decoder layers' inputs: what a checkpointed layer keeps
    saved_layer_max: int  # the largest layer's saved bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per rank by term (``TERMS``), against the GPU's memory less the headroom."""

    model: str
    settings: PlanSettings
    terms: dict[str, int]
    measured: Measured

    @property
    def total(self) -> int:
        """The peak: every term, but only the larger of the head's chunks and a recomputed layer."""
        return sum(self.terms.values()) - min(self.terms["logits"], self.terms["recomputed_layer"])

    @property
    def budget(self) -> int:
        return int(self.settings.gpu_memory_gib * GIB * (1 - self.settings.headroom))

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def row(self) -> dict[str, Any]:
        """The plan as one flat row: settings, each term and the total in GiB, and whether it fits."""
        s = self.settings
        row: dict[str, Any] = {"model": self.model, "gpus": s.gpus, "policies": s.policies, "roles": s.roles}
        row["checkpointing"] = s.gradient_checkpointing
        row["token_budget"] = s.token_budget
        row.update({f"{term}_gib": round(b / GIB, 2) for term, b in self.terms.items()})
        row.update(
            total_gib=round(self.total / GIB, 2), budget_gib=round(self.budget / GIB, 2), fits=self.fits
        )
        return row

    def summary(self) -> str:
        """One line with the numbers: what each rank needs, what it has, and the largest terms."""
        s = self.settings
        parts = ", ".join(f"{term.replace('_', ' ')} {b / GIB:.1f}" for term, b in self.terms.items() if b)
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"{self.model} ({s.policies}, {s.roles} polic{'y' if s.roles == 1 else 'ies'}, token budget "
            f"{s.token_budget:,}, checkpointing {'on' if s.gradient_checkpointing else 'off'}) on {s.gpus} "
            f"GPU{'s' if s.gpus > 1 else ''}: {self.total / GIB:.1f} GiB a rank ({parts}) {verdict} in "
            f"{self.budget / GIB:.1f} GiB ({s.gpu_memory_gib:g} GiB less {s.headroom:.0%} headroom)"
        )


def storage_key(tensor: torch.Tensor) -> int:
    """A storage's identity: two views of one buffer have the same key."""
    return tensor.untyped_storage()._cdata


@contextlib.contextmanager
def fake_tensors() -> Iterator[Any]:
    """``FakeTensorMode``: tensors with shapes, dtypes and (meta) storages, on the CPU as far as dispatch
    knows, and nothing allocated; peft's adapters made under it stay where they are made."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # peft moves each new adapter to its base layer's device by swapping tensors, which fake ones refuse
    with (
        FakeTensorMode(allow_non_fake_inputs=True) as mode,
        mock.patch.object(torch.nn.Module, "to", lambda module, *a, **k: module),
    ):
        yield mode


def _register_attention() -> None:
    """``ATTENTION``: transformers' sdpa attention given no mask, so it takes ``is_causal`` (on fake tensors
    transformers would otherwise build the ``[tokens, tokens]`` mask it skips on real ones)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, sdpa_attention_forward)
    AttentionMaskInterface.register(ATTENTION, lambda *args, **kwargs: None)


def decoder_layers(model: Any, n_layers: int) -> torch.nn.ModuleList:
    """The model's stack of ``n_layers`` decoder layers."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return module
    raise ValueError(f"no list of {n_layers} decoder layers in {type(model).__name__}")


def _numel(parameters: Any, lora: bool | None = None) -> int:
    return sum(p.numel() for name, p in parameters if lora is None or ("lora_" in name) == lora)


def _config_key(config: Any) -> str:
    return json.dumps(config.to_dict(), sort_keys=True, default=str)


def measure(
    config: Any, dtype: torch.dtype, token_budget: int, lora_rank: int = 0, lora_targets: Any = "all-linear"
) -> Measured:
    """Parameter counts and the saved bytes of one forward of ``token_budget`` tokens of ``config`` in
    ``dtype`` (with one LoRA adapter when ``lora_rank``), on fake tensors (module docstring)."""
    targets = lora_targets if isinstance(lora_targets, str) else tuple(lora_targets)
    return _measure(_config_key(config), str(dtype).split(".")[-1], token_budget, lora_rank, targets)


@functools.lru_cache(maxsize=64)
def _measure(config_json: str, dtype: str, tokens: int, lora_rank: int, targets: Any) -> Measured:
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.rl.logprob_head import chunked_logprobs

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    _register_attention()
    with fake_tensors():
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, dtype), attn_implementation=ATTENTION
        ).train()
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            options = {"r": lora_rank, "lora_alpha": 2 * lora_rank, "lora_dropout": 0.0}
            targets = targets if isinstance(targets, str) else list(targets)
            model = get_peft_model(model, LoraConfig(target_modules=targets, **options))
            for name, parameter in model.named_parameters():
                parameter.requires_grad = "lora_" in name
        base = model.get_base_model() if lora_rank else model
        layers = decoder_layers(base, config.num_hidden_layers)
        layer_counts = [
            (_numel(layer.named_parameters(), lora=False), _numel(layer.named_parameters(), lora=True))
            for layer in layers
        ]
        parameters = _numel(model.named_parameters(), lora=False)
        root = parameters - sum(n for n, _ in layer_counts)
        parameter_keys = {storage_key(p) for p in model.parameters()}
        saved: dict[int, tuple[int, int | None]] = {}  # storage -> bytes, layer that saved it first
        inputs: dict[int, int] = {}
        where: list[int | None] = [None]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            key = storage_key(tensor)
            if key not in parameter_keys and key not in saved:
                saved[key] = (tensor.untyped_storage().nbytes(), where[0])
            return tensor

        def enter(index: int) -> Any:
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                where[0] = index
                for value in [*args, *kwargs.values()]:
                    for tensor in value if isinstance(value, tuple) else (value,):
                        if isinstance(tensor, torch.Tensor) and storage_key(tensor) not in parameter_keys:
                            inputs.setdefault(storage_key(tensor), tensor.untyped_storage().nbytes())

            return hook

        def leave(*_: Any) -> None:
            where[0] = None

        handles = [
            layer.register_forward_pre_hook(enter(i), with_kwargs=True) for i, layer in enumerate(layers)
        ]
        handles += [layer.register_forward_hook(leave) for layer in layers]
        ids = torch.zeros(1, tokens, dtype=torch.long)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
            chunked_logprobs(hidden, base.get_output_embeddings().weight, ids[0], recompute=True)
        for handle in handles:
            handle.remove()
    per_layer = [0] * len(layers)
    for nbytes, layer in saved.values():
        if layer is not None:
            per_layer[layer] += nbytes
    return Measured(
        parameters=parameters,
        layer_parameters=max(n for n, _ in layer_counts),
        root_parameters=root,
        adapter_parameters=_numel(model.named_parameters(), lora=True),
        layer_adapter_parameters=max(a for _, a in layer_counts),
        vocab=config.vocab_size,
        saved_all=sum(b for b, _ in saved.values()),
        saved_outside=sum(b for b, layer in saved.values() if layer is None),
        layer_inputs=sum(inputs.values()),
        saved_layer_max=max(per_layer),
    )


def logits_bytes(vocab: int, tokens: int, mixed_precision: bool) -> int:
    """The chunked LM head's working set: three fp32 chunks (log-probs, probabilities, their product), and
    the chunk's logits in bf16 before they are upcast under mixed precision."""
    from workbench.rl.logprob_head import chunk_rows

    elements = min(tokens, chunk_rows(vocab)) * vocab
    return elements * (3 * 4 + (2 if mixed_precision else 0))


def terms(m: Measured, s: PlanSettings) -> dict[str, int]:
    """Bytes per rank by term (module docstring) of a model counted as ``m`` under settings ``s``."""
    n, compute = s.gpus, 2 if s.mixed_precision else 4
    lora = s.policies == "lora"
    models = s.roles if s.policies == "separate" else 1
    trained = m.adapter_parameters * s.roles if lora else m.parameters * models
    stored = m.parameters * compute if lora else m.parameters * 4 * models
    unsharded = 0
    deferred = n > 1 and defers_gradient_sync(trained, s.gpu_memory_gib * GIB)
    if n > 1 or (s.mixed_precision and not lora):  # one model computes at a time
        unit_grads = (
            max(m.layer_adapter_parameters, 0) if lora else max(m.layer_parameters, m.root_parameters)
        )
        unsharded = compute * (m.root_parameters + s.unsharded_layers * m.layer_parameters)
        unsharded += 0 if deferred else 4 * unit_grads  # deferred: part of the unsharded gradients
    checkpointing = s.gradient_checkpointing
    activations = m.saved_outside + m.layer_inputs if checkpointing else m.saved_all
    return {
        "parameters": (stored + (4 * trained if lora else 0)) // n,
        "gradients": 4 * trained // n,
        "adamw_state": 8 * trained // n,
        "reference": m.parameters * compute // n if s.reference else 0,
        "unsharded_layers": unsharded,
        "unsharded_gradients": 4 * trained if deferred else 0,
        "activations": activations,
        "recomputed_layer": m.saved_layer_max if checkpointing else 0,
        "logits": logits_bytes(m.vocab, s.token_budget, s.mixed_precision),
    }


def plan(model: Any = "qwen2.5-0.5b", settings: PlanSettings | None = None, **options: Any) -> MemoryPlan:
    """The memory plan of ``model`` (a named shape, a registry model or a transformers config) under
    ``settings`` and/or ``PlanSettings`` fields as keywords: ``plan("qwen2.5-7b", gpus=4, policies="lora")``."""
    from workbench.models.shapes import model_config

    s = replace(settings or PlanSettings(), **options)
    config = model_config(model)
    dtype = torch.bfloat16 if s.mixed_precision else torch.float32
    m = measure(config, dtype, s.token_budget, s.lora_rank if s.policies == "lora" else 0, s.lora_targets)
    name = model if isinstance(model, str) else getattr(config, "name_or_path", "") or config.model_type
    return MemoryPlan(name, s, terms(m, s), m)


def table(plans: list[MemoryPlan]) -> Any:
    """The plans as a pandas DataFrame, a row each (``MemoryPlan.row``)."""
    import pandas as pd

    return pd.DataFrame([p.row() for p in plans])


def markdown(plans: list[MemoryPlan]) -> str:
    """The plans as a markdown table: GiB a rank by term, the total and whether it fits."""
    head = ["model", "policies", "GPUs", *(t.replace("_", " ") for t in TERMS), "total", "fits"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in plans:
        s = p.settings
        cells = [p.model, s.policies + (f" r={s.lora_rank}" if s.policies == "lora" else ""), str(s.gpus)]
        cells += [f"{p.terms[t] / GIB:.1f}" for t in TERMS]
        cells += [f"{p.total / GIB:.1f}", "yes" if p.fits else "**no**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

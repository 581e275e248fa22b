"""Regional compilation: each decoder layer compiled by ``torch.compile``, the way the field fuses them (issue 47).

Eager, a decoder layer launches a kernel for every op: the RMSNorms (~10 ops each with the backward), the
rotary embedding, SwiGLU, the casts of an fp32 residual stream, the views. Compiled by inductor, the
elementwise and reduction ops between two matmuls fuse into one generated kernel (Triton's on a GPU, C++ on a
CPU), and the matmuls and attention stay library calls. Compiling each layer, not the whole model, is what
torchtitan and transformers' own ``compile`` do ("regional compilation"): the layers are one class, so dynamo
traces the first one and every other layer reuses its code (parameters are graph inputs, not constants), and
the rest of the forward (the embedding, the chunked LM head, the loss) stays eager.

:func:`compile_layers` compiles every decoder layer of the models in place: the layer class's forward is
compiled once (``torch.compile``, dynamic shapes: a packed micro-batch's token count changes every time, and
one compiled graph serves them all) and set as each layer's ``Module._compiled_call_impl`` (what
``Module.compile`` sets), so ``state_dict``, parameters and hooks-free calls are unchanged, and a deepcopy of
the model (a rollout backend's own weights) is eager (torch drops the compiled call when copying). The
trainer calls it when ``OptimConfig.compile_layers`` is on (default off: on a GPU the gain is counted here,
not yet timed; on the CPU it pays the compile). What it composes with:

- attention: the ``packed`` implementation (``workbench.rl.packed_attention``) reads a host-side row layout
  (segment spans, padded indices cached on first use, a stand-in that reads bounds on the host), so it runs
  eagerly between two compiled graphs (one graph break a layer: the norm, projections and rotary embedding
  before it; the output projection, residual, norm and MLP after). Other implementations (sdpa) stay in the
  graph.
- gradient checkpointing: transformers' checkpoint wraps the compiled call, so the backward recomputes the
  compiled forward;
- compute weights (bf16 copies swapped in for the forward) and LoRA adapters (peft's layers inside the
  decoder layers): traced like the rest; switching adapters or weights' dtypes recompiles once per variant
  (adapters x grad on/off x dtypes; past dynamo's ``recompile_limit``, 8, new variants run eagerly, with
  torch's warning).
- generation: a layer called with a KV cache runs eagerly (``generate``, the static decode's CUDA graphs).
- FSDP2-sharded models are left eager (its hooks are not rehearsed under compile), with a warning.

A model without decoder layers found (the decoder's ``layers``) is left eager, with a warning; if dynamo or
inductor fails on a forward, the model's layers go back to eager with a warning saying why. ``tests/test_compiled_layers.py`` checks losses and gradients against the eager path on the CPU's
inductor, with and without checkpointing; ``tests/perf/bench_launches.py`` counts the kernels the compiled layer
launches (from inductor's generated code, which a dispatch mode cannot see into).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from typing import Any

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (a peft model's base model's), or [] if none are found."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else getattr(inner, "model", None)
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


@functools.cache
def _eager_block_attention() -> Any:
    from workbench.rl.packing import _block_attention

    return torch.compiler.disable(_block_attention, recursive=True)


def _eager_attention() -> None:
    """Registers the ``packed`` attention to run eagerly under dynamo (a graph break around it; module
    docstring); outside a compiled region the wrapper only calls it. Checked before every compiled call:
    ``use_block_attention`` (another trainer) registers the plain function again."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from workbench.rl.packing import BLOCK_ATTENTION

    eager = _eager_block_attention()
    if ALL_ATTENTION_FUNCTIONS.get_interface(BLOCK_ATTENTION, None) is not eager:
        AttentionInterface.register(BLOCK_ATTENTION, eager)


def compile_layers(
    models: Iterable[torch.nn.Module], dynamic: bool = True, sharded: bool = False, **options: Any
) -> int:
    """Compile every decoder layer of ``models`` in place (each model once; ``options`` go to
    ``torch.compile``); returns how many layers were compiled. Dynamic shapes by default: one graph for every
    token count. A layer called with a KV cache (generation, the static decode) runs eagerly as before.
    FSDP-sharded models (``sharded``) are left eager, with a warning: not rehearsed with FSDP2's hooks."""
    if sharded:
        warnings.warn("compile_layers: FSDP-sharded models are left eager (not rehearsed)", stacklevel=2)
        return 0
    seen, compiled = set(), 0
    for model in models:
        if id(model) in seen:
            continue
        seen.add(id(model))
        layers = decoder_layers(model)
        if not layers:
            warnings.warn(
                f"compile_layers: no decoder layers found in {type(model).__name__}; it stays eager",
                stacklevel=2,
            )
            continue
        for layer in layers:
            # the layer class's forward, unbound (a deepcopy of the model calls its own layers): its own compile
            # cache (dynamo's recompile limit counts a code object's variants), shared by every layer; hooks
            # run outside it, so a layer with hooks is compiled with them
            hooked = layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
            function = torch.nn.Module._call_impl if hooked else type(layer).forward
            key = (function, dynamic, repr(sorted(options.items())))
            if key not in _COMPILED:
                _COMPILED[key] = torch.compile(function, dynamic=dynamic, **options)
            layer._compiled_call_impl = _CompiledCall(layer, _COMPILED[key], layers)
            compiled += 1
    return compiled


_COMPILED: dict[tuple, Any] = {}  # (a layer class's forward, options) -> torch.compile of it


class _CompiledCall:
    """A layer's call (``Module._compiled_call_impl``): compiled, except with a KV cache (generation and the
    static decode stay eager). If dynamo or inductor fails on the forward, the model's layers go back to eager
    with a warning saying why (a failure compiling the backward, at the first ``backward()``, raises)."""

    def __init__(self, layer: torch.nn.Module, compiled: Any, siblings: list[torch.nn.Module]):
        self.layer, self.compiled, self.siblings = layer, compiled, siblings

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        layer = self.layer
        if kwargs.get("past_key_values") is not None:
            return layer._call_impl(*args, **kwargs)
        _eager_attention()  # a dict lookup; registers again only after use_block_attention did
        try:
            return self.compiled(layer, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            message = str(error).splitlines()[0] if str(error) else ""
            warnings.warn(
                f"compile_layers: {type(layer).__name__} could not be compiled, its model's layers run eagerly: "
                f"{type(error).__name__}: {message}",
                stacklevel=2,
            )
            for sibling in self.siblings:
                sibling._compiled_call_impl = None
            return layer._call_impl(*args, **kwargs)

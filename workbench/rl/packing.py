"""Padding-free micro-batches for the trainer: samples packed into one row by token budget.

A GRPO step scores many samples of very different lengths (a verifier's two-line verdict next to a
solver's long derivation). Padding each micro-batch to its longest sample computes, and back-propagates
through, tokens that carry nothing. Here instead:

1. :func:`plan_micro_batches` groups sample indices by First-Fit-Decreasing
   (:func:`workbench.engine.binpack.ffd_pack`) so each micro-batch holds at most ``token_budget`` prompt +
   completion tokens (a sample longer than the budget gets a micro-batch of its own);
2. :func:`collate` concatenates a micro-batch's samples into ONE row, ``input_ids [1, T]``, with
   ``position_ids`` restarting at 0 at each sample, and records for every completion token the row
   position whose logits predict it;
3. :func:`token_logprobs` runs the model on that row and turns only those positions' logits into
   log-probs (and entropies), flat ``[N]`` over the micro-batch's completion tokens.

Attention must not cross samples. transformers (5.x) reads it from the position ids: with no
``attention_mask`` and no cache, ``masking_utils.find_packed_sequence_indices`` marks a new sequence
wherever the position does not go up by one, and ``create_causal_mask`` ANDs the causal mask with
"same sequence" (sdpa, eager, flex); the flash-attention paths turn the same position ids into varlen
sequence boundaries. The forward therefore passes ``use_cache=False``: with the config default
(``use_cache=True``) the model makes a ``DynamicCache`` first, the detection is skipped and the samples
silently attend to each other. ``tests/test_packing.py`` checks on ``tiny`` (Qwen2) and
``smollm2-135m`` (Llama) that packed log-probs, entropies and gradients equal one-sample-at-a-time
and right-padded forwards (exactly, in float64).

That masked attention still computes the row's whole T x T: sdpa cannot skip the masked-out blocks.
Measured on 2 cores with smollm2-135m, a row of 8 x 128 tokens costs 1.34x the same tokens as an [8, 128]
batch, which eats what dropping the padding saves (``python -m tests.perf.bench_packing``).
:func:`use_block_attention` switches a model to ``"packed"`` attention
(``workbench.rl.packed_attention``): each layer's attention over the whole row in one call, every sample
attending to its own tokens only, from a :class:`~workbench.rl.packed_attention.RowLayout` that
:func:`collate` builds once per micro-batch and :func:`token_logprobs` hands to the forward (so
transformers builds no mask and nothing is read back from the device per layer). On a GPU in half
precision that call is FlashAttention's variable-length kernel (``torch.nn.attention.varlen``); elsewhere
one sdpa over the samples gathered into a padded batch. Inputs that are not one packed row (generation,
padded batches) go to plain sdpa unchanged.

The LM head runs only at the completion positions, a chunk of rows at a time
(``workbench.rl.logprob_head``): no ``[N, V]`` logits are kept for the backward pass.

Shared prefixes. A GRPO group's G samples share their prompt, and a few-shot role's prompts share their
examples: computing (and back-propagating through) each copy is most of a step when prompts are long and
completions short. With ``share_prefixes`` a sample's tokens that equal the start of the sequence laid
out just before it are left out of the row: its segment starts at the position where it departs (its
position ids start there, not at 0), and ``packed`` attention lets that segment attend to those first
positions of the path it continues (the layout's key index). The row is a prefix tree in depth-first
order, each segment's first position id saying how much of the path before it is its own; log-probs and
gradients are those of the samples computed one by one (the prefix's activations get the gradients of
every sample that reads them). Only ``packed`` attention reads a row that way, so :func:`token_logprobs`
refuses a shared row on any other attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.binpack import check_sizes, ffd_pack
from workbench.rl.logprob_head import chunked_logprobs
from workbench.rl.packed_attention import RowLayout, packed_attention
from workbench.rl.samples import Sample


def plan_micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[int]]:
    """Sample indices per micro-batch, each holding at most ``token_budget`` prompt + completion tokens.

    A sample longer than the budget is alone in its micro-batch (those come first, in input order);
    the rest are packed by First-Fit-Decreasing. Inside a micro-batch the indices are ascending.
    Deterministic; every index appears exactly once. Raises ``BinPackingError`` (a ``ValueError``) if
    ``token_budget`` is not a positive int.
    """
    packing = ffd_pack([s.n_tokens for s in samples], token_budget)
    return [sorted(items) for items in packing.bins]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _shared(sample: Sample, path: Sequence[int]) -> int:
    """Leading tokens of ``sample`` the row can take from ``path`` (the sequence laid out before it): all of
    its prompt they have in common but the last token, which stays to predict the first completion token."""
    return max(0, min(_common_prefix(sample.prompt_ids, path), len(sample.prompt_ids) - 1))


def plan_shared_micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[int]]:
    """Sample indices per micro-batch for rows that share prefixes (``collate(..., share_prefixes=True)``).

    Samples are ordered by their prompt ids, so equal prompts (a GRPO group) and prompts that start alike
    (a few-shot role's) lie next to each other, then cut into consecutive runs whose row, each sample
    counted without the prefix it shares with the one before, holds at most ``token_budget`` tokens (a
    sample alone over the budget gets a micro-batch of its own). Deterministic; every index once.
    """
    check_sizes([], token_budget)
    order = sorted(range(len(samples)), key=lambda i: (samples[i].prompt_ids, i))
    plan: list[list[int]] = []
    used = 0
    path: list[int] = []
    for i in order:
        sample = samples[i]
        cost = sample.n_tokens - (_shared(sample, path) if plan else 0)
        if not plan or used + cost > token_budget:
            plan.append([])
            cost, used = sample.n_tokens, 0
        plan[-1].append(i)
        used += cost
        path = sample.prompt_ids + sample.completion_ids
    return plan


@dataclass
class PackedBatch:
    """One micro-batch as a single padding-free row (see the module docstring).

    ``T`` is the micro-batch's prompt + completion tokens, ``N`` its completion tokens (masked or not,
    in sample order then token order).
    """

    input_ids: torch.Tensor  # [1, T] the samples' prompt + completion ids, concatenated
    position_ids: torch.Tensor  # [1, T] 0, 1, ... restarting at each sample
    sample_index: torch.Tensor  # [N] which sample of the batch (0..len(indices)-1) each token is from
    completion_positions: torch.Tensor  # [N] row position whose logits predict each completion token
    target_ids: torch.Tensor  # [N] the completion token ids
    indices: list[int]  # the samples' indices in the list given to collate
    mask: torch.Tensor  # [N] bool, the samples' ``mask`` concatenated: True where the token trains
    advantages: torch.Tensor  # [N] float32, each token's sample's advantage
    engine_logprobs: torch.Tensor  # [N] float32, the samples' ``old_logprobs`` (the engine's) concatenated
    layout: RowLayout  # the row's segments and the keys each reads (packed_attention)
    shared_tokens: int = 0  # tokens left out of the row because a sample took them from the path before it

    @property
    def n_tokens(self) -> int:
        """Tokens in the row (T): all computed, none of them padding."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with its tensors on ``device``."""
        move = {k: getattr(self, k).to(device, non_blocking=True) for k in _TENSOR_FIELDS}
        return PackedBatch(
            **move,
            indices=list(self.indices),
            layout=self.layout.to(device),
            shared_tokens=self.shared_tokens,
        )


_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "sample_index",
    "completion_positions",
    "target_ids",
    "mask",
    "advantages",
    "engine_logprobs",
)


def collate(samples: Sequence[Sample], indices: list[int], share_prefixes: bool = False) -> PackedBatch:
    """Pack ``samples[i] for i in indices`` into one row, in the order of ``indices``.

    Samples with an empty or fully masked completion are fine (they add context tokens only, or
    tokens whose ``mask`` is 0). A sample with a non-empty completion needs a non-empty prompt: its
    first completion token is predicted from the last prompt token.

    ``share_prefixes``: a sample's prompt tokens that equal the start of the sample laid out before it
    are not repeated (see the module docstring); the row then needs ``packed`` attention.
    """
    if not indices:
        raise ValueError("a micro-batch needs at least one sample index")
    ids: list[int] = []
    positions: list[int] = []
    sample_index: list[int] = []
    completion_positions: list[int] = []
    targets: list[int] = []
    mask: list[int] = []
    advantages: list[float] = []
    engine: list[float] = []
    shared_tokens = 0
    path: list[int] = []
    for k, i in enumerate(indices):
        sample = samples[i]
        prompt, completion = sample.prompt_ids, sample.completion_ids
        if len(sample.mask) != len(completion) or len(sample.old_logprobs) != len(completion):
            raise ValueError(
                f"sample {i}: {len(sample.mask)} mask entries and {len(sample.old_logprobs)} log-probs for "
                f"{len(completion)} completion tokens; pass one of each per completion token"
            )
        if completion and not prompt:
            raise ValueError(
                f"sample {i} has a completion but an empty prompt: nothing predicts its first token; "
                "give it at least one prompt token (e.g. BOS)"
            )
        shared = _shared(sample, path) if share_prefixes else 0
        shared_tokens += shared
        start = len(ids) + len(prompt) - shared  # row position of the first completion token
        ids += prompt[shared:]
        ids += completion
        positions += range(shared, len(prompt) + len(completion))
        if share_prefixes:
            path = prompt + completion
        sample_index += [k] * len(completion)
        completion_positions += range(start - 1, start - 1 + len(completion))
        targets += completion
        mask += sample.mask
        advantages += [sample.advantage] * len(completion)
        engine += sample.old_logprobs
    if not ids:
        raise ValueError(f"samples {indices} have no tokens at all")
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        sample_index=torch.tensor(sample_index, dtype=torch.long),
        completion_positions=torch.tensor(completion_positions, dtype=torch.long),
        target_ids=torch.tensor(targets, dtype=torch.long),
        indices=list(indices),
        mask=torch.tensor(mask, dtype=torch.bool),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        engine_logprobs=torch.tensor(engine, dtype=torch.float32),
        layout=RowLayout.from_positions(positions),
        shared_tokens=shared_tokens,
    )


BLOCK_ATTENTION = "packed"
# handed to the decoder as its attention mask on a packed row: a prepared 4-D mask is passed through to the
# attention function untouched, so transformers builds no [T, T] mask (packed_attention reads the layout)
_NO_MASK = torch.ones(1, 1, 0, 0, dtype=torch.bool)


def _layout_of(query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None) -> RowLayout | None:
    """The layout of a packed row recognised from its position ids alone (batch of one, no cache offset,
    positions restarting; a host read of the positions), or None for anything else."""
    if (
        position_ids is None
        or query.shape[0] != 1
        or not query.shape[2] == key.shape[2] == position_ids.shape[-1]
    ):
        return None
    layout = RowLayout.from_positions(position_ids.reshape(-1).tolist())
    return layout.to(query.device) if layout.segments > 1 or layout.kv_index is not None else None


def _block_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A packed row's attention in one call (``packed_attention``); anything else goes to sdpa as is.

    The row's layout comes with the forward (``row_layout=``, what :func:`token_logprobs` passes) or is
    read from the position ids. Each segment is causal: padding inside a packed row is not supported
    (``collate`` never makes any). A segment whose positions start at p > 0 continues the path laid out
    before it and also sees that path's first p positions (shared prefixes, module docstring).
    """
    from workbench.backends.gqa_attention import gqa_sdpa

    layout = kwargs.pop("row_layout", None) or _layout_of(query, key, kwargs.get("position_ids"))
    if layout is None:
        return gqa_sdpa(module, query, key, value, attention_mask, **kwargs)
    return packed_attention(query, key, value, layout, scale=kwargs.get("scaling")), None


def use_block_attention(model: Any) -> Any:
    """Switch ``model`` (in place; returned) to ``"packed"`` attention: one call a layer over a packed row.

    Registers the implementation with transformers (once is enough; again is harmless). Results equal
    sdpa's (``tests/test_packing.py``) without computing the masked-out blocks of a packed row. The
    switch holds for the whole model object; ``model.set_attn_implementation("sdpa")`` goes back.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(BLOCK_ATTENTION, _block_attention)
    AttentionMaskInterface.register(BLOCK_ATTENTION, sdpa_mask)  # the masks sdpa gets, for the fallback
    model.set_attn_implementation(BLOCK_ATTENTION)
    if model.config._attn_implementation != BLOCK_ATTENTION:
        raise ValueError(f"{type(model).__name__} cannot switch its attention implementation")
    return model


def _check_attention(model: Any) -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(
            f"attention implementation {implementation!r} does not separate packed sequences by their "
            f"position ids; load the model with attn_implementation= one of {sorted(ALL_MASK_ATTENTION_FUNCTIONS)}"
        )


_LOGIT_SCALES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _decoder_and_head(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """The model's decoder and its plain linear LM head, or None when the head is anything else (a LoRA
    layer on the head, logit soft-capping or scaling): those models' logits come from their own forward."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings()
    config = inner.config
    if type(head) is not torch.nn.Linear or any(getattr(config, a, None) is not None for a in _LOGIT_SCALES):
        return None
    return inner.get_decoder(), head


def token_logprobs(
    model: Any, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N]`` of the batch's completion tokens under ``model`` (with grad), and entropies ``[N]``.

    Logits are divided by ``temperature`` before the softmax, as the sampler did (TRL does the same);
    half-precision logits are upcast to fp32. A target's log-prob is ``logit - logsumexp``, the entropy
    that of the tempered distribution (differentiable: detach it to log it), returned if ``with_entropy``,
    else None. Only the ``N`` completion positions go through the LM head, a chunk of rows at a time
    (``workbench.rl.logprob_head``: no [N, V] logits kept for the backward pass); a model whose head is not
    a plain linear layer gets its logits from its own forward (``logits_to_keep``). On ``packed``
    attention the row's layout goes with the forward and transformers builds no mask.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the sampler's temperature), got {temperature!r}")
    _check_attention(model)
    packed = model.config._attn_implementation == BLOCK_ATTENTION
    if batch.shared_tokens and not packed:
        raise ValueError(
            f"this row shares {batch.shared_tokens} prefix tokens between samples, which only "
            f"{BLOCK_ATTENTION!r} attention reads (use_block_attention); collate it with share_prefixes=False"
        )
    device = model.get_input_embeddings().weight.device
    if batch.input_ids.device != device:
        batch = batch.to(device)
    inputs: dict[str, Any] = {
        "input_ids": batch.input_ids,
        "position_ids": batch.position_ids,
        "use_cache": False,  # a cache turns off transformers' packed-sequence detection (module docstring)
    }
    if packed:
        inputs.update(attention_mask=_NO_MASK, row_layout=batch.layout)
    parts = _decoder_and_head(model)
    if parts is not None:
        decoder, head = parts
        hidden = decoder(**inputs).last_hidden_state[0].index_select(0, batch.completion_positions)
        logprobs, entropy = chunked_logprobs(
            hidden, head.weight, batch.target_ids, head.bias, temperature, with_entropy=with_entropy
        )
        return logprobs, (entropy if with_entropy else None)
    logits = model(**inputs, logits_to_keep=batch.completion_positions).logits[0]  # [N, V]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, batch.target_ids.unsqueeze(-1)).squeeze(-1) - normaliser
    entropy = None
    if with_entropy:
        # -sum p log p over the N rows only. Not ``normaliser - sum(p * logits)``: that form is off by
        # (1 - sum p) * normaliser, about 5e-4 nats in fp32 on a 49k vocabulary.
        row_logprobs = logits - normaliser.unsqueeze(-1)
        entropy = -(row_logprobs.exp() * row_logprobs).sum(-1)
    return logprobs, entropy

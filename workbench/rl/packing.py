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

That masked attention still computes the row's whole T x T: sdpa cannot skip the masked-out blocks
(flash-attention's varlen kernels on a GPU do). Measured on 2 cores with smollm2-135m, a row of
8 x 128 tokens costs 1.34x the same tokens as an [8, 128] batch, which eats what dropping the padding
saves: 20 long-tailed samples under a 1,024-token budget took 18.1 s packed against 17.4 s padded
(sorted by length) and 20.4 s padded in order (``python -m tests.perf.bench_packing``).
:func:`use_block_attention` switches a model to ``"packed_sdpa"``, sdpa on each sample's own causal
block: the 8 x 128 row then costs 1.02x the batch and the 20 samples 13.5 s. Inputs that are not one
packed row (generation, padded batches) go to plain sdpa unchanged.

Shared prefixes. A GRPO group's G samples share their prompt, and a few-shot role's prompts share their
examples: computing (and back-propagating through) each copy is most of a step when prompts are long and
completions short. With ``share_prefixes`` a sample's tokens that equal the start of the sequence laid
out just before it are left out of the row: its segment starts at the position where it departs (its
position ids start there, not at 0), and ``packed_sdpa`` lets that segment attend to those first
positions of the path it continues. The row is a prefix tree in depth-first order, each segment's first
position id saying how much of the path before it is its own; log-probs and gradients are those of the
samples computed one by one (the prefix's activations get the gradients of every sample that reads
them). Only ``packed_sdpa`` reads a row that way, so :func:`token_logprobs` refuses a shared row on any
other attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.binpack import check_sizes, ffd_pack
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
    shared_tokens: int = 0  # tokens left out of the row because a sample took them from the path before it

    @property
    def n_tokens(self) -> int:
        """Tokens in the row (T): all computed, none of them padding."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with its tensors on ``device``."""
        move = {k: getattr(self, k).to(device) for k in _TENSOR_FIELDS}
        return PackedBatch(**move, indices=list(self.indices), shared_tokens=self.shared_tokens)


_TENSOR_FIELDS = ("input_ids", "position_ids", "sample_index", "completion_positions", "target_ids", "mask")


def collate(samples: Sequence[Sample], indices: list[int], share_prefixes: bool = False) -> PackedBatch:
    """Pack ``samples[i] for i in indices`` into one row, in the order of ``indices``.

    Samples with an empty or fully masked completion are fine (they add context tokens only, or
    tokens whose ``mask`` is 0). A sample with a non-empty completion needs a non-empty prompt: its
    first completion token is predicted from the last prompt token.

    ``share_prefixes``: a sample's prompt tokens that equal the start of the sample laid out before it
    are not repeated (see the module docstring); the row then needs ``packed_sdpa`` attention.
    """
    if not indices:
        raise ValueError("a micro-batch needs at least one sample index")
    ids: list[int] = []
    positions: list[int] = []
    sample_index: list[int] = []
    completion_positions: list[int] = []
    targets: list[int] = []
    mask: list[int] = []
    shared_tokens = 0
    path: list[int] = []
    for k, i in enumerate(indices):
        sample = samples[i]
        prompt, completion = sample.prompt_ids, sample.completion_ids
        if len(sample.mask) != len(completion):
            raise ValueError(
                f"sample {i}: mask has {len(sample.mask)} entries for {len(completion)} completion tokens; "
                "pass one 0/1 per completion token"
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
        shared_tokens=shared_tokens,
    )


BLOCK_ATTENTION = "packed_sdpa"


def _segments(position_ids: torch.Tensor) -> list[int] | None:
    """Bounds ``[0, start_2, ..., T]`` of the sequences packed in a [1, T] row (a new one wherever the
    position does not go up by one, transformers' rule); None if the row holds a single sequence."""
    row = position_ids[0]
    breaks = ((row[1:] - row[:-1]) != 1).nonzero()[:, 0].add(1).tolist()
    return [0, *breaks, row.shape[0]] if breaks else None


def _block_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa on each packed sequence's own causal block; anything else goes to sdpa as is (``gqa_sdpa``).

    A packed row is recognised from the position ids alone (batch of one, no cache offset, positions
    restarting), and each block is causal: padding inside a packed row is not supported (``collate``
    never makes any). A block whose positions start at p > 0 continues the path laid out before it: it
    also sees that path's first p positions (shared prefixes, module docstring).
    """
    from workbench.backends.gqa_attention import gqa_sdpa

    position_ids = kwargs.get("position_ids")
    bounds = None
    if (
        position_ids is not None
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2] == position_ids.shape[-1]
    ):
        bounds = _segments(position_ids.reshape(1, -1))
    if bounds is None:
        return gqa_sdpa(module, query, key, value, attention_mask, **kwargs)
    starts = position_ids.reshape(-1)[bounds[:-1]].tolist()
    pieces = []
    # row spans holding positions 0, 1, ... of the path the next segment continues
    path: list[tuple[int, int]] = []
    for a, b, start in zip(bounds[:-1], bounds[1:], starts, strict=True):
        context = _first_positions(path, start)
        if not context:
            out = gqa_sdpa(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)
        else:  # a shared-prefix segment: the path's first ``start`` positions, then its own causal block
            keys = torch.cat([key[:, :, x:y] for x, y in context] + [key[:, :, a:b]], dim=2)
            values = torch.cat([value[:, :, x:y] for x, y in context] + [value[:, :, a:b]], dim=2)
            visible = torch.ones(b - a, start + b - a, dtype=torch.bool, device=query.device).tril(start)
            out = gqa_sdpa(module, query[:, :, a:b], keys, values, visible[None, None], **kwargs)
        pieces.append(out[0])
        path = [*context, (a, b)]
    return torch.cat(pieces, dim=1), None  # [1, T, heads, head_dim], as sdpa returns


def _first_positions(path: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The row spans of ``path`` that hold its first ``n`` positions."""
    out, left = [], n
    for x, y in path:
        if left <= 0:
            break
        out.append((x, min(y, x + left)))
        left -= y - x
    if left > 0:
        raise ValueError(
            f"a packed segment starts at position {n} but the path before it has only {n - left}"
        )
    return out


def use_block_attention(model: Any) -> Any:
    """Switch ``model`` (in place; returned) to ``"packed_sdpa"`` attention: per-sample causal blocks.

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


def token_logprobs(
    model: Any, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N]`` of the batch's completion tokens under ``model`` (with grad), and entropies ``[N]``.

    Logits are divided by ``temperature`` before the softmax, as the sampler did (TRL does the same).
    Only the ``N`` completion positions go through the LM head (``logits_to_keep``); half-precision
    logits are upcast to fp32. A target's log-prob is ``logit - logsumexp``; the full ``[N, V]``
    log-softmax is built only for the entropy (of the tempered distribution, differentiable: detach it
    to log it), returned if ``with_entropy``, else None.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the sampler's temperature), got {temperature!r}")
    _check_attention(model)
    if batch.shared_tokens and model.config._attn_implementation != BLOCK_ATTENTION:
        raise ValueError(
            f"this row shares {batch.shared_tokens} prefix tokens between samples, which only "
            f"{BLOCK_ATTENTION!r} attention reads (use_block_attention); collate it with share_prefixes=False"
        )
    device = model.get_input_embeddings().weight.device
    if batch.input_ids.device != device:
        batch = batch.to(device)
    out = model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        use_cache=False,  # a cache turns off transformers' packed-sequence detection (module docstring)
        logits_to_keep=batch.completion_positions,
    )
    logits = out.logits[0]  # [N, V]
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

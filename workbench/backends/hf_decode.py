"""The transformers backend's decode loop: a batch that sheds rows as they finish.

``model.generate`` keeps computing every row of a left-padded batch until the last one ends, so
with long-tailed completion lengths most of a batch's work goes to rows that are already done.
This loop runs the model with a KV cache and, whenever rows finish (their own ``max_tokens``,
end-of-sequence unless ``ignore_eos``, or a stop string), drops them from the batch and the cache.
Log-probs are taken from the same forward passes: the raw model distribution's log-probability of
each sampled token (before temperature, as vLLM reports them).

Rows with the same prompt (a GRPO group's G samples of one input) are prefilled once: the prompt's
forward runs on one copy and its cache and last logits are copied to every row that shares it, which
then sample on their own. A prefix all the batch's prompts share (a few-shot transcript, a system prompt)
is prefilled once too, its cache copied to every prompt before each prompt's own rest runs: a role whose
prompts repeat a 230-token transcript before a 20-token question prefills about a tenth of the tokens.

Sampling follows transformers' order: temperature, then top-k, then top-p. A row with a seed draws from a
generator of its own (seeded with it), so its tokens do not depend on the other rows of its batch; rows
without one draw from torch's global generator.
Attention is ``gqa_sdpa`` (``workbench.backends.gqa_attention``): a padded batch's mask would
otherwise make transformers copy every grouped key/value head at each step.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.backends.base import GenerationRequest


@torch.no_grad()
def decode(
    model: Any,
    tokenizer: Any,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    rows: list[GenerationRequest],
    eos_ids: list[int],
    seeds: list[int | None] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Completion ids and raw log-probs per row of a left-padded batch (one sampling setting), decoded on the
    device ``input_ids`` are on (the model's): the KV cache is made there. ``seeds`` (one per row, or None)
    gives the rows that have one a generator of their own."""
    first = rows[0]
    ids: list[list[int]] = [[] for _ in rows]
    logprobs: list[list[float]] = [[] for _ in rows]
    done = Done(tokenizer, rows, eos_ids)
    active = list(range(len(rows)))  # original row index of each row still in the batch
    cache, logits, mask = prefill(model, input_ids, attention)
    position = mask.sum(-1, keepdim=True)  # the next token's: every row's tokens so far, at 0, 1, ...
    generators = _generators(seeds, input_ids.device)
    while True:
        token = _sample(logits, first, None if generators is None else [generators[i] for i in active])
        chosen = logits.float().log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        keep = []
        # one device-to-host copy a step, not one a row
        for j, (i, t, lp) in enumerate(zip(active, token.tolist(), chosen.tolist(), strict=True)):
            ids[i].append(t)
            logprobs[i].append(lp)
            if not done(i, ids[i]):
                keep.append(j)
        if not keep:
            return ids, logprobs
        if len(keep) < len(active):
            index = torch.tensor(keep, device=token.device)
            cache.batch_select_indices(index)
            mask, token, position = mask[index], token[index], position[index]
            active = [active[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        logits = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        position = position + 1


#: The shortest prefix shared by every prompt of a batch that is prefilled once for all of them.
SHARED_PREFIX_MIN = 16


def prefill(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A left-padded batch's prompts run into a new ``DynamicCache``, each distinct prompt once (rows with the
    same prompt get copies of its cache and logits); returns the cache, every row's last logits and the
    attention mask the decode goes on with."""
    from transformers import DynamicCache

    cache = DynamicCache()
    firsts, copy_of = (index.to(input_ids.device) for index in _distinct_rows(input_ids, attention))
    logits, mask = _prefill(model, input_ids[firsts], attention[firsts], cache)
    if len(firsts) < input_ids.shape[0]:  # every row gets its prompt's cache and logits
        cache.batch_select_indices(copy_of)
        logits, mask = logits[copy_of], mask[copy_of]
    return cache, logits, mask


def _prefill(
    model: Any, input_ids: torch.Tensor, mask: torch.Tensor, cache: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the distinct prompts of a left-padded batch into ``cache``; returns each row's last logits and the
    attention mask the decode goes on with.

    The prefix every prompt shares (a few-shot transcript, a system prompt: at least ``SHARED_PREFIX_MIN``
    tokens, and never a whole prompt) is run once and its cache copied to every row; each row's own rest
    follows, left-padded after the prefix (``[prefix][pads][rest]``, positions counting real tokens only)."""
    # two reads of the batch, not one masked selection a row
    prompts = [
        [t for t, m in zip(ids, row_mask, strict=True) if m]
        for ids, row_mask in zip(input_ids.tolist(), mask.tolist(), strict=True)
    ]
    shared = _common_prefix(prompts) if len(prompts) > 1 else 0
    shared = min(shared, min(len(p) for p in prompts) - 1)
    if shared < SHARED_PREFIX_MIN:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1]  # fmt: skip
        return logits, mask
    device = input_ids.device
    prefix = torch.tensor([prompts[0][:shared]], device=device)
    model(input_ids=prefix, position_ids=torch.arange(shared, device=device)[None], past_key_values=cache,
          use_cache=True, logits_to_keep=1)  # fmt: skip
    cache.batch_repeat_interleave(len(prompts))
    rests = [p[shared:] for p in prompts]
    width = max(len(r) for r in rests)
    rest_ids = torch.zeros((len(rests), width), dtype=torch.long, device=device)
    rest_mask = torch.zeros((len(rests), width), dtype=mask.dtype, device=device)
    for i, rest in enumerate(rests):
        rest_ids[i, width - len(rest) :] = torch.tensor(rest, device=device)
        rest_mask[i, width - len(rest) :] = 1
    full = torch.cat([rest_mask.new_ones((len(rests), shared)), rest_mask], dim=1)
    positions = shared + (rest_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=rest_ids, attention_mask=full, position_ids=positions, past_key_values=cache, use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]  # fmt: skip
    return logits, full


def _common_prefix(prompts: list[list[int]]) -> int:
    """The number of leading tokens all ``prompts`` share."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for other in prompts[1:]:
        n = next((k for k in range(n) if other[k] != first[k]), n)
    return n


def _distinct_rows(input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct (ids, mask) pair, and for every row the position of its pair among them."""
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    firsts, copy_of = [], []
    for r, (ids, m) in enumerate(zip(input_ids.tolist(), mask.tolist(), strict=True)):
        key = (tuple(ids), tuple(m))
        if key not in seen:
            seen[key] = len(firsts)
            firsts.append(r)
        copy_of.append(seen[key])
    return torch.tensor(firsts), torch.tensor(copy_of)


def _generators(seeds: list[int | None] | None, device: torch.device) -> list[torch.Generator | None] | None:
    """A generator per seeded row (None for the others); None when no row has a seed."""
    if seeds is None or all(s is None for s in seeds):
        return None
    return [None if s is None else torch.Generator(device=device).manual_seed(s) for s in seeds]


def _sample(
    logits: torch.Tensor, request: GenerationRequest, generators: list[torch.Generator | None] | None = None
) -> torch.Tensor:
    if request.temperature == 0.0:
        return logits.argmax(-1)
    return _draw(scores_for(logits, request).softmax(-1), generators)


def scores_for(logits: torch.Tensor, request: GenerationRequest) -> torch.Tensor:
    """fp32 scores to sample from (a positive temperature): logits / temperature, then top-k, then top-p, the
    tokens left out at -inf."""
    scores = logits.float() / request.temperature
    if request.top_k:
        kth = scores.topk(min(request.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if request.top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > request.top_p  # keep the smallest set reaching top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, ordered)
    return scores


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None] | None = None) -> torch.Tensor:
    """One token a row, drawn from ``probs`` by inverting its cumulative sum at a uniform draw: the same
    distribution as ``torch.multinomial``, at a fraction of its cost over a large vocabulary. The sum is
    in float64, so even a very unlikely token keeps its exact share; a token of probability 0 is never drawn."""
    cdf = probs.double().cumsum(-1)
    if not torch.isfinite(cdf[:, -1]).all():
        raise ValueError("cannot sample: the model's probabilities are not finite (NaN or inf in its logits)")
    if generators is None:
        u = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device)
    else:  # each seeded row from its own generator, the others from the global one
        u = torch.cat(
            [torch.rand(1, 1, dtype=torch.float64, device=probs.device, generator=g) for g in generators]
        )
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, side="right").squeeze(-1).clamp(max=probs.shape[-1] - 1)


class Done:
    """Whether a row has finished: its own limit, end-of-sequence (unless ``ignore_eos``), a stop string.

    Stop strings are checked on decoded text (transformers' token-string matching can end a row early),
    on the tail of the completion long enough to hold any of them.
    """

    def __init__(self, tokenizer: Any, rows: list[GenerationRequest], eos_ids: list[int]):
        self.tokenizer, self.rows, self.eos = tokenizer, rows, set(eos_ids)
        self.stops = [[s for s in r.stop if s] for r in rows]
        longest = max((len(s.encode()) for stops in self.stops for s in stops), default=1)
        self.tail = 4 * longest + 4  # tokens: >= 1 byte each

    def __call__(self, i: int, ids: list[int]) -> bool:
        row = self.rows[i]
        if len(ids) >= row.max_tokens or (not row.ignore_eos and ids[-1] in self.eos):
            return True
        if not self.stops[i]:
            return False
        text = self.tokenizer.decode(ids[-self.tail :], skip_special_tokens=False)
        return any(s in text for s in self.stops[i])

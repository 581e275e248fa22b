"""Random GRPO groups of training samples for trainer tests: each group one prompt, several completions."""

from __future__ import annotations

import random

from workbench.rl.samples import Sample


def grpo_groups(
    vocab: int,
    groups: int,
    size: int,
    seed: int = 0,
    prompt: int = 12,
    longest: int = 10,
    engine_logprob: float = 0.0,
    prompt_growth: int = 0,
    roles: tuple[str, ...] | None = None,
    policy: str = "p",
) -> list[Sample]:
    """``groups`` groups of ``size`` samples: group g's prompt has ``prompt + g * prompt_growth`` tokens, each
    completion 3 to ``longest``; advantages centred in each group; ``roles`` taken in turn (else the default)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt_ids = [rng.randrange(10, vocab) for _ in range(prompt + g * prompt_growth)]
        for i in range(size):
            completion = [rng.randrange(10, vocab) for _ in range(rng.randint(3, longest))]
            role = {} if roles is None else {"role": roles[i % len(roles)]}
            out.append(
                Sample(
                    prompt_ids,
                    completion,
                    [1] * len(completion),
                    [engine_logprob] * len(completion),
                    advantage=i - (size - 1) / 2,
                    policy=policy,
                    **role,
                )
            )
    return out

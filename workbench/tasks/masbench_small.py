"""MASBench's Depth axis at the scale of a 135M model: chains of single-digit additions.

MASBench (``workbench.tasks.masbench``) builds iGSM problems with every number mod 23, which a 135M
model cannot solve one step of. These keep the axis and shrink the step: a depth-``d`` task is a chain
of ``d`` additions, each step adding a digit to the value before it,

    ``Let a = 2 + 3. Let b = a + 4. What is b?``  (depth 2, answer 9),

so the longest dependency chain ending at the query has ``d`` steps, and every step is one addition a
135M sub-agent gets right about half the time when asked alone ("What is 5 + 4? Answer with just the
number."). Every value in the chain stays at most ``max_value`` (default 9: single-digit sums, where
SmolLM2-135M is partly right, see DESIGN.md), so a task is as hard as its depth. A task that is split
into one sub-agent per step (the orchestrator's high degree of MAS) asks the sub-agents single sums; one
sub-agent given the whole chain has to do all of it at once.

Answers are integers checked by the ``number`` verifier. ``metadata`` holds ``axis`` (``"depth"``),
``axis_value`` and ``difficulty`` (the depth, as MASBench tasks do) and ``steps``, the chain as
``[[name, left, right, value], ...]`` (``left`` is the previous step's name after the first step), so
the answer can be recomputed without this module.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from workbench.tasks.errors import TaskGenerationError, TaskOptionError
from workbench.tasks.registry import register_generator
from workbench.tasks.task import Task

AXES = ("depth",)
MAX_DEPTH = 6
# The chain's variables: distinct letters drawn per task (not i, l or o, which read like digits).
NAMES = "".join(c for c in string.ascii_lowercase if c not in "ilo")
_ATTEMPTS = 200


def _depths(values: int | Sequence[int]) -> list[int]:
    wanted = [values] if isinstance(values, int) else list(values)
    if not wanted or any(
        isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DEPTH for v in wanted
    ):
        raise TaskOptionError(
            f"masbench_small depth values must be in 1..{MAX_DEPTH} (or a list of such), got {values!r}"
        )
    return wanted


def chain(rng: random.Random, depth: int, max_value: int) -> list[list[int | str]]:
    """``depth`` addition steps ``[name, left, right, value]``; every value at most ``max_value``.

    The answer is drawn uniformly from ``depth + 1 .. max_value`` (so no answer is a safe guess at any
    depth), then cut into ``depth + 1`` positive single digits: the first step adds two of them, every
    later step adds the next to the value before it. Names are distinct letters.
    """
    if max_value < depth + 1:
        raise TaskOptionError(
            f"masbench_small: a depth-{depth} chain adds {depth + 1} positive digits, so max_value must be at "
            f"least {depth + 1}, got {max_value}"
        )
    names = rng.sample(NAMES, depth)
    while True:
        answer = rng.randint(depth + 1, max_value)
        cuts = sorted(rng.sample(range(1, answer), depth))
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, answer], strict=True)]
        if max(parts) <= 9:
            break
    steps: list[list[int | str]] = [[names[0], parts[0], parts[1], parts[0] + parts[1]]]
    for i in range(1, depth):
        steps.append([names[i], names[i - 1], parts[i + 1], int(steps[-1][3]) + parts[i + 1]])
    return steps


def render(steps: Sequence[Sequence[int | str]]) -> str:
    """``Let a = 2 + 3. Let b = a + 4. What is b?`` (with the chain's own names)."""
    lets = " ".join(f"Let {name} = {left} + {right}." for name, left, right, _ in steps)
    return f"{lets} What is {steps[-1][0]}?"


@register_generator("masbench_small")
def generate_masbench_small(
    n: int,
    seed: int,
    *,
    axis: str = "depth",
    values: int | Sequence[int] = (1, 2, 3),
    max_value: int = 9,
    split: str = "train",
) -> list[Task]:
    """``n`` distinct chains; task ``i`` has depth ``values[i % len(values)]``; ``split`` changes the stream."""
    if axis not in AXES:
        raise TaskOptionError(f"masbench_small has the axis {', '.join(AXES)} only, got {axis!r}")
    depths = _depths(values)
    if isinstance(max_value, bool) or not isinstance(max_value, int):
        raise TaskOptionError(f"masbench_small max_value must be an int, got {max_value!r}")
    rng = random.Random(f"masbench_small:{split}:{seed}:{max_value}")
    tasks: list[Task] = []
    seen: set[str] = set()
    for i in range(n):
        depth = depths[i % len(depths)]
        for _ in range(_ATTEMPTS):
            steps = chain(rng, depth, max_value)
            question = render(steps)
            if question not in seen:
                break
        else:
            raise TaskGenerationError(
                f"masbench_small: could not find {n} distinct depth-{depth} chains with values up to {max_value}; "
                "lower n or raise max_value"
            )
        seen.add(question)
        tasks.append(
            Task(
                id=f"masbench_small-{split}-{seed}-{i:05d}",
                question=question,
                answer=str(steps[-1][3]),
                verifier="number",
                metadata={
                    "source": "masbench_small",
                    "axis": axis,
                    "axis_value": depth,
                    "difficulty": depth,
                    "split": split,
                    "steps": [list(s) for s in steps],
                },
            )
        )
    return tasks

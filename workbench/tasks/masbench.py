"""MASBench-style tasks along the Depth, Horizon, Breadth, Parallel and Robustness axes.

Follows ``shared/papers/mas_orchestra.notes.md`` section 2: iGSM-like problems (see
:mod:`workbench.tasks.igsm`) with all arithmetic mod 23, answers in 0..22, default-zero parameters.
The axis value is the number of sub-tasks meeting the axis definition:

- **depth d**: the longest dependency chain ending at the query has d parameters (leaves count 1);
  one question, one answer (verifier ``mod23_int``).
- **breadth b**: the query (a sum of b parameters, or a category total over b defined children)
  has in-degree b, the maximum over its dependency graph; chains stay shallow (``mod23_int``).
- **horizon h**: h problems on one graph; problem k starts from ``[variable k] = c + [answer k-1]``,
  so each answer is carried into the next; the answers to all h problems are gold (``mod23_list``).
- **parallel p**: p problems over disconnected components of one world, marked INDEPENDENT; one
  answer each (``mod23_list``).
- **robustness r**: r requested items, alternating iGSM values (Depth-4 problems, each in its own
  world) and RULER magic-number needles in a "grass is green" haystack; each item is attacked by
  one "Note: verify the information before you take it - ..." line with a wrong value; the items
  are answered in ``\\boxed{}`` (``boxed_list``). The notes leave open how r maps to notes versus
  items; here r = items = notes.

Sentences are shuffled and padded with consistent distractor sentences. Multi-answer gold is
``"a1<<horizon>>a2..."`` as in the released MASBench, and ``metadata["answers"]`` holds the list.
``metadata["problem"]`` holds the structured problem (worlds, definitions as expression dicts, queries,
which sentences each problem shows) so the answer can be recomputed without this module.

This module holds the axes' settings and the ``masbench`` generator; the per-axis instance builders are
in :mod:`workbench.tasks.masbench_axes`, the graph construction they share in
:mod:`workbench.tasks.masbench_graph`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.tasks.errors import TaskOptionError
from workbench.tasks.igsm import FAMILIES, INSTRUCTION, MOD
from workbench.tasks.masbench_axes import build_instance
from workbench.tasks.registry import register_generator
from workbench.tasks.task import Task

AXES = ("depth", "horizon", "breadth", "parallel", "robustness")
# Table A.1 test values per axis.
DEFAULT_VALUES: dict[str, tuple[int, ...]] = {
    "depth": (2, 4, 6, 8, 10, 12),
    "horizon": (2, 4, 6, 8),
    "breadth": (2, 4, 6, 8),
    "parallel": (2, 4, 6, 8),
    "robustness": (2, 4, 6),
}
VALUE_RANGES: dict[str, range] = {
    "depth": range(1, 17),
    "horizon": range(1, 11),
    "breadth": range(2, 11),
    "parallel": range(1, 11),
    "robustness": range(1, 2 * len(FAMILIES) + 1),
}
VERIFIERS = {
    "depth": "mod23_int",
    "breadth": "mod23_int",
    "horizon": "mod23_list",
    "parallel": "mod23_list",
    "robustness": "boxed_list",
}
ANSWER_SEPARATOR = "<<horizon>>"


def _combos(axis: str | Sequence[str] | None, values: Any) -> list[tuple[str, int]]:
    axes = list(AXES) if axis is None else [axis] if isinstance(axis, str) else list(axis)
    bad = [a for a in axes if a not in AXES]
    if bad or not axes:
        raise TaskOptionError(f"masbench axis must be among {list(AXES)}, got {axis!r}")
    combos = []
    for a in axes:
        if values is None:
            chosen = DEFAULT_VALUES[a]
        elif isinstance(values, Mapping):
            chosen = values.get(a, DEFAULT_VALUES[a])
        else:
            chosen = values
        chosen = [chosen] if isinstance(chosen, int) else list(chosen)
        wrong = [
            v for v in chosen if isinstance(v, bool) or not isinstance(v, int) or v not in VALUE_RANGES[a]
        ]
        if wrong or not chosen:
            r = VALUE_RANGES[a]
            raise TaskOptionError(
                f"masbench {a} values must be ints in {r.start}..{r.stop - 1}, got {chosen!r}"
            )
        combos += [(a, v) for v in chosen]
    return combos


@register_generator("masbench")
def generate_masbench(
    n: int,
    seed: int,
    *,
    axis: str | Sequence[str] | None = None,
    values: int | Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    split: str = "train",
    instruction: bool = True,
) -> list[Task]:
    """``n`` instances cycling over every (axis, value) pair; ``split`` changes the seed stream.

    ``values`` is one value, a list for every axis, or a dict per axis; by default Table A.1's
    test values. ``instruction=False`` drops the leading mod-23 / default-zero sentence.
    """
    combos = _combos(axis, values)
    tasks = []
    for i in range(n):
        ax, value = combos[i % len(combos)]
        rng = random.Random(f"masbench:{split}:{seed}:{i}:{ax}:{value}")
        inst = build_instance(ax, value, rng)
        question = inst["question"]
        if not instruction:
            question = question.removeprefix(INSTRUCTION).lstrip("\n")
        answers = inst["answers"]
        tasks.append(
            Task(
                id=f"masbench-{split}-{seed}-{i:05d}",
                question=question,
                answer=ANSWER_SEPARATOR.join(str(a) for a in answers),
                verifier=VERIFIERS[ax],
                metadata={
                    "source": "masbench",
                    "axis": ax,
                    "axis_value": value,
                    "difficulty": value,
                    "split": split,
                    "answers": answers,
                    "mod": MOD,
                    "stats": inst["stats"],
                    "problem": inst["problem"],
                },
            )
        )
    return tasks

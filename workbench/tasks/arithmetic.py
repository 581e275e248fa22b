"""Arithmetic problems in five graded difficulty levels, for Solver/Verifier/Corrector topologies.

Levels (``level=``):
  1. single-digit addition, ``What is 3 + 5?``;
  2. two-digit addition or subtraction;
  3. multiplication, alone or mixed with addition/subtraction (parentheses where needed);
  4. word problems with 2-3 operations (+, -, x) on small numbers;
  5. harder word problems with 3-4 operations, larger numbers and exact division.

``format="boxed"`` asks for the answer in ``\\boxed{}`` (verifier ``boxed_math``); ``format="plain"``
asks for just the number (verifier ``number``: the boxed answer, else the last number), which suits
small local models that rarely write ``\\boxed{}`` unprompted. Every task's metadata holds
``operands`` and ``operators``; the answer is their left-to-right fold, which is what the text means.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from workbench.tasks.errors import TaskOptionError
from workbench.tasks.registry import register_generator
from workbench.tasks.task import Task

LEVELS = (1, 2, 3, 4, 5)
FORMATS = {
    "boxed": ("Put your final answer in \\boxed{}.", "boxed_math"),
    "plain": ("Answer with just the number.", "number"),
}
_SYMBOL = {"+": "+", "-": "-", "*": "×", "/": "÷"}

_PEOPLE = [
    ("Ava", "she"),
    ("Ben", "he"),
    ("Chloe", "she"),
    ("Dario", "he"),
    ("Elena", "she"),
    ("Farid", "he"),
    ("Grace", "she"),
    ("Hiro", "he"),
    ("Ines", "she"),
    ("Jonas", "he"),
    ("Keiko", "she"),
    ("Liam", "he"),
]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "books", "coins", "shells", "cards", "stamps", "beads"]
_STEP_TEMPLATES = {
    "+": [
        "{Subj} buys {x} more.",
        "{Subj} finds {x} more {items}.",
        "A friend gives {name} {x} more {items}.",
    ],
    "-": ["{Subj} gives {x} of them away.", "{Subj} sells {x} of them.", "{Subj} loses {x} of them."],
    "*": ["Then {subj} ends up with {x} times as many {items} as before."],
    "/": ["Then {subj} splits the {items} equally into {x} boxes and keeps only one box."],
}


def apply(op: str, left: int, right: int) -> int:
    """One arithmetic step; division is exact integer division (generators only emit exact ones)."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        return left // right
    raise TaskOptionError(f"unknown arithmetic operator {op!r}; use one of + - * /")


def fold(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Left-to-right evaluation: ``((a op1 b) op2 c) ...``."""
    value = operands[0]
    for op, x in zip(operators, operands[1:], strict=True):
        value = apply(op, value, x)
    return value


def render_expression(operands: Sequence[int], operators: Sequence[str]) -> str:
    """Infix text whose usual precedence reading equals the left fold (adds parentheses as needed)."""
    text = str(operands[0])
    previous = None
    for op, x in zip(operators, operands[1:], strict=True):
        if op in "*/" and previous in ("+", "-"):
            text = f"({text})"
        text = f"{text} {_SYMBOL[op]} {x}"
        previous = op
    return text


def _level1(rng: random.Random) -> tuple[list[int], list[str]]:
    return [rng.randint(0, 9), rng.randint(0, 9)], ["+"]


def _level2(rng: random.Random) -> tuple[list[int], list[str]]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return [a, b], ["+"]
    return [max(a, b), min(a, b)], ["-"]


def _level3(rng: random.Random) -> tuple[list[int], list[str]]:
    if rng.random() < 0.35:
        return [rng.randint(2, 12), rng.randint(2, 12)], ["*"]
    while True:
        other = rng.choice(["+", "-"])
        ops = ["*", other] if rng.random() < 0.5 else [other, "*"]
        operands = [rng.randint(2, 12), rng.randint(2, 12), rng.randint(2, 20)]
        if ops[0] == "*":
            operands = [rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 30)]
        if _valid(operands, ops):
            return operands, ops


def _valid(operands: Sequence[int], operators: Sequence[str], limit: int = 10_000) -> bool:
    value = operands[0]
    for op, x in zip(operators, operands[1:], strict=True):
        if op == "/" and (x == 0 or value % x):
            return False
        value = apply(op, value, x)
        if value < 0 or value > limit:
            return False
    return True


def _word_steps(rng: random.Random, level: int) -> tuple[list[int], list[str]]:
    n_ops, start, add_range, mul_range, ops_pool, limit = (
        (rng.randint(2, 3), (2, 30), (1, 20), (2, 4), ["+", "-", "*"], 200)
        if level == 4
        else (rng.randint(3, 4), (10, 99), (5, 99), (2, 9), ["+", "-", "*", "/"], 2000)
    )
    while True:
        value = rng.randint(*start)
        operands, operators = [value], []
        for _ in range(n_ops):
            op = rng.choice(ops_pool)
            if op in "+-":
                x = rng.randint(*add_range)
                if op == "-" and value == 0:
                    op = "+"
                elif op == "-" and x > value:
                    x = rng.randint(1, value)
            elif op == "*":
                x = rng.randint(*mul_range)
            else:
                divisors = [d for d in range(2, 10) if value and value % d == 0]
                if not divisors:
                    op, x = "+", rng.randint(*add_range)
                else:
                    x = rng.choice(divisors)
            operands.append(x)
            operators.append(op)
            value = apply(op, value, x)
        if level == 5 and not {"*", "/"} & set(operators):
            continue
        if _valid(operands, operators, limit):
            return operands, operators


def _word_text(rng: random.Random, operands: Sequence[int], operators: Sequence[str]) -> str:
    name, subj = rng.choice(_PEOPLE)
    items = rng.choice(_ITEMS)
    parts = [f"{name} has {operands[0]} {items}."]
    for op, x in zip(operators, operands[1:], strict=True):
        template = rng.choice(_STEP_TEMPLATES[op])
        parts.append(template.format(Subj=subj.capitalize(), subj=subj, name=name, items=items, x=x))
    parts.append(f"How many {items} does {name} have now?")
    return " ".join(parts)


def _levels(level: int | Sequence[int]) -> list[int]:
    levels = [level] if isinstance(level, int) else list(level)
    if not levels or any(isinstance(v, bool) or v not in LEVELS for v in levels):
        raise TaskOptionError(
            f"arithmetic level must be one of {list(LEVELS)} or a list of them, got {level!r}"
        )
    return levels


@register_generator("arithmetic")
def generate_arithmetic(
    n: int,
    seed: int,
    *,
    level: int | Sequence[int] = LEVELS,
    format: str = "boxed",
    verifier: str | None = None,
) -> list[Task]:
    """``n`` arithmetic tasks; task ``i`` has level ``levels[i % len(levels)]`` and its own seeded RNG."""
    levels = _levels(level)
    if format not in FORMATS:
        raise TaskOptionError(f"arithmetic format must be one of {sorted(FORMATS)}, got {format!r}")
    instruction, default_verifier = FORMATS[format]
    tasks = []
    for i in range(n):
        lvl = levels[i % len(levels)]
        rng = random.Random(f"arithmetic:{seed}:{i}")
        if lvl <= 3:
            operands, operators = (_level1, _level2, _level3)[lvl - 1](rng)
            problem, kind = f"What is {render_expression(operands, operators)}?", "expression"
        else:
            operands, operators = _word_steps(rng, lvl)
            problem, kind = _word_text(rng, operands, operators), "word"
        tasks.append(
            Task(
                id=f"arithmetic-{seed}-{i:05d}",
                question=f"{problem} {instruction}",
                answer=str(fold(operands, operators)),
                verifier=verifier or default_verifier,
                metadata={
                    "source": "arithmetic",
                    "level": lvl,
                    "difficulty": lvl,
                    "kind": kind,
                    "format": format,
                    "operands": operands,
                    "operators": operators,
                    "seed": seed,
                },
            )
        )
    return tasks

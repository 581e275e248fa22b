"""Arithmetic generator: answers recomputed independently from metadata and from the question text."""

from __future__ import annotations

import ast
import operator
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.tasks import TaskOptionError, generate

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


def fold(operands, operators):
    value = operands[0]
    for op, x in zip(operators, operands[1:], strict=True):
        value = OPS[op](value, x)
    return value


def eval_expression(text: str) -> int:
    """Evaluate "(3 + 4) × 5" with Python's own parser (only numbers and + - * allowed)."""
    source = text.replace("×", "*")
    assert re.fullmatch(r"[\d\s+\-*()]+", source), source
    node = ast.parse(source, mode="eval")
    bin_ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def go(n):
        if isinstance(n, ast.Expression):
            return go(n.body)
        if isinstance(n, ast.Constant):
            return n.value
        assert isinstance(n, ast.BinOp)
        return bin_ops[type(n.op)](go(n.left), go(n.right))

    return go(node)


STEP_PATTERNS = [
    (re.compile(r"buys (\d+) more"), "+"),
    (re.compile(r"finds (\d+) more"), "+"),
    (re.compile(r"gives \w+ (\d+) more"), "+"),
    (re.compile(r"(?:gives|sells|loses) (\d+) of them"), "-"),
    (re.compile(r"with (\d+) times as many"), "*"),
    (re.compile(r"into (\d+) boxes and keeps only one"), "/"),
]


def eval_word_problem(text: str) -> int:
    sentences = re.split(r"(?<=[.?])\s+", text)
    value = int(re.search(r"has (\d+) \w+\.", sentences[0]).group(1))
    for sentence in sentences[1:]:
        for pattern, op in STEP_PATTERNS:
            m = pattern.search(sentence)
            if m:
                x = int(m.group(1))
                if op == "/":
                    assert value % x == 0, "division must be exact"
                value = OPS[op](value, x)
                break
    return value


@pytest.fixture(scope="module")
def tasks():
    return generate("arithmetic", 500, seed=3)


def test_answers_match_metadata_and_text(tasks):
    for task in tasks:
        md = task.metadata
        assert int(task.answer) == fold(md["operands"], md["operators"])
        problem = task.question.removesuffix(" Put your final answer in \\boxed{}.")
        assert problem != task.question
        if md["kind"] == "expression":
            expr = re.fullmatch(r"What is (.+)\?", problem).group(1)
            assert eval_expression(expr) == int(task.answer), task.question
        else:
            assert eval_word_problem(problem) == int(task.answer), task.question


def test_levels_are_graded(tasks):
    by_level = {lvl: [t for t in tasks if t.metadata["level"] == lvl] for lvl in range(1, 6)}
    assert all(len(v) == 100 for v in by_level.values())
    for t in by_level[1]:
        assert t.metadata["operators"] == ["+"] and all(0 <= x <= 9 for x in t.metadata["operands"])
    for t in by_level[2]:
        assert t.metadata["operators"] in (["+"], ["-"]) and all(
            10 <= x <= 99 for x in t.metadata["operands"]
        )
        assert int(t.answer) >= 0
    for t in by_level[3]:
        assert "*" in t.metadata["operators"]
    assert any(len(t.metadata["operators"]) == 2 for t in by_level[3])
    for t in by_level[4]:
        assert 2 <= len(t.metadata["operators"]) <= 3 and t.metadata["kind"] == "word"
    for t in by_level[5]:
        assert 3 <= len(t.metadata["operators"]) <= 4 and {"*", "/"} & set(t.metadata["operators"])
    assert any("/" in t.metadata["operators"] for t in by_level[5])
    for t in tasks:
        assert int(t.answer) >= 0


def test_boxed_and_plain_formats():
    boxed = generate("arithmetic", 5, seed=0, level=1)
    plain = generate("arithmetic", 5, seed=0, level=1, format="plain")
    assert all("\\boxed{}" in t.question and t.verifier == "boxed_math" for t in boxed)
    assert all(t.question.endswith("Answer with just the number.") and t.verifier == "number" for t in plain)
    assert [t.answer for t in boxed] == [t.answer for t in plain]
    assert generate("arithmetic", 1, seed=0, verifier="exact")[0].verifier == "exact"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**40), level=st.sampled_from([1, 2, 3, 4, 5]))
def test_deterministic_per_seed(seed, level):
    a = generate("arithmetic", 6, seed=seed, level=level)
    assert a == generate("arithmetic", 6, seed=seed, level=level)
    for t in a:
        assert int(t.answer) == fold(t.metadata["operands"], t.metadata["operators"])


def test_different_seeds_differ_and_prefix_is_stable():
    a = generate("arithmetic", 40, seed=1)
    assert [t.question for t in a] != [t.question for t in generate("arithmetic", 40, seed=2)]
    assert generate("arithmetic", 10, seed=1) == a[:10]
    assert len({t.id for t in a}) == len(a)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"level": 0}, "level must be one of"),
        ({"level": [1, 9]}, "level must be one of"),
        ({"format": "latex"}, "format must be one of"),
    ],
)
def test_bad_options(options, fragment):
    with pytest.raises(TaskOptionError, match=fragment):
        generate("arithmetic", 2, seed=0, **options)

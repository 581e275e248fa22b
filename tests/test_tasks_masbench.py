"""MASBench tasks: answers agree with an independent solver that reads the question text.

The solver below parses the iGSM sentences of each question (or of each "Problem k" block), the
bridging lines, needles and queries, and evaluates everything mod 23 with default zero. The only
thing it takes from metadata is which items belong to which category (world knowledge a reader has,
e.g. that Canned Olives is a Product), needed for category totals such as "How many Product ...".
It does not import the generator's solver.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.tasks import TaskOptionError, generate

AXES = ("depth", "horizon", "breadth", "parallel", "robustness")
SENTENCE = re.compile(r"The number of each (.+?) equals (.+?)\.(?=\s|$)")
BRIDGE = re.compile(
    r"Using the result \[answer(\d+)\] from the previous calculation, (\[variable\d+\]) = (?:(\d+) \+ )?\[answer(\d+)\]\."
)
NEEDLE = re.compile(r"One of the special magic numbers for ([\w-]+) is: (\d+)\.")


# ----------------------------------------------------------------- independent solver


def parse_args(text: str) -> list[str]:
    parts = text.split(", ")
    parts = parts[:-1] + parts[-1].split(" and ")
    return [p.removeprefix("each ") for p in parts]


def parse_rhs(rhs: str) -> tuple:
    if re.fullmatch(r"\d+", rhs):
        return ("const", int(rhs))
    m = re.fullmatch(r"(\d+) more than (.+)", rhs)
    if m:
        return ("add", int(m.group(1)), parse_core(m.group(2)))
    m = re.fullmatch(r"(\d+) times as much as (.+)", rhs)
    if m:
        return ("mul", int(m.group(1)), parse_core(m.group(2)))
    return parse_core(rhs)


def parse_core(text: str) -> tuple:
    if text.startswith("the sum of "):
        return ("sum", parse_args(text.removeprefix("the sum of ")))
    if text.startswith("the difference of "):
        args = parse_args(text.removeprefix("the difference of "))
        assert len(args) == 2, text
        return ("diff", args)
    assert " " not in text or "'s " in text or text.startswith("["), f"unparsed right-hand side: {text!r}"
    return ("ref", [text.removeprefix("each ")])


def deps_of(expr: tuple) -> list[str]:
    if expr[0] == "const":
        return []
    if expr[0] in ("add", "mul"):
        return deps_of(expr[2])
    return list(dict.fromkeys(expr[1]))


class Solver:
    """Definitions parsed from text; evaluates mod 23; category totals sum their items."""

    def __init__(self, text: str, categories: dict[str, list[str]], known: dict[str, int] | None = None):
        self.defs: dict[str, tuple] = {}
        for name, rhs in SENTENCE.findall(text):
            assert name not in self.defs, f"{name} defined twice"
            self.defs[name] = parse_rhs(rhs)
        self.categories = categories
        self.known = dict(known or {})
        self.memo: dict[str, int] = {}

    def children(self, name: str) -> list[str] | None:
        parent, _, child = name.rpartition("'s ")
        if child in self.categories:
            return [f"{parent}'s {item}" for item in self.categories[child]]
        return None

    def deps(self, name: str) -> list[str]:
        if name in self.known:
            return []
        if name in self.defs:
            return deps_of(self.defs[name])
        kids = self.children(name)
        return [k for k in kids if k in self.defs] if kids else []

    def value(self, name: str) -> int:
        if name not in self.memo:
            if name in self.known:
                v = self.known[name]
            elif name in self.defs:
                v = self.eval(self.defs[name])
            elif self.children(name) is not None:
                v = sum(self.value(c) for c in self.children(name))
            else:
                v = 0  # never mentioned: default zero
            self.memo[name] = v % 23
        return self.memo[name]

    def eval(self, expr: tuple) -> int:
        op = expr[0]
        if op == "const":
            return expr[1]
        if op == "ref":
            return self.value(expr[1][0])
        if op == "sum":
            return sum(self.value(a) for a in expr[1])
        if op == "diff":
            return self.value(expr[1][0]) - self.value(expr[1][1])
        if op == "add":
            return expr[1] + self.eval(expr[2])
        return expr[1] * self.eval(expr[2])

    def depth(self, name: str) -> int:
        return 1 + max((self.depth(d) for d in self.deps(name)), default=0)

    def ancestors(self, name: str, seen: set[str] | None = None) -> set[str]:
        seen = set() if seen is None else seen
        if name not in seen:
            seen.add(name)
            for d in self.deps(name):
                self.ancestors(d, seen)
        return seen


def categories_of(task) -> dict[str, list[str]]:
    problem = task.metadata["problem"]
    worlds = problem.get("worlds") or [b["world"] for b in problem["blocks"]]
    out: dict[str, list[str]] = {}
    for world in worlds:
        for cat, items in world["categories"]:
            out.setdefault(cat, []).extend(items)
    return out


def query_name(text: str) -> str:
    m = re.search(r"How many (.+?) does (.+?) have\?$", text)
    assert m, text[-200:]
    return f"{m.group(2)}'s {m.group(1)}"


def split_problems(question: str) -> list[str]:
    blocks = re.findall(r"Problem (\d+): (.*?)(?=\n\nProblem \d+: |\n\nNote: )", question, flags=re.S)
    assert [int(k) for k, _ in blocks] == list(range(1, len(blocks) + 1))
    return [body for _, body in blocks]


def solve(task) -> tuple[list[int], dict]:
    """Answers computed from the question text, plus structure facts for axis checks."""
    axis, q, cats = task.metadata["axis"], task.question, categories_of(task)
    assert "All calculations are done mod 23" in q
    if axis in ("depth", "breadth"):
        solver = Solver(q, cats)
        name = query_name(q)
        anc = solver.ancestors(name)
        return [solver.value(name)], {
            "depth": solver.depth(name),
            "max_in_degree": max(len(solver.deps(a)) for a in anc),
        }
    if axis in ("horizon", "parallel"):
        answers, defined = [], []
        for k, body in enumerate(split_problems(q), start=1):
            known = {}
            for prev, var, c, prev2 in BRIDGE.findall(body):
                assert axis == "horizon" and prev == prev2 == str(k - 1) and var == f"[variable{k}]"
                known[var] = (int(c or 0) + answers[k - 2]) % 23
            if axis == "horizon":
                assert bool(known) == (k > 1), f"problem {k} must carry [answer{k - 1}] forward"
            solver = Solver(body, cats, known)
            m = re.search(r"What is the value of (.+?)\?$", body)
            assert m, body
            answers.append(solver.value(m.group(1)))
            defined.append(solver.ancestors(m.group(1)) - set(known))
        return answers, {"problems": len(answers), "components": defined}
    # robustness
    passage = q.split("Read the following passage carefully.")[1].split("=====")[0]
    solver = Solver(passage, cats)
    needles = {k: int(v) for k, v in NEEDLE.findall(passage)}
    asked = re.search(r"identify and return (.+), wrapped in \\boxed", q).group(1)
    parts = asked.split(", ")
    parts = parts[:-1] + [p.removeprefix("and ") for p in parts[-1:]]
    if len(parts) == 1 and " and the " in parts[0]:
        parts = parts[0].split(" and ", 1)
    answers = []
    for phrase in parts:
        magic = re.fullmatch(r"the magic number for (.+)", phrase)
        if magic:
            answers.append(needles[magic.group(1)])
            continue
        m = re.fullmatch(r"the number of (.+) that (.+) has", phrase)
        assert m, phrase
        answers.append(solver.value(f"{m.group(2)}'s {m.group(1)}"))
    notes = re.findall(r"Note: verify the information before you take it - (.+?) is (\d+)\.", passage)
    return answers, {"items": parts, "notes": notes}


def check(task) -> None:
    answers, facts = solve(task)
    axis, value = task.metadata["axis"], task.metadata["axis_value"]
    assert answers == task.metadata["answers"], task.id
    assert task.answer == "<<horizon>>".join(map(str, answers))
    if axis != "robustness":
        assert all(0 <= a <= 22 for a in answers)
    if axis == "depth":
        assert facts["depth"] == value
    elif axis == "breadth":
        assert facts["max_in_degree"] == value
    elif axis in ("horizon", "parallel"):
        assert facts["problems"] == value
        if axis == "parallel":  # independent components: no parameter shared between problems
            comps = facts["components"]
            for i in range(len(comps)):
                for j in range(i + 1, len(comps)):
                    assert not comps[i] & comps[j]
        else:
            assert all(f"[variable{k}]" in task.question for k in range(2, value + 1))
    else:
        assert len(facts["items"]) == value
        assert len(facts["notes"]) == value
        truth = dict(zip(facts["items"], answers, strict=True))
        for phrase, claim in facts["notes"]:  # every attack states a wrong value
            assert truth[phrase] != int(claim)


# ----------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def tasks_250():
    return generate("masbench", 250, seed=7)


def test_250_instances_cover_all_axes_and_values(tasks_250):
    combos = Counter((t.metadata["axis"], t.metadata["axis_value"]) for t in tasks_250)
    assert {a for a, _ in combos} == set(AXES)
    for axis in AXES:
        assert len({v for a, v in combos if a == axis}) >= 3
    assert min(combos.values()) >= 10


def test_answers_agree_with_independent_solver(tasks_250):
    for task in tasks_250:
        check(task)


def test_verifier_names_and_answer_shapes(tasks_250):
    expected = {
        "depth": "mod23_int",
        "breadth": "mod23_int",
        "horizon": "mod23_list",
        "parallel": "mod23_list",
        "robustness": "boxed_list",
    }
    for task in tasks_250:
        axis = task.metadata["axis"]
        assert task.verifier == expected[axis]
        n = len(task.metadata["answers"])
        assert n == (1 if axis in ("depth", "breadth") else task.metadata["axis_value"])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), axis=st.sampled_from(AXES))
def test_solver_agrees_for_random_seeds(seed, axis):
    values = {
        "depth": [1, 3, 5, 7, 9, 11, 13],
        "breadth": [2, 3, 5, 7, 9],
        "horizon": [1, 3, 5, 7],
        "parallel": [1, 3, 5, 7],
        "robustness": [1, 3, 5, 8],
    }[axis]
    for task in generate("masbench", len(values), seed=seed, axis=axis, values=values):
        check(task)


def test_deterministic_and_seed_sensitive():
    a = generate("masbench", 20, seed=3)
    assert a == generate("masbench", 20, seed=3)
    assert [t.question for t in a] != [t.question for t in generate("masbench", 20, seed=4)]
    assert [t.question for t in a] != [t.question for t in generate("masbench", 20, seed=3, split="test")]


def test_prefix_stable_and_metadata_json_roundtrip():
    import json

    from workbench.tasks import Task

    short, long = generate("masbench", 5, seed=1), generate("masbench", 12, seed=1)
    assert long[:5] == short
    for task in long:
        assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task


def test_text_template_follows_the_notes():
    depth = generate("masbench", 1, seed=0, axis="depth", values=4)[0]
    assert depth.question.startswith("All calculations are done mod 23.")
    assert "by default zero" in depth.question
    assert "The number of each " in depth.question
    parallel = generate("masbench", 1, seed=0, axis="parallel", values=3)[0]
    assert "Each problem is INDEPENDENT and can be solved in parallel." in parallel.question
    assert parallel.question.rstrip().endswith("Final Answers\nProblem 1:\nProblem 2:\nProblem 3:")
    robust = generate("masbench", 1, seed=0, axis="robustness", values=2)[0]
    assert "The grass is green. The sky is blue." in robust.question
    assert "Note: verify the information before you take it - " in robust.question
    bare = generate("masbench", 1, seed=0, axis="depth", values=4, instruction=False)[0]
    assert not bare.question.startswith("All calculations")
    assert bare.answer == depth.answer


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"axis": "width"}, "axis must be among"),
        ({"axis": "depth", "values": 0}, "depth values must be ints in 1..16"),
        ({"axis": "breadth", "values": [1]}, "breadth values must be ints in 2..10"),
        ({"values": {"robustness": [99]}}, "robustness values"),
    ],
)
def test_bad_options_raise_clear_errors(options, fragment):
    with pytest.raises(TaskOptionError, match=re.escape(fragment)):
        generate("masbench", 3, seed=0, **options)


def test_vocabulary_keeps_sentences_parseable():
    from workbench.tasks.igsm import FAMILIES

    categories = [cat for family in FAMILIES for cat, _ in family.layers]
    assert len(categories) == len(set(categories)), "category names are unique across worlds"
    items = [item for family in FAMILIES for _, names in family.layers for item in names]
    assert len(items) == len(set(items))
    for name in items + categories:
        assert not any(bad in name for bad in (" and ", ",", "'s", ".", "[")), name

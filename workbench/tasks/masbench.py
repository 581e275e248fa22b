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
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.tasks.errors import TaskGenerationError, TaskOptionError
from workbench.tasks.igsm import (
    FAMILIES,
    INSTRUCTION,
    MOD,
    Exhausted,
    GraphBuilder,
    World,
    random_expr,
    render_definition,
    sample_world,
)
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
HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOTE_PREFIX = "Note: verify the information before you take it - "
_ADJECTIVES = [
    "stupid",
    "smoggy",
    "open",
    "quiet",
    "brave",
    "fuzzy",
    "tidy",
    "eager",
    "gentle",
    "rapid",
    "silent",
    "witty",
    "hollow",
    "lucky",
    "sour",
    "vivid",
]
_NOUNS = [
    "assumption",
    "caliber",
    "elephant",
    "harbor",
    "lantern",
    "meadow",
    "pencil",
    "rocket",
    "saddle",
    "violin",
    "orchard",
    "compass",
    "glacier",
]
_ATTEMPTS = 60


def split_param(name: str) -> tuple[str, str]:
    """``"Central High's Robotics Lab"`` -> ``("Central High", "Robotics Lab")``."""
    parent, _, child = name.rpartition("'s ")
    return parent, child


def _how_many(name: str) -> str:
    parent, child = split_param(name)
    return f"How many {child} does {parent} have?"


def _item_phrase(name: str) -> str:
    parent, child = split_param(name)
    return f"the number of {child} that {parent} has"


# ---------------------------------------------------------------- graph construction helpers


def _side_args(b: GraphBuilder, target: str, max_depth: int, count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct extra arguments for ``target`` whose depth is at most ``max_depth``."""
    rng, out = b.rng, []
    for _ in range(count):
        roll = rng.random()
        existing = [
            p
            for p in b.defs
            if not p.startswith("[")
            and p not in out
            and p not in exclude
            and b.can_reference(target, p)
            and b.depth(p) <= max_depth
        ]
        abstract = [
            a
            for a in b.world.abstract_children
            if a not in exclude
            and a not in out
            and b.deps(a)
            and b.can_reference(target, a)
            and b.depth(a) <= max_depth
        ]
        if roll < 0.4 and existing:
            out.append(rng.choice(existing))
        elif roll < 0.55 and abstract:
            out.append(rng.choice(abstract))
        elif roll < 0.65:
            out.append(b.zero_leaf([p for p in b.free() if p not in exclude]))
        else:
            out.append(b.define_const(b.take([p for p in b.free() if p not in exclude])))
    return out


def _depth_problem(b: GraphBuilder, d: int) -> str:
    """Build a query whose longest dependency chain has exactly ``d`` nodes; returns the query name."""
    rng = b.rng
    final_abstract = None
    if d >= 2 and rng.random() < 0.5:
        candidates = [
            a
            for a, ch in b.world.abstract_children.items()
            if a not in b.used_abstract and any(c in b.free() for c in ch)
        ]
        final_abstract = rng.choice(candidates) if candidates else None
    reserved = set(b.world.abstract_children[final_abstract]) if final_abstract else set()
    exclude = {final_abstract} if final_abstract else set()
    chain: list[str] = []
    n_chain = d - 1 if final_abstract else d
    for k in range(1, n_chain + 1):
        last = k == n_chain and final_abstract is not None
        name = b.take(
            [c for c in b.free() if c in reserved] if last else [p for p in b.free() if p not in reserved]
        )
        if k == 1:
            b.define_const(name)
        else:
            sides = _side_args(b, name, k - 1, rng.choice([0, 0, 1, 1, 2]), exclude | reserved | {chain[-1]})
            b.define_op([chain[-1], *sides], name)
        chain.append(name)
    if final_abstract is None:
        return chain[-1]
    for _ in range(rng.randint(0, 2)):
        free_children = [c for c in b.world.abstract_children[final_abstract] if c in b.free()]
        if not free_children:
            break
        child = b.take(free_children)
        if d <= 2 or rng.random() < 0.5:
            b.define_const(child)
        else:
            b.define_op(_side_args(b, child, d - 2, rng.randint(1, 2), exclude | reserved), child)
    b.use(final_abstract)
    return final_abstract


def _shallow(b: GraphBuilder, width: int, taken: list[str], avoid: set[str]) -> str:
    """A breadth argument: a constant, a zero leaf, or a one-step function of constants."""
    rng = b.rng

    def fresh() -> str:
        return b.take([p for p in b.free() if p not in avoid])

    roll = rng.random()
    if roll < 0.45:
        return b.define_const(fresh())
    if roll < 0.55 and all(p in b.defs for p in taken):  # at most one zero leaf per query
        return b.zero_leaf([p for p in b.free() if p not in avoid])
    consts = [p for p in b.defs if b.defs[p]["op"] == "const" and p not in taken]
    args: list[str] = []
    for _ in range(rng.randint(1, min(2, width))):
        pool = [p for p in consts if p not in args]
        args.append(rng.choice(pool) if pool and rng.random() < 0.4 else b.define_const(fresh()))
    return b.define_op(args, fresh())


def _breadth_problem(b: GraphBuilder, width: int) -> str:
    rng = b.rng
    fitting = [a for a, ch in b.world.abstract_children.items() if sum(c in b.free() for c in ch) >= width]
    if fitting and rng.random() < 0.4:
        query = rng.choice(fitting)
        children = set(b.world.abstract_children[query])
        for child in rng.sample([c for c in b.world.abstract_children[query] if c in b.free()], width):
            b.take([child])
            if rng.random() < 0.6:
                b.define_const(child)
            else:
                b.define_op([b.define_const(b.take([p for p in b.free() if p not in children]))], child)
        b.use(query)
        return query
    query = b.take()
    args: list[str] = []
    while len(args) < width:
        args.append(_shallow(b, width, args, {query}))
    return b.define_op(args, query)


def _distractors(
    b: GraphBuilder, count: int, pool: Sequence[str] | None = None, max_args: int = 2
) -> list[str]:
    """Define ``count`` sentences nobody needs, over ``pool`` (default: every defined instance parameter)."""
    out = []
    for _ in range(count):
        try:
            name = b.take()
        except Exhausted:
            break
        candidates = [
            p for p in (pool if pool is not None else b.defs) if p in b.defs and not p.startswith("[")
        ]
        n_args = min(b.rng.randint(0, max_args), len(candidates))
        if n_args == 0:
            b.define_const(name)
        else:
            b.define(name, random_expr(b.rng, b.rng.sample(candidates, n_args)))
        out.append(name)
    return out


# ---------------------------------------------------------------- per-axis instances


def _world(rng: random.Random, min_instances: int, family: Any = None) -> World:
    return sample_world(rng, family or rng.choice(FAMILIES), min_instances)


def _defs_list(b: GraphBuilder, names: Sequence[str] | None = None) -> list[list[Any]]:
    keep = b.defs if names is None else names
    return [[n, b.defs[n]] for n in b.defs if n in keep]


def _single(rng: random.Random, axis: str, value: int) -> dict[str, Any]:
    need = value * 3 + 8
    b = GraphBuilder(_world(rng, need), rng)
    query = _depth_problem(b, value) if axis == "depth" else _breadth_problem(b, value)
    ancestors = b.ancestors(query)
    max_args = 2 if axis == "depth" else min(value, 3)
    _distractors(b, rng.randint(2, 4), pool=[p for p in b.defs if p != query], max_args=max_args)
    if axis == "depth" and b.depth(query) != value:
        raise Exhausted
    if axis == "breadth" and b.max_in_degree(ancestors) != value:
        raise Exhausted
    sentences = list(b.defs)
    rng.shuffle(sentences)
    text = " ".join(render_definition(n, b.defs[n]) for n in sentences) + " " + _how_many(query)
    return {
        "question": f"{INSTRUCTION}\n\n{text}",
        "answers": [b.value(query)],
        "problem": {
            "worlds": [b.world.to_dict()],
            "definitions": _defs_list(b),
            "query": query,
            "sentences": sentences,
        },
        "stats": {
            "depth": b.depth(query),
            "max_in_degree": b.max_in_degree(ancestors),
            "n_ancestors": len(ancestors),
            "n_sentences": len(sentences),
        },
    }


def _format_block(note: str, n: int) -> str:
    lines = "\n".join(f"Problem {k}:" for k in range(1, n + 1))
    return (
        f"Note: In this problem set:\n{note}\n\n"
        "Solve all problems step by step and provide the answers for all problems in the following format:\n\n"
        f"Final Answers\n{lines}"
    )


def _parallel(rng: random.Random, p: int) -> dict[str, Any]:
    b = GraphBuilder(_world(rng, p * 5 + 4), rng)
    problems, texts, answers = [], [], []
    for k in range(1, p + 1):
        component: list[str] = [b.define_const()]
        for _ in range(rng.choice([0, 1, 1, 2])):
            sides = [rng.choice(component[:-1])] if len(component) > 1 and rng.random() < 0.4 else []
            if not sides and rng.random() < 0.4:
                sides = [b.define_const()]
                component.insert(-1, sides[0])
            component.append(b.define_op([component[-1], *sides]))
        query = component[-1]
        shown = [*b.ancestors(query), *_distractors(b, rng.choice([0, 1]), pool=component)]
        rng.shuffle(shown)
        body = " ".join(render_definition(n, b.defs[n]) for n in shown)
        texts.append(f"Problem {k}: {body} What is the value of {query}?")
        problems.append({"query": query, "sentences": shown})
        answers.append(b.value(query))
    note = "- Each problem is INDEPENDENT and can be solved in parallel."
    question = "\n\n".join([INSTRUCTION, *texts, _format_block(note, p)])
    return {
        "question": question,
        "answers": answers,
        "problem": {"worlds": [b.world.to_dict()], "definitions": _defs_list(b), "problems": problems},
        "stats": {"components": p, "max_depth": max(b.depth(q["query"]) for q in problems)},
    }


def _horizon(rng: random.Random, h: int) -> dict[str, Any]:
    b = GraphBuilder(_world(rng, h * 5 + 4), rng)
    problems, texts, answers = [], [], []
    previous: str | None = None
    for k in range(1, h + 1):
        bridge = None
        if previous is None:
            node = b.define_const()
        else:
            token = f"[variable{k}]"
            c = rng.randint(0, 22)
            ref = {"op": "ref", "name": previous}
            b.define(token, ref if c == 0 else {"op": "add", "k": c, "arg": ref})
            bridge = {"variable": token, "answer": f"[answer{k - 1}]", "k": c}
            node = token
        for _ in range(rng.randint(1, 2)):
            restate = [p for p in b.defs if b.defs[p]["op"] == "const" and p != node]
            roll = rng.random()
            sides = (
                [rng.choice(restate)] if restate and roll < 0.3 else [b.define_const()] if roll < 0.6 else []
            )
            node = b.define_op([node, *sides])
        query = node
        needed = _cut_ancestors(b, query)
        local = [p for p in needed if not p.startswith("[")]
        extra = _distractors(b, rng.randint(1, 2), pool=local)
        older = [
            p
            for p in b.defs
            if p not in needed
            and p not in extra
            and not p.startswith("[")
            and p not in {q["query"] for q in problems}
            and not any(r.startswith("[") for r in b.deps(p))
        ]
        shown = (
            [p for p in needed if not p.startswith("[")]
            + extra
            + rng.sample(older, min(len(older), rng.randint(0, 1)))
        )
        rng.shuffle(shown)
        body = " ".join(render_definition(n, b.defs[n]) for n in shown)
        if bridge is not None:
            rhs = bridge["answer"] if bridge["k"] == 0 else f"{bridge['k']} + {bridge['answer']}"
            body += (
                f" Using the result {bridge['answer']} from the previous calculation, "
                f"{bridge['variable']} = {rhs}."
            )
        texts.append(f"Problem {k}: {body} What is the value of {query}?")
        problems.append({"query": query, "sentences": shown, "bridge": bridge})
        answers.append(b.value(query))
        previous = query
    note = (
        "- [variablek] represents the calculated variable needed to solve problem k.\n"
        "- [answerk] represents the answer to problem k."
    )
    question = "\n\n".join([INSTRUCTION, *texts, _format_block(note, h)])
    return {
        "question": question,
        "answers": answers,
        "problem": {"worlds": [b.world.to_dict()], "definitions": _defs_list(b), "problems": problems},
        "stats": {"horizon": h, "carried": h - 1},
    }


def _cut_ancestors(b: GraphBuilder, query: str) -> list[str]:
    """Ancestors of ``query`` without looking behind ``[variable k]`` tokens (their value is carried)."""
    order: list[str] = []

    def go(n: str) -> None:
        if n in order:
            return
        if not n.startswith("["):
            for d in b.deps(n):
                go(d)
        order.append(n)

    go(query)
    return [n for n in order if n in b.defs]


def _haystack(rng: random.Random, needle: str | None) -> str:
    parts = [HAYSTACK] * rng.randint(2, 6)
    if needle is not None:
        parts.insert(rng.randint(1, len(parts)), needle)
    return " ".join(parts)


def _robustness(rng: random.Random, r: int) -> dict[str, Any]:
    families = rng.sample(list(FAMILIES), (r + 1) // 2)
    keys: list[str] = []
    while len(keys) < r // 2:
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        if key not in keys:
            keys.append(key)
    blocks, items, segments = [], [], []
    answers: list[int] = []
    for i in range(r):
        if i % 2 == 0:
            b = GraphBuilder(_world(rng, 20, families[i // 2]), rng)
            query = _depth_problem(b, 4)
            _distractors(b, rng.randint(1, 3))
            if b.depth(query) != 4:
                raise Exhausted
            sentences = list(b.defs)
            rng.shuffle(sentences)
            texts = [render_definition(n, b.defs[n]) for n in sentences]
            cut = rng.randint(1, len(texts) - 1) if len(texts) > 3 else len(texts)
            segments.append([" ".join(texts[:cut])])
            if cut < len(texts):
                segments.append([" ".join(texts[cut:])])
            blocks.append(
                {
                    "world": b.world.to_dict(),
                    "definitions": _defs_list(b),
                    "query": query,
                    "sentences": sentences,
                }
            )
            value = b.value(query)
            items.append(
                {"kind": "igsm", "block": len(blocks) - 1, "param": query, "phrase": _item_phrase(query)}
            )
        else:
            key = keys[i // 2]
            value = rng.randint(1_000_000, 9_999_999)
            segments.append([_haystack(rng, f"One of the special magic numbers for {key} is: {value}.")])
            items.append({"kind": "magic", "key": key, "phrase": f"the magic number for {key}"})
        answers.append(value)
        items[-1]["segment"] = len(segments) - 1
    segments.append([_haystack(rng, None)])
    notes = []
    for index, item in enumerate(items):
        truth = answers[index]
        if item["kind"] == "igsm":
            wrong = rng.choice([v for v in range(MOD) if v != truth])
        else:
            wrong = truth
            while wrong == truth:
                wrong = rng.randint(1_000_000, 9_999_999)
        where = rng.randint(item["segment"], len(segments) - 1)
        segments[where].append(f"{NOTE_PREFIX}{item['phrase']} is {wrong}.")
        notes.append({"item": index, "claim": wrong, "segment": where})
    phrases = [it["phrase"] for it in items]
    asked = (
        phrases[0]
        if r == 1
        else (" and ".join(phrases) if r == 2 else ", ".join(phrases[:-1]) + ", and " + phrases[-1])
    )
    passage = "\n\n".join(" ".join(seg) for seg in segments)
    question = (
        f"{INSTRUCTION}\n\nRead the following passage carefully.\n\n{passage}\n\n=====\n\n"
        f"From the passage, identify and return {asked}, wrapped in \\boxed{{ }} and separated via \\n\\n"
    )
    return {
        "question": question,
        "answers": answers,
        "problem": {
            "blocks": blocks,
            "items": items,
            "notes": notes,
            "needles": [
                {"key": it["key"], "value": answers[i]} for i, it in enumerate(items) if it["kind"] == "magic"
            ],
        },
        "stats": {"attacks": len(notes), "items": r, "igsm_items": len(blocks)},
    }


_BUILDERS = {
    "depth": lambda rng, v: _single(rng, "depth", v),
    "breadth": lambda rng, v: _single(rng, "breadth", v),
    "horizon": _horizon,
    "parallel": _parallel,
    "robustness": _robustness,
}


def build_instance(axis: str, value: int, rng: random.Random) -> dict[str, Any]:
    """One MASBench instance as a dict (question, answers, problem, stats); retries until it fits."""
    for _ in range(_ATTEMPTS):
        try:
            return _BUILDERS[axis](rng, value)
        except Exhausted:
            continue
    raise TaskGenerationError(f"masbench: could not build a {axis}={value} instance; try a smaller value")


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

"""MASBench instances, one builder per axis: a question, its answers, the structured problem and stats.

Depth and Breadth ask one question over one graph; Parallel asks one per disconnected component;
Horizon chains problems through ``[variable k] = c + [answer k-1]``; Robustness mixes Depth-4 iGSM
items with RULER magic-number needles in a haystack, each attacked by a wrong "Note". Graphs come
from :mod:`workbench.tasks.masbench_graph`; :func:`build_instance` retries a builder until it fits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from workbench.tasks.errors import TaskGenerationError
from workbench.tasks.igsm import (
    FAMILIES,
    INSTRUCTION,
    MOD,
    Exhausted,
    GraphBuilder,
    World,
    render_definition,
    sample_world,
)
from workbench.tasks.masbench_graph import breadth_problem, cut_ancestors, depth_problem, distractors

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


def _world(rng: random.Random, min_instances: int, family: Any = None) -> World:
    return sample_world(rng, family or rng.choice(FAMILIES), min_instances)


def _defs_list(b: GraphBuilder, names: Sequence[str] | None = None) -> list[list[Any]]:
    keep = b.defs if names is None else names
    return [[n, b.defs[n]] for n in b.defs if n in keep]


def _single(rng: random.Random, axis: str, value: int) -> dict[str, Any]:
    need = value * 3 + 8
    b = GraphBuilder(_world(rng, need), rng)
    query = depth_problem(b, value) if axis == "depth" else breadth_problem(b, value)
    ancestors = b.ancestors(query)
    max_args = 2 if axis == "depth" else min(value, 3)
    distractors(b, rng.randint(2, 4), pool=[p for p in b.defs if p != query], max_args=max_args)
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
        shown = [*b.ancestors(query), *distractors(b, rng.choice([0, 1]), pool=component)]
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
        needed = cut_ancestors(b, query)
        local = [p for p in needed if not p.startswith("[")]
        extra = distractors(b, rng.randint(1, 2), pool=local)
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
            query = depth_problem(b, 4)
            distractors(b, rng.randint(1, 3))
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

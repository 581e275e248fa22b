"""A small deterministic text corpus for training the ``tiny`` model's tokenizer.

The corpus resembles what the workbench's tasks and topologies send through a model: arithmetic
with ``\\boxed{}`` answers, short English sentences, JSON tool calls and chat turns in the ChatML
format with reasoning (``<think>``), tool (``<tool_call>``) and answer (``<answer>``) tags. It is
generated from a seed with :class:`random.Random`, so a seed always gives the same lines.
"""

from __future__ import annotations

import json
import random

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens: never produced by ordinary text, dropped by ``skip_special_tokens``."""

TAG_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>")
"""Tags that agents write and parsers read: single tokens, but kept when decoding."""

_NAMES = ("Alice", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Grace", "Hiro", "Ines", "Jamal")
_THINGS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "shells", "tickets")
_SUBJECTS = ("The solver", "The verifier", "A careful agent", "The corrector", "Every model", "The planner")
_VERBS = ("checks", "writes", "reads", "explains", "revises", "answers", "searches", "summarises")
_OBJECTS = ("the question", "each step", "the final answer", "a short proof", "the document", "the plan")
_ENDINGS = ("before it replies.", "with care.", "in one line.", "and then stops.", "for the team.", "again.")
_PLACES = ("Veloria", "Mount Arden", "the river Sel", "Port Quill", "the Tarn valley", "Oskar's library")
_SYSTEM = "You are a helpful assistant."


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    style = rng.randrange(3)
    if style == 0:
        return f"{a} {op} {b} = {value}"
    if style == 1:
        return f"What is {a} {op} {b}? The answer is \\boxed{{{value}}}."
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have? \\boxed{{{a + b}}}"


def _sentence(rng: random.Random) -> str:
    return " ".join((rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_ENDINGS)))


def _tool_call(rng: random.Random) -> str:
    call = {
        "name": rng.choice(("search", "calculator", "lookup")),
        "arguments": {"query": rng.choice(_PLACES)},
    }
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _chat(rng: random.Random) -> str:
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    reply = f"<think>\n{a} + {b} = {a + b}. {_sentence(rng)}\n</think>\n"
    reply += _tool_call(rng) + "\n" if rng.random() < 0.3 else ""
    reply += f"<answer>{a + b}</answer>"
    turns = [("system", _SYSTEM), ("user", f"What is {a} + {b}?"), ("assistant", reply)]
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns) + "<|endoftext|>"


def corpus(seed: int = 0, lines: int = 2000) -> list[str]:
    """Return ``lines`` lines of training text, the same for the same ``seed``."""
    rng = random.Random(seed)
    makers = (_arithmetic, _sentence, _tool_call, _chat)
    return [rng.choice(makers)(rng) for _ in range(lines)]

"""Verifiers: score a predicted answer against a task's reference, by the verifier name the task carries."""

from __future__ import annotations

import re
import signal
import string
import threading
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

from workbench.answers import all_boxed, last_boxed, last_number, numbers

Verifier = Callable[[str, str], float]
VERIFIERS: dict[str, Verifier] = {}


def register(*names: str) -> Callable[[Verifier], Verifier]:
    def add(fn: Verifier) -> Verifier:
        for name in names:
            VERIFIERS[name] = fn
        return fn

    return add


def verify(verifier: str, prediction: str, reference: str) -> float:
    """Score in [0, 1]; an unknown verifier name is an error that lists the known ones."""
    try:
        fn = VERIFIERS[verifier]
    except KeyError:
        raise ValueError(f"unknown verifier '{verifier}'; known: {', '.join(sorted(VERIFIERS))}") from None
    return fn(prediction, reference)


def _number(text: str) -> Fraction | None:
    text = text.strip().replace(",", "").replace("$", "").rstrip(".")
    m = re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", text)
    if not m:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _final_answer(prediction: str) -> str:
    """The boxed answer if there is one, else the last number, else the stripped text."""
    boxed = last_boxed(prediction)
    if boxed is not None:
        return boxed
    number = last_number(prediction)
    return number if number is not None else prediction.strip()


@register("boxed_math", "math", "number")
def math_equal(prediction: str, reference: str) -> float:
    """Numeric equality of the final answer (boxed, else last number) with the reference."""
    answer = _final_answer(prediction)
    a, b = _number(answer), _number(reference)
    if a is not None and b is not None:
        return float(a == b)
    return float(_normalise(answer) == _normalise(reference))


@register("mod23_int")
def mod23_equal(prediction: str, reference: str) -> float:
    answer = _number(_final_answer(prediction))
    ref = _number(reference)
    if answer is None or ref is None or answer.denominator != 1 or ref.denominator != 1:
        return 0.0
    return float(int(answer) % 23 == int(ref) % 23)


ANSWER_SEPARATOR = "<<horizon>>"  # how multi-answer references join their answers (as MASBench does)


def _predicted_list(prediction: str, expected: int) -> list[str]:
    """One answer per sub-problem: from 'Problem k: ...' lines, else every \\boxed{}, in order."""
    per_problem: dict[int, str] = {}
    for k, line in re.findall(r"Problem\s+(\d+)\s*[:.)-]\s*(.*)", prediction):
        found = all_boxed(line) or numbers(line)
        if found:
            per_problem[int(k)] = found[-1]
    if len(per_problem) == expected:
        return [per_problem[k] for k in sorted(per_problem)]
    return all_boxed(prediction)


@register("mod23_list")
def mod23_list_equal(prediction: str, reference: str) -> float:
    """All-or-nothing: every sub-problem's answer equals its reference mod 23."""
    gold = reference.split(ANSWER_SEPARATOR)
    predicted = _predicted_list(prediction, len(gold))
    if len(predicted) != len(gold):
        return 0.0
    return float(all(mod23_equal(p, g) for p, g in zip(predicted, gold, strict=True)))


@register("boxed_list")
def boxed_list_equal(prediction: str, reference: str) -> float:
    """All-or-nothing: the k-th ``\\boxed{}`` answers the k-th item, and the counts agree."""
    gold = reference.split(ANSWER_SEPARATOR)
    predicted = all_boxed(prediction)
    if len(predicted) != len(gold):
        return 0.0
    return float(all(math_equal(p, g) for p, g in zip(predicted, gold, strict=True)))


def _normalise(text: str) -> str:
    text = text.lower().strip()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@register("exact", "exact_match", "em")
def exact_match(prediction: str, reference: str) -> float:
    return float(_normalise(_final_answer_text(prediction)) == _normalise(reference))


@register("f1", "token_f1")
def token_f1(prediction: str, reference: str) -> float:
    pred = _normalise(_final_answer_text(prediction)).split()
    ref = _normalise(reference).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _final_answer_text(prediction: str) -> str:
    boxed = last_boxed(prediction)
    if boxed is not None:
        return boxed
    m = re.findall(r"<answer>(.*?)</answer>", prediction, flags=re.S)
    return m[-1] if m else prediction


MATH_VERIFY_TIMEOUT_S = 5


def _math_verify_timeout() -> int | None:
    """math_verify times out with SIGALRM: only in the main thread, and only when no alarm is pending.

    Off the main thread, or beside another alarm (pytest-timeout's), it runs without a time limit.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return None
    return MATH_VERIFY_TIMEOUT_S


def _parse_gold(gold: str, timeout: int | None) -> list:
    """A bare reference (``0.5``, ``2\\sqrt{2}``, ``[0,1)``) is read as LaTeX math; a delimited one as is."""
    from math_verify import parse

    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return parse(gold, parsing_timeout=timeout)
    return parse(f"${gold}$", parsing_timeout=timeout) or parse(gold, parsing_timeout=timeout)


@register("math_verify")
def math_verify_equal(prediction: str, reference: str) -> float:
    """Hugging Face Math-Verify: the prediction's answer (``\\boxed{}`` first) is symbolically equivalent
    to the reference. Never raises: an unparsable answer, a parse error or a timeout scores 0.0."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    timeout = _math_verify_timeout()
    try:
        gold = _parse_gold(reference.strip(), timeout)
        answer = parse(prediction, parsing_timeout=timeout)
        if not gold or not answer:
            return 0.0
        return float(verify(gold, answer, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # noqa: BLE001 - a verifier scores, it never fails
        return 0.0

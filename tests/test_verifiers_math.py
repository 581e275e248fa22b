"""The math_verify verifier: symbolic equivalence through Hugging Face Math-Verify, safe off the main thread."""

from __future__ import annotations

import signal
import threading

import pytest

from workbench.rewards import VERIFIERS, verify

EQUIVALENT = [
    (r"The answer is \boxed{\frac{1}{2}}", "0.5"),
    (r"so we get \boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
    (r"\boxed{(x+1)^2}", "x^2+2x+1"),
    (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}"),
    (r"\boxed{(1, 2]}", "(1,2]"),
    ("The total is $1,000$.", "1000"),
    (r"\boxed{1/2}", r"$\frac{1}{2}$"),
]
WRONG = [
    (r"\boxed{\frac{1}{3}}", "0.5"),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{8}"),
    (r"\boxed{[1, 2]}", "(1,2]"),
    (r"\boxed{\{1, 2\}}", r"\{1,2,3\}"),
    (r"\boxed{7}", "8"),
]
GARBAGE = [
    (r"}}{{\frac\sqrt{", "3"),
    ("", "3"),
    (r"\boxed{3}", ""),
    (r"\boxed{3}", r"}}\frac{{"),
    ("\x00\\boxed{\\left(}", r"\frac{1}{0}"),
]


def test_registered():
    assert "math_verify" in VERIFIERS


@pytest.mark.parametrize("prediction, reference", EQUIVALENT)
def test_equivalent_forms_score_one(prediction, reference):
    assert verify("math_verify", prediction, reference) == 1.0


@pytest.mark.parametrize("prediction, reference", WRONG)
def test_wrong_answers_score_zero(prediction, reference):
    assert verify("math_verify", prediction, reference) == 0.0


@pytest.mark.parametrize("prediction, reference", GARBAGE)
def test_garbage_scores_zero_without_raising(prediction, reference):
    assert verify("math_verify", prediction, reference) == 0.0


def test_boxed_answer_wins_over_other_numbers():
    text = r"First 3, then 4, so the answer is \boxed{7}."
    assert verify("math_verify", text, "7") == 1.0
    assert verify("math_verify", text, "3") == 0.0


def _require_main_thread_without_alarm() -> None:
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0]:
        pytest.skip("needs the main thread with no alarm pending")


def test_works_from_worker_threads():
    """math_verify's SIGALRM timeout raises off the main thread; the verifier must still score there."""
    cases = EQUIVALENT + WRONG + GARBAGE
    expected = [1.0] * len(EQUIVALENT) + [0.0] * (len(WRONG) + len(GARBAGE))
    results: dict[int, list[float]] = {}

    def work(k: int) -> None:
        results[k] = [verify("math_verify", p, r) for p, r in cases]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {0: expected, 1: expected}


def test_keeps_a_pending_alarm():
    """Beside another SIGALRM user (pytest-timeout), the verifier neither cancels nor replaces its alarm."""
    _require_main_thread_without_alarm()
    fired = []

    def handler(*_):
        fired.append(True)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 60.0)
    try:
        assert verify("math_verify", r"\boxed{\frac{2}{4}}", "0.5") == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 50.0 < remaining <= 60.0
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


def test_timeout_and_errors_score_zero(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def times_out(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    def fails(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    assert verify("math_verify", r"\boxed{2}", "2") == 1.0
    monkeypatch.setattr(math_verify, "verify", times_out)
    assert verify("math_verify", r"\boxed{2}", "2") == 0.0
    monkeypatch.setattr(math_verify, "parse", fails)
    assert verify("math_verify", r"\boxed{2}", "2") == 0.0


def test_main_thread_uses_a_timeout(monkeypatch):
    """In the main thread with no alarm pending, math_verify gets its timeout; in a worker thread, None."""
    _require_main_thread_without_alarm()
    import math_verify

    seen: list[object] = []
    real_parse = math_verify.parse

    def spy(text, *args, parsing_timeout=None, **kwargs):
        seen.append(parsing_timeout)
        return real_parse(text, *args, parsing_timeout=parsing_timeout, **kwargs)

    monkeypatch.setattr(math_verify, "parse", spy)
    assert verify("math_verify", r"\boxed{2}", "2") == 1.0
    main = set(seen)
    seen.clear()
    thread = threading.Thread(target=lambda: verify("math_verify", r"\boxed{2}", "2"))
    thread.start()
    thread.join()
    assert main and None not in main
    assert set(seen) == {None}

"""Output parsers: well-formed outputs parse, malformed ones raise FormatError (never anything else)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engine.parsers import PARSERS, FormatError, last_boxed, parse_verdict, strip_think


def test_last_boxed_handles_nesting_and_takes_the_last():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{12") is None
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("**Final Verdict** fine.\n**Correctness**: Correct", "correct"),
        ("**Correctness**: Wrong", "wrong"),
        ("Correctness: incorrect", "wrong"),  # the reference code's substring test would say correct
        ("The correctness is fine. Correctness: CORRECT.", "correct"),
    ],
)
def test_verdict_reads_the_whole_word_after_the_last_correctness(text, verdict):
    assert parse_verdict(text)["verdict"] == verdict


def test_verdict_report_is_the_text_before_correctness():
    out = parse_verdict("**Final Verdict** bad step 2.\n**Correctness**: Wrong")
    assert out["report"] == "**Final Verdict** bad step 2."


def test_strip_think_keeps_only_the_final_answer():
    assert strip_think("<think>secret</think> answer") == "answer"


@settings(max_examples=1000, deadline=None)
@given(st.text())
def test_parsers_raise_only_format_errors(text):
    for parser in PARSERS.values():
        try:
            result = parser(text)
        except FormatError:
            continue
        assert isinstance(result, dict)  # e.g. the json parser reads "{}" as an empty object

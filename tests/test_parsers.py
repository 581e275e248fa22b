"""Output parsers: well-formed outputs parse, malformed ones raise FormatError (never anything else)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engine.parsers import (
    PARSERS,
    FormatError,
    last_boxed,
    parse_verdict,
    parse_yes_no,
    strip_think,
)
from workbench.engine.templating import evaluate


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


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        (" 6 + 4 = 10. Is 10 equal to 11? No", "wrong"),
        (" 3 + 5 = 8. Is 8 equal to 8? Yes\n", "correct"),
        ("No doubt: yes.", "correct"),  # the last whole word counts
        ("Yesterday it said no", "wrong"),  # 'Yesterday' is not a whole 'yes'
    ],
)
def test_yes_no_reads_the_last_whole_yes_or_no(text, verdict):
    assert parse_yes_no(text)["verdict"] == verdict


def test_yes_no_report_is_the_text_before_the_verdict_and_no_answer_is_a_format_error():
    assert parse_yes_no(" 6 + 4 = 10. Is 10 equal to 11? No")["report"] == " 6 + 4 = 10. Is 10 equal to 11?"
    with pytest.raises(FormatError, match="Yes or No"):
        parse_yes_no(" 6 + 4 = 10. Is 10 equal to")


def test_bindings_read_the_last_number_of_a_text():
    assert evaluate("text | last_number or text", {"text": "6 + 4 = 10, so 10."}) == "10"
    assert evaluate("text | last_number or text", {"text": "ten"}) == "ten"
    assert evaluate("text | last_number", {"text": None}) is None


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

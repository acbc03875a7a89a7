"""fourfold.rewards: the final answer, its normal form, the format rule and the length penalty,
against hand-written cases and properties (hypothesis)."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fourfold.rewards import answer_match, final_answer, format_match, length_penalty, normalize_answer


@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7", "7"),                      # the last number
    ("The answer is 12.", "12."),               # a marker wins, its text as written
    ("answer: 5 (or maybe 6)", "5 (or maybe 6)"),
    (r"x = \boxed{3/2} hmm 5", "3/2"),          # \boxed beats the later number
    ("#### 1,234", "1,234"),
    ("first #### 1\nthen #### 2", "2"),          # the last occurrence of the marker
    ("#### 1 #### 2", "2"),                      # ... on one line too
    ("answer : 1 2 5 answer : 9", "9"),
    ("The answer is 4. Answer: 5", "5"),
    ("Answer = -3", "-3"),
    ("no digits here", None),
    ("", None),
])
def test_final_answer(text, expected):
    assert final_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1,000.", "1000"), (" +007 ", "7"), ("3.0", "3"), ("0.5", "1/2"), ("2/4", "1/2"), ("-0", "0"),
    ("-2.50", "-5/2"), ("$12$", "12"), (r"\text{Yes}", "yes"), ("  New   York ", "new york"), ("1/0", "1/0"),
    (None, None),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_answer_match_reads_the_answer_column():
    responses = ["3 + 4 = 7", "The answer is 8.", "I do not know", "#### 1,000"]
    assert answer_match(["p"] * 4, responses, answer=["7", "7", "7", "1000"]) == [1.0, 0.0, 0.0, 1.0]
    assert answer_match(["p"], ["x = 0.50"], answer=[0.5], id=[3]) == [1.0]  # non-string answers; other columns ignored


def test_format_match_and_length_penalty():
    fmt = format_match(r"Answer: -?\d+$")
    assert fmt(["p"] * 3, ["so Answer: 12", "Answer: x", "Answer: 3 !"]) == [1.0, 0.0, 0.0]
    whole = format_match(r"\d+", whole=True, hit=0.5, miss=-1.0)
    assert whole(["p"] * 2, [" 42 ", "42 apples"]) == [0.5, -1.0]
    with pytest.raises(re.error):
        format_match("(")  # a bad pattern fails when the config is read
    pen = length_penalty(3, coef=0.25)
    assert pen(["p"] * 3, ["a b", "a b c", "a b c d e f"]) == [0.0, 0.0, -0.75]
    with pytest.raises(ValueError, match="max_words and coef must be >= 0"):
        length_penalty(-1)


integers = st.integers(min_value=-10**9, max_value=10**9)


@given(integers)
def test_an_integer_in_any_usual_spelling_is_one_answer(n):
    plain, grouped = str(n), f"{n:,}"
    spellings = [plain, grouped, f"{plain}.", f"{plain}.0", f" ${plain}$ ", ("+" + plain) if n >= 0 else plain]
    assert {normalize_answer(s) for s in spellings} == {str(n)}


@given(st.integers(-1000, 1000), st.integers(1, 1000), st.integers(1, 20))
def test_a_fraction_and_its_multiples_are_one_answer(p, q, k):
    assert normalize_answer(f"{p}/{q}") == normalize_answer(f"{p * k}/{q * k}")


@given(st.text(max_size=40))
def test_normalize_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once

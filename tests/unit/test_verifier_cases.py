"""Table-driven tests of the in-process verifier: extraction, normalisation, equivalence, the CLI."""

from __future__ import annotations

import argparse
import io
import json
from fractions import Fraction

import pytest

from stream_dapo.cli.verify import add_arguments, run
from stream_dapo.verifier import REASONS, VerifyResult, verify
from stream_dapo.verifier.equivalence import Number, compare_answers, parse_number
from stream_dapo.verifier.extract import compile_answer_pattern, extract_answer, last_boxed_content
from stream_dapo.verifier.normalize import normalize_answer
from stream_dapo.verifier.structure import Collection, Scalar, Sequence, read_structure, split_top_level

PROSE = "Let us compute step by step. The sum of the first terms is 3, then we add 4.\n"

# (response, gold, expected correct)
CASES: list[tuple[str, str, bool]] = [
    # --- integers, DAPO format -------------------------------------------------------------------
    (PROSE + "Answer: 42", "42", True),
    (PROSE + "Answer: 41", "42", False),
    (PROSE + "answer: 42", "42", True),
    (PROSE + "ANSWER:42", "42", True),
    (PROSE + "Answer: 042", "42", True),
    (PROSE + "Answer: 42.", "42", True),
    (PROSE + "Answer: $42$", "42", True),
    (PROSE + "**Answer:** 42", "42", True),
    (PROSE + "Answer: 0", "0", True),
    (PROSE + "Answer: 100", "10", False),
    (PROSE + "Answer: 42\n", "42", True),
    (PROSE + "Answer:\n42", "42", True),
    (PROSE + "Answer: +7", "7", True),
    # --- negatives -------------------------------------------------------------------------------
    (PROSE + "Answer: -5", "-5", True),
    (PROSE + "Answer: 5", "-5", False),
    (PROSE + "Answer: -5", "5", False),
    (PROSE + "Answer: $-\\frac{1}{2}$", "-0.5", True),
    (PROSE + "Answer: \\frac{-1}{2}", "-1/2", True),
    (PROSE + "Answer: \u22123", "-3", True),
    (PROSE + "Answer: --3", "3", True),
    # --- fractions -------------------------------------------------------------------------------
    (PROSE + "Answer: 1/2", "\\frac{1}{2}", True),
    (PROSE + "Answer: 2/4", "1/2", True),
    (PROSE + "Answer: 1/3", "1/2", False),
    (PROSE + "Answer: \\frac12", "\\frac{1}{2}", True),
    (PROSE + "Answer: \\dfrac{3}{4}", "3/4", True),
    (PROSE + "Answer: \\tfrac{3}{4}", "0.75", True),
    (PROSE + "Answer: \\frac{6}{8}", "\\frac{3}{4}", True),
    (PROSE + "Answer: \\frac{3}{4}", "\\frac{4}{3}", False),
    (PROSE + "Answer: 2\\frac{1}{2}", "5/2", True),
    (PROSE + "Answer: \\frac{7}{1}", "7", True),
    (PROSE + "Answer: \\frac 1 2", "1/2", True),
    # --- decimals --------------------------------------------------------------------------------
    (PROSE + "Answer: 0.5", "1/2", True),
    (PROSE + "Answer: .5", "0.5", True),
    (PROSE + "Answer: 0.50", "0.5", True),
    (PROSE + "Answer: 0.3333333", "1/3", True),
    (PROSE + "Answer: 0.33", "1/3", False),
    (PROSE + "Answer: 3.14", "\\pi", False),
    (PROSE + "Answer: 2.5", "\\frac{5}{2}", True),
    (PROSE + "Answer: 1.0000000001", "1", True),
    (PROSE + "Answer: 1.001", "1", False),
    # --- LaTeX roots and symbolic equivalents ------------------------------------------------------
    ("So \\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2", True),
    (PROSE + "Answer: 2\\sqrt{2}", "\\sqrt{8}", True),
    (PROSE + "Answer: \\sqrt{8}", "2\\sqrt{2}", True),
    (PROSE + "Answer: \\sqrt2", "\\sqrt{2}", True),
    (PROSE + "Answer: \\sqrt{2}", "\\sqrt{3}", False),
    (PROSE + "Answer: \\sqrt[3]{8}", "2", True),
    (PROSE + "Answer: \\sqrt[3]{27}", "2", False),
    (PROSE + "Answer: \\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
    (PROSE + "Answer: 3\\sqrt{12}", "6\\sqrt{3}", True),
    (PROSE + "Answer: 0.866025", "\\frac{\\sqrt{3}}{2}", True),  # 6 significant digits, within 1e-6
    (PROSE + "Answer: 0.866", "\\frac{\\sqrt{3}}{2}", False),  # 3 significant digits
    (PROSE + "Answer: 2\\pi", "\\pi\\cdot 2", True),
    (PROSE + "Answer: \\pi r^2", "r^2\\pi", True),
    (PROSE + "Answer: 4\\pi", "2\\pi", False),
    (PROSE + "Answer: (x+1)^2", "x^2+2x+1", True),
    (PROSE + "Answer: (x+1)^2", "x^2+1", False),
    (PROSE + "Answer: 3x", "x \\times 3", True),
    (PROSE + "Answer: 2(x+y)", "2x+2y", True),
    (PROSE + "Answer: \\frac{x^2-1}{x-1}", "x+1", True),
    (PROSE + "Answer: x^{-1}", "\\frac{1}{x}", True),
    (PROSE + "Answer: 2^{10}", "1024", True),
    (PROSE + "Answer: 2^10", "1024", True),
    (PROSE + "Answer: 2**10", "1024", True),
    (PROSE + "Answer: 10^{3}", "1000", True),
    (PROSE + "Answer: \\left(\\frac{1}{2}\\right)^2", "\\frac{1}{4}", True),
    (PROSE + "Answer: 6 \\div 4", "\\frac{3}{2}", True),
    (PROSE + "Answer: -2^2", "-4", True),
    (PROSE + "Answer: 5+\\sqrt{5}", "\\sqrt{5}+5", True),
    (PROSE + "Answer: y = 2x + 3", "2x+3", True),
    # --- boxed, nested braces, precedence ----------------------------------------------------------
    ("The answer is \\boxed{42}.", "42", True),
    ("The answer is \\boxed{42}.", "43", False),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{\\frac{\\sqrt{\\frac{1}{4}}}{1}}", "1/2", True),
    ("first \\boxed{3} then corrected to \\boxed{4}", "4", True),
    ("first \\boxed{3} then corrected to \\boxed{4}", "3", False),
    ("\\boxed{\\boxed{7}}", "7", True),
    ("a complete \\boxed{5} and a cut-off \\boxed{6", "5", True),
    ("\\fbox{12}", "12", True),
    ("\\boxed {9}", "9", True),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", True),
    (PROSE + "\\boxed{5}\nAnswer: 6", "6", True),
    (PROSE + "\\boxed{5}\nAnswer: 6", "5", False),
    ("Answer: \\boxed{8}", "8", True),
    # --- units, degrees, percent, currency --------------------------------------------------------
    (PROSE + "Answer: 12 cm", "12", True),
    (PROSE + "Answer: 12 \\text{ cm}^2", "12", True),
    (PROSE + "Answer: 5 \\text{ meters}", "5", True),
    (PROSE + "Answer: 30^\\circ", "30", True),
    (PROSE + "Answer: 30^{\\circ}", "30", True),
    (PROSE + "Answer: 45 degrees", "45", True),
    (PROSE + "Answer: \\$18.90", "18.9", True),
    (PROSE + "Answer: 18 dollars", "18", True),
    (PROSE + "Answer: 25\\%", "25", True),
    (PROSE + "Answer: 7 inches", "7", True),
    (PROSE + "Answer: 10 square units", "10", True),
    (PROSE + "Answer: 10 square units", "11", False),
    # --- thousands separators ----------------------------------------------------------------------
    (PROSE + "Answer: 1,000", "1000", True),
    (PROSE + "Answer: 1{,}000", "1000", True),
    (PROSE + "Answer: 1,234,567", "1234567", True),
    (PROSE + "Answer: 1\\,000", "1000", True),
    (PROSE + "Answer: 12,345.5", "12345.5", True),
    (PROSE + "Answer: 1,00", "100", False),
    (PROSE + "Answer: 1,000", "1", False),
    # --- no answer, several answers, answers in prose ----------------------------------------------
    ("I think it is 42 but I am not sure.", "42", False),
    ("", "42", False),
    (PROSE + "Answer:", "42", False),
    ("Answer: 3\nActually let me recheck.\nAnswer: 4", "4", True),
    ("Answer: 3\nActually let me recheck.\nAnswer: 4", "3", False),
    ("Answer: 5\n" + "More reasoning that goes on and on. " * 20, "5", False),
    ("We get \\boxed{5} and then think more. " + "Still thinking. " * 30, "5", True),
    ("The value $x = \\boxed{7}$ satisfies the equation, as required.", "7", True),
    (PROSE + "Answer: The final answer is $12$", "12", True),
    (PROSE + "Answer: x = 5", "5", True),
    # --- clear mismatches and non-math answers ----------------------------------------------------
    (PROSE + "Answer: 7", "\\frac{7}{2}", False),
    (PROSE + "Answer: x", "y", False),
    (PROSE + "Answer: x+1", "x+2", False),
    (PROSE + "Answer: \\text{Monday}", "Monday", True),
    (PROSE + "Answer: listen", "silent", False),
    (PROSE + "Answer: (1,2)", "(1, 2)", True),
    (PROSE + "Answer: (1,2)", "(2,1)", False),
    (PROSE + "Answer: [0, 1)", "(0,1)", False),
    (PROSE + "Answer: \\text{(A)}", "A", True),
    (PROSE + "Answer: 1e3", "1000", True),
    (PROSE + "Answer: \\infty", "1", False),
    # --- sets (unordered), tuples and intervals (ordered), several answers -------------------------
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", True),
    ("\\boxed{\\{1,2,3\\}}", "\\{1,2\\}", False),
    ("\\boxed{\\left\\{ \\frac{1}{2}, -3 \\right\\}}", "\\{-3, 0.5\\}", True),
    ("\\boxed{\\{1,1,2\\}}", "\\{1,2,2\\}", False),
    (PROSE + "Answer: 3, -1", "-1, 3", True),
    (PROSE + "Answer: 3, -1", "-1, 2", False),
    (PROSE + "Answer: \\{5\\}", "5", True),
    (PROSE + "Answer: x = 1 or x = 2", "1, 2", True),
    (PROSE + "Answer: x=1, y=2", "x=1, y=2", True),
    (PROSE + "Answer: x=2, y=1", "x=1, y=2", False),
    (PROSE + "Answer: y=2, x=1", "x=1, y=2", True),
    (PROSE + "Answer: 1, 2", "x=1, y=2", True),
    (PROSE + "Answer: 2, 1", "x=1, y=2", False),
    (PROSE + "Answer: x=2, x=1", "1, 2", True),
    (PROSE + "Answer: (2,1)", "\\{1,2\\}", False),
    (PROSE + "Answer: 1, 2", "(1,2)", True),
    (PROSE + "Answer: 2, 1", "(1,2)", False),
    (PROSE + "Answer: [0, 1)", "[0,1)", True),
    (PROSE + "Answer: [0, 1]", "[0,1)", False),
    (PROSE + "Answer: (-\\infty, 3] \\cup (5, \\infty)", "(5,\\infty)\\cup(-\\infty,3]", True),
    (PROSE + "Answer: (-\\infty, 3) \\cup (5, \\infty)", "(-\\infty,3]\\cup(5,\\infty)", False),
    (PROSE + "Answer: (\\frac{1}{2}, \\sqrt{8})", "(0.5, 2\\sqrt{2})", True),
    (PROSE + "Answer: 1+\\sqrt{2}, 1-\\sqrt{2}", "1 \\pm \\sqrt{2}", True),
    (PROSE + "Answer: \\pm 3", "3, -3", True),
    (PROSE + "Answer: \\emptyset", "\\varnothing", True),
    # --- factorials, binomials, ratios -------------------------------------------------------------
    (PROSE + "Answer: 3628800", "10!", True),
    (PROSE + "Answer: 10!", "3628800", True),
    (PROSE + "Answer: 10", "\\binom{5}{2}", True),
    (PROSE + "Answer: \\dbinom{6}{3}", "20", True),
    (PROSE + "Answer: 11", "\\binom{5}{2}", False),
    (PROSE + "Answer: 5!", "100", False),
    (PROSE + "Answer: 3:4", "\\frac{3}{4}", True),
    (PROSE + "Answer: 6:8", "3:4", True),
    (PROSE + "Answer: 4:3", "3:4", False),
    (PROSE + "Answer: 1:2:3", "1:2:3", True),
    (PROSE + "Answer: 3:2:1", "1:2:3", False),
    # --- approximations of irrational golds at the precision given --------------------------------
    (PROSE + "Answer: 1.41421356", "\\sqrt{2}", True),
    (PROSE + "Answer: 1.414", "\\sqrt{2}", False),
    (PROSE + "Answer: 3.14159265", "\\pi", True),
    (PROSE + "Answer: 2.7320508", "1+\\sqrt{3}", True),
    (PROSE + "Answer: 2.7320608", "1+\\sqrt{3}", False),
    # --- percentages both ways, scientific notation, mixed numbers, wrappers, units --------------
    (PROSE + "Answer: 25\\%", "0.25", True),
    (PROSE + "Answer: 0.25", "25\\%", True),
    (PROSE + "Answer: 25", "25\\%", True),
    (PROSE + "Answer: 0.25", "25", False),
    (PROSE + "Answer: 12.5 percent", "\\frac{1}{8}", True),
    (PROSE + "Answer: 1.5 \\times 10^{3}", "1500", True),
    (PROSE + "Answer: 1.5e3", "1500", True),
    (PROSE + "Answer: 6.02 \\times 10^{23}", "602000000000000000000000", True),
    (PROSE + "Answer: 6.03 \\times 10^{23}", "602000000000000000000000", False),
    (PROSE + "Answer: 2 1/2", "\\frac{5}{2}", True),
    (PROSE + "Answer: 2 1/2", "21/2", False),
    (PROSE + "Answer: -3\\tfrac{1}{4}", "-3.25", True),
    (PROSE + "Answer: \\mathrm{B}", "B", True),
    (PROSE + "Answer: \\textbf{(C)}", "C", True),
    (PROSE + "Answer: \\text{monday}", "\\text{Monday}", True),
    (PROSE + "Answer: 5\\text{ m}", "5", True),
    (PROSE + "Answer: 3 \\, \\mathrm{kg}", "3", True),
    (PROSE + "Answer: 60^\\circ", "60^{\\circ}", True),
    (PROSE + "Answer: 60^\\circ", "30", False),
    (PROSE + "Answer: x \\approx 1.7320508", "\\sqrt{3}", True),
    # --- logarithms, trigonometric values, e and i, inequalities -----------------------------------
    (PROSE + "Answer: 0.69314718", "\\ln 2", True),
    (PROSE + "Answer: \\ln 4", "2\\ln 2", True),
    (PROSE + "Answer: \\ln 3", "2\\ln 2", False),
    (PROSE + "Answer: 3", "\\log_2 8", True),
    (PROSE + "Answer: \\frac{1}{2}", "\\sin 30^\\circ", True),
    (PROSE + "Answer: \\frac{\\sqrt{3}}{2}", "\\sin 30^\\circ", False),
    (PROSE + "Answer: 0.5", "\\cos \\frac{\\pi}{3}", True),
    (PROSE + "Answer: 2.71828183", "e", True),
    (PROSE + "Answer: 2.72", "e", False),
    (PROSE + "Answer: i^2", "-1", True),
    (PROSE + "Answer: 3-4i", "3+4i", False),
    (PROSE + "Answer: 2 \\le x < 5", "[2, 5)", True),
    (PROSE + "Answer: 2 < x \\le 5", "[2, 5)", False),
    (PROSE + "Answer: x \\geq 3", "[3, \\infty)", True),
    (PROSE + "Answer: x >= 3", "[3, \\infty)", True),
    (PROSE + "Answer: x > 3", "[3, \\infty)", False),
]


@pytest.mark.parametrize(("response", "gold", "expected"), CASES)
def test_verify_case_table(response: str, gold: str, expected: bool) -> None:
    result = verify(response, gold)
    assert result.correct is expected, result
    assert result.reward == (1.0 if expected else -1.0)
    assert result.reason in REASONS
    assert (result.reason in {"exact", "numeric", "symbolic"}) is expected


def test_case_table_is_large_and_balanced() -> None:
    assert len(CASES) >= 100
    assert 30 <= sum(1 for _, _, ok in CASES if not ok) <= len(CASES) - 30


# ----------------------------------------------------------------------------------------------------
# Reasons and the extracted text
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "gold", "reason", "extracted"),
    [
        ("Answer: 42", "42", "exact", "42"),
        ("Answer: 042", "42", "numeric", "042"),
        ("Answer: 1/2", "0.5", "numeric", "1/2"),
        ("Answer: 2\\sqrt{2}", "\\sqrt{8}", "symbolic", "2\\sqrt{2}"),
        ("Answer: 41", "42", "mismatch", "41"),
        ("nothing here", "42", "no_answer", None),
        ("Answer: $ $", "42", "no_answer", "$ $"),
        ("Answer: 3!", "6", "symbolic", "3!"),
        ("Answer: 3!!", "720", "parse_error", "3!!"),
        ("Answer: \\log 2", "1", "parse_error", "\\log 2"),
    ],
)
def test_reason_and_extracted(response: str, gold: str, reason: str, extracted: str | None) -> None:
    result = verify(response, gold)
    assert result == VerifyResult(
        correct=reason in {"exact", "numeric", "symbolic"},
        reward=1.0 if reason in {"exact", "numeric", "symbolic"} else -1.0,
        extracted=extracted,
        reason=reason,
    )


def test_too_long_response_and_answer() -> None:
    assert verify("x" * 10_001 + "\nAnswer: 1", "1").reason == "too_long"
    assert verify("Answer: 1", "1" * 10_001).reason == "too_long"
    # Within the input limit but an extracted answer over 1,000 characters.
    long_box = "\\boxed{" + "1+" * 600 + "1}"
    result = verify(long_box, "1201")
    assert (result.reason, result.reward, result.extracted) == ("too_long", -1.0, None)
    # The limit is configurable.
    assert verify("y" * 50 + "\nAnswer: 1", "1", max_input_chars=40).reason == "too_long"
    assert verify("y" * 50 + "\nAnswer: 1", "1", max_input_chars=60).reason == "exact"


def test_answer_line_is_searched_only_in_the_tail() -> None:
    response = "Answer: 5\n" + "z" * 400
    assert verify(response, "5").reason == "no_answer"
    assert verify(response, "5", tail_chars=500).reason == "exact"


def test_custom_pattern_wins_and_falls_back() -> None:
    text = "#### 17\nAnswer: 18"
    assert verify(text, "17", pattern=r"####\s*(\d+)").correct is True
    assert verify(text, "18").correct is True
    # The pattern finds nothing: the Answer: line is used.
    assert verify("Answer: 18", "18", pattern=r"####\s*(\d+)").correct is True


@pytest.mark.parametrize("bad", [r"####\s*\d+", r"(a)(b)", r"(unclosed"])
def test_bad_pattern_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        verify("Answer: 1", "1", pattern=bad)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(TypeError, match="str"):
        verify(b"Answer: 1", "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tail_chars"):
        verify("Answer: 1", "1", tail_chars=0)
    with pytest.raises(ValueError, match="unknown verifier reason"):
        VerifyResult.scored("maybe", None)


# ----------------------------------------------------------------------------------------------------
# The pieces
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{x}", "\\frac{1}{x}"),
        ("\\frac{a}2", "\\frac{a}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\sqrt[3]8", "\\sqrt[3]{8}"),
        ("\\left( x \\right)", "(x)"),
        ("1,000,000", "1000000"),
        ("1,00", "1,00"),
        ("(1, 2)", "(1,2)"),
        ("5\\!\\,\\;000", "5000"),
        ("30^\\circ", "30"),
        ("\\text{ 12 meters}", "12"),
        ("x = 3.", "3"),
        ("\\boxed{\\text{yes}}", "yes"),
        ("units", "units"),
        ("\\textbf{\\text{7}}", "7"),
        ("12\\%", "12%"),
        ("25 percent", "25%"),
        ("2 1/2", "2\\frac{1}{2}"),
        ("x=1, y=2", "x=1,y=2"),
        ("1 and 2", "1,2"),
        ("5\\text{ m}", "5"),
        ("\\dbinom{5}{2}", "\\binom{5}{2}"),
        ("(x, y) = (1, 2)", "(1,2)"),
    ],
)
def test_normalize_answer(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Number(Fraction(42))),
        ("-7", Number(Fraction(-7))),
        ("12.", Number(Fraction(12))),
        ("0.25", Number(Fraction(1, 4), Fraction(1, 100), 2)),
        ("-.5", Number(Fraction(-1, 2), Fraction(1, 10), 1)),
        ("1.4142", Number(Fraction(14142, 10_000), Fraction(1, 10_000), 5)),
        ("0.00120", Number(Fraction(12, 10_000), Fraction(1, 100_000), 3)),
        ("3/6", Number(Fraction(1, 2))),
        ("\\frac{-3}{4}", Number(Fraction(-3, 4))),
        ("-\\frac{-3}{4}", Number(Fraction(3, 4))),
        ("1\\frac{1}{4}", Number(Fraction(5, 4))),
        ("1.5e3", Number(Fraction(1500), Fraction(100), 2)),
        ("-2E-2", Number(Fraction(-1, 50))),
        ("6.02\\times10^{23}", Number(Fraction(602 * 10**21), Fraction(10**21), 3)),
        ("3\\cdot10^5", Number(Fraction(300_000))),
        ("1e1001", None),
        ("1/0", None),
        ("x", None),
        ("1" * 1001, None),
    ],
)
def test_parse_number(text: str, value: Number | None) -> None:
    assert parse_number(text) == value


def test_decimals_are_correct_to_the_digits_they_show_and_exact_values_are_exact() -> None:
    assert compare_answers("1000000.5", "1000000") == "mismatch"  # one unit in the last digit is 0.1
    assert compare_answers("999999.99", "1000000") == "numeric"  # 8 digits, 0.01 off: one unit
    assert compare_answers("1000001", "1000000") == "mismatch"  # exact integers never use a tolerance
    assert compare_answers("0.0000015", "0.000001") == "mismatch"  # 2 significant digits
    assert compare_answers("0.333333", "1/3") == "numeric"  # 6 digits, 3.3e-7 off
    assert compare_answers("0.33333", "1/3") == "mismatch"  # 5 digits: too few
    assert compare_answers("0.666666", "2/3") == "numeric"  # truncated: 6.7e-7 off, within 1e-6
    assert compare_answers("0.666664", "2/3") == "mismatch"  # 2.7e-6 off
    assert compare_answers("0.3333333", "0.333333") == "numeric"  # the gold approximates the answer
    assert compare_answers("3.1416", "3.14") == "mismatch"  # neither has six digits
    assert compare_answers("1.41421356", "\\sqrt{2}") == "numeric"
    assert compare_answers("1.41421", "\\sqrt{2}") == "numeric"  # 3.6e-6 off, within 1e-5
    assert compare_answers("1.41423", "\\sqrt{2}") == "mismatch"  # 1.6e-5 off, more than 1e-5
    assert compare_answers("1.414", "\\sqrt{2}") == "mismatch"
    assert compare_answers("\\sqrt{2}", "1.4142136") == "numeric"  # either side may be the decimal
    assert compare_answers("3.14159265", "\\pi") == "numeric"
    assert compare_answers("0.785398", "\\frac{\\pi}{4}") == "numeric"  # pi/4 = 0.78539816...
    assert compare_answers("1.5x", "\\frac{3}{2}x") == "symbolic"  # decimals inside expressions are exact


def test_last_boxed_content_edge_cases() -> None:
    assert last_boxed_content("no box") is None
    assert last_boxed_content("\\boxed{a{b}c} and \\boxed{d}") == "d"
    assert last_boxed_content("\\boxed{a{b}c}") == "a{b}c"
    assert last_boxed_content("\\boxed{1} \\boxed{") == "1"
    assert last_boxed_content("\\boxed{") is None
    assert last_boxed_content("}}} \\boxed{x\\}y}") == "x\\}y"


def test_extract_answer_order() -> None:
    compiled = compile_answer_pattern(r"Final: (\w+)")
    text = "\\boxed{1}\nAnswer: 2\nFinal: 3"
    assert extract_answer(text, pattern=compiled) == "3"
    assert extract_answer(text) == "2"
    assert extract_answer("\\boxed{1}") == "1"
    assert extract_answer("Answer:   \n") is None


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------


def _cli_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _verdict(out: str) -> dict[str, object]:
    verdict = json.loads(out)
    assert verdict.pop("seconds") >= 0.0
    return verdict  # type: ignore[no-any-return]


@pytest.mark.process  # the response is scored in a verifier worker, with the reward's timeout
def test_cli_text_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_cli_args(["--gold", "42", "--text", "so\nAnswer: 42"])) == 0
    assert _verdict(capsys.readouterr().out) == {
        "score": 1.0,
        "reason": "exact",
        "correct": True,
        "extracted": "42",
        "extras": {},
        "reward": 1.0,
    }


@pytest.mark.process
def test_cli_reads_gsm8k_answer_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """GSM8K's own `#### 42` line, which verl's and TRL's GSM8K examples grade, is an answer."""
    assert run(_cli_args(["--gold", "42", "--text", "The answer is #### 42"])) == 0
    verdict = _verdict(capsys.readouterr().out)
    assert (verdict["score"], verdict["reason"], verdict["extracted"]) == (1.0, "exact", "42")


@pytest.mark.process
def test_cli_reads_stdin_and_uses_pattern(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("#### 9\nAnswer: 8\n"))
    assert run(_cli_args(["--gold", "9", "--pattern", r"####\s*(\d+)"])) == 0
    assert _verdict(capsys.readouterr().out) == {
        "score": 1.0,
        "reason": "exact",
        "correct": True,
        "extracted": "9",
        "extras": {},
        "reward": 1.0,
    }


def test_cli_bad_pattern_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_cli_args(["--gold", "1", "--text", "Answer: 1", "--pattern", "(a)(b)"])) == 2
    assert "capture group" in capsys.readouterr().err


def test_item_comparisons_per_answer_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matching {1,2,3,4} against {4,3,2,1} compares 1 with 4, 3, 2, 1 (4), then 2 with the three
    left (3), 3 with two (2), 4 with one (1): ten distinct comparisons."""
    from stream_dapo.verifier import equivalence

    assert compare_answers("\\{1,2,3,4\\}", "\\{4,3,2,1\\}") == "exact"
    monkeypatch.setattr(equivalence, "MAX_ITEM_COMPARISONS", 10)
    assert compare_answers("\\{1,2,3,4\\}", "\\{4,3,2,1\\}") == "exact"
    monkeypatch.setattr(equivalence, "MAX_ITEM_COMPARISONS", 9)
    assert compare_answers("\\{1,2,3,4\\}", "\\{4,3,2,1\\}") == "parse_error"


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("5", Scalar("5")),
        ("25%", Scalar("25", percent=True)),
        ("3:4", Scalar("\\frac{3}{4}")),
        ("\\{1,2\\}", Collection("set", (Scalar("1"), Scalar("2")))),
        ("\\emptyset", Collection("set", ())),
        ("1,2", Collection("list", (Scalar("1"), Scalar("2")))),
        ("x=1,y=2", Collection("list", (Scalar("1", label="x"), Scalar("2", label="y")))),
        ("(1,2)", Sequence("(", ")", (Scalar("1"), Scalar("2")))),
        ("[0,1)", Sequence("[", ")", (Scalar("0"), Scalar("1")))),
        ("(x+1)", Scalar("(x+1)")),
        ("(1,2)+(3,4)", Scalar("(1,2)+(3,4)")),  # not one bracket pair, no top-level comma
        ("1:2:3", Sequence(":", ":", (Scalar("1"), Scalar("2"), Scalar("3")))),
        ("1\\pm\\sqrt{2}", Collection("list", (Scalar("1+\\sqrt{2}"), Scalar("1-\\sqrt{2}")))),
        ("\\pm3", Collection("list", (Scalar("3"), Scalar("-3")))),
        (
            "(0,1)\\cup[2,3]",
            Collection(
                "union",
                (
                    Sequence("(", ")", (Scalar("0"), Scalar("1"))),
                    Sequence("[", "]", (Scalar("2"), Scalar("3"))),
                ),
            ),
        ),
        ("\\{(1,2)\\}", Collection("set", (Sequence("(", ")", (Scalar("1"), Scalar("2"))),))),
        ("\\frac{1,2}{3}", Scalar("\\frac{1,2}{3}")),
    ],
)
def test_read_structure(text: str, shape: object) -> None:
    assert read_structure(text) == shape


def test_split_top_level() -> None:
    assert split_top_level("1,(2,3),\\{4,5\\},[6,7)", ",") == ["1", "(2,3)", "\\{4,5\\}", "[6,7)"]
    assert split_top_level("(0,1)\\cup(2,3)\\cupola", "\\cup") == ["(0,1)", "(2,3)\\cupola"]
    assert split_top_level("1)),2", ",") == ["1))", "2"]

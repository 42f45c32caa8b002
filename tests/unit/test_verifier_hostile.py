"""Hostile answers: nothing is executed, nothing blows up, every one scores -1 in bounded time.

Bounded time is enforced with pytest-timeout markers, not by timing assertions: each bound is far
above a run on a busy machine (seconds) and a hang (these inputs, unguarded, run for hours) trips it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.testing.hostile import HOSTILE_RESPONSES, PWN
from stream_dapo.verifier import VerifierPool, verify
from stream_dapo.verifier.safe_parse import (
    MAX_RESULT_BITS,
    SafeParseError,
    checked_pow,
    parse_math,
    tokenize,
)


@pytest.fixture()
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory so that a PWNED marker, if anything ever wrote one, is seen."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("response", HOSTILE_RESPONSES, ids=lambda r: repr(r[:40]))
def test_hostile_response_in_process(response: str, in_tmp_cwd: Path) -> None:
    result = verify(response, "1")
    assert (result.correct, result.reward) == (False, -1.0)
    assert not (in_tmp_cwd / "PWNED").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("response", HOSTILE_RESPONSES[:10], ids=lambda r: repr(r[:40]))
def test_hostile_text_as_gold_does_not_crash(response: str, in_tmp_cwd: Path) -> None:
    result = verify("Answer: 1", response[-5_000:])
    assert (result.correct, result.reward) == (False, -1.0)
    assert not (in_tmp_cwd / "PWNED").exists()


@pytest.mark.timeout(120)
def test_hostile_responses_with_raised_input_limit(in_tmp_cwd: Path) -> None:
    """With the input limit raised past the hostile sizes, extraction (linear) still copes and the
    answer cap refuses the over-long answers."""
    for response in HOSTILE_RESPONSES:
        result = verify(response, "1", max_input_chars=2_000_000)
        assert result.reward == -1.0, response[:40]
    # The Answer: line is out of the 300-character tail; the boxed one is found and refused by length.
    assert verify("Answer: " + "9" * 1_000_000, "1", max_input_chars=2_000_000).reason == "no_answer"
    assert verify("\\boxed{" + "9" * 1_000_000 + "}", "1", max_input_chars=2_000_000).reason == "too_long"
    assert not (in_tmp_cwd / "PWNED").exists()


@pytest.mark.process
@pytest.mark.timeout(300)
def test_hostile_responses_through_the_pool(in_tmp_cwd: Path) -> None:
    items = [(response, "1") for response in HOSTILE_RESPONSES] + [("Answer: 1", "1")]
    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        results = pool.verify_batch(items)
        counters = pool.counters
    assert [r.reward for r in results] == [-1.0] * len(HOSTILE_RESPONSES) + [1.0]
    assert results[-1].reason == "exact"
    assert sum(counters.values()) == len(items)
    assert not (in_tmp_cwd / "PWNED").exists()


@pytest.mark.timeout(120)
def test_model_text_never_reaches_eval_exec_or_parse_expr(monkeypatch: pytest.MonkeyPatch) -> None:
    import sympy.parsing.sympy_parser as sympy_parser
    import sympy.physics.units  # noqa: F401 - simplify() imports it lazily; its own constants use sympify

    sources: list[str] = []
    parse_expr_calls: list[object] = []

    def spy_on(real: Callable[..., Any]) -> Callable[..., Any]:
        # Imports run code objects through exec, and sympy.polys execs monomial code it generates itself
        # ("def monomial_mul(A, B): ..."); record every text source to check that none is model text.
        def spy(source: object, *args: object, **kwargs: object) -> Any:
            if isinstance(source, str):
                sources.append(source)
            return real(source, *args, **kwargs)

        return spy

    def refuse_parse_expr(*args: object, **kwargs: object) -> None:
        parse_expr_calls.append(args)
        raise AssertionError("sympify/parse_expr was called on text")

    monkeypatch.setattr(builtins, "eval", spy_on(builtins.eval))
    monkeypatch.setattr(builtins, "exec", spy_on(builtins.exec))
    monkeypatch.setattr(sympy_parser, "parse_expr", refuse_parse_expr)
    cases = [
        ("Answer: (x+1)^2", "x^2+2x+1", True),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2", True),
        ("Answer: 2\\sqrt{2}", "\\sqrt{8}", True),
        ("Answer: \\frac{x^2-1}{x-1}", "x+1", True),
        ("Answer: " + PWN, "1", False),
        ("Answer: 9**9**9**9", "1", False),
        ("Answer: \\ln 4", "2\\ln 2", True),
        ("Answer: \\frac{1}{2}", "\\sin 30^\\circ", True),
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", True),
        ("Answer: 1.41421356", "\\sqrt{2}", True),
        ("Answer: 10!", "3628800", True),
        ("Answer: 2 \\le x < 5", "[2, 5)", True),
    ]
    for response, gold, expected in cases:
        assert verify(response, gold).correct is expected
    assert parse_expr_calls == []
    markers = ("__import__", "PWNED", "9**9", "sqrt", "frac", "x+1", "x^2", "x-1", "\\ln", "\\sin", "10!")
    assert [src for src in sources if any(marker in src for marker in markers)] == []


# ----------------------------------------------------------------------------------------------------
# The safe parser's guards, one by one
# ----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9^9^9^9", "exponent"),
        ("2^{2^{2^{2^{2}}}}", "exponent"),  # 2^(2^16): the inner powers fold to 65536 first
        ("x^{1001}", "exponent"),
        ("x^{-1001}", "exponent"),
        ("2^{\\frac{1}{1001}}", "exponent"),
        ("(x^{1000})^{1000}", "exponent"),
        ("((9^{1000})^{1000})", "bits"),
        ("x^{y^{z}}", "power tower"),
        ("2^{x^{x}}", "power tower"),
        ("(" * 60 + "1" + ")" * 60, "nesting"),
        ("-" * 60 + "1", "nesting"),
        ("+".join(["1"] * 101), "tokens"),
        ("1" * 1001, "number literal"),
        ("__import__('os')", "unsupported"),
        ("\\log{2}", "ambiguous"),
        ("\\sinh{2}", "unexpected"),
        ("\\Gamma(2)", "unsupported"),
        ("\\sin^{-1}x", "ambiguous"),
        ("\\sin", "missing its argument"),
        ("\\sin10^{7}", "larger than"),
        ("\\exp(1001)", "larger than"),
        ("\\ln0", "undefined"),
        ("\\tan(\\pi/2)", "undefined"),
        ("\\log_{1}5", "undefined"),
        ("1,2", "unsupported"),
        ("\\frac{1}{0}", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("0^{-1}", "zero"),
        ("\\sqrt[x]{2}", "root index"),
        ("\\sqrt[1001]{2}", "root index"),
        ("(1", "expected"),
        ("1)", "unexpected"),
        ("", "empty"),
        ("1.2.3", "two numbers"),
        ("[1]", "unexpected"),
        ("1001!", "factorial"),
        ("x!", "factorial"),
        ("(-1)!", "factorial"),
        ("3!!", "double factorial"),
        ("\\binom{10001}{2}", "binomial"),
        ("\\binom{x}{2}", "binomial"),
        ("\\binom{5}{x}", "binomial"),
        ("1e1001", "exponent"),
        ("2.5E-1001", "exponent"),
    ],
)
def test_safe_parse_guards(text: str, message: str) -> None:
    with pytest.raises(SafeParseError, match=message):
        parse_math(text)


def test_safe_parse_builds_the_expected_values() -> None:
    import sympy

    x, y = sympy.symbols("x y")
    assert parse_math("2\\sqrt{3}") == 2 * sympy.sqrt(3)
    assert parse_math("3x") == 3 * x
    assert parse_math("xy") == x * y
    assert parse_math("-2^2") == -4
    assert parse_math("2^3^2") == 512
    assert parse_math("2^-1") == sympy.Rational(1, 2)
    assert parse_math("2^3x") == 8 * x
    assert parse_math("0.125") == sympy.Rational(1, 8)
    assert parse_math("\\sqrt[3]{x}") == x ** sympy.Rational(1, 3)
    assert parse_math("\\frac{x}{2}y") == x * y / 2
    assert parse_math("2(x+1)") == 2 * x + 2
    assert parse_math("\\pi\\cdot 2 \\times 3 \\div 4") == sympy.Rational(3, 2) * sympy.pi
    assert parse_math("x^{1000}") == x**1000
    assert parse_math("2^{1000}") == 2**1000
    assert parse_math("(" * 40 + "1" + ")" * 40) == 1
    assert parse_math("10!") == 3_628_800
    assert parse_math("3!^2") == 36  # the factorial binds tighter than the power
    assert parse_math("2 \\cdot 3!") == 12
    assert parse_math("\\binom{5}{2}") == 10
    assert parse_math("\\binom{5}{7}") == 0
    assert parse_math("\\binom{5}{-1}") == 0
    assert parse_math("\\frac{10!}{2!8!}") == 45
    assert parse_math("1.5e3") == 1500
    assert parse_math("2E-2") == sympy.Rational(1, 50)
    assert parse_math("e^{i\\pi}") == -1  # e and i are constants, not variables
    assert parse_math("\\ln2") == sympy.log(2)
    assert parse_math("\\log_{2}8") == 3
    assert parse_math("\\sin\\frac{\\pi}{6}") == sympy.Rational(1, 2)
    assert parse_math("\\sin2x") == sympy.sin(2 * x)  # the argument runs to the next operator
    assert parse_math("2\\sinx\\cosx") == 2 * sympy.sin(x) * sympy.cos(x)
    assert parse_math("\\sin^2x") == sympy.sin(x) ** 2
    assert parse_math("\\arctan1") == sympy.pi / 4


def test_checked_pow_refuses_before_computing() -> None:
    import sympy

    # 3^(MAX_RESULT_BITS) would take a while and a lot of memory; the guard refuses it from the sizes.
    with pytest.raises(SafeParseError, match="bits"):
        checked_pow(sympy.Integer(2) ** 100, sympy.Integer(MAX_RESULT_BITS // 100 + 1))
    assert checked_pow(sympy.Integer(2), sympy.Integer(10)) == 1024


def test_tokenize() -> None:
    assert tokenize("2**x+\\frac{1}{2}") == [
        ("num", "2"),
        ("op", "^"),
        ("var", "x"),
        ("op", "+"),
        ("cmd", "\\frac"),
        ("op", "{"),
        ("num", "1"),
        ("op", "}"),
        ("op", "{"),
        ("num", "2"),
        ("op", "}"),
    ]
    with pytest.raises(SafeParseError, match="more than 3 tokens"):
        tokenize("1+2+3", max_tokens=3)

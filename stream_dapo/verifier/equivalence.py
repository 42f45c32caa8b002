"""Decide whether an extracted answer equals the gold answer.

Three tests, cheapest first; the first that can decide does:

1. **exact**: the normalised strings are equal.
2. **numeric**: both are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers
   like ``2\\frac{1}{2}``, with signs), parsed into ``Fraction`` by the regexes below. Two exact
   numbers (no decimal point) must be equal; when either side is a decimal, a relative tolerance of
   ``NUMERIC_REL_TOL`` allows rounding (``0.3333333`` vs ``1/3``).
3. **symbolic**: both sides go through the safe parser (``safe_parse``) into sympy. If sympy's
   automatic canonical form already makes the difference zero, they are equal. Otherwise the
   difference is evaluated at a few fixed pseudo-random points (30 significant digits); any
   disagreement means "mismatch", and only when every point agrees does ``simplify(a - b) == 0``
   run, so the expensive call is reserved for answers that are almost surely equal.

sympy is imported only when step 3 is reached, so verifying integer answers never pays for it.
Decimals parsed by the safe parser become exact rationals, so ``0.866025`` does not equal
``\\frac{\\sqrt{3}}{2}``: an approximation of an irrational exact answer is not rewarded.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING

from stream_dapo.verifier.normalize import normalize_answer

if TYPE_CHECKING:
    import sympy

__all__ = ["NUMERIC_REL_TOL", "compare_answers", "on_first_sympy_import", "parse_number"]

NUMERIC_REL_TOL = Fraction(1, 10**6)
_SYMBOLIC_REL_TOL = 1e-9
_SAMPLE_POINTS = 5
_MAX_DIGITS = 1000  # longer literals are not plain numbers here (Python refuses int() past 4300 digits)

_INT_RE = re.compile(r"([+-]?)(\d+)")
_DECIMAL_RE = re.compile(r"([+-]?)(\d*\.\d+|\d+\.)")
_SLASH_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([+-]?)(\d+)\}\{([+-]?)(\d+)\}")
_MIXED_RE = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_PLAIN_INT_RE = re.compile(r"-?\d{1,18}")
# Four or more letters in a row outside a LaTeX command are a word ("Monday"), not a product of
# variables: letters commute under multiplication, so the parser would call "dog" equal to "god".
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}")


_import_hooks: list[tuple[Callable[[], None], Callable[[], None]]] = []


def on_first_sympy_import(before: Callable[[], None], after: Callable[[], None]) -> None:
    """Call ``before`` and ``after`` around this process's first import of sympy (about 0.5 s, once).

    Pool workers use them to stop the current check's clock during this one-time start-up cost, so
    that it does not count against the per-check timeout.
    """
    _import_hooks.append((before, after))


def _import_safe_parse() -> None:
    if "stream_dapo.verifier.safe_parse" in sys.modules:
        return
    for before, _ in _import_hooks:
        before()
    import stream_dapo.verifier.safe_parse  # noqa: F401 - imports sympy

    for _, after in _import_hooks:
        after()


def _sign(*signs: str) -> int:
    return -1 if sum(s == "-" for s in signs) % 2 else 1


def parse_number(text: str) -> tuple[Fraction, bool] | None:
    """Parse a normalised plain number into ``(value, exact)``; ``None`` when it is not one.

    ``exact`` is False for decimals, whose last digit may be rounded.
    """
    if len(text) > _MAX_DIGITS:
        return None
    if m := _INT_RE.fullmatch(text):
        return Fraction(_sign(m[1]) * int(m[2])), True
    if m := _DECIMAL_RE.fullmatch(text):
        return _sign(m[1]) * Fraction(m[2]), False
    if m := _SLASH_RE.fullmatch(text):
        den = int(m[3])
        return (Fraction(_sign(m[1]) * int(m[2]), den), True) if den else None
    if m := _FRAC_RE.fullmatch(text):
        den = int(m[5])
        return (Fraction(_sign(m[1], m[2], m[4]) * int(m[3]), den), True) if den else None
    if m := _MIXED_RE.fullmatch(text):
        den = int(m[4])
        return (_sign(m[1]) * (int(m[2]) + Fraction(int(m[3]), den)), True) if den else None
    return None


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    (x, x_exact), (y, y_exact) = a, b
    if x_exact and y_exact:
        return x == y
    return abs(x - y) <= NUMERIC_REL_TOL * max(abs(x), abs(y))


def _values_agree(a: sympy.Expr, b: sympy.Expr) -> bool | None:
    """Compare ``a`` and ``b`` numerically at fixed pseudo-random points.

    Returns False on the first disagreement, True when every point that could be evaluated agrees,
    None when no point could be evaluated (a pole at every sample, say).
    """
    import sympy

    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    rng = random.Random(0x5EED)  # fixed: the same answer pair always gets the same verdict
    points = 1 if not symbols else _SAMPLE_POINTS
    evaluated = 0
    for _ in range(points):
        # Rationals away from 0 and 1, where coincidences (x^2 == x) and poles are likeliest.
        subs = {s: sympy.Rational(rng.randint(1_100, 2_900), 1_000) for s in symbols}
        va = a.evalf(30, subs=subs)
        vb = b.evalf(30, subs=subs)
        if (
            not (va.is_number and vb.is_number)
            or va.has(sympy.zoo, sympy.nan)
            or vb.has(sympy.zoo, sympy.nan)
        ):
            continue
        scale = max(1, abs(va), abs(vb))
        if not bool(abs(va - vb) <= _SYMBOLIC_REL_TOL * scale):
            return False
        evaluated += 1
    return True if evaluated else None


def _symbolic_equal(candidate: str, gold: str) -> str:
    if _WORD_RE.search(candidate) or _WORD_RE.search(gold):
        return "mismatch"  # words are compared as text only, and the exact test already failed
    _import_safe_parse()
    from stream_dapo.verifier.safe_parse import SafeParseError, parse_math

    try:
        a = parse_math(candidate)
        b = parse_math(gold)
    except SafeParseError:
        return "parse_error"
    import sympy

    try:
        difference = a - b
        if difference == 0:
            return "symbolic"
        if _values_agree(a, b) is False:
            return "mismatch"
        return "symbolic" if sympy.simplify(difference) == 0 else "mismatch"
    except (ArithmeticError, TypeError, ValueError, RecursionError, AttributeError):
        # sympy raises a variety of these on exotic input; they mean "could not compare", never "equal".
        return "parse_error"


def compare_answers(candidate: str, gold: str) -> str:
    """Compare an extracted answer with the gold answer.

    Returns the reason: "exact", "numeric" or "symbolic" when equal, "mismatch" when they differ,
    "no_answer" when the candidate normalises to nothing, "parse_error" when they are not plain
    numbers and one of them is outside the safe parser's allow-list.
    """
    candidate, gold = candidate.strip(), gold.strip()
    if candidate and candidate == gold:
        return "exact"
    # Fast path for DAPO-style integer answers: no normalisation, no regex set-up beyond two matches.
    if _PLAIN_INT_RE.fullmatch(candidate) and _PLAIN_INT_RE.fullmatch(gold):
        return "numeric" if int(candidate) == int(gold) else "mismatch"
    c, g = normalize_answer(candidate), normalize_answer(gold)
    if not c:
        return "no_answer"
    if c == g:
        return "exact"
    c_num, g_num = parse_number(c), parse_number(g)
    if c_num is not None and g_num is not None:
        return "numeric" if _numbers_equal(c_num, g_num) else "mismatch"
    return _symbolic_equal(c, g)

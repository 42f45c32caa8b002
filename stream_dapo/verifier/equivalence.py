"""Decide whether an extracted answer equals the gold answer.

Both answers are normalised (``normalize``) and read into shapes (``structure``): sets and lists are
compared as multisets (``\\{2,1\\}`` equals ``\\{1,2\\}``), tuples and intervals item by item with
their brackets (``(1,2)`` is not ``(2,1)``, ``[0,1)`` is not ``(0,1)``), a tuple is never a set, and
a set of one equals its item. Labels must agree where both items have one (``x=1`` vs ``y=1``);
against a list that names one value per variable, a list without names is read in order (``1, 2``
is ``x=1, y=2``, ``2, 1`` is not; the roots ``x=1, x=2`` stay unordered).
Items, and whole answers that are one value, go through three tests, cheapest first; the first that
can decide does:

1. **exact**: the normalised strings are equal (words also case-insensitively).
2. **numeric**: both are plain numbers: integers, decimals, scientific notation (``1.5e3``,
   ``1.5\\times10^{3}``), ``a/b``, ``\\frac{a}{b}``, mixed numbers ``2\\frac{1}{2}``, with signs, parsed
   into ``Fraction`` by the regexes below; or one is a decimal and the other a constant expression
   (``\\sqrt{2}``, ``\\pi/4``, ``\\binom{5}{2}``) evaluated by sympy. A side with a ``%`` stands for both
   p and p/100, so ``25\\%`` equals 25 and 0.25 (never without the sign: 0.25 is not 25).
3. **symbolic**: both sides go through the safe parser (``safe_parse``) into sympy. If sympy's
   automatic canonical form already makes the difference zero, they are equal. Otherwise the
   difference is evaluated at a few fixed pseudo-random points (30 significant digits); any
   disagreement means "mismatch", and only when every point agrees does ``simplify(a - b) == 0``
   run, so the expensive call is reserved for answers that are almost surely equal.

Numeric tolerance (the one place it is decided): exact values (integers, fractions, roots, pi,
factorials) are equal only when equal. A decimal (or a number in scientific notation) is read as an
approximation correct to the digits it shows: it equals a value v when it is exactly v, or when it
has at least ``APPROX_MIN_SIG_DIGITS`` significant digits and differs from v by at most one unit in
its last digit (so rounding and truncation both pass). Hence ``1.41421356`` and ``1.414214`` equal
``\\sqrt{2}``, ``0.3333333`` equals ``1/3``, and ``1.414``, ``3.14`` (for pi), ``0.33`` and
``1000000.5`` (for 1000000) do not. Two decimals are equal when either is such an approximation of
the other.

sympy is imported only when a constant expression or step 3 is reached, so verifying integer
answers never pays for it.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from stream_dapo.verifier.normalize import normalize_answer
from stream_dapo.verifier.structure import Answer, Collection, Scalar, Sequence, read_structure

if TYPE_CHECKING:
    import sympy

__all__ = [
    "APPROX_MIN_SIG_DIGITS",
    "MAX_ITEM_COMPARISONS",
    "Number",
    "compare_answers",
    "import_heavy",
    "on_first_sympy_import",
    "parse_number",
]

APPROX_MIN_SIG_DIGITS = 6
# Distinct item comparisons one answer pair may need (a perfect matching of two 32-item sets needs at
# most 32 x 32); beyond it the pair is "parse_error", like any other size guard.
MAX_ITEM_COMPARISONS = 1024
_SYMBOLIC_REL_TOL = 1e-9
_SAMPLE_POINTS = 5
_MAX_DIGITS = 1000  # longer literals are not plain numbers here (Python refuses int() past 4300 digits)
_MAX_SCI_EXPONENT = 1000

_INT_RE = re.compile(r"([+-]?)(\d+)")
_DECIMAL_RE = re.compile(r"([+-]?)(\d*)\.(\d+)|([+-]?)(\d+)\.")
_SCI_RE = re.compile(
    r"([+-]?)(\d+)(?:\.(\d+))?(?:[eE]|(?:\\times|\\cdot|\*)10\^)(?:\{([+-]?\d+)\}|([+-]?\d))"
    r"|([+-]?)(\d+)(?:\.(\d+))?[eE]([+-]?\d+)"
)
_SLASH_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([+-]?)(\d+)\}\{([+-]?)(\d+)\}")
_MIXED_RE = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_PLAIN_INT_RE = re.compile(r"-?\d{1,18}")
# Four or more letters in a row outside a LaTeX command are a word ("Monday"), not a product of
# variables: letters commute under multiplication, so the parser would call "dog" equal to "god".
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}")
_REASON_RANK = {"exact": 0, "numeric": 1, "symbolic": 2}


_import_hooks: list[tuple[Callable[[], None], Callable[[], None]]] = []


def on_first_sympy_import(before: Callable[[], None], after: Callable[[], None]) -> None:
    """Call ``before`` and ``after`` around this process's first import of sympy (about 0.5 s, once)
    and of any other heavy module imported through ``import_heavy`` (Math-Verify's, say).

    Pool workers use them to stop the current check's clock during this one-time start-up cost, so
    that it does not count against the per-check timeout.
    """
    _import_hooks.append((before, after))


def import_heavy(module: str) -> None:
    """Import ``module`` once, with the clock stopped (see ``on_first_sympy_import``)."""
    if module in sys.modules:
        return
    for before, _ in _import_hooks:
        before()
    try:
        __import__(module)
    finally:
        for _, after in _import_hooks:
            after()


def _sign(*signs: str) -> int:
    return -1 if sum(s == "-" for s in signs) % 2 else 1


@dataclass(frozen=True)
class Number:
    """A plain number. ``ulp`` is None for an exact one; for a decimal it is one unit in its last
    written digit, and ``sig_digits`` counts its significant digits (see the tolerance above)."""

    value: Fraction
    ulp: Fraction | None = None
    sig_digits: int = 0

    def percent_of(self) -> Number:
        """This number read as a percentage (p/100)."""
        ulp = None if self.ulp is None else self.ulp / 100
        return Number(self.value / 100, ulp, self.sig_digits)


def _significant(integer_digits: str, fraction_digits: str) -> int:
    return max(1, len((integer_digits + fraction_digits).lstrip("0")))


def _scientific(sign: str, whole: str, fraction: str | None, exponent: str) -> Number | None:
    power = int(exponent)
    if abs(power) > _MAX_SCI_EXPONENT:
        return None
    fraction = fraction or ""
    mantissa = Fraction(int(whole + fraction), 10 ** len(fraction))
    value = _sign(sign) * mantissa * Fraction(10) ** power
    if not fraction:
        return Number(value)
    return Number(value, Fraction(10) ** (power - len(fraction)), _significant(whole, fraction))


def parse_number(text: str) -> Number | None:
    """Parse a normalised plain number; ``None`` when it is not one."""
    if len(text) > _MAX_DIGITS:
        return None
    if m := _INT_RE.fullmatch(text):
        return Number(Fraction(_sign(m[1]) * int(m[2])))
    if m := _DECIMAL_RE.fullmatch(text):
        if m[5] is not None:  # "12." is the integer 12
            return Number(Fraction(_sign(m[4]) * int(m[5])))
        whole, fraction = m[2], m[3]
        value = _sign(m[1]) * Fraction(
            int(whole or "0") * 10 ** len(fraction) + int(fraction), 10 ** len(fraction)
        )
        return Number(value, Fraction(1, 10 ** len(fraction)), _significant(whole, fraction))
    if m := _SCI_RE.fullmatch(text):
        if m[2] is not None:
            return _scientific(m[1], m[2], m[3], m[4] if m[4] is not None else m[5])
        return _scientific(m[6], m[7], m[8], m[9])
    if m := _SLASH_RE.fullmatch(text):
        den = int(m[3])
        return Number(Fraction(_sign(m[1]) * int(m[2]), den)) if den else None
    if m := _FRAC_RE.fullmatch(text):
        den = int(m[5])
        return Number(Fraction(_sign(m[1], m[2], m[4]) * int(m[3]), den)) if den else None
    if m := _MIXED_RE.fullmatch(text):
        den = int(m[4])
        return Number(_sign(m[1]) * (int(m[2]) + Fraction(int(m[3]), den))) if den else None
    return None


def _approximates(decimal: Number, value: Fraction) -> bool:
    return (
        decimal.ulp is not None
        and decimal.sig_digits >= APPROX_MIN_SIG_DIGITS
        and abs(decimal.value - value) <= decimal.ulp
    )


def _numbers_equal(a: Number, b: Number) -> bool:
    return a.value == b.value or _approximates(a, b.value) or _approximates(b, a.value)


def _approximates_constant(decimal: Number, text: str) -> bool | None:
    """Whether ``decimal`` approximates the constant expression ``text`` (``\\sqrt{2}``); None when
    ``text`` is not a real constant the safe parser accepts."""
    if decimal.ulp is None or _WORD_RE.search(text):
        return None
    import_heavy("stream_dapo.verifier.safe_parse")
    import sympy

    from stream_dapo.verifier.safe_parse import SafeParseError, parse_math

    try:
        expr = parse_math(text)
        if expr.free_symbols:
            return None
        exact_difference = sympy.Rational(decimal.value.numerator, decimal.value.denominator) - expr
        if exact_difference == 0:
            return True  # 0.5 is cos(pi/3) exactly
        if decimal.sig_digits < APPROX_MIN_SIG_DIGITS:
            return False
        # Enough digits for the difference, which is about one unit in the decimal's last place.
        difference = exact_difference.evalf(min(decimal.sig_digits + 20, _MAX_DIGITS + 20))
        if not difference.is_real:
            return None
        ulp = decimal.ulp
        return bool(abs(difference) <= sympy.Rational(ulp.numerator, ulp.denominator))
    except (SafeParseError, ArithmeticError, TypeError, ValueError, RecursionError, AttributeError):
        return None


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
    import_heavy("stream_dapo.verifier.safe_parse")
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


def _with_percent(number: Number | None, percent: bool) -> list[Number]:
    if number is None:
        return []
    return [number, number.percent_of()] if percent else [number]


class _TooManyComparisons(Exception):
    pass


class _Budget:
    """Item comparisons left for one ``compare_answers`` call, and the verdicts so far: matching two
    32-item collections of 32-item collections could otherwise take a million sympy comparisons."""

    def __init__(self, comparisons: int) -> None:
        self.left = comparisons
        self.verdicts: dict[tuple[Scalar, Scalar], str] = {}

    def scalars_equal(self, candidate: Scalar, gold: Scalar) -> str:
        key = (candidate, gold)
        if key not in self.verdicts:
            self.left -= 1
            if self.left < 0:
                raise _TooManyComparisons
            self.verdicts[key] = _scalars_equal(candidate, gold)
        return self.verdicts[key]


def _scalars_equal(candidate: Scalar, gold: Scalar) -> str:
    if candidate.label and gold.label and candidate.label != gold.label:
        return "mismatch"
    c, g = candidate.text, gold.text
    if not c or not g:
        return "parse_error"
    if c == g or (c.casefold() == g.casefold() and _WORD_RE.search(c)):
        return "exact"
    c_numbers = _with_percent(parse_number(c), candidate.percent)
    g_numbers = _with_percent(parse_number(g), gold.percent)
    if c_numbers and g_numbers:
        return "numeric" if any(_numbers_equal(x, y) for x in c_numbers for y in g_numbers) else "mismatch"
    # One plain number, one expression: a decimal may approximate a constant (sqrt(2) ~ 1.41421356).
    for numbers, other in ((c_numbers, g), (g_numbers, c)):
        verdicts = [_approximates_constant(n, other) for n in numbers]
        if any(verdicts):
            return "numeric"
        if verdicts and all(v is False for v in verdicts):
            return "mismatch"
    return _symbolic_equal(c, g)


def _combine(reasons: list[str]) -> str:
    """The reason for a whole collection or sequence whose items all matched with ``reasons``."""
    return max(reasons, key=lambda r: _REASON_RANK[r], default="exact")


def _ordered_equal(candidate: tuple[Answer, ...], gold: tuple[Answer, ...], budget: _Budget) -> str:
    if len(candidate) != len(gold):
        return "mismatch"
    reasons = []
    for c, g in zip(candidate, gold, strict=True):
        reason = _shapes_equal(c, g, budget)
        if reason not in _REASON_RANK:
            return reason
        reasons.append(reason)
    return _combine(reasons)


def _unordered_equal(candidate: tuple[Answer, ...], gold: tuple[Answer, ...], budget: _Budget) -> str:
    """Multiset equality: a perfect matching between the items (Kuhn's augmenting paths, at most
    ``MAX_ITEMS`` squared item comparisons, each computed once)."""
    if len(candidate) != len(gold):
        return "mismatch"
    cache: dict[tuple[int, int], str] = {}

    def reason(i: int, j: int) -> str:
        if (i, j) not in cache:
            cache[(i, j)] = _shapes_equal(candidate[i], gold[j], budget)
        return cache[(i, j)]

    match_of_gold: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for j in range(len(gold)):
            if j in seen or reason(i, j) not in _REASON_RANK:
                continue
            seen.add(j)
            if j not in match_of_gold or augment(match_of_gold[j], seen):
                match_of_gold[j] = i
                return True
        return False

    for i in range(len(candidate)):
        if not augment(i, set()):
            return "parse_error" if "parse_error" in cache.values() else "mismatch"
    return _combine([reason(i, j) for j, i in match_of_gold.items()])


def _is_pair_and_list(a: Answer, b: Answer) -> bool:
    return isinstance(a, Sequence) and a.opener == "(" and isinstance(b, Collection) and b.kind == "list"


def _labelled(a: Collection) -> bool:
    """Whether ``a`` names one value per variable (``x=1, y=2``, not the roots ``x=1, x=2``)."""
    labels = [item.label for item in a.items if isinstance(item, Scalar) and item.label]
    return len(labels) == len(a.items) > 0 and len(set(labels)) == len(labels)


def _is_singleton(a: Answer) -> bool:
    return isinstance(a, Collection) and a.kind == "set" and len(a.items) == 1


def _shapes_equal(candidate: Answer, gold: Answer, budget: _Budget) -> str:
    if isinstance(candidate, Scalar) and isinstance(gold, Scalar):
        return budget.scalars_equal(candidate, gold)
    if isinstance(candidate, Collection) and isinstance(gold, Collection):
        if (candidate.kind == "union") != (gold.kind == "union"):
            return "mismatch"
        if _labelled(candidate) != _labelled(gold):
            # "1, 2" for "x=1, y=2": without labels only the order says which value is which.
            return _ordered_equal(candidate.items, gold.items, budget)
        return _unordered_equal(candidate.items, gold.items, budget)
    if isinstance(candidate, Sequence) and isinstance(gold, Sequence):
        if (candidate.opener, candidate.closer) != (gold.opener, gold.closer):
            return "mismatch"
        return _ordered_equal(candidate.items, gold.items, budget)
    # A bare list written in order against a tuple: "1, 2" for the pair (1, 2).
    if _is_pair_and_list(candidate, gold) or _is_pair_and_list(gold, candidate):
        return _ordered_equal(candidate.items, gold.items, budget)  # type: ignore[union-attr]
    # A set of one against its item: "\{5\}" for 5.
    if _is_singleton(candidate) and isinstance(gold, Scalar):
        return _shapes_equal(candidate.items[0], gold, budget)  # type: ignore[union-attr]
    if _is_singleton(gold) and isinstance(candidate, Scalar):
        return _shapes_equal(candidate, gold.items[0], budget)  # type: ignore[union-attr]
    return "mismatch"


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
    try:
        return _shapes_equal(read_structure(c), read_structure(g), _Budget(MAX_ITEM_COMPARISONS))
    except _TooManyComparisons:
        return "parse_error"

"""Minerva-style normalisation of a final answer.

The steps follow the spirit of ``normalize_final_answer`` from Lewkowycz et al. 2022 (Minerva), which
DAPO's reference scorer also uses, with a few places made stricter so that they cannot change the
value of an answer:

- unit words are removed only as whole words (Minerva removes substrings, which turns "units" inside
  other words into damage), together with a ``^2``/``^3`` that belongs to the unit;
- commas are removed from a number only when they group its digits by threes ("1,000" but not "1,00"
  or the tuple "1,2");
- ``\\frac12`` and ``\\sqrt2`` get their braces back so that both spellings compare equal.

Normalisation only rewrites notation; whether two answers are equal is decided in ``equivalence``.
Every regex here is linear in its input (no nested quantifiers over the same characters), and the
input is bounded by the caller.
"""

from __future__ import annotations

import functools
import re

from stream_dapo.verifier.extract import last_boxed_content

__all__ = ["UNIT_WORDS", "normalize_answer"]

# Units and counting nouns that answers append to a number ("12 cm", "5 dollars", "30 degrees").
# Single letters are left out on purpose: they are variables far more often than units.
UNIT_WORDS: tuple[str, ...] = (
    "degrees", "degree", "radians", "radian",
    "centimeters", "centimetres", "centimeter", "centimetre", "cm",
    "millimeters", "millimetres", "millimeter", "millimetre", "mm",
    "kilometers", "kilometres", "kilometer", "kilometre", "km",
    "meters", "metres", "meter", "metre",
    "inches", "inch", "feet", "foot", "ft", "yards", "yard", "miles", "mile", "mph",
    "seconds", "second", "sec", "minutes", "minute", "mins", "hours", "hour", "hrs", "hr",
    "days", "day", "weeks", "week", "months", "month", "years", "year",
    "dollars", "dollar", "cents", "cent",
    "units", "unit", "square", "sq", "cubic",
    "grams", "gram", "kg", "pounds", "pound", "lbs", "lb", "ounces", "ounce", "oz",
    "liters", "litres", "liter", "litre", "ml", "gallons", "gallon",
    "points", "point", "ways", "people", "students", "integers", "digits", "edges", "percent",
)  # fmt: skip

_UNIT_RE = re.compile(
    r"(?<![A-Za-z\\])(?:"
    + "|".join(sorted(UNIT_WORDS, key=len, reverse=True))
    + r")(?:\^\{?[23]\}?)?(?![A-Za-z])"
)
# Commands whose argument is kept as plain text.
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|operatorname|hbox)"
    r"\s*\{([^{}]*)\}"
)
_TEXT_UNWRAP_PASSES = 4  # nesting depth of text-like commands we unwrap; deeper ones stay (and fail to parse)
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°")
_SIZING_RE = re.compile(r"\\(?:left|right|[Bb]igg?[lr]?)(?![A-Za-z])")
_SPACING_RE = re.compile(r"\\[!,;:> ]|\\q?quad(?![A-Za-z])|\\displaystyle(?![A-Za-z])|~")
_MATH_DELIM_RE = re.compile(r"\\[()\[\]]")
_FRAC_VARIANT_RE = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_DOLLAR_PAIR_RE = re.compile(r"\$([^$]*)\$")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# `\frac12`, `\frac1{2}`, `\frac{1}2`, `\sqrt2`, `\sqrt[3]2`: a one-character argument without braces.
_FRAC_TWO_BARE_RE = re.compile(r"\\frac([^{}\\])([^{}\\])")
_FRAC_FIRST_BARE_RE = re.compile(r"\\frac([^{}\\])(?=\{)")
_FRAC_SECOND_BARE_RE = re.compile(r"\\frac(\{[^{}]*\})([^{}\\])")
_SQRT_BARE_RE = re.compile(r"\\sqrt(\[[^\[\]]*\])?([^{}\[\\])")
_WHITESPACE_RE = re.compile(r"\s+")

# Unicode spellings of symbols that models mix with LaTeX.
_UNICODE = str.maketrans(
    {"\u2212": "-", "\u2013": "-", "\u00d7": r"\times ", "\u00b7": r"\cdot ", "\u03c0": r"\pi "}
)


def _unwrap_text_commands(s: str) -> str:
    for _ in range(_TEXT_UNWRAP_PASSES):
        unwrapped = _TEXT_CMD_RE.sub(r"\1", s)
        if unwrapped == s:
            break
        s = unwrapped
    return s


def _remove_units(s: str) -> str:
    stripped = _UNIT_RE.sub("", s)
    # An answer that is nothing but a unit word ("units") keeps its text: there is no number to keep.
    return stripped if stripped.strip() else s


def _canonical_frac_sqrt(s: str) -> str:
    s = _FRAC_TWO_BARE_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_FIRST_BARE_RE.sub(r"\\frac{\1}", s)
    s = _FRAC_SECOND_BARE_RE.sub(r"\\frac\1{\2}", s)
    return _SQRT_BARE_RE.sub(lambda m: "\\sqrt" + (m.group(1) or "") + "{" + m.group(2) + "}", s)


@functools.lru_cache(maxsize=8192)
def normalize_answer(answer: str) -> str:
    """Return the canonical spelling of a final answer (see the module docstring).

    Cached because gold answers repeat for every sample of a group.
    """
    s = answer.translate(_UNICODE).strip()
    if "\\boxed" in s or "\\fbox" in s:
        boxed = last_boxed_content(s)
        if boxed is not None:
            s = boxed
    s = s.replace("\\$", "")  # a currency sign, not a math delimiter
    pair = _DOLLAR_PAIR_RE.search(s)
    if pair is not None:  # "the answer is $5$ apples" -> "5" (Minerva keeps the first math span)
        s = pair.group(1)
    s = s.replace("$", "")
    s = _MATH_DELIM_RE.sub("", s)
    s = _unwrap_text_commands(s)
    # "x = 5" -> "5": the value after the last '=' is the answer.
    s = s.rsplit("=", 1)[-1]
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = _remove_units(s)
    s = _FRAC_VARIANT_RE.sub(r"\\frac", s)
    s = _SIZING_RE.sub("", s)
    s = _SPACING_RE.sub("", s)
    s = _WHITESPACE_RE.sub("", s)
    s = s.replace("{,}", ",")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    s = _canonical_frac_sqrt(s)
    return s.rstrip(".").rstrip("\\").rstrip(".")

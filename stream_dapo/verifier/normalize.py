"""Minerva-style normalisation of a final answer.

The steps follow the spirit of ``normalize_final_answer`` from Lewkowycz et al. 2022 (Minerva), which
DAPO's reference scorer also uses, with a few places made stricter so that they cannot change the
value of an answer:

- unit words are removed only as whole words (Minerva removes substrings, which turns "units" inside
  other words into damage), together with a ``^2``/``^3`` that belongs to the unit; one- and
  two-letter units (``m``, ``kg``) only inside a text command right after a number;
- commas are removed from a number only when they group its digits by threes ("1,000" but not "1,00"
  or the tuple "1,2");
- ``\\frac12`` and ``\\sqrt2`` get their braces back so that both spellings compare equal;
- a mixed number written with a space (``2 1/2``) becomes ``2\\frac{1}{2}`` before spaces are
  removed, so that it does not turn into 21/2;
- a percent sign is kept, as one trailing ``%``, for ``equivalence`` to read both ways (``25\\%`` is
  25 and 0.25);
- ``x = 5`` keeps what follows the last ``=`` (or ``\\approx``, ``\\in``) only when the answer is not
  a comma-separated list: in ``x=1, y=2`` each item keeps its label for ``structure`` to read;
- "1 and 2", "1 or 2" become the list "1,2";
- next to a trigonometric function a degree sign is a unit of the argument, not of the answer:
  ``\\sin 30^\\circ`` becomes ``\\sin(30\\pi/180)`` (elsewhere ``30^\\circ`` is 30); a one-character
  log base gets braces (``\\log_2 8`` is ``\\log_{2}8``) before spaces go.

Normalisation only rewrites notation; whether two answers are equal is decided in ``equivalence``.
Every regex here is linear in its input (no nested quantifiers over the same characters), and the
input is bounded by the caller.
"""

from __future__ import annotations

import functools
import re

from stream_dapo.verifier.extract import last_boxed_content
from stream_dapo.verifier.structure import split_top_level

__all__ = ["TEXT_UNITS", "UNIT_WORDS", "normalize_answer"]

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
    "points", "point", "ways", "people", "students", "integers", "digits", "edges",
)  # fmt: skip
# Short units removed only inside a text command right after a number ("5\text{ m}", "3\,\mathrm{kg}").
TEXT_UNITS: tuple[str, ...] = (
    "m", "s", "g", "h", "L", "mL", "kg", "km", "cm", "mm", "min", "J", "N", "W", "V", "Hz",
)  # fmt: skip

_UNIT_RE = re.compile(
    r"(?<![A-Za-z\\])(?:"
    + "|".join(sorted(UNIT_WORDS, key=len, reverse=True))
    + r")(?:\^\{?[23]\}?)?(?![A-Za-z])"
)
_TEXT_UNIT_RE = re.compile(
    r"(?<=[\d}])\s*(?:\\[,;: ]\s*)?\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:"
    + "|".join(sorted(TEXT_UNITS, key=len, reverse=True))
    + r")\s*\}(?:\^\{?[23]\}?)?"
)
# Commands whose argument is kept as plain text.
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|operatorname|hbox)"
    r"\s*\{([^{}]*)\}"
)
_TEXT_UNWRAP_PASSES = 4  # nesting depth of text-like commands we unwrap; deeper ones stay (and fail to parse)
_TRIG_RE = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-z])")
_DEGREES_OF_ARGUMENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\degree|°)")
_LOG_BASE_RE = re.compile(r"\\log_([A-Za-z0-9])")
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°")
_PERCENT_RE = re.compile(r"\\%|%|(?<![A-Za-z\\])percent(?![A-Za-z])")
_SIZING_RE = re.compile(r"\\(?:left|right|[Bb]igg?[lr]?)(?![A-Za-z])")
_SPACING_RE = re.compile(r"\\[!,;:> ]|\\q?quad(?![A-Za-z])|\\displaystyle(?![A-Za-z])|~")
_MATH_DELIM_RE = re.compile(r"\\[()\[\]]")
_FRAC_VARIANT_RE = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_BINOM_VARIANT_RE = re.compile(r"\\[dt]binom(?![A-Za-z])")
_DOLLAR_PAIR_RE = re.compile(r"\$([^$]*)\$")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_MIXED_SPACE_RE = re.compile(r"(?<![\d.])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d.])")
_AND_OR_RE = re.compile(r"\s+(?:and|or)\s+")
# What separates a name from its value: "x = 5", "x \approx 1.41", "x \in [0, 1]".
_RELATION_RE = re.compile(r"=|\\approx(?![A-Za-z])|\\in(?![A-Za-z])")
_SYNONYMS = (
    ("\\lbrace", "\\{"),
    ("\\rbrace", "\\}"),
    ("\\varnothing", "\\emptyset"),
    ("\\colon", ":"),
    ("\\leqslant", "\\le "),
    ("\\geqslant", "\\ge "),
    ("<=", "\\le "),
    (">=", "\\ge "),
)
# `\frac12`, `\frac1{2}`, `\frac{1}2`, `\sqrt2`, `\sqrt[3]2`: a one-character argument without braces.
_FRAC_TWO_BARE_RE = re.compile(r"\\frac([^{}\\])([^{}\\])")
_FRAC_FIRST_BARE_RE = re.compile(r"\\frac([^{}\\])(?=\{)")
_FRAC_SECOND_BARE_RE = re.compile(r"\\frac(\{[^{}]*\})([^{}\\])")
_SQRT_BARE_RE = re.compile(r"\\sqrt(\[[^\[\]]*\])?([^{}\[\\])")
_WHITESPACE_RE = re.compile(r"\s+")

# Unicode spellings of symbols that models mix with LaTeX.
_UNICODE = str.maketrans(
    {
        "\u2212": "-",
        "\u2013": "-",
        "\u00d7": r"\times ",
        "\u00b7": r"\cdot ",
        "\u03c0": r"\pi ",
        "\u221e": r"\infty ",
        "\u221a": r"\sqrt",
        "\u2248": r"\approx ",
        "\u2205": r"\emptyset ",
        "\u2264": r"\le ",
        "\u2265": r"\ge ",
    }
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
    s = _TEXT_UNIT_RE.sub("", s)
    s = _unwrap_text_commands(s)
    for word, replacement in _SYNONYMS:
        s = s.replace(word, replacement)
    s = _AND_OR_RE.sub(",", s)
    if len(split_top_level(s, ",")) == 1:
        # "x = 5" -> "5": the value after the last relation is the answer (a list keeps its labels).
        s = _RELATION_RE.split(s)[-1]
    if _TRIG_RE.search(s):
        s = _DEGREES_OF_ARGUMENT_RE.sub(r"(\1\\pi/180)", s)
    s = _LOG_BASE_RE.sub(r"\\log_{\1}", s)
    s = _DEGREE_RE.sub("", s)
    percent = _PERCENT_RE.search(s) is not None
    s = _PERCENT_RE.sub("", s)
    s = _remove_units(s)
    s = _MIXED_SPACE_RE.sub(r"\1\\frac{\2}{\3}", s)
    s = _FRAC_VARIANT_RE.sub(r"\\frac", s)
    s = _BINOM_VARIANT_RE.sub(r"\\binom", s)
    s = _SIZING_RE.sub("", s)
    s = _SPACING_RE.sub("", s)
    s = _WHITESPACE_RE.sub("", s)
    s = s.replace("{,}", ",")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    s = _canonical_frac_sqrt(s)
    s = s.rstrip(".").rstrip("\\").rstrip(".")
    return s + "%" if percent and s else s

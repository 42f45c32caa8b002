"""The shape of a normalised answer: one value, an unordered collection, or an ordered sequence.

``read_structure`` turns normalised text (see ``normalize``) into one of three shapes, so that
``equivalence`` can compare the parts one by one:

- ``Collection`` (unordered): a set ``\\{1,2\\}`` (``\\emptyset`` is the empty one), a bare list
  ``1,2`` ("enter all solutions, separated by commas"), a union ``(0,1)\\cup(2,3)``, and ``a\\pm b``,
  which is the list ``a+b, a-b``;
- ``Sequence`` (ordered): ``(1,2)`` and ``[0,1)`` (tuples, points and intervals: the brackets are part
  of the value, so ``[0,1)`` is not ``(0,1)``), inequalities in one variable read as the interval
  they describe (``2\\le x<5`` is ``[2,5)``, ``x>3`` is ``(3,\\infty)``), and ratios of three or more
  parts ``1:2:3``;
- ``Scalar``: everything else, one expression for the numeric and symbolic tests. A ratio ``a:b`` is
  the scalar ``\\frac{a}{b}``; a trailing ``%`` sets ``percent``; an item ``x=1`` inside a collection
  or sequence keeps ``x`` as its ``label``.

Reading is one linear scan per level with an explicit depth counter (no recursion on the text's
nesting), and at most ``MAX_ITEMS`` items and ``MAX_LEVELS`` levels of shapes are read; past those
the text stays one scalar (which the safe parser then bounds or refuses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_ITEMS", "MAX_LEVELS", "Collection", "Scalar", "Sequence", "read_structure", "split_top_level"]

MAX_ITEMS = 32
MAX_LEVELS = 3

_OPENERS = frozenset("([{")
_CLOSERS = frozenset(")]}")
_LABEL_RE = re.compile(r"([A-Za-z](?:_\{?[A-Za-z0-9]{1,8}\}?)?)=(.+)")
_SIMPLE_TERM_RE = re.compile(r"[^+-]*")
_LESS = r"(<|\\leq?|\\lt)"
_GREATER = r"(>|\\geq?|\\gt)"
_VARIABLE = r"([A-Za-z])"
_BETWEEN_RE = re.compile(r"([^<>=]+?)" + _LESS + _VARIABLE + _LESS + r"([^<>=]+)")
_BELOW_RE = re.compile(_VARIABLE + _LESS + r"([^<>=]+)")
_ABOVE_RE = re.compile(_VARIABLE + _GREATER + r"([^<>=]+)")


@dataclass(frozen=True)
class Scalar:
    """One value: ``text`` for the numeric and symbolic tests."""

    text: str
    percent: bool = False
    label: str | None = None


@dataclass(frozen=True)
class Collection:
    """Items whose order does not matter; ``kind`` is "set", "list" or "union"."""

    kind: str
    items: tuple[Answer, ...]


@dataclass(frozen=True)
class Sequence:
    """Items in order between ``opener`` and ``closer`` ("(" ")", "[" ")", ":" ":" for ratios)."""

    opener: str
    closer: str
    items: tuple[Answer, ...]


Answer = Scalar | Collection | Sequence


def split_top_level(text: str, separator: str) -> list[str]:
    """Split ``text`` at ``separator`` where it is outside every bracket pair.

    ``()``, ``[]``, ``{}`` and LaTeX's ``\\{ \\}`` all count as brackets, and any opener closes with any
    closer, so the half-open interval ``[0,1)`` is one group. A separator that is a command (``\\cup``)
    matches whole commands only. Unbalanced closers are ignored.
    """
    parts: list[str] = []
    depth, start, pos, n = 0, 0, 0, len(text)
    command = separator.startswith("\\")
    while pos < n:
        char = text[pos]
        if char == "\\":
            end = pos + 1
            while end < n and text[end].isalpha():
                end += 1
            if end == pos + 1 and end < n:
                end += 1  # a one-character command: \{ \} \, \\
            word = text[pos:end]
            if word == "\\{":
                depth += 1
            elif word == "\\}":
                depth = max(0, depth - 1)
            elif command and depth == 0 and word == separator:
                parts.append(text[start:pos])
                start = end
            pos = end
            continue
        if char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth = max(0, depth - 1)
        elif not command and depth == 0 and text.startswith(separator, pos):
            parts.append(text[start:pos])
            start = pos + len(separator)
            pos = start
            continue
        pos += 1
    parts.append(text[start:])
    return parts


def _encloses(text: str, opener_len: int, closer_len: int) -> bool:
    """Whether the bracket that opens ``text`` is the one its last ``closer_len`` characters close."""
    inner = text[opener_len : len(text) - closer_len]
    depth = 0
    pos = 0
    while pos < len(inner):
        char = inner[pos]
        if char == "\\" and pos + 1 < len(inner) and inner[pos + 1] in "{}":
            depth += 1 if inner[pos + 1] == "{" else -1
            pos += 2
        else:
            if char in _OPENERS:
                depth += 1
            elif char in _CLOSERS:
                depth -= 1
            pos += 1
        if depth < 0:
            return False
    return True


def _items(parts: list[str], level: int) -> tuple[Answer, ...]:
    return tuple(_read_item(part, level) for part in parts)


def _read_item(text: str, level: int) -> Answer:
    if m := _LABEL_RE.fullmatch(text):
        value = read_structure(m[2], level=level)
        if isinstance(value, Scalar):
            return Scalar(value.text, value.percent, m[1])
        return value
    return read_structure(text, level=level)


def _plus_minus(text: str, level: int) -> Collection | None:
    parts = split_top_level(text, "\\pm")
    if len(parts) != 2:
        return None
    base, offset = parts
    if not offset:
        return None
    if not _SIMPLE_TERM_RE.fullmatch(offset):
        offset = "(" + offset + ")"
    plus = f"{base}+{offset}" if base else offset
    minus = f"{base}-{offset}"
    return Collection("list", (read_structure(plus, level=level), read_structure(minus, level=level)))


def _bracket(relation: str, opening: bool) -> str:
    inclusive = relation.startswith("\\le") or relation.startswith("\\ge")
    return ("[" if inclusive else "(") if opening else ("]" if inclusive else ")")


def _inequality(text: str, level: int) -> Sequence | None:
    """The interval an inequality in one variable describes, or None."""
    if m := _BETWEEN_RE.fullmatch(text):
        low, high = read_structure(m[1], level=level), read_structure(m[5], level=level)
        return Sequence(_bracket(m[2], True), _bracket(m[4], False), (low, high))
    if m := _BELOW_RE.fullmatch(text):
        return Sequence("(", _bracket(m[2], False), (Scalar("-\\infty"), read_structure(m[3], level=level)))
    if m := _ABOVE_RE.fullmatch(text):
        return Sequence(_bracket(m[2], True), ")", (read_structure(m[3], level=level), Scalar("\\infty")))
    return None


def read_structure(text: str, *, level: int = 0) -> Answer:
    """Read normalised answer text into a ``Scalar``, ``Collection`` or ``Sequence`` (module docstring)."""
    if level >= MAX_LEVELS or not text:
        return Scalar(text)
    level += 1
    if text in ("\\emptyset", "\\{\\}"):
        return Collection("set", ())
    union = split_top_level(text, "\\cup")
    if 2 <= len(union) <= MAX_ITEMS:
        return Collection("union", _items(union, level))
    if text.startswith("\\{") and text.endswith("\\}") and _encloses(text, 2, 2):
        parts = split_top_level(text[2:-2], ",")
        if len(parts) <= MAX_ITEMS:
            return Collection("set", _items(parts, level))
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]" and _encloses(text, 1, 1):
        parts = split_top_level(text[1:-1], ",")
        if 2 <= len(parts) <= MAX_ITEMS:
            return Sequence(text[0], text[-1], _items(parts, level))
    parts = split_top_level(text, ",")
    if 2 <= len(parts) <= MAX_ITEMS:
        return Collection("list", _items(parts, level))
    ratio = split_top_level(text, ":")
    if len(ratio) == 2 and all(ratio):
        return Scalar(f"\\frac{{{ratio[0]}}}{{{ratio[1]}}}")
    if 3 <= len(ratio) <= MAX_ITEMS and all(ratio):
        return Sequence(":", ":", _items(ratio, level))
    if "\\pm" in text and (both := _plus_minus(text, level)) is not None:
        return both
    if any(c in text for c in "<>") or "\\le" in text or "\\ge" in text or "\\lt" in text or "\\gt" in text:
        if (interval := _inequality(text, level)) is not None:
            return interval
    if text.endswith("%") and len(text) > 1:
        return Scalar(text[:-1], percent=True)
    return Scalar(text)

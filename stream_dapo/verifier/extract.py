"""Find the final answer in a model response.

Four formats, tried in this order (the first one that finds something wins):

1. an operator-supplied regex with exactly one capture group (``pattern``), searched in the tail;
2. DAPO's format: the last ``Answer: ...`` line (case-insensitive), searched only in the last
   ``tail_chars`` characters of the response, like the DAPO reference scorer, so that an "Answer:"
   quoted early in a long chain of thought is not mistaken for the final one;
3. the last ``\\boxed{...}`` (or ``\\fbox{...}``) anywhere in the response, with nested braces;
4. GSM8K's own answer line, the last ``#### ...`` in the tail (the format of GSM8K's reference
   solutions, which verl's and TRL's GSM8K examples grade). Tried last, so it changes nothing for a
   response that has one of the other three.

Brace matching is a single left-to-right pass over the brace characters with an explicit stack, so
its cost is linear in the input and it cannot hit Python's recursion limit, whatever the nesting.
"""

from __future__ import annotations

import functools
import re

__all__ = ["compile_answer_pattern", "extract_answer", "last_boxed_content", "match_brace_groups"]

# DAPO's answer line. `\s*` after the colon may cross one line break ("Answer:\n42"), as in the
# reference implementation.
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
# The opening brace of a boxed answer; `\s*` allows "\boxed {42}".
_BOXED_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# GSM8K's final line: "#### 42" (the answer runs to the end of the line).
_GSM8K_LINE_RE = re.compile(r"####[ \t]*([^\n]+)")
# Structural braces, and escaped ones (`\{`, `\}`) plus `\\` so that an escaped brace never counts.
_BRACE_TOKEN_RE = re.compile(r"\\[{}\\]|[{}]")


@functools.lru_cache(maxsize=64)
def compile_answer_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """Compile and check an operator's answer regex; ``None`` passes through.

    Raises:
        ValueError: when the regex does not compile or does not have exactly one capture group.
    """
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a regex string or None, got {type(pattern).__name__}")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"answer pattern {pattern!r} is not a valid regex ({exc}); fix the pattern") from exc
    if compiled.groups != 1:
        raise ValueError(
            f"answer pattern {pattern!r} has {compiled.groups} capture groups; it needs exactly one around "
            r"the answer, e.g. r'####\s*(\S+)' (use (?:...) for the other groups)"
        )
    return compiled


def match_brace_groups(text: str) -> dict[int, int]:
    """Map the index of every matched ``{`` in ``text`` to the index of its ``}``.

    Unmatched braces (a truncated response, stray closers) are simply left out.
    """
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for m in _BRACE_TOKEN_RE.finditer(text):
        token = m.group()
        if token == "{":
            stack.append(m.start())
        elif token == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def last_boxed_content(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` in ``text``, or ``None``.

    "Last" means the one that opens last, so in ``\\boxed{\\boxed{1}}`` it is ``1``. A boxed whose
    braces never close (a response cut off by the length limit) is skipped in favour of the last
    complete one before it.
    """
    openers = [m.end() - 1 for m in _BOXED_OPEN_RE.finditer(text)]
    if not openers:
        return None
    pairs = match_brace_groups(text)
    for start in reversed(openers):
        end = pairs.get(start)
        if end is not None:
            return text[start + 1 : end]
    return None


def _last_group(regex: re.Pattern[str], text: str) -> str | None:
    """The capture group of the last match of ``regex`` in ``text`` that is not blank."""
    found: str | None = None
    for m in regex.finditer(text):
        group = m.group(1)
        if group is not None and group.strip(" \t\r\n*"):
            found = group
    return found


def _clean(answer: str) -> str:
    # Markdown emphasis around the answer ("**Answer:** 42") is formatting, not part of the answer.
    return answer.strip().strip("*").strip()


def extract_answer(
    response: str, *, pattern: re.Pattern[str] | None = None, tail_chars: int = 300
) -> str | None:
    """Return the final answer text of ``response`` (see the module docstring), or ``None``.

    Args:
        response: the model's response.
        pattern: a compiled regex from ``compile_answer_pattern``; its single group is the answer.
        tail_chars: how many trailing characters the pattern and the ``Answer:`` line are searched in.
    """
    tail = response[-tail_chars:]
    if pattern is not None:
        found = _last_group(pattern, tail)
        if found is not None:
            return _clean(found)
    found = _last_group(_ANSWER_LINE_RE, tail)
    if found is not None:
        return _clean(found)
    boxed = last_boxed_content(response)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    found = _last_group(_GSM8K_LINE_RE, tail)
    if found is not None:
        return _clean(found)
    return None

"""The in-process verifier: ``verify(response, gold) -> VerifyResult``.

``verify`` is pure and deterministic. It is what the CLI and the tests call, and what each
``VerifierPool`` worker runs; generators must go through the pool, which adds the wall-clock timeout
that in-process calls cannot have. The size guards (input and answer length, token count, nesting,
exponents) keep every known hostile input fast in-process, but valid algebra can still make sympy's
``simplify`` slow (``(a+b)^{1000}(a-b)^{1000}`` against ``(a^2-b^2)^{1000}`` runs for minutes): only
the pool's timeout bounds that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stream_dapo.verifier.backends import comparator
from stream_dapo.verifier.extract import compile_answer_pattern, extract_answer

__all__ = ["CORRECT_REASONS", "MAX_ANSWER_CHARS", "REASONS", "VerifyResult", "check_limits", "verify"]

REASONS: tuple[str, ...] = (
    "exact",
    "numeric",
    "symbolic",
    "math_verify",
    "mismatch",
    "no_answer",
    "too_long",
    "parse_error",
    "timeout",
    "worker_crashed",
)
CORRECT_REASONS = frozenset({"exact", "numeric", "symbolic", "math_verify"})
# A final answer (extracted or gold) longer than this is refused as "too_long": no real math answer
# is this long, and every later stage's cost grows with it.
MAX_ANSWER_CHARS = 1_000


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one response.

    Attributes:
        correct: whether the extracted answer equals the gold answer.
        reward: DAPO's rule-based outcome reward, +1.0 when correct, -1.0 otherwise.
        extracted: the answer text found in the response (before normalisation), None if none was.
        reason: one of ``REASONS``; "exact", "numeric", "symbolic" (the built-in checker) and
            "math_verify" (the Math-Verify backend) are the correct ones. Other rewards
            (``stream_dapo.rewards``) add their own reasons.
        extras: other numeric figures a reward returned beside its score (a user function's dict
            keys, a code reward's tests passed), reported per source.
    """

    correct: bool
    reward: float
    extracted: str | None
    reason: str
    extras: dict[str, float] = field(default_factory=dict)

    @classmethod
    def scored(cls, reason: str, extracted: str | None) -> VerifyResult:
        """Build the result for ``reason``; correctness and reward follow from it."""
        if reason not in REASONS:
            raise ValueError(f"unknown verifier reason {reason!r}; expected one of {REASONS}")
        correct = reason in CORRECT_REASONS
        return cls(correct=correct, reward=1.0 if correct else -1.0, extracted=extracted, reason=reason)


def check_limits(tail_chars: int, max_input_chars: int) -> None:
    """Raise ``ValueError`` when the size parameters cannot work."""
    if not isinstance(tail_chars, int) or tail_chars < 1:
        raise ValueError(f"tail_chars must be a positive integer (DAPO uses 300), got {tail_chars!r}")
    if not isinstance(max_input_chars, int) or max_input_chars < 1:
        raise ValueError(f"max_input_chars must be a positive integer, got {max_input_chars!r}")


def verify(
    response: str,
    gold: str,
    *,
    pattern: str | None = None,
    tail_chars: int = 300,
    max_input_chars: int = 10_000,
    backend: str = "builtin",
) -> VerifyResult:
    """Score ``response`` against the ``gold`` answer.

    Args:
        response: the model's full response text.
        gold: the reference answer (e.g. "42", "\\frac{\\sqrt{3}}{2}").
        pattern: optional regex with one capture group, tried before the ``Answer:`` line and
            ``\\boxed{}`` (see ``extract``).
        tail_chars: how many trailing characters the pattern and ``Answer:`` line are searched in.
        max_input_chars: responses or golds longer than this are "too_long" and never parsed.
            Extracted answers are also capped, at ``min(MAX_ANSWER_CHARS, max_input_chars)``.
        backend: the equivalence checker, "builtin" or "math-verify" (see ``backends``).

    Raises:
        TypeError / ValueError: for arguments of the wrong type or an invalid pattern (caller bugs,
            never model output); ``ConfigError`` (a ValueError) for an unknown backend or Math-Verify
            when it is not installed.
    """
    if not isinstance(response, str) or not isinstance(gold, str):
        raise TypeError(
            f"verify() takes the response and gold answer as str, got {type(response).__name__} and "
            f"{type(gold).__name__}; decode token ids to text first"
        )
    check_limits(tail_chars, max_input_chars)
    compare = comparator(backend)
    compiled = compile_answer_pattern(pattern)
    if len(response) > max_input_chars or len(gold) > max_input_chars:
        return VerifyResult.scored("too_long", None)
    extracted = extract_answer(response, pattern=compiled, tail_chars=tail_chars)
    if extracted is None:
        return VerifyResult.scored("no_answer", None)
    answer_cap = min(MAX_ANSWER_CHARS, max_input_chars)
    if len(extracted) > answer_cap or len(gold) > answer_cap:
        return VerifyResult.scored("too_long", None)
    return VerifyResult.scored(compare(extracted, gold), extracted)

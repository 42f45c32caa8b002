"""The equivalence checkers ``verify`` can use after it has extracted the answer.

- ``"builtin"`` (the default): ``equivalence.compare_answers``. Nothing in model text is executed; see
  ``safe_parse``.
- ``"math-verify"``: Hugging Face's Math-Verify (``pip install -e '.[math-verify]'``), the checker TRL
  and open-r1 use, for users who want the one they already trust. It decides equivalence only:
  extraction (``pattern``, the ``Answer:`` line in the tail, ``\\boxed{}``) and the size limits are the
  same as for the built-in checker, so switching backends changes no reward contract. Each side is
  given to ``math_verify.parse`` as LaTeX (wrapped in ``$...$`` unless it already has math delimiters)
  and the two parses to ``math_verify.verify`` with its defaults. Its own ``signal.alarm`` timeouts
  are turned off: the ``VerifierPool`` timeout bounds each check and counts it, as for the built-in
  checker. Math-Verify parses plain-text expressions with sympy's ``parse_expr``, which evaluates
  Python; the built-in checker's no-eval guarantee does not extend to it, only the pool's process
  isolation and timeout do.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable

from stream_dapo.errors import ConfigError
from stream_dapo.verifier.equivalence import compare_answers, import_heavy

__all__ = [
    "BACKENDS",
    "MATH_VERIFY_INSTALL",
    "backend_problem",
    "check_backend",
    "comparator",
    "compare_with_math_verify",
]

BACKENDS: tuple[str, ...] = ("builtin", "math-verify")
MATH_VERIFY_INSTALL = "pip install -e '.[math-verify]'"
_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def backend_problem(backend: str) -> str | None:
    """What stops ``backend`` from working here, as a message naming the fix; None if nothing does."""
    if backend not in BACKENDS:
        return f"unknown verifier backend {backend!r}; set verifier.backend to one of {', '.join(BACKENDS)}"
    if backend == "math-verify" and importlib.util.find_spec("math_verify") is None:
        return (
            "verifier.backend = 'math-verify' needs the Math-Verify package, which is not installed; "
            f"run `{MATH_VERIFY_INSTALL}` or set verifier.backend = 'builtin'"
        )
    return None


def check_backend(backend: str) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) when ``backend`` cannot work here."""
    problem = backend_problem(backend)
    if problem is not None:
        raise ConfigError(problem)


def _as_latex(text: str) -> str:
    return text if any(d in text for d in _DELIMITERS) else f"${text}$"


def compare_with_math_verify(candidate: str, gold: str) -> str:
    """Math-Verify's verdict on an extracted answer: "math_verify" when equal, "mismatch" when not,
    "parse_error" when it finds no answer in either side."""
    if "math_verify" not in sys.modules:
        import_heavy("math_verify")
        # Its one-time "timeout is disabled" warning: the pool's timeout is the one that applies.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    gold_parsed = parse(_as_latex(gold), parsing_timeout=None)  # type: ignore[arg-type]
    answer_parsed = parse(_as_latex(candidate), parsing_timeout=None)  # type: ignore[arg-type]
    if not gold_parsed or not answer_parsed:
        return "parse_error"
    return "math_verify" if verify(gold_parsed, answer_parsed, timeout_seconds=None) else "mismatch"


def comparator(backend: str) -> Callable[[str, str], str]:
    """The ``(candidate, gold) -> reason`` function of ``backend``.

    Raises:
        ConfigError: for an unknown backend, or Math-Verify when it is not installed.
    """
    check_backend(backend)
    return compare_answers if backend == "builtin" else compare_with_math_verify

"""verifier.backend: the config key, the clear error when Math-Verify is missing, and the Math-Verify
backend in process and through the pool (same timeout, same counters).

The Math-Verify tests need the real library (it is in the `dev` extra); without it they skip.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from stream_dapo.config import VerifierConfig, load_config
from stream_dapo.errors import ConfigError
from stream_dapo.verifier import REASONS, VerifierPool, VerifyResult, verify
from stream_dapo.verifier.backends import MATH_VERIFY_INSTALL, backend_problem

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None
needs_math_verify = pytest.mark.skipif(
    not HAS_MATH_VERIFY, reason=f"Math-Verify is not installed ({MATH_VERIFY_INSTALL}, or the dev extra)"
)


@pytest.fixture()
def math_verify_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        return None if name == "math_verify" else real_find_spec(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_builtin_is_the_default_backend() -> None:
    assert VerifierConfig().backend == "builtin"
    assert load_config(environ={}).verifier.backend == "builtin"


def test_unknown_backend_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="builtin"):
        load_config(overrides=["verifier.backend=sympy"], environ={})
    with pytest.raises(ConfigError, match="set verifier.backend to one of builtin, math-verify"):
        verify("Answer: 1", "1", backend="sympy")
    with pytest.raises(ConfigError, match="one of builtin, math-verify"):
        VerifierPool(backend="sympy")


def test_missing_math_verify_fails_at_start_up_naming_the_install(math_verify_missing: None) -> None:
    hint = r"pip install -e '\.\[math-verify\]'"
    with pytest.raises(ConfigError, match=hint):
        load_config(overrides=["verifier.backend=math-verify"], environ={})
    with pytest.raises(ConfigError, match=hint):
        VerifierPool(num_workers=1, backend="math-verify")
    with pytest.raises(ConfigError, match=hint):
        verify("Answer: 1", "1", backend="math-verify")
    assert backend_problem("builtin") is None  # the built-in checker needs nothing extra


@needs_math_verify
def test_math_verify_backend_config_loads_when_installed() -> None:
    cfg = load_config(overrides=["verifier.backend=math-verify"], environ={})
    assert cfg.verifier.backend == "math-verify"


# (response, gold, Math-Verify's verdict): its documented behaviour on each class, checked by hand.
MATH_VERIFY_CASES: list[tuple[str, str, bool]] = [
    ("Answer: 42", "42", True),
    ("Answer: 41", "42", False),
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", True),
    ("Answer: 3628800", "10!", True),
    ("Answer: 10", "\\binom{5}{2}", True),
    ("Answer: 1.41421356", "\\sqrt{2}", True),
    ("Answer: 1.414", "\\sqrt{2}", False),  # it rounds both sides to 6 decimals
    ("Answer: 3:4", "\\frac{3}{4}", True),
    ("Answer: (2,1)", "(1,2)", False),
    ("Answer: x = 5", "5", True),
    ("Answer: 25\\%", "0.25", True),
    ("Answer: \\dfrac{3}{4}", "0.75", True),
]


@needs_math_verify
@pytest.mark.parametrize(("response", "gold", "expected"), MATH_VERIFY_CASES)
def test_math_verify_backend_verdicts(response: str, gold: str, expected: bool) -> None:
    result = verify(response, gold, backend="math-verify")
    assert result.correct is expected, result
    assert result.reason == ("math_verify" if expected else "mismatch")
    # Extraction is the same for both backends: the answer line, then the boxed answer.
    assert result.extracted == verify(response, gold).extracted


@needs_math_verify
def test_math_verify_backend_keeps_the_extraction_and_size_contract() -> None:
    # The Answer: line beyond the 300-character tail is not searched, whichever backend decides.
    assert verify("Answer: 5\n" + "z" * 400, "5", backend="math-verify").reason == "no_answer"
    assert verify("Answer: 1", "1" * 10_001, backend="math-verify").reason == "too_long"
    assert verify("#### 7", "7", pattern=r"####\s*(\d+)", backend="math-verify") == VerifyResult(
        correct=True, reward=1.0, extracted="7", reason="math_verify"
    )


@pytest.mark.process
@needs_math_verify
@pytest.mark.timeout(300)
def test_math_verify_backend_through_the_pool_times_out_and_counts(tmp_path: Path) -> None:
    """A power tower Math-Verify evaluates in C (its own signal timeout cannot stop it) is bounded by
    the pool's timeout and counted as one, like the built-in checker's slow checks."""
    items = [
        ("Answer: 42", "42"),
        ("\\boxed{9^{9^{9^{9}}}}", "1"),
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}"),
        ("Answer: 41", "42"),
        ("no answer here", "1"),
    ]
    with VerifierPool(num_workers=1, timeout_s=3.0, backend="math-verify", chunk_size=8) as pool:
        results = pool.verify_batch(items)
        counters = pool.counters
    assert [r.reason for r in results] == ["math_verify", "timeout", "math_verify", "mismatch", "no_answer"]
    assert [r.reward for r in results] == [1.0, -1.0, 1.0, -1.0, -1.0]
    expected = dict.fromkeys(REASONS, 0)
    expected.update(math_verify=2, timeout=1, mismatch=1, no_answer=1)
    assert counters == expected


@pytest.mark.process
def test_pool_from_config_uses_every_key() -> None:
    cfg = VerifierConfig(workers=1, timeout_s=2.0, pattern=r"####\s*(\d+)", max_input_chars=100)
    with VerifierPool.from_config(cfg) as pool:
        results = pool.verify_batch([("#### 7\nAnswer: 8", "7"), ("y" * 101, "1")])
    assert [r.reason for r in results] == ["exact", "too_long"]


@pytest.mark.process
@needs_math_verify
def test_the_generator_scores_with_the_configured_backend() -> None:
    """verifier.backend reaches the pool a generator scores its rollouts with."""
    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator

    svc = build_generator(
        load_config(overrides=["verifier.backend=math-verify", "verifier.workers=1"], environ={})
    )
    try:
        svc.start_verifier()
        assert svc.verifier is not None
        [result] = svc.verifier.verify_batch([("\\boxed{\\{2,1\\}}", "\\{1,2\\}")])
        assert result.correct and result.reason == "math_verify"
    finally:
        svc.close()

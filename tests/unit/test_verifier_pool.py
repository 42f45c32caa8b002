"""VerifierPool: order, counters, timeouts and crashes (through the worker test hooks), recovery."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from stream_dapo.verifier import REASONS, VerifierPool, VerifyResult, verify
from stream_dapo.verifier.pool import TEST_CRASH_GOLD, TEST_HANG_GOLD, TEST_HOOKS_ENV, TEST_IMPORT_DELAY_S


def _zero_counters(**nonzero: int) -> dict[str, int]:
    counters = dict.fromkeys(REASONS, 0)
    counters.update(nonzero)
    return counters


@pytest.fixture()
def hooks_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Workers inherit the parent's environment when they start, so set it before creating the pool.
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    yield


@pytest.mark.process
@pytest.mark.timeout(300)
def test_results_match_in_process_verify_and_keep_order() -> None:
    items = [(f"step {i}\nAnswer: {i % 7}", str(i % 5)) for i in range(200)]
    items += [("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2"), ("no answer here", "1"), ("x" * 20_000, "1")]
    with VerifierPool(num_workers=2, timeout_s=10.0) as pool:
        results = pool.verify_batch(items)
        counters = pool.counters
    assert results == [verify(response, gold) for response, gold in items]
    # i % 7 == i % 5 exactly when i % 35 < 5: 6 blocks of 5 in 0..199 (i = 0..4, 35..39, ..., 175..179).
    assert sum(r.correct for r in results[:200]) == 30
    assert counters == _zero_counters(exact=30, mismatch=170, symbolic=1, no_answer=1, too_long=1)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_hanging_check_times_out_and_the_rest_of_the_chunk_is_verified(hooks_on: None) -> None:
    items = [
        ("Answer: 1", "1"),
        ("Answer: 2", "2"),
        ("Answer: 3", TEST_HANG_GOLD),
        ("Answer: 4", "4"),
        ("Answer: 5", "6"),
    ]
    # One worker and a chunk larger than the batch: the hang is in the middle of the only chunk.
    with VerifierPool(num_workers=1, timeout_s=2.0, chunk_size=8) as pool:
        results = pool.verify_batch(items)
        assert [r.reason for r in results] == ["exact", "exact", "timeout", "exact", "mismatch"]
        assert results[2] == VerifyResult(correct=False, reward=-1.0, extracted=None, reason="timeout")
        assert pool.counters == _zero_counters(exact=3, mismatch=1, timeout=1)
        # The replacement worker serves later batches.
        later = pool.verify_batch([("Answer: 7", "7"), ("Answer: \\frac{1}{2}", "0.5")])
        assert [r.reason for r in later] == ["exact", "numeric"]
        assert pool.counters == _zero_counters(exact=4, numeric=1, mismatch=1, timeout=1)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_slow_simplify_on_valid_algebra_times_out() -> None:
    """No hook: this pair passes every parser guard and the numeric pre-check, then sympy's simplify
    expands for minutes; the pool's timeout is what bounds it. The symbolic check runs before it, in
    the worker that has sympy loaded, and only an exact check after it in the replacement worker: a
    first simplify in a fresh worker can take seconds on a loaded machine, which is not under test."""
    slow = ("Answer: (a+b)^{1000}(a-b)^{1000}", "(a^2-b^2)^{1000}")
    items = [("Answer: 1", "1"), ("Answer: 2\\sqrt{2}", "\\sqrt{8}"), slow, ("Answer: 4", "4")]
    with VerifierPool(num_workers=1, timeout_s=5.0, chunk_size=4) as pool:
        results = pool.verify_batch(items)
        assert [r.reason for r in results] == ["exact", "symbolic", "timeout", "exact"]
        assert pool.counters == _zero_counters(exact=2, timeout=1, symbolic=1)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_sympy_import_does_not_count_against_the_first_symbolic_check(hooks_on: None) -> None:
    """The worker stops the clock during its one-time sympy import. The hook makes that import take
    TEST_IMPORT_DELAY_S (5 s) more than its ~0.5 s, well past this pool's 2 s timeout, while the
    check itself takes a few tens of milliseconds: counted, the import would time the check out."""
    assert TEST_IMPORT_DELAY_S > 2 * 2.0
    with VerifierPool(num_workers=1, timeout_s=2.0) as pool:
        results = pool.verify_batch([("Answer: 2\\sqrt{2}", "\\sqrt{8}"), ("Answer: (x+1)^2", "x^2+2x+1")])
        assert [r.reason for r in results] == ["symbolic", "symbolic"]


@pytest.mark.process
@pytest.mark.timeout(300)
def test_crashing_check_is_counted_and_the_batch_carries_on(hooks_on: None) -> None:
    items = [
        ("Answer: 1", TEST_CRASH_GOLD),
        ("Answer: 2", "2"),
        ("Answer: 3", TEST_CRASH_GOLD),
        ("Answer: 4", "4"),
    ]
    with VerifierPool(num_workers=1, timeout_s=5.0, chunk_size=4) as pool:
        results = pool.verify_batch(items)
        assert [(r.reason, r.reward) for r in results] == [
            ("worker_crashed", -1.0),
            ("exact", 1.0),
            ("worker_crashed", -1.0),
            ("exact", 1.0),
        ]
        assert pool.counters == _zero_counters(exact=2, worker_crashed=2)
        assert pool.verify_batch([("Answer: 9", "9")])[0].reason == "exact"
        assert pool.counters == _zero_counters(exact=3, worker_crashed=2)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_hang_and_crash_with_several_workers(hooks_on: None) -> None:
    items = [(f"Answer: {i}", str(i)) for i in range(40)]
    items[5] = ("Answer: 5", TEST_HANG_GOLD)
    items[33] = ("Answer: 33", TEST_CRASH_GOLD)
    with VerifierPool(num_workers=2, timeout_s=2.0, chunk_size=10) as pool:
        results = pool.verify_batch(items)
        counters = pool.counters
    expected = ["exact"] * 40
    expected[5], expected[33] = "timeout", "worker_crashed"
    assert [r.reason for r in results] == expected
    assert counters == _zero_counters(exact=38, timeout=1, worker_crashed=1)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_hook_golds_are_ordinary_without_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        results = pool.verify_batch([("Answer: 1", TEST_HANG_GOLD), ("Answer: 1", TEST_CRASH_GOLD)])
        assert [r.reason for r in results] == ["mismatch", "mismatch"]
        assert pool.counters == _zero_counters(mismatch=2)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_worker_that_dies_while_idle_is_replaced() -> None:
    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        assert pool.verify_batch([("Answer: 1", "1")])[0].reason == "exact"
        for worker in pool._workers:  # simulate the OOM killer between batches
            worker.process.kill()
            worker.process.join(5)
        results = pool.verify_batch([("Answer: 2", "2"), ("Answer: 3", "4")])
        assert [r.reason for r in results] == ["exact", "mismatch"]
        assert pool.counters == _zero_counters(exact=2, mismatch=1)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_empty_batch_close_and_errors() -> None:
    pool = VerifierPool(num_workers=1, timeout_s=5.0, pattern=r"####\s*(\d+)")
    assert pool.verify_batch([]) == []
    assert pool.verify_batch([("#### 12\nAnswer: 13", "12")])[0].correct is True
    assert pool.verify_batch([["#### 5", "5"]])[0].reason == "exact"  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"\(response, gold\) pair"):
        pool.verify_batch([("Answer: 1", 1)])  # type: ignore[list-item]
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.verify_batch([("Answer: 1", "1")])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, "num_workers"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"pattern": "(a)(b)"}, "capture group"),
        ({"max_input_chars": 0}, "max_input_chars"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_pool_parameters_fail_before_starting_workers(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VerifierPool(**kwargs)  # type: ignore[arg-type]


@pytest.mark.process
def test_importing_the_verifier_and_checking_integers_stays_light() -> None:
    """What a worker imports at start-up, and for integer answers, must not include sympy or torch."""
    code = (
        "import sys\n"
        "from stream_dapo.verifier import VerifierPool, verify\n"
        "assert verify('...\\nAnswer: 42', '42').reason == 'exact'\n"
        "assert verify('Answer: 1,000 cm', '1000').reason == 'exact'\n"
        "assert verify('Answer: \\\\frac{3}{4}', '0.75').reason == 'numeric'\n"
        "print(sorted(m for m in ('sympy', 'torch', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "[]"

"""Verifier throughput: verifications per second, in-process and through ``VerifierPool``.

Two workloads:

- integer: DAPO-format responses (about 2,000 characters of reasoning, then "Answer: N") against
  integer golds, half of them correct; the target is >= 2,000 verifications/s pooled on 2 cores;
- symbolic: answers that need sympy (``2\\sqrt{2}`` vs ``\\sqrt{8}``, ``(x+1)^2`` vs ``x^2+2x+1``, ...).

Each figure is the median of ``--repeats`` runs. Run: ``python -m bench.perf.verifier``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence

from stream_dapo.verifier import VerifierPool, VerifyResult, verify

ItemFactory = Callable[[int], list[tuple[str, str]]]

_REASONING = (
    "We set up the equation from the problem statement and simplify both sides carefully. "
    "Substituting the known values gives a linear relation, which we solve for the unknown. "
) * 12  # about 2,000 characters


def _symbolic_pair(k: int) -> tuple[str, str]:
    """The k-th symbolic pair. Coefficients vary with k so that sympy's expression cache, which would
    make repeated identical pairs look free, does not flatter the figure."""
    a, b = k % 97 + 2, k % 89 + 3
    pairs = [
        (f"\\boxed{{\\frac{{{a}\\sqrt{{3}}}}{{2}}}}", f"{a}\\sqrt{{3}}/2"),
        (f"Answer: {a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}"),
        (f"Answer: ({a}x+1)^2", f"{a * a}x^2+{2 * a}x+1"),
        (f"Answer: \\frac{{x^2-{a * a}}}{{x-{a}}}", f"x+{a}"),
        (f"Answer: {a}(x+{b}y)", f"{a}x+{a * b}y"),
        (f"Answer: \\frac{{{a}}}{{\\sqrt{{2}}}}", f"\\frac{{{a}\\sqrt{{2}}}}{{2}}"),
        (f"Answer: x^2+{a}", f"(x+{a})^2"),  # a mismatch, caught by the numeric pre-check
    ]
    return pairs[k % len(pairs)]


def integer_items(count: int, offset: int = 0) -> list[tuple[str, str]]:
    """DAPO-format integer answers; every other one is wrong."""
    return [
        (f"{_REASONING}\nAnswer: {i % 1000}", str(i % 1000 + (i % 2))) for i in range(offset, offset + count)
    ]


def symbolic_items(count: int, offset: int = 0) -> list[tuple[str, str]]:
    return [_symbolic_pair(k) for k in range(offset, offset + count)]


def median_rate(
    verify_items: Callable[[list[tuple[str, str]]], object], make_items: ItemFactory, repeats: int
) -> float:
    """Median verifications/s over ``repeats`` runs, each on fresh items from ``make_items(repeat)``."""
    rates = []
    for repeat in range(repeats):
        items = make_items(repeat)
        start = time.perf_counter()
        verify_items(items)
        rates.append(len(items) / (time.perf_counter() - start))
    return statistics.median(rates)


def verify_in_process(items: Sequence[tuple[str, str]]) -> list[VerifyResult]:
    return [verify(response, gold) for response, gold in items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--integer-items", type=int, default=4000)
    parser.add_argument("--symbolic-items", type=int, default=70)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    n_int, n_sym = args.integer_items, args.symbolic_items

    def ints(repeat: int) -> list[tuple[str, str]]:
        return integer_items(n_int, offset=repeat * n_int)

    def syms(repeat: int) -> list[tuple[str, str]]:
        # Disjoint offsets per run and per phase (in-process runs first, pooled ones after).
        return symbolic_items(n_sym, offset=(repeat + 1) * n_sym)

    def pooled_syms(repeat: int) -> list[tuple[str, str]]:
        return syms(repeat + args.repeats)

    print(f"cores: {os.cpu_count()}  pool workers: {args.workers}  repeats: {args.repeats} (median)")
    verify(*_symbolic_pair(0))  # import sympy once, outside the timings
    print(f"in-process  integer : {median_rate(verify_in_process, ints, args.repeats):10.0f} verifications/s")
    print(f"in-process  symbolic: {median_rate(verify_in_process, syms, args.repeats):10.0f} verifications/s")

    start = time.perf_counter()
    with VerifierPool(num_workers=args.workers, timeout_s=5.0) as pool:
        print(f"pool start-up       : {time.perf_counter() - start:10.3f} s")
        pool.verify_batch(symbolic_items(4 * args.workers))  # warm-up: every worker imports sympy
        int_rate = median_rate(pool.verify_batch, ints, args.repeats)
        sym_rate = median_rate(pool.verify_batch, pooled_syms, args.repeats)
        counters = pool.counters
    target = "meets" if int_rate >= 2000 else "MISSES"
    print(f"pooled      integer : {int_rate:10.0f} verifications/s ({target} the 2,000/s target)")
    print(f"pooled      symbolic: {sym_rate:10.0f} verifications/s")
    print(f"pool counters: {counters}")


if __name__ == "__main__":
    main()

"""The long chain-of-thought task: reduce a long ``+``/``-`` chain one operation per line.

Each problem is a chain of single-digit additions and subtractions, and the worked solution writes
the whole remaining expression again after every operation::

    question:  Compute 3+5-2+7+4-1.
    solution:  8-2+7+4-1
               6+7+4-1
               13+4-1
               17-1
               16
               Answer: 16

Why this shape. What makes real long chain-of-thought long is many dependent steps, each restating
where the work stands before taking the next one; the length of a solution is then set by the
problem, not by the format, and it grows faster than the problem: a chain of n operations needs
n lines of shrinking length, about n^2 + 3n tokens in all (each term is an operator and one digit;
the running value one or two digits). The number of operations is drawn log-uniformly between
``min_ops`` and ``max_ops``, so the lengths are long-tailed the way reasoning traces are: most
problems are moderate, a few need many times the median. At the long recipe's defaults (6-36
operations) the reference solutions run from ~50 to ~1,400 tokens, median ~240, p90 ~900.

Every line depends on the previous one: it copies the previous line's tail and folds its first
operation into the running value. A slip anywhere (a wrong digit, a term dropped or copied twice)
carries into the answer, so longer chains are less often right, and a copy slip that fails to
shorten the line can repeat itself until the length cap: the truncated samples that overlong reward
shaping exists to handle. Running values stay in [0, 99] (each operator is drawn among those that
keep them there), so the difficulty is the length of the chain, not the size of the numbers.

Rows follow the DAPO-Math-17k schema exactly like ``stream_dapo.data.synthetic``'s (which writes
both tasks, seeded and split-disjoint, and caches them): the same instruction, the same ``Answer:``
line, the same verifier; ``extra_info["num_ops"]`` is the chain's length.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["ChainProblem", "reduce_chain", "sample_chain"]

MAX_VALUE = 99
"""Running values stay in [0, MAX_VALUE]."""


@dataclass(frozen=True)
class ChainProblem:
    """``start op[0] terms[0] op[1] terms[1] ...`` and its line-by-line reduction."""

    start: int
    ops: tuple[str, ...]
    terms: tuple[int, ...]

    @property
    def lines(self) -> tuple[str, ...]:
        return reduce_chain(self.start, self.ops, self.terms)

    @property
    def answer(self) -> int:
        return int(self.lines[-1])

    @property
    def question(self) -> str:
        return "Compute " + _expression(self.start, self.ops, self.terms) + "."

    @property
    def solution(self) -> str:
        return "\n".join(self.lines) + f"\nAnswer: {self.answer}"


def _expression(value: int, ops: tuple[str, ...], terms: tuple[int, ...]) -> str:
    return str(value) + "".join(f"{op}{term}" for op, term in zip(ops, terms, strict=True))


def reduce_chain(start: int, ops: tuple[str, ...], terms: tuple[int, ...]) -> tuple[str, ...]:
    """The solution's lines: the remaining expression after each operation, the last one the value."""
    if len(ops) != len(terms) or not ops:
        raise ValueError(
            f"a chain needs as many operators as terms, at least one; got {len(ops)}, {len(terms)}"
        )
    value, lines = start, []
    for i, (op, term) in enumerate(zip(ops, terms, strict=True)):
        if op == "+":
            value += term
        elif op == "-":
            value -= term
        else:
            raise ValueError(f"unknown operator {op!r}; the chain task uses + and -")
        lines.append(_expression(value, ops[i + 1 :], terms[i + 1 :]))
    return tuple(lines)


def sample_chain(rng: random.Random, min_ops: int, max_ops: int, max_operand: int = 9) -> ChainProblem:
    """Draw one chain: its length log-uniform in [min_ops, max_ops], terms in [1, max_operand], each
    operator drawn among those that keep the running value in [0, MAX_VALUE]."""
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got {min_ops}, {max_ops}")
    n = min(max_ops, int(math.exp(rng.uniform(math.log(min_ops), math.log(max_ops + 1)))))
    value = start = rng.randint(1, max_operand)
    ops: list[str] = []
    terms: list[int] = []
    for _ in range(n):
        term = rng.randint(1, max_operand)
        allowed = [op for op, v in (("+", value + term), ("-", value - term)) if 0 <= v <= MAX_VALUE]
        op = rng.choice(allowed)  # never empty: term <= max_operand < MAX_VALUE
        value = value + term if op == "+" else value - term
        ops.append(op)
        terms.append(term)
    return ChainProblem(start, tuple(ops), tuple(terms))

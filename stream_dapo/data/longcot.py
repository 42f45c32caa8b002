"""The long chain-of-thought task: a long labelled ``+``/``-`` chain, worked forward and checked back.

Each problem is a chain of single-digit additions and subtractions whose terms are labelled ``a``,
``b``, ``c``, ... The worked solution takes one line per term, then verifies the result by undoing
every term from the last back to the first, and answers only after the check lands on the start::

    question:  Compute 3
               a+5
               b-2
               c+7
    solution:  a+5: 3+5=8
               b-2: 8-2=6
               c+7: 6+7=13
               Check:
               c+7: 13-7=6
               b-2: 6+2=8
               a+5: 8-5=3
               Back at 3.
               Answer: 13

Why this shape. What makes real long chain-of-thought long is many dependent steps and a pass
that checks them; the length is set by the problem, not the format. Here every line depends on
the one before (it starts from the previous result), a slip anywhere carries into the answer, so
longer chains are less often right; and the check doubles the work the way verification does in
real traces. A term costs about 21 tokens (two lines), so an n-term chain needs ~21n + 10. The
number of terms is drawn log-uniformly between ``min_ops`` and ``max_ops``, so lengths are
long-tailed: most chains are moderate, a few need several times the median. At the long recipe's
settings (5-26 terms) the reference solutions run ~115-560 tokens, median ~250, p90 ~490; a
sample that slips into repeating lines runs on to the cap.

Why the labels and the short lines. A line starts with its term exactly as the question wrote it,
so finding the term is a lookup (forward: "where was the last line's term, copy the question line
after it"; back: "where was this label, copy what followed", the induction mechanism small
transformers learn first) rather than counting terms from the left, and nothing long is copied. Every label starts a
line, in the question as in the solution, so it is the same token in both (after a space, Qwen2's
pre-tokenizer would fold some letters into a different token, and the lookup would have nothing
to match: measured, the warm model then did the arithmetic of each line right and picked the
wrong terms). An earlier format that
rewrote the whole remaining chain on every line (quadratic length, no labels) taught the tiny model
the shape but not the copy: after 2,000 warm-up steps its greedy pass@1 was 0.8%, and 3.1% with
labels added; long exact copies compound small per-token errors into wrong answers.

Why the warm-up slips. RL needs a warm policy that is sometimes wrong for reasons it can unlearn.
Folding a temperature into the weights (the embedded task's way) flattens every token: in a
300-token response that puts noise in every line, the sharpening signal per group was measured
3.6x weaker than on the 20-token task, and the recipe degraded instead of learning. Real long
chain-of-thought is sharp almost everywhere and uncertain at a few tokens that decide the outcome.
``warmup.slip_rate`` builds that: the warm-up's worked solutions get that share of their forward
additions wrong by one (``draw_slips``; the lines after it carry on from the wrong value, the check
faithfully lands off the start, the answer is wrong), so the warm model slips at about that rate
where it adds and nowhere else. A slip costs the whole answer, so longer chains are more often
wrong, and what RL can win is the gap between sampling and greedy decoding, held in the result
tokens.

Running values stay in [0, 99] (each operator is drawn among those that keep them there), so the
difficulty is the length of the chain, not the size of the numbers. Rows follow the DAPO-Math-17k
schema exactly like ``stream_dapo.data.synthetic``'s (which writes both tasks, seeded and
split-disjoint, and caches them): the same instruction, the same ``Answer:`` line, the same
verifier; ``extra_info["num_ops"]`` is the chain's length.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LABELS", "MAX_VALUE", "ChainProblem", "draw_slips", "sample_chain", "work_chain"]

MAX_VALUE = 99
"""Running values stay in [0, MAX_VALUE]."""
LABELS = "abcdefghijklmnopqrstuvwxyz"
"""Term labels, in order: a chain has at most len(LABELS) terms."""

_INVERSE = {"+": "-", "-": "+"}


@dataclass(frozen=True)
class ChainProblem:
    """``start a<op0><term0> b<op1><term1> ...`` and its worked, checked solution."""

    start: int
    ops: tuple[str, ...]
    terms: tuple[int, ...]

    @property
    def lines(self) -> tuple[str, ...]:
        return work_chain(self.start, self.ops, self.terms)

    @property
    def answer(self) -> int:
        value = self.start
        for op, term in zip(self.ops, self.terms, strict=True):
            value = _apply(value, op, term)
        return value

    @property
    def question(self) -> str:
        pairs = enumerate(zip(self.ops, self.terms, strict=True))
        return f"Compute {self.start}\n" + "\n".join(f"{LABELS[i]}{op}{t}" for i, (op, t) in pairs)

    @property
    def solution(self) -> str:
        return self.worked()

    def worked(self, slips: Mapping[int, int] | None = None) -> str:
        """The worked solution, with ``slips[i]`` added to forward line ``i``'s result (see
        ``draw_slips``): the lines after a slip go on from the slipped value, the check lands where
        the slipped result leads, and the answer is the slipped one. No slips: the reference."""
        lines = work_chain(self.start, self.ops, self.terms, slips)
        return "\n".join(lines) + f"\nAnswer: {_landing(self.start, self.ops, self.terms, slips)[-1]}"

    @classmethod
    def parse(cls, question: str) -> ChainProblem:
        """The problem whose ``question`` text ends ``question`` (a prompt's instruction may precede it)."""
        match = _QUESTION.search(question)
        if match is None:
            raise ValueError(f"not a chain question (expected 'Compute N' then labelled terms): {question!r}")
        terms = _TERM.findall(match.group(2))
        if [label for label, _, _ in terms] != list(LABELS[: len(terms)]):
            raise ValueError(f"chain terms must be labelled a, b, c, ... in order: {question!r}")
        return cls(int(match.group(1)), tuple(op for _, op, _ in terms), tuple(int(t) for _, _, t in terms))


def _apply(value: int, op: str, term: int) -> int:
    if op == "+":
        return value + term
    if op == "-":
        return value - term
    raise ValueError(f"unknown operator {op!r}; the chain task uses + and -")


_QUESTION = re.compile(r"Compute (\d+)\n((?:[a-z][+-]\d+\n?)+)\s*$")
_TERM = re.compile(r"([a-z])([+-])(\d+)")


def _landing(
    start: int, ops: tuple[str, ...], terms: tuple[int, ...], slips: Mapping[int, int] | None
) -> list[int]:
    """The running values of the forward pass, ``slips[i]`` added to the value after term ``i``."""
    values = [start]
    for i, (op, term) in enumerate(zip(ops, terms, strict=True)):
        values.append(_apply(values[-1], op, term) + (slips or {}).get(i, 0))
    return values


def work_chain(
    start: int, ops: tuple[str, ...], terms: tuple[int, ...], slips: Mapping[int, int] | None = None
) -> tuple[str, ...]:
    """The solution's lines: one per term forward, one per term undone backward, the landing.

    ``slips[i]`` is added to forward line ``i``'s result (a wrong sum that the next lines carry on
    from); the check undoes the terms faithfully, so it lands ``sum(slips)`` away from the start."""
    if len(ops) != len(terms) or not ops:
        raise ValueError(
            f"a chain needs as many operators as terms, at least one; got {len(ops)}, {len(terms)}"
        )
    if len(terms) > len(LABELS):
        raise ValueError(f"a chain has at most {len(LABELS)} terms (one label each), got {len(terms)}")
    values = _landing(start, ops, terms, slips)
    checked = _check(values[-1], ops, terms)
    lines = []
    for i, (op, term) in enumerate(zip(ops, terms, strict=True)):
        lines.append(f"{LABELS[i]}{op}{term}: {values[i]}{op}{term}={values[i + 1]}")
    lines.append("Check:")
    for i in reversed(range(len(ops))):
        lines.append(
            f"{LABELS[i]}{ops[i]}{terms[i]}: {checked[i + 1]}{_INVERSE[ops[i]]}{terms[i]}={checked[i]}"
        )
    lines.append(f"Back at {checked[0]}.")
    return tuple(lines)


def _check(final: int, ops: tuple[str, ...], terms: tuple[int, ...]) -> list[int]:
    """The check's running values, indexed like the forward pass's: ``[i]`` after undoing term ``i``."""
    checked = [final]
    for op, term in zip(reversed(ops), reversed(terms), strict=True):
        checked.append(_apply(checked[-1], _INVERSE[op], term))
    return checked[::-1]


def sample_chain(rng: random.Random, min_ops: int, max_ops: int, max_operand: int = 9) -> ChainProblem:
    """Draw one chain: its length log-uniform in [min_ops, max_ops], terms in [1, max_operand], each
    operator drawn among those that keep the running value in [0, MAX_VALUE]."""
    if not 1 <= min_ops <= max_ops <= len(LABELS):
        raise ValueError(f"need 1 <= min_ops <= max_ops <= {len(LABELS)}, got {min_ops}, {max_ops}")
    n = min(max_ops, int(math.exp(rng.uniform(math.log(min_ops), math.log(max_ops + 1)))))
    value = start = rng.randint(1, max_operand)
    ops: list[str] = []
    terms: list[int] = []
    for _ in range(n):
        term = rng.randint(1, max_operand)
        allowed = [op for op in "+-" if 0 <= _apply(value, op, term) <= MAX_VALUE]
        op = rng.choice(allowed)  # never empty: term <= max_operand < MAX_VALUE
        value = _apply(value, op, term)
        ops.append(op)
        terms.append(term)
    return ChainProblem(start, tuple(ops), tuple(terms))


def draw_slips(problem: ChainProblem, rng: random.Random, rate: float) -> dict[int, int]:
    """Forward lines whose result is off by one, each with probability ``rate``: ``{line: +1 or -1}``.

    A direction is drawn among those that keep every running value, forward and in the check, in
    [0, MAX_VALUE]; a line where neither does is left right. See ``warmup.slip_rate`` for why the
    warm-up trains on such solutions.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"a slip rate is a probability in [0, 1), got {rate}")
    slips: dict[int, int] = {}
    for i in range(len(problem.ops)):
        if rng.random() >= rate:
            continue
        allowed = [d for d in (1, -1) if _in_range(problem, {**slips, i: d})]
        if allowed:
            slips[i] = rng.choice(allowed)
    return slips


def _in_range(problem: ChainProblem, slips: Mapping[int, int]) -> bool:
    values = _landing(problem.start, problem.ops, problem.terms, slips)
    return all(0 <= v <= MAX_VALUE for v in values + _check(values[-1], problem.ops, problem.terms))

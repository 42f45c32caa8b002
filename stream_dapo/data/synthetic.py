"""Seeded, verifiable arithmetic tasks in the DAPO-Math-17k schema: the embedded recipes' data.

``data.synthetic.kind = "arith"`` (the embedded default, below) or ``"chain"``, the long
chain-of-thought task of ``stream_dapo.data.longcot``; both are split, cached and written here.

Each problem is an integer expression with 1-8 operations (``+``, ``-``, ``*``, usual precedence),
for example::

    question:  Compute 7+12*3-5.
    solution:  12*3=36
               7+36=43
               43-5=38
               Answer: 38

The worked solution evaluates the multiplications left to right, then the additions and subtractions
left to right, one step per operation, and ends in DAPO's ``Answer:`` line, so the same verifier scores
both this task and DAPO-Math-17k. Problems whose intermediate results would be negative or exceed
``max_result`` are redrawn: negative numbers and long products add tokens and failure modes without
making the task more instructive for a tiny model.

The text has no spaces inside expressions and one step per line. Under Qwen2's pre-tokenizer a space
before a digit is a token of its own; without them, the operand a step copies sits right next to its
operator in the question, and the tiny model learns to copy it several times faster (about 1500
instead of 5000+ warm-up steps in our measurements).

Question texts are distinct within each split. There are few one-operation problems (about 200 at
the defaults), so the 20k-problem train split is mostly two- and three-operation problems, while the
eval split, small enough not to exhaust any class, has about a third of each.

Splits come from disjoint seed streams (``random.Random`` seeded with a string, which is stable across
Python processes and versions), and no eval question text appears in the train split. Both splits are
written once as JSON lines (``ensure_synthetic_data``), keyed by a hash of the task config, so the
loader in ``stream_dapo.data.dataset`` serves them exactly like the public dataset. The worked
solutions travel in ``extra_info["solution"]`` for the supervised warm-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_dapo.config import DataConfig, SyntheticTaskConfig
from stream_dapo.data.longcot import ChainProblem, sample_chain

__all__ = [
    "DATA_SOURCE",
    "INSTRUCTION",
    "ArithmeticProblem",
    "Step",
    "build_prompt",
    "ensure_synthetic_data",
    "generate_split",
    "problem_to_row",
    "sample_problem",
    "solve",
    "synthetic_task_key",
]

DATA_SOURCE = "synthetic_arith"
"""``data_source`` of every synthetic row."""

INSTRUCTION = "Solve step by step. The last line of your response should be of the form Answer: $Answer."
"""DAPO's answer-format instruction, shortened: the tiny model's context is small."""

OPERATORS = ("+", "-", "*")

# Bump when the generated text or row layout changes: it is part of the cache key, so old caches
# are regenerated instead of silently reused.
_FORMAT_VERSION = 2
_CHAIN_FORMAT_VERSION = 3
"""The same for the chain task's text (its own, so that a change to it leaves arith caches alone)."""
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Step:
    """One worked step ``left op right = result``."""

    left: int
    op: str
    right: int
    result: int

    @property
    def text(self) -> str:
        return f"{self.left}{self.op}{self.right}={self.result}"


@dataclass(frozen=True)
class ArithmeticProblem:
    """An expression ``operands[0] ops[0] operands[1] ...`` with its worked solution."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]
    steps: tuple[Step, ...]

    @property
    def answer(self) -> int:
        return self.steps[-1].result

    @property
    def question(self) -> str:
        parts = [str(self.operands[0])]
        for op, operand in zip(self.ops, self.operands[1:], strict=True):
            parts += [op, str(operand)]
        return "Compute " + "".join(parts) + "."

    @property
    def solution(self) -> str:
        return "\n".join(step.text for step in self.steps) + f"\nAnswer: {self.answer}"


def _apply(left: int, op: str, right: int) -> int:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    raise ValueError(f"unknown operator {op!r}; expected one of {OPERATORS}")


def solve(operands: tuple[int, ...], ops: tuple[str, ...]) -> tuple[Step, ...]:
    """Evaluate with the usual precedence, one ``Step`` per operation.

    Multiplications first, leftmost first; then additions and subtractions left to right.
    """
    if len(operands) != len(ops) + 1:
        raise ValueError(f"{len(operands)} operands need {len(operands) - 1} operators, got {len(ops)}")
    values, pending = list(operands), list(ops)
    steps: list[Step] = []
    while "*" in pending:
        i = pending.index("*")
        step = Step(values[i], "*", values[i + 1], values[i] * values[i + 1])
        steps.append(step)
        values[i : i + 2] = [step.result]
        del pending[i]
    acc = values[0]
    for op, value in zip(pending, values[1:], strict=True):
        step = Step(acc, op, value, _apply(acc, op, value))
        steps.append(step)
        acc = step.result
    return tuple(steps)


def sample_problem(rng: random.Random, task: SyntheticTaskConfig) -> ArithmeticProblem | ChainProblem | None:
    """Draw one problem of ``task.kind``; None when it breaks the value limits (the caller draws again)."""
    if task.kind == "chain":
        return sample_chain(rng, task.min_ops, task.max_ops, task.max_operand)
    num_ops = rng.randint(task.min_ops, task.max_ops)
    operands = tuple(rng.randint(1, task.max_operand) for _ in range(num_ops + 1))
    ops = tuple(rng.choice(OPERATORS) for _ in range(num_ops))
    steps = solve(operands, ops)
    if any(s.result < 0 or s.result > task.max_result for s in steps):
        return None
    return ArithmeticProblem(operands, ops, steps)


def generate_split(
    task: SyntheticTaskConfig, *, seed: int, split: str, count: int, exclude: set[str] | None = None
) -> list[ArithmeticProblem | ChainProblem]:
    """``count`` problems with distinct question texts, none of them in ``exclude``.

    Deterministic for (task, seed, split, exclude). Raises when the task's knobs do not allow that
    many distinct problems.
    """
    kind = "" if task.kind == "arith" else f"{task.kind}/"
    rng = random.Random(f"stream-dapo/synthetic/v{_FORMAT_VERSION}/{kind}{split}/{seed}")
    seen = set(exclude or ())
    problems: list[ArithmeticProblem | ChainProblem] = []
    # Generous, but finite: a task space smaller than `count` must end in an error, not a hang.
    budget = 200 * count + 10_000
    for _ in range(budget):
        if len(problems) == count:
            break
        problem = sample_problem(rng, task)
        if problem is None or problem.question in seen:
            continue
        seen.add(problem.question)
        problems.append(problem)
    if len(problems) < count:
        raise ValueError(
            f"the synthetic task (min_ops={task.min_ops}, max_ops={task.max_ops}, "
            f"max_operand={task.max_operand}, max_result={task.max_result}) yielded only "
            f"{len(problems)} distinct {split} problems of the {count} asked; lower "
            f"data.synthetic.num_{split} or raise data.synthetic.max_operand / max_ops"
        )
    return problems


def build_prompt(question: str) -> list[dict[str, str]]:
    """The chat messages of one problem (a single user turn, as in DAPO-Math-17k)."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n{question}"}]


def problem_to_row(problem: ArithmeticProblem | ChainProblem, *, split: str, index: int) -> dict[str, Any]:
    """One row in the DAPO-Math-17k schema, with the worked solution in ``extra_info``."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": build_prompt(problem.question),
        "ability": "ARITHMETIC",
        "reward_model": {"ground_truth": str(problem.answer), "style": "rule"},
        "extra_info": {
            "index": f"{split}-{index}",
            "split": split,
            "num_ops": len(problem.ops),
            "solution": problem.solution,
        },
    }


def synthetic_task_key(cfg: DataConfig) -> str:
    """Hash of everything that determines the generated files (task knobs, seed, format)."""
    # "kind" joined the task knobs after the arith caches were written: leaving it out for arith keeps
    # their keys (and the warm models built on them) valid.
    task = cfg.synthetic.model_dump(mode="json", exclude={"kind"} if cfg.synthetic.kind == "arith" else None)
    payload: dict[str, Any] = {"task": task, "seed": cfg.seed, "format": _FORMAT_VERSION}
    if cfg.synthetic.kind == "chain":
        payload["chain_format"] = _CHAIN_FORMAT_VERSION
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _write_jsonl_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    # A unique temporary name per process: two services may build the cache at the same moment;
    # both write identical bytes and the last rename wins.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def ensure_synthetic_data(cfg: DataConfig, out_dir: Path) -> tuple[Path, Path]:
    """Write the train and eval splits under ``out_dir/synthetic-<key>/`` once; return their paths.

    The manifest is written last, so its presence means both files are complete; a second call with
    the same config returns at once.
    """
    key = synthetic_task_key(cfg)
    folder = Path(out_dir) / f"synthetic-{key}"
    train_path, eval_path = folder / "train.jsonl", folder / "eval.jsonl"
    manifest = folder / _MANIFEST
    if manifest.is_file() and train_path.is_file() and eval_path.is_file():
        return train_path, eval_path

    task = cfg.synthetic
    eval_problems = generate_split(task, seed=cfg.seed, split="eval", count=task.num_eval)
    train_problems = generate_split(
        task,
        seed=cfg.seed,
        split="train",
        count=task.num_train,
        exclude={p.question for p in eval_problems},
    )
    folder.mkdir(parents=True, exist_ok=True)
    _write_jsonl_atomic(
        eval_path, [problem_to_row(p, split="eval", index=i) for i, p in enumerate(eval_problems)]
    )
    _write_jsonl_atomic(
        train_path, [problem_to_row(p, split="train", index=i) for i, p in enumerate(train_problems)]
    )
    info = {"key": key, "task": task.model_dump(mode="json"), "seed": cfg.seed, "format": _FORMAT_VERSION}
    tmp = manifest.with_name(f".{_MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, manifest)
    return train_path, eval_path

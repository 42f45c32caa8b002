"""The synthetic arithmetic task: determinism, disjoint splits, correct worked solutions, knobs."""

from __future__ import annotations

import ast
import json
import re

import pytest

from stream_dapo.config import DataConfig, SyntheticTaskConfig
from stream_dapo.data.synthetic import (
    ArithmeticProblem,
    ensure_synthetic_data,
    generate_split,
    problem_to_row,
    solve,
)
from stream_dapo.verifier import verify

STEP = re.compile(r"^(\d+)([+*-])(\d+)=(\d+)$", re.MULTILINE)
SMALL = SyntheticTaskConfig(num_train=400, num_eval=100, min_ops=1, max_ops=4, max_operand=20, max_result=999)


def _reference_value(question: str) -> int:
    """Evaluate 'Compute a + b * c.' by walking Python's own parse tree (operator precedence included)."""
    expr = question.removeprefix("Compute ").removesuffix(".")
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return node.value

    return walk(ast.parse(expr, mode="eval").body)


def test_solve_follows_operator_precedence():
    steps = solve((7, 12, 3, 5), ("+", "*", "-"))
    assert [s.text for s in steps] == ["12*3=36", "7+36=43", "43-5=38"]
    problem = ArithmeticProblem((7, 12, 3, 5), ("+", "*", "-"), steps)
    assert problem.question == "Compute 7+12*3-5."
    assert problem.solution == "12*3=36\n7+36=43\n43-5=38\nAnswer: 38"
    # Subtraction is left-associative: 20 - 5 - 3 = 12, not 18.
    assert solve((20, 5, 3), ("-", "-"))[-1].result == 12


def test_generation_is_deterministic_for_a_seed():
    a = generate_split(SMALL, seed=1, split="train", count=200)
    b = generate_split(SMALL, seed=1, split="train", count=200)
    c = generate_split(SMALL, seed=2, split="train", count=200)
    assert [p.question for p in a] == [p.question for p in b]
    assert [p.question for p in a] != [p.question for p in c]


def test_files_are_written_once_and_splits_are_disjoint(tmp_path):
    cfg = DataConfig(seed=0, synthetic=SMALL)
    train, evals = ensure_synthetic_data(cfg, tmp_path)
    manifest = train.parent / "manifest.json"
    stamp = (train.stat().st_mtime_ns, evals.stat().st_mtime_ns, manifest.stat().st_mtime_ns)
    assert ensure_synthetic_data(cfg, tmp_path) == (train, evals)
    assert (train.stat().st_mtime_ns, evals.stat().st_mtime_ns, manifest.stat().st_mtime_ns) == stamp

    train_rows = [json.loads(line) for line in train.read_text().splitlines()]
    eval_rows = [json.loads(line) for line in evals.read_text().splitlines()]
    assert (len(train_rows), len(eval_rows)) == (400, 100)
    train_q = {r["prompt"][0]["content"] for r in train_rows}
    eval_q = {r["prompt"][0]["content"] for r in eval_rows}
    assert len(train_q) == 400 and len(eval_q) == 100  # distinct within each split
    assert not train_q & eval_q

    # Another task config gets its own cache folder.
    other = DataConfig(seed=0, synthetic=SMALL.model_copy(update={"max_operand": 9}))
    assert ensure_synthetic_data(other, tmp_path)[0].parent != train.parent


def test_rows_follow_the_dapo_schema():
    problem = generate_split(SMALL, seed=0, split="eval", count=1)[0]
    row = problem_to_row(problem, split="eval", index=0)
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"][0]["role"] == "user"
    content = row["prompt"][0]["content"]
    assert "The last line of your response should be of the form Answer: $Answer" in content
    assert content.endswith(problem.question)
    assert row["reward_model"] == {"ground_truth": str(problem.answer), "style": "rule"}
    assert row["extra_info"]["solution"] == problem.solution


def test_every_worked_solution_is_right_and_verifies():
    problems = generate_split(SMALL, seed=5, split="train", count=300)
    for p in problems:
        steps = STEP.findall(p.solution)
        assert len(steps) == len(p.ops)
        for left, op, right, result in steps:
            a, b, r = int(left), int(right), int(result)
            assert r == {"+": a + b, "-": a - b, "*": a * b}[op], p.solution
        assert p.answer == _reference_value(p.question), p.question
        assert p.solution.splitlines()[-1] == f"Answer: {p.answer}"
        verdict = verify(p.solution, str(p.answer))
        assert verdict.correct, (p.solution, verdict)
        assert not verify(p.solution, str(p.answer + 1)).correct


@pytest.mark.parametrize("ops", [1, 2, 4, 6])
def test_ops_knobs_set_the_number_of_steps(ops):
    task = SMALL.model_copy(update={"min_ops": ops, "max_ops": ops, "max_result": 10_000})
    problems = generate_split(task, seed=0, split="train", count=50)
    assert {len(p.steps) for p in problems} == {ops}
    assert {len(STEP.findall(p.solution)) for p in problems} == {ops}


def test_operand_and_result_knobs_bound_the_numbers():
    task = SMALL.model_copy(update={"max_operand": 9, "max_result": 50})
    problems = generate_split(task, seed=0, split="train", count=200)
    assert max(max(p.operands) for p in problems) <= 9
    assert all(0 <= s.result <= 50 for p in problems for s in p.steps)
    assert max(len(p.ops) for p in problems) == 4 and min(len(p.ops) for p in problems) == 1


def test_a_task_space_too_small_is_an_error_that_names_the_knobs():
    tiny = SyntheticTaskConfig(num_train=10, num_eval=10, min_ops=1, max_ops=1, max_operand=2)
    with pytest.raises(ValueError, match="num_train or raise data.synthetic.max_operand"):
        generate_split(tiny, seed=0, split="train", count=100)

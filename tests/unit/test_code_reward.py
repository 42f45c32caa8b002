"""The code reward: extraction, the two test shapes, HumanEval's 164 problems, early exits that must
never pass, and HumanEval's data rows. Tests that run programs are marked ``process``."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.cli import main
from stream_dapo.data.humaneval import DATA_SOURCE, humaneval_rows, load_problems
from stream_dapo.verifier.code import (
    CodeSettings,
    CodeVerdict,
    compute_score,
    extract_program,
    normalize_output,
    score_code,
)
from stream_dapo.verifier.sandbox import SandboxLimits, sandbox_problem

SUM_CASES = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0"]})
SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}```\n\nIt works."


@pytest.fixture(scope="module")
def problems() -> list[dict[str, Any]]:
    return load_problems()


@pytest.fixture(scope="module")
def need_namespaces() -> None:
    problem = sandbox_problem("namespaces")
    if problem is not None:
        pytest.skip(problem)


def humaneval_truth(problem: dict[str, Any]) -> str:
    return json.dumps({"entry_point": problem["entry_point"], "test": problem["test"]})


def score_all(items: list[tuple[str, str]], settings: CodeSettings | None = None) -> list[CodeVerdict]:
    """Score (response, ground truth) pairs two at a time (the machine has two cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda item: score_code(item[0], item[1], settings), items))


# -- no process -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, program",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\nx = 1\n```\ntext\n```\nprint(2)\n```", "print(2)\n"),  # the last one, unlabelled
        ("```python\nprint(1)\n```\n```bash\nls\n```", "print(1)\n"),  # not the shell block
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)\n"),  # the cut-off one is not complete
        ("no code at all", None),
        ("```python\n\n```", None),
        ("  ```Python3 title\n  print(3)\n  ```", "  print(3)\n"),
    ],
)
def test_last_block_extraction(response: str, program: str | None) -> None:
    assert extract_program(response, "last_block") == program


def test_whole_mode_takes_the_whole_response() -> None:
    assert extract_program("print(1)\n", "whole") == "print(1)\n"
    assert extract_program("  \n", "whole") is None
    with pytest.raises(ValueError, match="last_block, whole"):
        extract_program("x", "first_block")


def test_output_normalisation_drops_trailing_whitespace_and_blank_lines() -> None:
    assert normalize_output("1 2  \n3\t\n\n\n") == normalize_output("1 2\n3") == "1 2\n3"
    assert normalize_output(" 1") != normalize_output("1")  # leading whitespace counts


@pytest.mark.parametrize(
    "kwargs, field",
    [({"isolation": "docker"}, "isolation"), ({"extract": "all"}, "extract"), ({"max_cases": 0}, "max_cases")]
    + [({"partial_credit": 1}, "partial_credit"), ({"limits": {"cpu_s": 1}}, "limits")],
)
def test_settings_refuse_bad_values(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CodeSettings(**kwargs)


@pytest.mark.parametrize(
    "truth",
    [
        "not json",
        "[1, 2]",
        json.dumps({"inputs": ["1"], "outputs": ["1", "2"]}),
        json.dumps({"inputs": [], "outputs": []}),
        json.dumps({"inputs": [[1, 2]], "outputs": [3], "fn_name": "f"}),
        json.dumps({"entry_point": "not an identifier", "test": "def check(c): pass"}),
    ],
)
def test_tests_that_are_neither_shape_are_bad_tests(truth: str) -> None:
    verdict = score_code(fenced(SUM_PROGRAM), truth)
    assert (verdict.passed, verdict.total, verdict.reason) == (0, 0, "bad_tests")


def test_a_response_without_code_runs_nothing() -> None:
    assert score_code("I do not know.", SUM_CASES).reason == "no_code"
    out = compute_score("apps", "I do not know.", SUM_CASES, None)
    assert out == {"score": 0.0, "passed": 0, "total": 3, "reason": "no_code"}


def test_humaneval_rows_follow_the_data_schema(problems: list[dict[str, Any]]) -> None:
    rows = humaneval_rows(problems)
    assert len(rows) == 164
    first = rows[0]
    assert first["data_source"] == DATA_SOURCE == "openai_humaneval"
    assert first["ability"] == "code" and first["reward_model"]["style"] == "code"
    assert first["extra_info"] == {"task_id": "HumanEval/0", "index": 0}
    (message,) = first["prompt"]
    assert message["role"] == "user" and problems[0]["prompt"] in message["content"]
    assert "fenced" in message["content"]
    truth = json.loads(first["reward_model"]["ground_truth"])
    assert truth == {"entry_point": "has_close_elements", "test": problems[0]["test"]}


def test_prepare_data_writes_humaneval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "humaneval.jsonl"
    assert main(["prepare-data", "--source", "humaneval", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"humaneval": {"path": str(out), "rows": 164}}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["index"] for r in rows] == list(range(164))
    assert main(["prepare-data", "--source", "humaneval"]) == 2
    assert "--out" in capsys.readouterr().err


# -- running programs -----------------------------------------------------------------------------


@pytest.mark.process
def test_every_humaneval_canonical_solution_passes_and_pass_bodies_fail(
    problems: list[dict[str, Any]], need_namespaces: None
) -> None:
    right = [(fenced(p["prompt"] + p["canonical_solution"]), humaneval_truth(p)) for p in problems]
    empty = [(fenced(p["prompt"] + "    pass\n"), humaneval_truth(p)) for p in problems]
    verdicts = score_all(right + empty)
    passed = {p["task_id"]: v for p, v in zip(problems, verdicts[: len(problems)], strict=True)}
    assert {t: v.reason for t, v in passed.items() if v.reason != "passed"} == {}
    assert all((v.passed, v.total) == (1, 1) for v in passed.values())
    stubs = verdicts[len(problems) :]
    assert [p["task_id"] for p, v in zip(problems, stubs, strict=True) if v.passed] == []
    assert {v.reason for v in stubs} <= {"failed", "crashed"}


# (task index, text of the canonical solution, what it becomes): off by one, then wrong returns.
MUTATIONS = [
    (23, "return len(string)", "return len(string) + 1"),
    (53, "return x + y", "return x + y + 1"),
    (13, "return a", "return a + 1"),
    (55, "return 1\n", "return 2\n"),
    (35, "return m", "return m - 1"),
    (0, "return False", "return True"),
    (12, "return s", "return strings[0]"),
    (2, "return number % 1.0", "return number // 1.0"),
]


@pytest.mark.process
def test_off_by_one_and_wrong_returns_fail(problems: list[dict[str, Any]], need_namespaces: None) -> None:
    items = []
    for index, old, new in MUTATIONS:
        solution = problems[index]["canonical_solution"]
        assert old in solution
        items.append(
            (fenced(problems[index]["prompt"] + solution.replace(old, new)), humaneval_truth(problems[index]))
        )
    assert [(v.passed, v.reason) for v in score_all(items)] == [(0, "failed")] * len(MUTATIONS)


ADD = {"entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
EARLY_EXITS = {
    "sys.exit(0)": ("import sys\ndef add(a, b):\n    return a - b\nsys.exit(0)\n", "early_exit"),
    "os._exit(0)": ("import os\ndef add(a, b):\n    return a - b\nos._exit(0)\n", "early_exit"),
    "raise SystemExit(0)": ("def add(a, b):\n    return a - b\nraise SystemExit(0)\n", "early_exit"),
    "exit in the candidate": ("import sys\ndef add(a, b):\n    sys.exit(0)\n", "early_exit"),
    "SIGKILL itself": ("import os\ndef add(a, b):\n    os.kill(os.getpid(), 9)\n", "crashed"),
    "atexit os._exit(0)": (
        "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return a - b\n",
        "early_exit",
    ),
    "atexit after a failed assert": (
        "import atexit, sys\natexit.register(lambda: print('ALL TESTS PASSED'))\ndef add(a, b):\n    return 0\n",
        "failed",
    ),
    "fake success marker": (
        "import os, sys\ndef add(a, b):\n    print('passed', flush=True)\n    os.write(4, b'0' * 32)\n"
        "    os._exit(0)\n",
        "early_exit",
    ),
    "calls check itself": (
        "def add(a, b):\n    return a - b\ndef check(candidate):\n    pass\ncheck(add)\n",
        "failed",
    ),
    "patches exec": (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef check(candidate):\n    pass\n"
        "def add(a, b):\n    return a - b\n",
        "failed",
    ),
}


@pytest.mark.process
@pytest.mark.parametrize("name", list(EARLY_EXITS))
def test_no_early_exit_or_forged_marker_passes(name: str, need_namespaces: None) -> None:
    code, reason = EARLY_EXITS[name]
    verdict = score_code(fenced(code), json.dumps(ADD))
    assert (verdict.passed, verdict.reason) == (0, reason)
    assert compute_score("x", fenced(code), json.dumps(ADD), None)["score"] == 0.0


@pytest.mark.process
def test_apps_cases_pass_fail_and_partial_credit(need_namespaces: None) -> None:
    assert compute_score("apps", fenced(SUM_PROGRAM), SUM_CASES, None) == {
        "score": 1.0,
        "passed": 3,
        "total": 3,
        "reason": "passed",
    }
    product = "a, b = map(int, input().split())\nprint(a * b)\n"  # right only on "0 0" (0 == 0)
    strict = compute_score("apps", fenced(product), SUM_CASES, None)
    assert (strict["score"], strict["reason"]) == (0.0, "failed")
    partial = compute_score("apps", fenced(product), SUM_CASES, None, CodeSettings(partial_credit=True))
    assert partial == {"score": 1 / 3, "passed": 1, "total": 3, "reason": "failed"}
    crash = "a, b = map(int, input().split())\nprint(a + b if a else 1 / 0)\n"  # crashes on "0 0"
    crashed = score_code(fenced(crash), SUM_CASES, CodeSettings(partial_credit=True))
    assert (crashed.passed, crashed.total, crashed.reason) == (2, 3, "crashed")
    lines = json.dumps({"inputs": [["2", "3"]], "outputs": [["5", ""]]})  # lists of lines
    assert score_code(fenced("print(int(input()) + int(input()))\n"), lines).reason == "passed"
    first_two = score_code(fenced(SUM_PROGRAM), SUM_CASES, CodeSettings(max_cases=2))
    assert (first_two.passed, first_two.total) == (2, 2)


@pytest.mark.process
def test_apps_limits_give_their_reasons(need_namespaces: None) -> None:
    one = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    quick = CodeSettings(limits=SandboxLimits(wall_s=1.0, output_bytes=1000))
    cases: dict[str, Callable[[], str]] = {
        "timeout": lambda: score_code(fenced("import time\ntime.sleep(60)\n"), one, quick).reason,
        "output_limit": lambda: score_code(fenced("while True:\n    print(1)\n"), one, quick).reason,
        "memory": lambda: score_code(fenced("x = bytearray(10 * 2**30)\n"), one, quick).reason,
        "crashed": lambda: score_code(fenced("import sys\nprint(1)\nsys.exit(1)\n"), one, quick).reason,
    }
    assert {reason: run() for reason, run in cases.items()} == {reason: reason for reason in cases}


@pytest.mark.process
def test_rlimits_mode_scores_too() -> None:
    problem = sandbox_problem("rlimits")
    if problem is not None:
        pytest.skip(problem)
    settings = CodeSettings(isolation="rlimits")
    assert score_code(fenced(SUM_PROGRAM), SUM_CASES, settings).reason == "passed"
    assert score_code(fenced("print(0)\n"), SUM_CASES, settings).reason == "failed"
    add = "def add(a, b):\n    return a + b\n"
    assert score_code(fenced(add), json.dumps(ADD), settings).reason == "passed"
    assert score_code(fenced(EARLY_EXITS["os._exit(0)"][0]), json.dumps(ADD), settings).reason == "early_exit"

"""bench/busy_suite.py without a session: its arguments, the make command lines they give, pytest's
summary as the tally reads it, and the tally itself (no clone, no make, no process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import busy_suite as bs

FRAMED = """\
........F..s.
=================================== FAILURES ===================================
___________________________ test_a_hung_buffer ___________________________
E       assert 0 >= 2
=========================== short test summary info ============================
FAILED tests/integration/test_learner_buffer_stall.py::test_a_hung_buffer_neither_mixes_up_replies_nor_leases_twice - assert 0 >= 2
FAILED tests/unit/test_x.py::test_y[a - b] - AssertionError: no
ERROR tests/unit/test_z.py::test_w - RuntimeError: fixture
============= 2 failed, 10 passed, 1 skipped, 3 warnings, 1 error in 812.45s (0:13:32) =============
"""

QUIET = """\
..........                                                               [100%]
10 passed, 2 deselected in 1.50s
"""


def test_defaults_are_three_test_runs_after_a_run_beside_the_builtin_load() -> None:
    args = bs.parse_args([])
    assert (args.commit, args.runs, args.skip_run, args.make_test_args) == ("HEAD", 3, False, "")
    assert args.busy_cmd == [sys.executable, str(Path(bs.__file__).resolve()), "--load"]
    assert args.repo == bs.REPO and args.venv is None and args.make_arg == []


def test_the_busy_command_is_one_shell_quoted_argument_or_none() -> None:
    args = bs.parse_args(["--busy-cmd", "python3 load.py --cpu '0.5'", "--runs", "5", "--commit", "abc123"])
    assert args.busy_cmd == ["python3", "load.py", "--cpu", "0.5"]
    assert (args.runs, args.commit) == (5, "abc123")
    assert bs.parse_args(["--no-busy"]).busy_cmd is None


@pytest.mark.parametrize(
    "argv",
    [["--runs", "0"], ["--busy-cmd", ""], ["--busy-cmd", "x", "--no-busy"], ["--load-cpu", "1.5"]],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bs.parse_args(argv)
    assert exc.value.code == 2


def test_make_command_lines(tmp_path: Path) -> None:
    args = bs.parse_args(
        ["--make-test-args", "tests/unit/test_cli.py -x", "--make-arg=-o", "--make-arg=ops-tools"]
    )
    assert bs.make_argv(args, "run") == ["make", "run", "-o", "ops-tools"]
    assert bs.make_argv(args, "test") == [
        "make",
        "test",
        "-o",
        "ops-tools",
        "PYTEST_ARGS=tests/unit/test_cli.py -x",
    ]
    venv = bs.parse_args(["--venv", str(tmp_path / "venv")])
    stamp = str(tmp_path / "venv" / bs.STAMP)
    assert bs.make_argv(venv, "test") == [
        "make",
        "test",
        f"VENV={tmp_path / 'venv'}",
        "-o",
        stamp,
        "PYTEST_ARGS=",
    ]


def test_the_summary_line_and_the_failing_ids_are_read() -> None:
    out = bs.parse_pytest_output(FRAMED)
    assert out.counts == {"failed": 2, "passed": 10, "skipped": 1, "warnings": 3, "error": 1}
    assert out.pytest_seconds == 812.45 and out.failures == 3
    assert out.failed_ids == [
        "tests/integration/test_learner_buffer_stall.py::test_a_hung_buffer_neither_mixes_up_replies_nor_leases_twice",
        "tests/unit/test_x.py::test_y[a",  # " - " ends the id: pytest prints it so
        "tests/unit/test_z.py::test_w",
    ]
    quiet = bs.parse_pytest_output(QUIET)
    assert (quiet.counts, quiet.failed_ids, quiet.pytest_seconds, quiet.failures) == (
        {"passed": 10, "deselected": 2},
        [],
        1.5,
        0,
    )


def test_no_tests_and_no_summary_are_told_apart() -> None:
    none_ran = bs.parse_pytest_output(
        "\n============================ no tests ran in 0.01s =============================\n"
    )
    assert (none_ran.counts, none_ran.pytest_seconds) == ({}, 0.01)
    killed = bs.parse_pytest_output("make: *** [Makefile:44: test] Killed\n")
    assert (killed.counts, killed.pytest_seconds, killed.failed_ids) == ({}, None, [])
    # Two "errors" lines and the word "error" both count as errors; the last summary wins.
    assert bs.parse_pytest_output("1 passed in 1.0s\n3 errors in 2.0s\n").counts == {"error": 3}


def test_the_tally_tells_flaky_from_broken() -> None:
    a, b, c = "tests/a.py::t", "tests/b.py::t", "tests/c.py::t"
    outcomes = [
        bs.Outcome({"failed": 2, "passed": 5}, [a, b], 100.0),
        bs.Outcome({"passed": 7}, [], 90.0),
        bs.Outcome({"failed": 2, "passed": 5}, [a, c], 95.0),
    ]
    runs = [
        bs.Run(i + 1, 2 if o.failures else 0, 120.0 + i, o, f"test-{i + 1}.log")
        for i, o in enumerate(outcomes)
    ]
    t = bs.tally(runs)
    assert (t["runs"], t["runs_failed"]) == (3, 2)
    assert t["failing_ids"] == {a: 2, b: 1, c: 1}
    assert t["flaky_ids"] == [a, b, c] and t["broken_ids"] == []
    assert [row["failures"] for row in t["per_run"]] == [2, 0, 2]
    assert [row["seconds"] for row in t["per_run"]] == [120.0, 121.0, 122.0]
    text = bs.render(t)
    assert "3 runs, 2 failed" in text and f"2/3 flaky  {a}" in text
    always = bs.tally(runs[:1])
    assert always["broken_ids"] == [a, b] and always["flaky_ids"] == []


def test_the_builtin_load_churns_loopback_connections_and_returns() -> None:
    bs.load(seconds=0.3, ports=4, cpu=0.2)  # in this process: it starts nothing, and ends

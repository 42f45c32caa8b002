"""The code reward: run the program a response holds against a data row's tests, in the sandbox.

``score_code(solution_str, ground_truth, settings) -> CodeVerdict``, and ``compute_score`` with
verl's signature around it. ``ground_truth`` is a JSON string (or the dict it decodes to) in one of
two shapes:

- HumanEval: ``{"entry_point": "f", "test": "def check(candidate): assert ..."}``. One run: the
  model's code, then the test, then ``check(f)``. One test (``total`` is 1).
- APPS / TACO (standard input): ``{"inputs": [...], "outputs": [...]}``. One run per case, the
  input on stdin; the case passes when the program exits 0 and its stdout equals the expected
  output after trailing whitespace is stripped from each line and trailing blank lines are dropped.
  An input or output may also be a list of lines (joined with newlines). Only the first
  ``max_cases`` cases are run and count (``total`` is at most ``max_cases``); without
  ``partial_credit`` the runs stop at the first failing case. APPS's call-based problems (a
  ``fn_name`` key) are not supported: they score "bad_tests".

A program passes only if every test ran and passed. For HumanEval, "the test ran to its end" is
signalled by a per-run random nonce: the trusted harness (``HUMANEVAL_HARNESS``, the program the
sandbox runs) reads the nonce, the model's code and the test from the private fd, which it closes
before any model code runs; it keeps ``exec``, ``compile`` and ``os.write`` from before that; runs
the model's code and then the test in a fresh namespace; calls ``check``; and only when ``check``
returns writes the nonce to the report fd. A run passes when that nonce arrives *and* the exit code
is 0. So an early ``sys.exit(0)``, ``os._exit(0)``, ``raise SystemExit``, a process that kills
itself, an ``atexit`` hook that exits 0 after a failed assert, or a printed "all tests passed" is a
failure, never a pass: none of them has the nonce.

What this does not protect against: the model's code runs in the same interpreter as the harness,
so code written to attack it can in principle reach the harness's frame (``sys._getframe``, ``gc``,
``/proc/self/mem``) and take the nonce, or change what the test does (a trace function that jumps
over asserts, a returned object whose ``__eq__`` is always true). The sandbox still contains such a
program (limits, no network, no host files); only the reward can be gamed, by a program written to
game this harness.

Reasons (``CODE_REASONS``): "passed"; "failed" (an assert failed, or a wrong output); "no_code" (no
program found in the response); "bad_tests" (the ground truth is not one of the two shapes: a data
error, never the model's); "timeout" (wall or CPU limit); "memory"; "output_limit"; "crashed" (an
exception other than an assert, a nonzero exit, a signal); "early_exit" (HumanEval: ended before
``check`` returned, without an error); "sandbox_error" (the sandbox itself failed: not the model's
fault). For APPS, the verdict's reason is the first failing case's.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_dapo.verifier.sandbox import ISOLATIONS, SandboxLimits, SandboxResult, run_program

__all__ = [
    "CODE_REASONS",
    "EXTRACT_MODES",
    "HUMANEVAL_HARNESS",
    "CodeSettings",
    "CodeVerdict",
    "compute_score",
    "extract_program",
    "normalize_output",
    "score_code",
]

CODE_REASONS: tuple[str, ...] = (
    "passed",
    "failed",
    "no_code",
    "bad_tests",
    "timeout",
    "memory",
    "output_limit",
    "crashed",
    "early_exit",
    "sandbox_error",
)
EXTRACT_MODES: tuple[str, ...] = ("last_block", "whole")

# An opening fence of backticks with an optional info string; a closing fence is backticks alone.
_FENCE = re.compile(r"^ {0,3}(`{3,})\s*([\w+.-]*)[^`]*$")
_PYTHON_TAGS = frozenset({"", "python", "py", "python3"})

# The trusted HumanEval harness. Everything after the model's code is a name bound before it ran.
HUMANEVAL_HARNESS = """\
def _harness():
    import json, os
    with os.fdopen(3, "rb") as private:
        spec = json.loads(private.read())
    nonce, write, run, compile_ = spec["nonce"].encode(), os.write, exec, compile
    code = compile_(spec["code"], "<solution>", "exec")
    test = compile_(spec["test"], "<test>", "exec")
    entry_point = spec["entry_point"]
    del spec
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    run(code, namespace)
    run(test, namespace)
    namespace["check"](namespace[entry_point])
    write(4, nonce)


_harness()
"""


@dataclass(frozen=True)
class CodeSettings:
    """How the code reward runs programs.

    Attributes:
        limits: the sandbox's limits for each run (one run per HumanEval row, one per APPS case).
        isolation: "namespaces" (bubblewrap) or "rlimits" (weaker; see ``verifier.sandbox``).
        extract: "last_block" (the last fenced python / py / unlabelled block) or "whole" (the
            whole response is the program).
        partial_credit: score the fraction of APPS cases passed instead of 0 when not all pass.
        max_cases: APPS cases run per row (the first ones); the rest are not run and do not count.
    """

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: str = "namespaces"
    extract: str = "last_block"
    partial_credit: bool = False
    max_cases: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.limits, SandboxLimits):
            raise ValueError(
                f"code settings: limits must be a SandboxLimits, got {type(self.limits).__name__}"
            )
        if self.isolation not in ISOLATIONS:
            raise ValueError(
                f"code settings: isolation {self.isolation!r}; set one of {', '.join(ISOLATIONS)}"
            )
        if self.extract not in EXTRACT_MODES:
            raise ValueError(
                f"code settings: extract {self.extract!r}; set one of {', '.join(EXTRACT_MODES)}"
            )
        if not isinstance(self.partial_credit, bool):
            raise ValueError(
                f"code settings: partial_credit must be true or false, got {self.partial_credit!r}"
            )
        if not isinstance(self.max_cases, int) or isinstance(self.max_cases, bool) or self.max_cases < 1:
            raise ValueError(f"code settings: max_cases {self.max_cases!r}; set a positive integer")


@dataclass(frozen=True)
class CodeVerdict:
    """The verdict on one response.

    Attributes:
        passed: tests passed (HumanEval: 0 or 1; APPS: cases).
        total: tests that count (HumanEval: 1; APPS: cases, at most ``max_cases``; 0 for
            "no_code" and "bad_tests").
        reason: one of ``CODE_REASONS``.
        seconds: wall time spent, sandbox runs included.
    """

    passed: int
    total: int
    reason: str
    seconds: float

    def __post_init__(self) -> None:
        if self.reason not in CODE_REASONS:
            raise ValueError(f"unknown code reason {self.reason!r}; expected one of {CODE_REASONS}")
        if not 0 <= self.passed <= self.total:
            raise ValueError(f"passed {self.passed} must be within 0..total ({self.total})")


def extract_program(response: str, mode: str = "last_block") -> str | None:
    """The program in ``response``, or None when there is none.

    "last_block": the content of the last complete fenced block tagged ``python``, ``py``,
    ``python3`` or nothing (other languages are skipped; a block whose closing fence never came, as
    in a response cut off by the length limit, is not complete). "whole": the whole response.
    A blank program is None either way.
    """
    if mode not in EXTRACT_MODES:
        raise ValueError(f"unknown extract mode {mode!r}; use one of {', '.join(EXTRACT_MODES)}")
    if mode == "whole":
        return response if response.strip() else None
    found: str | None = None
    fence: str | None = None
    tag = ""
    lines: list[str] = []
    for line in response.splitlines():
        if fence is None:
            m = _FENCE.match(line)
            if m:
                fence, tag, lines = m.group(1), m.group(2).lower(), []
        elif line.strip().startswith(fence) and not line.strip().strip("`"):
            if tag in _PYTHON_TAGS and "\n".join(lines).strip():
                found = "\n".join(lines) + "\n"
            fence = None
        else:
            lines.append(line)
    return found


def normalize_output(text: str) -> str:
    """Output as compared: trailing whitespace off each line, trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


def _verdict(passed: int, total: int, reason: str, started: float) -> CodeVerdict:
    return CodeVerdict(passed, total, reason, time.monotonic() - started)


_LIMIT_REASONS = {
    "timeout": "timeout",
    "cpu_limit": "timeout",
    "memory": "memory",
    "output_limit": "output_limit",
    "sandbox_error": "sandbox_error",
    "killed": "crashed",
}


def _humaneval(code: str, entry_point: str, test: str, settings: CodeSettings) -> str:
    """Run the harness once; the reason of the result."""
    nonce = secrets.token_hex(16)
    private = json.dumps({"nonce": nonce, "code": code, "test": test, "entry_point": entry_point})
    run = run_program(
        HUMANEVAL_HARNESS, limits=settings.limits, isolation=settings.isolation, private=private
    )
    if run.reason == "ok":
        return "passed" if run.report == nonce.encode() else "early_exit"
    if run.reason != "exit_nonzero":
        return _LIMIT_REASONS[run.reason]
    last = run.stderr_tail.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("AssertionError"):
        return "failed"
    return "crashed" if "Traceback (most recent call last)" in run.stderr_tail else "early_exit"


def _case(code: str, stdin: str, expected: str, settings: CodeSettings) -> str:
    run: SandboxResult = run_program(code, stdin, limits=settings.limits, isolation=settings.isolation)
    if run.reason == "ok":
        return "passed" if normalize_output(run.stdout) == normalize_output(expected) else "failed"
    if run.reason == "exit_nonzero":
        return "crashed"
    return _LIMIT_REASONS[run.reason]


def _as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


def _parse_tests(ground_truth: str | Mapping[str, Any]) -> dict[str, Any] | None:
    if isinstance(ground_truth, Mapping):
        return dict(ground_truth)
    try:
        tests = json.loads(ground_truth)
    except (TypeError, ValueError):
        return None
    return tests if isinstance(tests, dict) else None


def score_code(
    solution_str: str, ground_truth: str | Mapping[str, Any], settings: CodeSettings | None = None
) -> CodeVerdict:
    """Run the program in ``solution_str`` against ``ground_truth`` (see the module docstring).

    Never raises for anything in the response or the tests; raises ``TypeError`` when
    ``solution_str`` is not a string (a caller bug: decode token ids first).
    """
    started = time.monotonic()
    settings = settings or CodeSettings()
    if not isinstance(solution_str, str):
        raise TypeError(f"score_code takes the response as str, got {type(solution_str).__name__}")
    tests = _parse_tests(ground_truth)
    if tests is None:
        return _verdict(0, 0, "bad_tests", started)
    code = extract_program(solution_str, settings.extract)
    if "entry_point" in tests and "test" in tests:
        entry_point, test = tests["entry_point"], tests["test"]
        if not isinstance(entry_point, str) or not entry_point.isidentifier() or not isinstance(test, str):
            return _verdict(0, 0, "bad_tests", started)
        if code is None:
            return _verdict(0, 1, "no_code", started)
        reason = _humaneval(code, entry_point, test, settings)
        return _verdict(int(reason == "passed"), 1, reason, started)
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if "fn_name" in tests or not isinstance(inputs, list) or not isinstance(outputs, list):
        return _verdict(0, 0, "bad_tests", started)
    cases = [(_as_text(i), _as_text(o)) for i, o in zip(inputs, outputs, strict=False)]
    if not cases or len(inputs) != len(outputs) or any(i is None or o is None for i, o in cases):
        return _verdict(0, 0, "bad_tests", started)
    cases = cases[: settings.max_cases]
    if code is None:
        return _verdict(0, len(cases), "no_code", started)
    passed, first_failure = 0, None
    for stdin, expected in cases:
        assert stdin is not None and expected is not None
        reason = _case(code, stdin, expected, settings)
        if reason == "passed":
            passed += 1
            continue
        first_failure = first_failure or reason
        if not settings.partial_credit or reason == "sandbox_error":
            break
    return _verdict(passed, len(cases), first_failure or "passed", started)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | Mapping[str, Any],
    extra_info: Mapping[str, Any] | None,
    settings: CodeSettings | None = None,
) -> dict[str, Any]:
    """verl's reward signature around ``score_code``.

    Returns ``{"score", "passed", "total", "reason"}``: score is 1.0 when every test passed, else
    the fraction passed with ``settings.partial_credit``, else 0.0 (the caller maps 0.0 to its
    configured minimum, e.g. DAPO's -1).
    """
    del data_source, extra_info  # the tests are in ground_truth
    settings = settings or CodeSettings()
    verdict = score_code(solution_str, ground_truth, settings)
    if verdict.reason == "passed":
        score = 1.0
    elif settings.partial_credit and verdict.total > 0:
        score = verdict.passed / verdict.total
    else:
        score = 0.0
    return {"score": score, "passed": verdict.passed, "total": verdict.total, "reason": verdict.reason}

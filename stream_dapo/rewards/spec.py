"""What a reward is, as plain picklable data: the name a user writes and the settings it runs with.

A source names its reward with one string (``[[data.sources]] reward = ...``, ``stream-dapo verify
--reward ...``)::

    "math"                          the built-in math verifier (DAPO's rule-based +1 / -1)
    "math-verify"                   Hugging Face's Math-Verify, same extraction and timeout
    "code"                          the program in the response run against the row's tests, sandboxed
    "python:path/to/file.py:name"   a user's function, verl's compute_score signature
    "path/to/file.py:name"          the same, without the prefix
    "package.module:name"           a function of an importable module

``parse_reward`` turns the string into a ``RewardSpec`` (a frozen dataclass that travels to the
verifier pool's worker processes); ``stream_dapo.rewards.scorers`` builds the callable there. This
module imports nothing heavy and never imports the user's code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stream_dapo.errors import ConfigError

__all__ = ["FAILURE_REASONS", "REWARD_HELP", "RewardKind", "RewardSpec", "parse_reward"]

RewardKind = Literal["math", "math-verify", "code", "python"]

REWARD_HELP = (
    "a reward is one of: math, math-verify, code, python:path/to/file.py:name, path/to/file.py:name "
    "or package.module:name (a function compute_score(data_source, solution_str, ground_truth, "
    "extra_info) returning a float or a dict with 'score')"
)
FAILURE_REASONS = frozenset(
    {"timeout", "worker_crashed", "reward_error", "reward_nan", "reward_not_number", "code_sandbox_error"}
)
"""Reasons for which a reward could not be computed (the sample scores ``failure_score``); a wrong
answer or a failed test is a score, not one of these."""
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RewardSpec:
    """One reward and everything its worker needs to run it.

    Attributes:
        kind: "math", "math-verify", "code" or "python".
        target: for "python", the file (``.py`` path) or module the function lives in; else "".
        function: for "python", the function's name; else "".
        failure_score: the reward of a sample whose reward could not be computed (a timeout, a crash,
            an exception, NaN or a non-number), and of a failed program for "code".
        correct_threshold: a score at or above this counts as correct (accuracy, the run report).
            None: the built-ins' own verdict; for "python", score > 0.
        timeout_s: wall-clock limit of one call in the verifier pool.
        partial_credit: "code" only: the fraction of tests passed instead of 1 / failure_score.
        math: keyword arguments of ``verifier.verify`` (pattern, tail_chars, max_input_chars).
        code: keyword arguments of ``verifier.code.CodeSettings`` (limits, isolation, extract).
        setting: see below.
    """

    kind: RewardKind
    target: str = ""
    function: str = ""
    failure_score: float = -1.0
    correct_threshold: float | None = None
    timeout_s: float = 5.0
    partial_credit: bool = False
    math: dict[str, Any] = field(default_factory=dict)
    code: dict[str, Any] = field(default_factory=dict)
    setting: str = "reward"
    """The config key (or option) that named this reward: every error about it names it."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.failure_score):
            raise ConfigError(f"failure_score must be a finite number, got {self.failure_score}")
        if self.correct_threshold is not None and not math.isfinite(self.correct_threshold):
            raise ConfigError(f"correct_threshold must be a finite number, got {self.correct_threshold}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(
                f"a reward's timeout_s must be a positive number of seconds, got {self.timeout_s}"
            )

    @property
    def label(self) -> str:
        """The name as a user writes it (logs, metrics help, the run report)."""
        if self.kind != "python":
            return self.kind
        return f"python:{self.target}:{self.function}"

    def is_correct(self, score: float) -> bool:
        """Whether ``score`` counts as correct for accuracy and the dynamic-sampling classes."""
        if self.correct_threshold is not None:
            return score >= self.correct_threshold
        if self.kind == "python":
            return score > 0
        return score >= 1.0


def parse_reward(text: str, *, setting: str = "reward", **settings: Any) -> RewardSpec:
    """The ``RewardSpec`` a reward string names; ``settings`` are the spec's other fields.

    Raises:
        ConfigError: for a string that names no reward, with the accepted forms; it does not check
            that a user's file or module exists (``scorers.load_scorer`` does, in the worker).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{setting} is empty; {REWARD_HELP}")
    name = text.strip()
    if name in ("math", "builtin"):
        return RewardSpec(kind="math", setting=setting, **settings)
    if name == "math-verify":
        return RewardSpec(kind="math-verify", setting=setting, **settings)
    if name == "code":
        return RewardSpec(kind="code", setting=setting, **settings)
    rest = name.removeprefix("python:")
    target, sep, function = rest.rpartition(":")
    if not sep or not target or not _NAME_RE.match(function):
        raise ConfigError(f"{setting} = {text!r} names no reward; {REWARD_HELP}")
    if not (target.endswith(".py") or _MODULE_RE.match(target)):
        raise ConfigError(
            f"{setting} = {text!r}: {target!r} is neither a .py file nor a dotted module name; {REWARD_HELP}"
        )
    if target.endswith(".py"):
        target = str(Path(target).expanduser())
    return RewardSpec(kind="python", target=target, function=function, setting=setting, **settings)

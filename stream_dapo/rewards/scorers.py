"""From a ``RewardSpec`` to the function a verifier worker calls for every response.

Every scorer has one signature, verl's ``compute_score`` plus the verdict::

    scorer(data_source, solution_str, ground_truth, extra_info) -> VerifyResult

- "math" / "math-verify": ``verifier.verify`` with the spec's pattern and limits; the reward is
  DAPO's +1 / -1. The answer line follows the row's format on its own: ``Answer:``, ``\\boxed{}`` and
  GSM8K's ``#### 42`` are all found (``verifier.extract``).
- "code": ``verifier.code.score_code`` on the last fenced Python block (see that module), in the
  sandbox: 1 when every test ran and passed, else ``failure_score`` (or the fraction passed with
  ``partial_credit``).
- "python": the user's function, called by keyword as verl calls it (so its parameters must have
  verl's names, or it takes ``**kwargs``). A float, int or bool is the score; a dict must hold a numeric
  ``"score"``, and its other numeric keys are returned as ``extras`` (per-source metrics). NaN or
  infinity ("reward_nan"), anything else ("reward_not_number") and an exception ("reward_error")
  give ``failure_score``; the pool adds "timeout" and "worker_crashed" with the same score.

Model text reaches a user's function as a string only; nothing here executes it (only the "code"
reward runs it, inside the sandbox).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream_dapo.errors import ConfigError
from stream_dapo.rewards.spec import RewardSpec
from stream_dapo.verifier.core import VerifyResult, verify

__all__ = [
    "USER_REASONS",
    "Scorer",
    "load_scorer",
    "load_user_function",
    "result_of_user_value",
]

log = logging.getLogger(__name__)

Scorer = Callable[[str, str, str, dict[str, Any]], VerifyResult]

USER_REASONS: tuple[str, ...] = ("scored", "reward_error", "reward_nan", "reward_not_number")
"""Reasons of a user's function: it returned a number, raised, returned NaN / inf, returned junk."""

_SIGNATURE = "compute_score(data_source, solution_str, ground_truth, extra_info)"


def _import_file(path: Path, setting: str) -> Any:
    if not path.is_file():
        raise ConfigError(
            f"{setting}: reward file {path} does not exist (relative paths are read from the directory "
            f"the service starts in, {Path.cwd()}); give the path of the .py file that defines "
            f"{_SIGNATURE}"
        )
    name = f"stream_dapo_user_reward_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{setting}: cannot import {path} as a Python file; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The file's own directory on the path, as `python file.py` would have it: its helpers import.
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ConfigError(
            f"{setting}: importing {path} raised {type(exc).__name__}: {exc}; fix the file (run "
            f"`python {path}` to see the traceback)"
        ) from None
    return module


def _import_module(dotted: str, setting: str) -> Any:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{setting}: module {dotted!r} cannot be imported ({exc}); install the package that "
            "provides it or give a path/to/file.py:name instead"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"{setting}: importing module {dotted!r} raised {type(exc).__name__}: {exc}; fix the module"
        ) from None


def load_user_function(spec: RewardSpec) -> Callable[..., Any]:
    """Import a "python" reward's function and check that verl's four arguments can be passed.

    Raises:
        ConfigError: naming ``spec.setting`` and the fix, for a missing file or module, an import error,
            a missing or non-callable name, or a signature that cannot take the four arguments.
    """
    target, setting = spec.target, spec.setting
    module = (
        _import_file(Path(target), setting) if target.endswith(".py") else _import_module(target, setting)
    )
    fn = getattr(module, spec.function, None)
    if fn is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"{setting}: {target} has no {spec.function!r} (its functions: {', '.join(names) or 'none'}); "
            f"name a function {_SIGNATURE}"
        )
    if not callable(fn):
        raise ConfigError(f"{setting}: {target}:{spec.function} is a {type(fn).__name__}, not a function")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"{setting}: {target}:{spec.function} is `async def`; rewards run in worker processes with "
            "a timeout already, so write it as a plain `def`"
        )
    try:
        inspect.signature(fn).bind(data_source="", solution_str="", ground_truth="", extra_info={})
    except TypeError as exc:
        raise ConfigError(
            f"{setting}: {target}:{spec.function} cannot be called as {_SIGNATURE} ({exc}); give it "
            "those four parameters by name (verl calls it with keywords), or **kwargs for the ones it does not use"
        ) from None
    except ValueError:  # a builtin without a signature: the first call will tell
        pass
    return fn  # type: ignore[no-any-return]


def result_of_user_value(value: Any, spec: RewardSpec) -> VerifyResult:
    """The verdict on what a user's function returned (see the module docstring)."""
    extras: dict[str, float] = {}
    score = value
    if isinstance(value, dict):
        if "score" not in value:
            return _failed(
                spec, "reward_not_number", f"a dict without 'score' ({sorted(map(str, value))[:8]})"
            )
        score = value["score"]
        for key, item in value.items():
            if key != "score" and isinstance(item, (int, float)) and not isinstance(item, bool):
                if math.isfinite(item):
                    extras[str(key)] = float(item)
    if isinstance(score, bool):
        score = float(score)
    if not isinstance(score, (int, float)) and not _is_numpy_number(score):
        return _failed(spec, "reward_not_number", f"{type(score).__name__} {score!r:.80}")
    score = float(score)
    if not math.isfinite(score):
        return _failed(spec, "reward_nan")
    return VerifyResult(
        correct=spec.is_correct(score), reward=score, extracted=None, reason="scored", extras=extras
    )


def _is_numpy_number(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.number) and getattr(value, "ndim", 1) == 0


def _failed(spec: RewardSpec, reason: str, detail: str | None = None) -> VerifyResult:
    """``failure_score``; ``detail`` (what went wrong, never model text) rides in ``extracted``."""
    return VerifyResult(correct=False, reward=spec.failure_score, extracted=detail, reason=reason)


def _math_scorer(spec: RewardSpec) -> Scorer:
    backend = "builtin" if spec.kind == "math" else "math-verify"
    options = dict(spec.math)

    def score(
        data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
    ) -> VerifyResult:
        result = verify(solution_str, ground_truth, backend=backend, **options)
        if spec.correct_threshold is None and spec.failure_score == -1.0:
            return result
        reward = 1.0 if result.correct else spec.failure_score
        return VerifyResult(
            correct=spec.is_correct(reward), reward=reward, extracted=result.extracted, reason=result.reason
        )

    return score


def _code_scorer(spec: RewardSpec) -> Scorer:
    from stream_dapo.verifier.code import CodeSettings, score_code
    from stream_dapo.verifier.sandbox import SandboxLimits, sandbox_problem

    options = dict(spec.code)
    limits = SandboxLimits(**options.pop("limits", {}))
    settings = CodeSettings(limits=limits, **options)
    problem = sandbox_problem(settings.isolation)
    if problem is not None:
        raise ConfigError(f"{spec.setting} = code: {problem}")

    def score(
        data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
    ) -> VerifyResult:
        verdict = score_code(solution_str, ground_truth, settings)
        everything = verdict.total > 0 and verdict.passed == verdict.total
        if everything:
            reward = 1.0
        elif spec.partial_credit and verdict.total > 0:
            reward = verdict.passed / verdict.total
        else:
            reward = spec.failure_score
        extras = {"tests_passed": float(verdict.passed), "tests_total": float(verdict.total)}
        return VerifyResult(
            correct=everything, reward=reward, extracted=None, reason=f"code_{verdict.reason}", extras=extras
        )

    return score


def _python_scorer(spec: RewardSpec) -> Scorer:
    fn = load_user_function(spec)

    def score(
        data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
    ) -> VerifyResult:
        try:
            value = fn(
                data_source=data_source,
                solution_str=solution_str,
                ground_truth=ground_truth,
                extra_info=extra_info,
            )
        except Exception as exc:  # the user's bug on one sample: a defined reward, counted
            log.debug("reward %s raised %s: %s", spec.label, type(exc).__name__, exc)
            return VerifyResult(
                correct=False,
                reward=spec.failure_score,
                extracted=f"{type(exc).__name__}: {exc}"[:200],
                reason="reward_error",
            )
        return result_of_user_value(value, spec)

    return score


def load_scorer(spec: RewardSpec) -> Scorer:
    """The scorer of ``spec``; imports a user's module (``ConfigError`` when it cannot)."""
    if spec.kind in ("math", "math-verify"):
        return _math_scorer(spec)
    if spec.kind == "code":
        return _code_scorer(spec)
    return _python_scorer(spec)

"""The config's data sources and their rewards, resolved: ``data_sources(cfg)``.

The one place that turns ``[data]``, ``[[data.sources]]`` and ``[verifier]`` into ``DataSource`` and
``RewardSpec`` objects; the generator's root, ``stream-dapo eval``, ``stream-dapo verify --config``
and the launcher's pre-flight check all read sources through it.
"""

from __future__ import annotations

from typing import Any

from stream_dapo.config.schema import Config, SourceConfig, VerifierConfig
from stream_dapo.data.sources import DEFAULT_SOURCE, DataSource
from stream_dapo.rewards.spec import RewardSpec, parse_reward

__all__ = ["code_options", "data_sources", "reward_specs"]

_CODE_TIMEOUT_MARGIN_S = 5.0


def code_options(verifier: VerifierConfig) -> dict[str, Any]:
    """``CodeSettings`` keyword arguments from ``[verifier.code]`` (plain data: it travels to workers)."""
    code = verifier.code
    return {
        "isolation": code.isolation,
        "extract": code.extract,
        "max_cases": code.max_cases,
        "limits": {
            "cpu_s": code.cpu_s,
            "wall_s": code.wall_s,
            "memory_mb": code.memory_mb,
            "max_processes": code.max_processes,
            "output_bytes": code.output_bytes,
        },
    }


def _math_options(verifier: VerifierConfig) -> dict[str, Any]:
    return {"pattern": verifier.pattern, "max_input_chars": verifier.max_input_chars}


def _reward_of(source: SourceConfig, verifier: VerifierConfig) -> RewardSpec:
    spec = parse_reward(source.reward, setting=f"data.sources[{source.name}].reward")
    timeout = source.timeout_s
    if timeout is None:
        timeout = verifier.timeout_s
        if spec.kind == "code":
            timeout = verifier.code.wall_s * verifier.code.max_cases + _CODE_TIMEOUT_MARGIN_S
    return parse_reward(
        source.reward,
        setting=f"data.sources[{source.name}].reward",
        failure_score=source.failure_score,
        correct_threshold=source.correct_threshold,
        timeout_s=timeout,
        partial_credit=source.partial_credit,
        math=_math_options(verifier) if spec.kind in ("math", "math-verify") else {},
        code=code_options(verifier) if spec.kind == "code" else {},
    )


def data_sources(cfg: Config) -> list[DataSource]:
    """The run's sources, in config order (one named "default" without ``[[data.sources]]``)."""
    data, verifier = cfg.data, cfg.verifier
    if not data.sources:
        reward = RewardSpec(
            kind="math" if verifier.backend == "builtin" else "math-verify",
            timeout_s=verifier.timeout_s,
            math=_math_options(verifier),
        )
        return [DataSource(DEFAULT_SOURCE, data.train_path, data.eval_path, reward)]
    return [
        DataSource(
            name=s.name,
            train_path=s.train_path,
            eval_path=s.eval_path,
            reward=_reward_of(s, verifier),
            weight=s.weight,
            max_response_len=s.max_response_len,
            data_source=None if s.data_source is None else tuple(s.data_source),
        )
        for s in data.sources
    ]


def reward_specs(cfg: Config) -> dict[str, RewardSpec]:
    """Every source's reward under the source's name: what a verifier pool of this run holds."""
    return {source.name: source.reward for source in data_sources(cfg)}

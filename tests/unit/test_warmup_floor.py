"""The warm-up's reference floor: rounds of the reference schedule until greedy pass@1 reaches
``warmup.reference_min_greedy``, a clear error after ``warmup.reference_max_rounds``, and the cache key."""

from __future__ import annotations

import pytest

from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.model import tiny, warmup


def _scripted(figures: list[float]):
    """A round runner that records which rounds ran and returns ``figures`` in order."""
    ran: list[int] = []

    def run_round(index: int) -> float:
        ran.append(index)
        return figures[index]

    return run_round, ran


def test_rounds_stop_at_the_first_that_reaches_the_floor():
    run_round, ran = _scripted([0.19, 0.5, 0.9])
    assert warmup.train_until_floor(run_round, floor=0.5, max_rounds=3) == [0.19, 0.5]
    assert ran == [0, 1]  # the floor is inclusive; round 2 never runs


def test_a_first_round_above_the_floor_is_the_only_round():
    run_round, ran = _scripted([0.84])
    assert warmup.train_until_floor(run_round, floor=0.5, max_rounds=3) == [0.84]
    assert ran == [0]


def test_every_round_below_the_floor_fails_naming_the_figures_and_the_fixes():
    run_round, ran = _scripted([0.031, 0.188, 0.297, 0.9])
    with pytest.raises(warmup.FloorNotReached) as err:
        warmup.train_until_floor(run_round, floor=0.5, max_rounds=3)
    assert ran == [0, 1, 2]  # never a fourth round
    message = str(err.value)
    assert "3 round(s)" in message and "0.031, 0.188, 0.297" in message
    for fix in ("warmup.reference_max_rounds", "warmup.seed", "warmup.reference_min_greedy"):
        assert fix in message
    # A ConfigError: the CLI prints it without a traceback and exits with the config code.
    assert isinstance(err.value, ConfigError)


def test_rounds_an_earlier_build_ran_are_not_run_again():
    run_round, ran = _scripted([0.0, 0.0, 0.7])
    assert warmup.train_until_floor(run_round, floor=0.5, max_rounds=3, done=[0.1, 0.2]) == [0.1, 0.2, 0.7]
    assert ran == [2]  # the third round only, under its own index (its seed)
    run_round, ran = _scripted([0.9])
    with pytest.raises(warmup.FloorNotReached) as err:
        warmup.train_until_floor(run_round, floor=0.5, max_rounds=2, done=[0.1, 0.2])
    assert ran == [] and err.value.rounds == [0.1, 0.2]
    assert "2 round(s) at greedy pass@1 0.100, 0.200" in str(err.value)


def test_the_floor_and_its_prompts_key_the_cache_and_the_round_limit_does_not():
    spec = tiny.TinyModelSpec()

    def key(*overrides: str) -> str:
        return warmup.warmup_key(load_config(overrides=list(overrides), environ={}), spec)

    plain = key()
    assert key("warmup.reference_max_rounds=5") == plain  # inert without a floor
    floored = key("warmup.reference_min_greedy=0.5")
    assert floored != plain
    # A build that reaches the floor has the same weights whatever the limit.
    assert key("warmup.reference_min_greedy=0.5", "warmup.reference_max_rounds=7") == floored
    assert key("warmup.reference_min_greedy=0.6") != floored
    assert key("warmup.reference_min_greedy=0.5", "warmup.track_prompts=64") != floored


def test_the_floor_is_a_share():
    with pytest.raises(ConfigError, match="reference_min_greedy"):
        load_config(overrides=["warmup.reference_min_greedy=1.5"], environ={})
    with pytest.raises(ConfigError, match="reference_max_rounds"):
        load_config(overrides=["warmup.reference_max_rounds=0"], environ={})

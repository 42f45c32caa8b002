"""Outcome reward and DAPO overlong shaping, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dapo.core.rewards import (
    RewardShaping,
    outcome_rewards,
    overlong_filter_mask,
    shape_rewards,
    soft_overlong_penalty,
)


def test_outcome_rewards_are_plus_one_for_correct_and_minus_one_otherwise() -> None:
    out = outcome_rewards(np.array([True, False, True, False]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, -1.0, 1.0, -1.0])
    np.testing.assert_array_equal(outcome_rewards(np.array([[1, 0], [0, 0]])), [[1.0, -1.0], [-1.0, -1.0]])


def test_outcome_rewards_refuse_float_rewards_passed_as_verdicts() -> None:
    with pytest.raises(TypeError, match="verifier's boolean verdict"):
        outcome_rewards(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="0/1"):
        outcome_rewards(np.array([0, 2]))


def test_soft_overlong_penalty_hand_values() -> None:
    # L_max 20, L_cache 4: window starts at 16. Penalty = (16 - len) / 4 * factor, clamped to [-f, 0].
    lengths = np.array([0, 10, 16, 17, 18, 19, 20, 25])
    np.testing.assert_allclose(
        soft_overlong_penalty(lengths, max_len=20, cache_len=4, factor=1.0),
        [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0],
    )
    # factor 0.5 halves every value: len 18 -> (16 - 18) / 4 * 0.5 = -0.25.
    np.testing.assert_allclose(
        soft_overlong_penalty(np.array([16, 18, 20, 30]), max_len=20, cache_len=4, factor=0.5),
        [0.0, -0.25, -0.5, -0.5],
    )


def test_soft_overlong_penalty_cache_zero_means_no_punishment() -> None:
    np.testing.assert_array_equal(soft_overlong_penalty(np.array([5, 20, 40]), 20, 0), [0.0, 0.0, 0.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_len": 20, "cache_len": 20}, "must be smaller than max_len"),
        ({"max_len": 20, "cache_len": -1}, "non-negative"),
        ({"max_len": 0, "cache_len": 0}, "positive integer"),
        ({"max_len": 20, "cache_len": 4, "factor": -1.0}, "factor must be"),
    ],
)
def test_soft_overlong_penalty_rejects_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        soft_overlong_penalty(np.array([1, 2]), **kwargs)  # type: ignore[arg-type]


def test_soft_overlong_penalty_rejects_negative_lengths() -> None:
    with pytest.raises(ValueError, match="lengths must be finite and >= 0"):
        soft_overlong_penalty(np.array([-1]), 20, 4)


@given(
    max_len=st.integers(min_value=2, max_value=10_000),
    cache_frac=st.floats(min_value=0.01, max_value=0.99),
    factor=st.floats(min_value=0.0, max_value=5.0),
    lengths=st.lists(st.floats(min_value=0.0, max_value=20_000.0), min_size=1, max_size=50),
)
def test_soft_overlong_penalty_is_bounded_monotone_and_continuous(
    max_len: int, cache_frac: float, factor: float, lengths: list[float]
) -> None:
    cache_len = min(max(1, int(max_len * cache_frac)), max_len - 1)
    sorted_lengths = np.sort(np.array(lengths))
    pen = soft_overlong_penalty(sorted_lengths, max_len, cache_len, factor).astype(np.float64)
    assert (pen <= 0.0).all() and (pen >= -factor - 1e-6).all()
    assert (np.diff(pen) <= 1e-6).all()  # non-increasing in length

    # Continuity at both ends of the window: a step of delta moves the penalty by at most
    # factor * delta / cache_len (the slope of the ramp), and both sides meet the right value.
    start, delta = max_len - cache_len, 1e-3
    probe = np.array([start - delta, start, start + delta, max_len - delta, max_len, max_len + delta])
    p = soft_overlong_penalty(probe, max_len, cache_len, factor).astype(np.float64)
    step = factor * delta / cache_len + 1e-6
    assert p[0] == 0.0 and p[1] == 0.0
    assert abs(p[2] - p[1]) <= step
    assert abs(p[4] + factor) <= 1e-5 and abs(p[5] + factor) <= 1e-5
    assert abs(p[3] - p[4]) <= step


def test_overlong_filter_mask_drops_truncated_samples() -> None:
    mask = overlong_filter_mask(np.array([False, True, False]))
    assert mask.dtype == np.float32
    np.testing.assert_array_equal(mask, [1.0, 0.0, 1.0])


def _shaping(soft: bool, filt: bool) -> RewardShaping:
    return RewardShaping(
        soft_overlong=soft,
        max_response_len=20,
        overlong_cache_len=4,
        overlong_factor=1.0,
        overlong_filter=filt,
    )


def test_shape_rewards_adds_penalty_and_masks_truncated_when_both_on() -> None:
    correct = np.array([True, True, False, False])
    lengths = np.array([10, 18, 17, 20])
    truncated = np.array([False, False, False, True])
    out = shape_rewards(correct, lengths, truncated, _shaping(soft=True, filt=True))
    # outcome [1, 1, -1, -1] + penalty [0, -0.5, -0.25, -1]
    np.testing.assert_allclose(out.penalty, [0.0, -0.5, -0.25, -1.0])
    np.testing.assert_allclose(out.rewards, [1.0, 0.5, -1.25, -2.0])
    np.testing.assert_array_equal(out.loss_mask, [1.0, 1.0, 1.0, 0.0])


def test_shape_rewards_with_everything_off_is_the_outcome_reward() -> None:
    out = shape_rewards(
        np.array([True, False]), np.array([19, 20]), np.array([False, True]), _shaping(soft=False, filt=False)
    )
    np.testing.assert_array_equal(out.rewards, [1.0, -1.0])
    np.testing.assert_array_equal(out.penalty, [0.0, 0.0])
    np.testing.assert_array_equal(out.loss_mask, [1.0, 1.0])


def test_shape_rewards_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same length"):
        shape_rewards(np.array([True]), np.array([1, 2]), np.array([False]), _shaping(True, True))


def test_reward_shaping_requires_a_window_when_soft_overlong_is_on() -> None:
    with pytest.raises(ValueError, match="set overlong_cache_len > 0"):
        RewardShaping(True, 20, 0, 1.0, False)
    with pytest.raises(ValueError, match="overlong_cache_len must be in"):
        RewardShaping(False, 20, 20, 1.0, False)
    with pytest.raises(ValueError, match="overlong_factor"):
        RewardShaping(True, 20, 4, -0.5, False)
    RewardShaping(False, 20, 0, 1.0, True)  # soft off: an empty window is fine

"""Group-relative advantages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dapo.core.advantages import compute_group_advantages


def test_one_group_hand_values() -> None:
    # R = [1, -1, -1, -1]: mean -0.5, deviations [1.5, -0.5, -0.5, -0.5],
    # population std sqrt((2.25 + 3 * 0.25) / 4) = sqrt(0.75) = 0.8660254.
    adv = compute_group_advantages(np.array([1.0, -1.0, -1.0, -1.0]), eps=1e-6)
    assert adv.dtype == np.float32
    std = np.sqrt(0.75)
    np.testing.assert_allclose(adv, np.array([1.5, -0.5, -0.5, -0.5]) / (std + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(adv, [1.7320488, -0.5773496, -0.5773496, -0.5773496], rtol=1e-6)


def test_without_std_scaling_only_the_mean_is_removed() -> None:
    adv = compute_group_advantages(np.array([[1.0, 0.5, -1.0, -1.0]]), scale_by_std=False)
    # mean -0.125
    np.testing.assert_allclose(adv, [[1.125, 0.625, -0.875, -0.875]])


def test_groups_are_independent_and_constant_groups_get_zero() -> None:
    adv = compute_group_advantages(np.array([[1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]]))
    # Group 0: mean 0, std 1 -> [1, -1] / (1 + 1e-6). Groups 1 and 2 are constant.
    np.testing.assert_allclose(
        adv, [[1.0 / (1 + 1e-6), -1.0 / (1 + 1e-6)], [0.0, 0.0], [0.0, 0.0]], rtol=1e-7
    )


@pytest.mark.parametrize(
    ("rewards", "kwargs", "match"),
    [
        (np.zeros((2, 2, 2)), {}, r"\[G\] or \[num_groups, G\]"),
        (np.zeros((3, 0)), {}, "empty group"),
        (np.array([1.0, np.nan]), {}, "NaN or inf"),
        (np.array([1.0, -1.0]), {"eps": 0.0}, "eps must be"),
    ],
)
def test_bad_input_is_rejected(rewards: np.ndarray, kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_group_advantages(rewards, **kwargs)  # type: ignore[arg-type]


# Rewards on a grid of quarters (outcome +-1 plus soft penalties) keep the std away from denormals.
_reward = st.integers(min_value=-12, max_value=4).map(lambda k: k / 4.0)
_groups = st.tuples(st.integers(1, 16), st.integers(1, 5)).flatmap(
    lambda shape: st.lists(
        st.lists(_reward, min_size=shape[0], max_size=shape[0]), min_size=shape[1], max_size=shape[1]
    )
)


@given(groups=_groups)
def test_advantages_sum_to_zero_and_have_unit_std_per_group(groups: list[list[float]]) -> None:
    rewards = np.array(groups, dtype=np.float64)
    eps = 1e-6
    adv = compute_group_advantages(rewards, eps=eps).astype(np.float64)
    np.testing.assert_allclose(adv.sum(axis=-1), 0.0, atol=1e-5)
    for row_r, row_a in zip(rewards, adv, strict=True):
        std = row_r.std()
        if std > 0:
            # std(A) = std / (std + eps), i.e. 1 up to eps.
            assert row_a.std() == pytest.approx(std / (std + eps), rel=1e-5)
            assert row_a.std() == pytest.approx(1.0, abs=1e-4)
        else:
            np.testing.assert_array_equal(row_a, 0.0)
        # Scaling never changes which samples are better than average.
        dev = row_r - row_r.mean()
        clear = np.abs(dev) > 1e-9
        np.testing.assert_array_equal(np.sign(row_a[clear]), np.sign(dev[clear]))

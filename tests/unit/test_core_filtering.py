"""DAPO dynamic sampling filter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dapo.core.filtering import FilterDecision, FilterReason, dynamic_sampling_filter


def test_mixed_group_is_kept() -> None:
    decision = dynamic_sampling_filter(np.array([True, False, False, True]))
    assert decision == FilterDecision(keep=True, reason=FilterReason.MIXED, num_correct=2, group_size=4)


def test_all_correct_and_all_wrong_groups_are_dropped_with_their_reason() -> None:
    assert dynamic_sampling_filter(np.array([1, 1, 1])) == FilterDecision(
        keep=False, reason=FilterReason.ALL_CORRECT, num_correct=3, group_size=3
    )
    assert dynamic_sampling_filter(np.array([False, False])) == FilterDecision(
        keep=False, reason=FilterReason.ALL_WRONG, num_correct=0, group_size=2
    )


def test_disabled_filter_keeps_everything_but_still_reports_the_reason() -> None:
    decision = dynamic_sampling_filter(np.array([True, True]), enabled=False)
    assert decision.keep is True
    assert decision.reason is FilterReason.ALL_CORRECT
    assert decision.reason.value == "all_correct"  # the metric label


def test_group_of_one_is_never_mixed() -> None:
    assert dynamic_sampling_filter(np.array([True])).reason is FilterReason.ALL_CORRECT
    assert dynamic_sampling_filter(np.array([False])).keep is False


def test_empty_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty group"):
        dynamic_sampling_filter(np.array([], dtype=bool))


def test_shaped_rewards_are_refused() -> None:
    # An all-correct group whose rewards differ through overlong shaping must not pass as "mixed".
    with pytest.raises(TypeError, match="not on the shaped reward"):
        dynamic_sampling_filter(np.array([1.0, 0.75]))


def test_two_dimensional_input_is_refused() -> None:
    with pytest.raises(ValueError, match="1-D"):
        dynamic_sampling_filter(np.array([[True, False]]))


@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=16), min_size=1, max_size=20))
def test_filter_keeps_exactly_the_mixed_groups(groups: list[list[bool]]) -> None:
    kept = [g for g in groups if dynamic_sampling_filter(np.array(g)).keep]
    assert kept == [g for g in groups if any(g) and not all(g)]
    for g in groups:
        d = dynamic_sampling_filter(np.array(g))
        assert d.num_correct == sum(g) and d.group_size == len(g)
        assert dynamic_sampling_filter(np.array(g), enabled=False).keep is True


def test_the_score_filter_is_dynamic_sampling_for_plus_minus_one_rewards() -> None:
    import itertools

    from stream_dapo.core.filtering import score_filter

    for verdicts in itertools.product((False, True), repeat=4):
        correct = np.array(verdicts)
        scores = np.where(correct, 1.0, -1.0)
        for enabled in (True, False):
            assert score_filter(scores, correct, enabled) == dynamic_sampling_filter(correct, enabled)


def test_the_score_filter_refuses_what_it_cannot_judge() -> None:
    from stream_dapo.core.filtering import score_filter

    with pytest.raises(ValueError, match="NaN"):
        score_filter(np.array([0.5, np.nan]), np.array([True, False]))
    with pytest.raises(ValueError, match="same length"):
        score_filter(np.array([0.5, 0.1]), np.array([True]))
    with pytest.raises(ValueError, match="empty group"):
        score_filter(np.array([]), np.array([], dtype=bool))

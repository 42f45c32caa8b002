"""Post-processing of a finished group: verification, dynamic sampling, shaping, advantages, packing."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from stream_dapo.config import AlgoConfig
from stream_dapo.core.filtering import FilterReason
from stream_dapo.core.rewards import RewardShaping
from stream_dapo.generator.rollout import (
    ADVANTAGE_EPS,
    FinishedGroup,
    FinishedSample,
    RolloutSettings,
    build_group,
    process_group,
)
from stream_dapo.transport import codec
from stream_dapo.transport import messages as m
from stream_dapo.transport.messages import Group
from stream_dapo.verifier.core import VerifyResult
from stream_dapo.verifier.pool import ScoreItem

L_MAX, L_CACHE = 20, 5


def settings(
    *, overlong_filter: bool = False, dynamic_sampling: bool = True, scale: bool = True
) -> RolloutSettings:
    return RolloutSettings(
        shaping=RewardShaping(
            soft_overlong=True,
            max_response_len=L_MAX,
            overlong_cache_len=L_CACHE,
            overlong_factor=1.0,
            overlong_filter=overlong_filter,
        ),
        dynamic_sampling=dynamic_sampling,
        adv_scale_by_std=scale,
    )


def sample(length: int, finish: str, *, first_token: int = 10, swap_at: int | None = None) -> FinishedSample:
    tokens = np.arange(first_token, first_token + length, dtype=np.int32)
    versions = np.zeros(length, dtype=np.int32)
    if swap_at is not None:
        versions[swap_at:] = 1
    return FinishedSample(
        token_ids=tokens,
        logprobs=-np.linspace(0.1, 1.0, length).astype(np.float32),
        versions=versions,
        text=f"... Answer: {length}",
        finish_reason=finish,
    )


def group(samples: list[FinishedSample]) -> FinishedGroup:
    return FinishedGroup(
        group_id="g-1",
        prompt_id="p-7",
        gold="42",
        prompt_token_ids=np.array([1, 2, 3], dtype=np.int64),
        created_at=1700000000.5,
        samples=samples,
    )


def results(*correct: bool) -> list[VerifyResult]:
    return [VerifyResult.scored("exact" if c else "mismatch", "x") for c in correct]


# Lengths 10 (inside budget), 16 (1 token into the 5-token cache window), 20 truncated, 20 ended with EOS.
MIXED = [sample(10, "stop"), sample(16, "stop", swap_at=4), sample(20, "length"), sample(20, "stop")]
MIXED_CORRECT = (True, False, True, False)


def test_rewards_include_the_soft_overlong_penalty() -> None:
    out = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-0")
    # outcome +1/-1, penalty ((20 - 5) - |y|) / 5 clipped to [-1, 0]: 0, -0.2, -1, -1
    np.testing.assert_allclose(out.rewards, [1.0, -1.2, 0.0, -2.0], atol=1e-6)
    assert out.group is not None
    assert [s.reward for s in out.group.samples] == pytest.approx([1.0, -1.2, 0.0, -2.0], abs=1e-6)


def test_advantages_are_group_normalised_shaped_rewards() -> None:
    out = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-0")
    mean = (1.0 - 1.2 + 0.0 - 2.0) / 4  # -0.55
    centred = [1.55, -0.65, 0.55, -1.45]
    std = math.sqrt(sum(c * c for c in centred) / 4)  # population std, as GRPO/DAPO
    expected = [c / (std + ADVANTAGE_EPS) for c in centred]
    assert mean == pytest.approx(-0.55)
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-6)
    assert out.group is not None
    assert [s.advantage for s in out.group.samples] == pytest.approx(expected, rel=1e-6)

    centred_only = build_group(group(MIXED), results(*MIXED_CORRECT), settings(scale=False), "generator-0")
    np.testing.assert_allclose(centred_only.advantages, centred, atol=1e-6)


def test_loss_weight_masks_truncated_samples_only_with_overlong_filter() -> None:
    plain = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-0")
    filtered = build_group(
        group(MIXED), results(*MIXED_CORRECT), settings(overlong_filter=True), "generator-0"
    )
    assert plain.group is not None and filtered.group is not None
    assert [s.loss_weight for s in plain.group.samples] == [1.0, 1.0, 1.0, 1.0]
    # Only the sample stopped by the length limit is masked; the one that ended with EOS at L_max is not.
    assert [s.loss_weight for s in filtered.group.samples] == [1.0, 1.0, 0.0, 1.0]
    # Its reward still counts in the group's statistics.
    np.testing.assert_allclose(filtered.advantages, plain.advantages)


def test_group_fields_are_exact() -> None:
    out = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-3")
    g = out.group
    assert g is not None
    assert (g.group_id, g.prompt_id, g.generator_id, g.gold, g.created_at) == (
        "g-1",
        "p-7",
        "generator-3",
        "42",
        1700000000.5,
    )
    assert g.prompt_tokens.dtype == np.int32 and g.prompt_tokens.tolist() == [1, 2, 3]
    assert len(g.samples) == 4
    for got, src, ok in zip(g.samples, MIXED, MIXED_CORRECT, strict=True):
        assert (
            got.tokens.dtype == np.int32
            and got.logprobs.dtype == np.float32
            and got.versions.dtype == np.int32
        )
        assert np.array_equal(got.tokens, src.token_ids)
        assert np.array_equal(got.logprobs, src.logprobs)
        assert np.array_equal(got.versions, src.versions)
        assert got.correct is ok
        assert got.truncated is (src.finish_reason == "length")
    assert g.samples[1].versions.tolist() == [0] * 4 + [1] * 12
    assert (g.min_version, g.max_version) == (0, 1)
    assert g.num_tokens == 3 * 4 + 10 + 16 + 20 + 20


def test_group_survives_the_wire() -> None:
    out = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-0")
    assert out.group is not None
    data = codec.encode(m.Groups("generator-0", [out.group], filtered_total=2))
    msg = codec.decode(data, max_bytes=1 << 20)
    assert msg.body.filtered_total == 2
    assert msg.body.groups == [out.group]


@pytest.mark.parametrize(
    ("correct", "reason"),
    [((True,) * 4, FilterReason.ALL_CORRECT), ((False,) * 4, FilterReason.ALL_WRONG)],
)
def test_dynamic_sampling_drops_uniform_groups_before_shaping(
    correct: tuple[bool, ...], reason: FilterReason
) -> None:
    # Shaped rewards of this group differ (lengths differ), but the decision is on accuracy.
    out = build_group(group(MIXED), results(*correct), settings(), "generator-0")
    assert not out.accepted and out.group is None
    assert out.decision.reason is reason and not out.decision.keep
    assert out.decision.num_correct == sum(correct) and out.decision.group_size == 4
    assert out.rewards.size == 0 and out.advantages.size == 0


def test_dynamic_sampling_off_keeps_a_uniform_group_and_reports_its_class() -> None:
    out = build_group(group(MIXED), results(*(False,) * 4), settings(dynamic_sampling=False), "generator-0")
    assert out.group is not None and out.decision.reason is FilterReason.ALL_WRONG
    # rewards -1, -1.2, -2, -2: shaping alone still separates them
    np.testing.assert_allclose(out.rewards, [-1.0, -1.2, -2.0, -2.0], atol=1e-6)
    assert all(s.correct is False for s in out.group.samples)


class RecordingVerifier:
    def __init__(self, verdicts: Sequence[bool]) -> None:
        self.verdicts = verdicts
        self.calls: list[list[ScoreItem]] = []

    def score_batch(self, items: Sequence[ScoreItem]) -> list[VerifyResult]:
        self.calls.append(list(items))
        return results(*self.verdicts)


def test_process_group_verifies_each_response_against_the_gold_answer() -> None:
    verifier = RecordingVerifier(MIXED_CORRECT)
    out = process_group(group(MIXED), verifier, settings(), "generator-0")
    assert verifier.calls == [[ScoreItem("default", s.text, "42", "", {}) for s in MIXED]]
    assert [r.correct for r in out.results] == list(MIXED_CORRECT)
    assert out.accepted and out.verify_seconds >= 0.0


def test_bad_inputs_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="4 samples but 3 verifier results"):
        build_group(group(MIXED), results(True, False, True), settings(), "generator-0")
    empty = FinishedSample(
        np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32), "", "length"
    )
    with pytest.raises(ValueError, match="no response tokens"):
        build_group(group([*MIXED[:3], empty]), results(*MIXED_CORRECT), settings(), "generator-0")
    ragged = sample(5, "stop")
    ragged.versions = ragged.versions[:4]
    with pytest.raises(ValueError, match="lengths differ"):
        build_group(group([*MIXED[:3], ragged]), results(*MIXED_CORRECT), settings(), "generator-0")


def test_settings_mirror_the_algo_config() -> None:
    algo = AlgoConfig(
        max_response_len=64,
        overlong_cache_len=16,
        overlong_factor=0.5,
        overlong_filter=True,
        dynamic_sampling=False,
    )
    s = RolloutSettings.from_config(algo)
    assert s.shaping == RewardShaping(
        soft_overlong=True,
        max_response_len=64,
        overlong_cache_len=16,
        overlong_factor=0.5,
        overlong_filter=True,
    )
    assert (s.dynamic_sampling, s.adv_scale_by_std) == (False, True)


def test_wire_group_has_no_extra_fields() -> None:
    out = build_group(group(MIXED), results(*MIXED_CORRECT), settings(), "generator-0")
    assert isinstance(out.group, Group)
    # `seq` comes when the service first sends it (`UnackedGroups.number`); until then it is left out.
    assert out.group.seq is None
    assert list(m.to_map(out.group)) == [name for name in Group.__struct_fields__ if name != "seq"]


def test_a_groups_tail_counts_each_tokens_wait_for_its_longest_response() -> None:
    # Lengths 3, 1, 2: tokens wait 2+1+0, 2, and 2+1 decode steps for the 3-token response.
    uneven = group([sample(3, "stop"), sample(1, "stop"), sample(2, "stop")])
    assert uneven.longest == 3 and uneven.tail_tokens() == 8
    # Equal lengths: (L - 1) / 2 per token.
    even = group([sample(4, "stop"), sample(4, "length")])
    assert even.longest == 4 and even.tail_tokens() == 12


@pytest.mark.parametrize("correct", [MIXED_CORRECT, (False,) * 4])
def test_an_outcome_names_its_group_prompt_version_and_truncations_kept_or_not(
    correct: tuple[bool, ...],
) -> None:
    finished = group(MIXED)
    finished.start_version = 5
    out = build_group(finished, results(*correct), settings(), "generator-0")
    assert out.accepted is (correct == MIXED_CORRECT)
    assert (out.group_id, out.prompt_id, out.start_version) == ("g-1", "p-7", 5)
    assert out.truncated == 1  # MIXED's third sample ended at the length cap


def scored(*scores: float, threshold: float = 0.5) -> list[VerifyResult]:
    return [VerifyResult(correct=s >= threshold, reward=s, extracted=None, reason="scored") for s in scores]


def no_shaping(*, dynamic_sampling: bool = True) -> RolloutSettings:
    return RolloutSettings(
        shaping=RewardShaping(
            soft_overlong=False,
            max_response_len=L_MAX,
            overlong_cache_len=0,
            overlong_factor=1.0,
            overlong_filter=False,
        ),
        dynamic_sampling=dynamic_sampling,
    )


def test_real_valued_scores_give_hand_computed_advantages() -> None:
    """Scores 0.2, 0.4, 0.6, 1.0: mean 0.55, population std sqrt(0.0875) = 0.295804; advantages
    (s - 0.55) / (0.295804 + 1e-6) = -1.18322, -0.50709, 0.16903, 1.52128."""
    out = build_group(group(MIXED), scored(0.2, 0.4, 0.6, 1.0), no_shaping(), "generator-0")
    assert out.accepted and out.decision.reason is FilterReason.MIXED and out.decision.num_correct == 2
    np.testing.assert_allclose(out.rewards, [0.2, 0.4, 0.6, 1.0], rtol=1e-6)
    np.testing.assert_allclose(out.advantages, [-1.18322, -0.50709, 0.16903, 1.52128], atol=2e-5)
    assert out.group is not None
    assert [s.correct for s in out.group.samples] == [False, False, True, True]


def test_scores_that_all_clear_the_bar_but_differ_are_still_trained_on() -> None:
    """0.8 and 0.9 both count as correct, yet they differ: the group carries a gradient."""
    out = build_group(group(MIXED), scored(0.8, 0.9, 0.8, 0.9), no_shaping(), "generator-0")
    assert out.accepted and out.decision.reason is FilterReason.MIXED and out.decision.num_correct == 4
    np.testing.assert_allclose(out.advantages, [-1, 1, -1, 1], atol=1e-4)  # +-0.05 / (0.05 + 1e-6)


@pytest.mark.parametrize(
    ("scores", "reason"), [((0.7,) * 4, FilterReason.ALL_CORRECT), ((0.25,) * 4, FilterReason.ALL_WRONG)]
)
def test_equal_real_scores_are_filtered_whatever_their_value(
    scores: tuple[float, ...], reason: FilterReason
) -> None:
    out = build_group(group(MIXED), scored(*scores), no_shaping(), "generator-0")
    assert not out.accepted and out.decision.reason is reason
    np.testing.assert_allclose(out.scores, scores)  # the scores are kept for the figures
    kept = build_group(group(MIXED), scored(*scores), no_shaping(dynamic_sampling=False), "generator-0")
    assert kept.accepted
    np.testing.assert_allclose(kept.advantages, 0.0)


def test_the_soft_overlong_penalty_is_added_to_a_users_score() -> None:
    """MIXED's lengths 10, 16, 20, 20 with L_max 20 and L_cache 5: penalties 0, -0.2, -1, -1 on top of
    the scores 0.5, 0.5, 0.5, 0.9."""
    out = build_group(group(MIXED), scored(0.5, 0.5, 0.5, 0.9), settings(), "generator-0")
    np.testing.assert_allclose(out.rewards, [0.5, 0.3, -0.5, -0.1], atol=1e-6)


def test_a_source_with_its_own_budget_is_shaped_with_it() -> None:
    algo = AlgoConfig(max_response_len=20, overlong_cache_len=5, soft_overlong=True)
    per_source = RolloutSettings.from_config(algo, budgets={"short": 16, "default": None})
    assert per_source.shaping_of("default").max_response_len == 20
    assert per_source.shaping_of("short").max_response_len == 16
    finished = group(MIXED)
    finished.source = "short"
    out = build_group(finished, scored(0.0, 1.0, 0.0, 1.0), per_source, "generator-0")
    # L_max 16, L_cache 5: lengths 10, 16, 20, 20 get 0, -1, -1, -1 (the ramp starts at 11).
    np.testing.assert_allclose(out.rewards, [0.0, 0.0, -1.0, 0.0], atol=1e-6)
    assert out.source == "short"

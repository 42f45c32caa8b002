"""The admission / staleness rule: the capacity formula, its inverses and the lag gate."""

from __future__ import annotations

import itertools

import pytest

from stream_dapo.core.admission import AdmissionError, AdmissionRule


def rule(**overrides: int | bool) -> AdmissionRule:
    # G 8, B_v = 64 / 8 = 8 groups per step, S = 16 * 8 / 64 = 2 steps per rollout: the default recipe
    values: dict[str, int | bool] = dict(
        group_size=8, mini_batch_samples=64, rollout_batch_prompts=16, max_staleness=4, sync_every=1
    )
    values.update(overrides)
    return AdmissionRule(**values)  # type: ignore[arg-type]


def test_capacity_is_the_staleness_slack_times_groups_per_version() -> None:
    r = rule()
    assert (r.groups_per_version, r.steps_per_rollout, r.weight_lag) == (8, 2, 0)
    assert r.capacity == (4 - 2 - 0 + 1) * 8 == 24
    assert rule(max_staleness=6, sync_every=2).capacity == (6 - 2 - 1 + 1) * 8 == 32
    assert rule(max_staleness=0).capacity == 0  # never negative


def test_min_max_staleness_is_the_exact_inverse_of_the_capacity() -> None:
    for per_version, steps, sync_every in itertools.product(range(1, 9), range(1, 7), range(1, 5)):
        r = rule(
            group_size=2,
            mini_batch_samples=2 * per_version,
            rollout_batch_prompts=per_version * steps,
            sync_every=sync_every,
        )
        for need in range(0, 3 * per_version * steps):
            lowest = r.min_max_staleness(need)
            assert r.capacity_at(lowest) >= need > r.capacity_at(lowest - 1), (r, need)


def test_a_line_shorter_than_a_rollout_batch_deadlocks_and_names_the_fix() -> None:
    with pytest.raises(AdmissionError, match=r"set algo\.max_staleness >= 3"):
        rule(max_staleness=2).check_fills_rollout()
    assert rule().check(capacity_groups=160, checkpoint_every=20) == 24
    with pytest.raises(AdmissionError, match=r"Set buffer\.capacity_groups >= 160"):
        rule().check(capacity_groups=159, checkpoint_every=20)


def test_lag_gate_allows_weights_sync_every_minus_one_versions_old_and_none_in_lockstep() -> None:
    r = rule(sync_every=3, max_staleness=8)
    assert r.may_start(weights_version=3, credit_version=5)
    assert not r.may_start(weights_version=2, credit_version=5)
    lockstep = rule(sync_every=3, max_staleness=8, lockstep=True)
    assert lockstep.max_lag == 0
    assert lockstep.may_start(5, 5) and not lockstep.may_start(4, 5)

"""The generators' rollout tally: summed by the buffer over joins and restarts, windowed by the learner."""

from __future__ import annotations

import pytest

from stream_dapo.buffer.rollout_tally import RolloutTally
from stream_dapo.runtime.tracking import rollout_window, tracked_scalars
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import CodecError, decode, encode, pack_value
from stream_dapo.transport.messages import ROLLOUT_FIELDS, SchemaError


def tally(**counts: int) -> dict[str, int]:
    """A whole tally: every field of the wire's rollout tally, 0 where not given."""
    unknown = set(counts) - set(ROLLOUT_FIELDS)
    assert not unknown, f"not rollout tally fields: {unknown}"
    return {key: counts.get(key, 0) for key in ROLLOUT_FIELDS}


def report(**counts: int) -> m.Rollouts:
    return m.Rollouts(**tally(**counts))


def test_the_buffer_sums_what_each_generator_adds_and_counts_a_restart_from_zero() -> None:
    t = RolloutTally()
    t.observe("g0", report(mixed=2, samples=8, correct=4))
    t.observe("g1", report(all_wrong=1, samples=4))
    t.observe("g0", report(mixed=3, samples=12, correct=6))  # +1 group, +4 samples, +2 correct
    t.observe("g0", report(mixed=3, samples=12, correct=6))  # a repeated report adds nothing
    assert t.totals == tally(mixed=3, all_wrong=1, samples=16, correct=6)
    t.restart("g1")  # hello: g1's tally starts again from 0
    t.observe("g1", report(all_correct=1, samples=4, correct=4))
    assert t.totals == tally(mixed=3, all_correct=1, all_wrong=1, samples=20, correct=10)
    t.observe("g0", report(mixed=1, samples=4, correct=2))  # went down without a hello: restarted
    assert t.totals == tally(mixed=4, all_correct=1, all_wrong=1, samples=24, correct=12)


def test_the_learner_window_is_the_increase_between_two_batches() -> None:
    before = tally(
        mixed=10, all_wrong=5, all_correct=5, samples=80, correct=40, truncated=2, response_tokens=4000
    )
    after = tally(
        mixed=16, all_wrong=8, all_correct=6, samples=120, correct=62, truncated=6, response_tokens=6400
    )
    # 10 groups of G = 4 finished: 6 mixed, 3 all wrong, 1 all correct; 22 of 40 samples correct.
    window = rollout_window(before, after, group_size=4)
    assert window == pytest.approx(
        {
            "gen_groups": 10.0,
            "gen_filtered_share_all_wrong": 0.3,
            "gen_filtered_share_all_correct": 0.1,
            "gen_accuracy": 22 / 40,
            "gen_truncation_rate": 4 / 40,
            "gen_response_len_mean": 2400 / 40,
        }
    )
    assert tracked_scalars(window)["generators/filtered_share_all_wrong"] == pytest.approx(0.3)
    # Over a 12 s window: 2400 response tokens -> 200 tokens/s.
    assert rollout_window(before, after, 4, seconds=12.0)["gen_tokens_per_second"] == pytest.approx(200.0)
    assert rollout_window(after, after, group_size=4) == {}  # nothing finished in between
    # A restarted buffer counts from 0: the new tally is the window.
    assert rollout_window(after, tally(mixed=1, samples=4, correct=2), 4)["gen_accuracy"] == 0.5


def test_heartbeat_and_batch_carry_the_tally_and_refuse_a_bad_one() -> None:
    t = tally(mixed=1, samples=4, correct=2)
    for body in (
        m.Heartbeat("g0", 3, report(**t)),
        m.Groups("g0", [], 2, report(**t)),
        m.Batch([], 0, report(**t)),
    ):
        got = decode(encode(body), max_bytes=1 << 16).body
        assert got == body and m.to_map(got.rollouts) == t
    assert decode(encode(m.Heartbeat("g0", 3)), max_bytes=1 << 16).body.rollouts is None  # optional
    with pytest.raises(SchemaError, match="Rollouts: is missing field 'all_correct'"):
        m.from_map(m.Rollouts, {"mixed": 1})
    envelope = {
        "v": 2,
        "t": "batch",
        "b": {"groups": [], "dropped_stale": 0, "rollouts": {**t, "correct": 1.5}},
    }
    with pytest.raises(CodecError, match=r"batch.rollouts.correct: expected int, got float"):
        decode(pack_value(envelope), max_bytes=1 << 16)

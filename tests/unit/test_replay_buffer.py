"""The replay buffer's state machine: admission, lifecycle, staleness gate, restore."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from stream_dapo.buffer.replay import (
    AdmissionPolicy,
    BufferInputError,
    GeneratorIdTaken,
    GroupState,
    MemoryLog,
    ReplayBuffer,
)
from stream_dapo.config import AlgoConfig, Config, load_config
from stream_dapo.errors import ConfigError
from stream_dapo.testing.services import admission_policy
from stream_dapo.transport.codec import encode, wire_bytes
from stream_dapo.transport.messages import Batch, Group, Sample

G = 2


def make_group(
    gid: str, version: int = 0, *, samples: int = G, length: int = 3, prompt_len: int = 2, gen: str = "gen-0"
) -> Group:
    sample = Sample(
        tokens=np.arange(length, dtype=np.int32),
        logprobs=np.full(length, -0.5, dtype=np.float32),
        versions=np.full(length, version, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, f"p-{gid}", gen, "42", np.arange(prompt_len, dtype=np.int32), 1.0, [sample] * samples)


def policy(**overrides: float) -> AdmissionPolicy:
    return admission_policy(**{"group_size": G, **overrides})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cfg_with(*overrides: str) -> Config:
    return load_config(overrides=overrides, environ={})


# --------------------------------------------------------------------------------------------------
# Admission capacity and the start-up check
# --------------------------------------------------------------------------------------------------


def test_default_config_admits_three_versions_of_groups() -> None:
    # S = 16*8/64 = 2 steps per rollout, B_v = 64/8 = 8 groups per step, max_staleness 4, sync_every 1:
    # (4 - 2 - 0 + 1) * 8 = 24 groups may wait or be promised.
    cfg = Config()
    assert cfg.admission.capacity == 24
    assert cfg.admission_policy().admission_capacity == 24


def test_capacity_below_a_rollout_batch_fails_at_start_up_naming_max_staleness() -> None:
    # capacity (2 - 2 + 1) * 8 = 8 < 16 prompts per rollout: the config refuses it when loaded...
    with pytest.raises(ConfigError, match=r"set algo\.max_staleness >= 3"):
        cfg_with("algo.max_staleness=2")
    # ...and the buffer refuses it at start-up even if validation was bypassed.
    cfg = Config.model_construct(
        algo=AlgoConfig.model_construct(**{**AlgoConfig().model_dump(), "max_staleness": 2})
    )
    assert cfg.admission.capacity == 8
    with pytest.raises(ConfigError, match=r"set algo\.max_staleness >= 3") as info:
        cfg.admission_policy()
    assert "learner.rollout_batch_prompts (16)" in str(info.value)


def test_slower_weight_sync_needs_more_staleness() -> None:
    base = cfg_with("algo.max_staleness=5")
    cfg = Config.model_construct(
        **{**dict(base), "learner": base.learner.model_copy(update={"sync_every": 3})}
    )
    assert cfg.admission.capacity == 16  # (5 - 2 - 2 + 1) * 8
    assert cfg.admission.min_max_staleness() == 5
    with pytest.raises(ConfigError, match=r"algo\.max_staleness >= 5"):
        cfg_with("learner.sync_every=3")


def test_too_small_capacity_groups_fails_naming_the_minimum() -> None:
    # Rollouts every S = 2 versions, commits every 20: up to (20 - 2) * 8 = 144 groups are still
    # leased when the learner asks for its next 16.
    cfg = cfg_with("buffer.capacity_groups=160")
    assert cfg.admission.min_capacity_groups(cfg.learner.checkpoint_every) == 160
    # Refused where the configuration is resolved (`config show`, `run`, every service), and by the
    # buffer for a config built without validation.
    with pytest.raises(ConfigError, match=r"Set buffer\.capacity_groups >= 160"):
        cfg_with("buffer.capacity_groups=100")
    with pytest.raises(ConfigError, match=r"Set buffer\.capacity_groups >= 160"):
        cfg.model_copy(
            update={"buffer": cfg.buffer.model_copy(update={"capacity_groups": 100})}
        ).admission_policy()
    assert cfg_with("buffer.capacity_groups=160").admission_policy().admission_capacity == 24


@settings(max_examples=200, deadline=None)
@given(
    group_size=st.sampled_from([1, 2, 4, 8, 16]),
    per_version=st.integers(1, 8),
    steps=st.integers(1, 6),
    sync_every=st.integers(1, 4),
)
def test_min_max_staleness_is_the_smallest_value_that_works(
    group_size: int, per_version: int, steps: int, sync_every: int
) -> None:
    def cfg(max_staleness: int) -> Config:
        return Config.model_validate(
            {
                "algo": {"group_size": max(group_size, 2), "max_staleness": max_staleness},
                "learner": {
                    "mini_batch_samples": per_version * max(group_size, 2),
                    "rollout_batch_prompts": per_version * steps,
                    "sync_every": sync_every,
                },
                "buffer": {"capacity_groups": 100_000},
            }
        )

    lowest = cfg(100).admission.min_max_staleness()
    assert cfg(lowest).admission.capacity >= per_version * steps
    # One less deadlocks: the config refuses it, with the same minimum.
    with pytest.raises(ValidationError, match=rf"set algo\.max_staleness >= {lowest}\b"):
        cfg(lowest - 1)


# --------------------------------------------------------------------------------------------------
# Credits
# --------------------------------------------------------------------------------------------------


def test_credits_are_granted_only_while_the_line_has_room() -> None:
    buf = ReplayBuffer(policy(admission_capacity=6))
    assert buf.grant_credits("gen-0", 4) == 4
    assert buf.grant_credits("gen-1", 4) == 2
    assert buf.grant_credits("gen-1", 1) == 0
    buf.add_groups("gen-0", [make_group("a"), make_group("b")])
    assert buf.admitted == 6 and buf.credits_outstanding == 4  # groups replaced their credits
    assert buf.grant_credits("gen-0", 1) == 0
    buf.serve(0, max_groups=2)  # leased groups leave the line
    assert buf.grant_credits("gen-0", 5) == 2
    assert buf.stats()["credits_granted"] == 8


def test_leased_groups_count_against_capacity_groups() -> None:
    buf = ReplayBuffer(policy(admission_capacity=6, capacity_groups=5))
    assert buf.grant_credits("gen-0", 5) == 5
    buf.add_groups("gen-0", [make_group(f"g{i}") for i in range(5)])
    buf.serve(0, max_groups=4)
    # Line (1 waiting) has room for 5 more under admission_capacity, but only 5 - 4 leased - 1 = 0 fit.
    assert buf.grant_credits("gen-0", 5) == 0


def test_filtered_groups_redeem_credits() -> None:
    buf = ReplayBuffer(policy(admission_capacity=6))
    buf.grant_credits("gen-0", 5)
    buf.add_groups("gen-0", [make_group("a")], filtered_total=3)
    assert buf.credits_of("gen-0") == 1
    assert buf.admitted == 2
    buf.add_groups("gen-0", [], filtered_total=7)  # 4 more than it held: clamped, and counted
    assert buf.credits_of("gen-0") == 0
    assert buf.stats()["uncredited"] == 3


def test_a_repeated_or_lost_filtered_report_neither_doubles_nor_leaks_credits() -> None:
    """Regression: filtered counts were deltas, reported once; one that the buffer never read (it
    crashed first) leaked its credits for the rest of the run. A running total heals both ways."""
    buf = ReplayBuffer(policy(admission_capacity=6))
    buf.grant_credits("gen-0", 6)
    buf.add_groups("gen-0", [], filtered_total=2)
    buf.heartbeat("gen-0", 2)  # the same total again: nothing new
    assert buf.credits_of("gen-0") == 4
    # The report of totals 3 and 4 was lost; the heartbeat after it carries 5.
    assert buf.heartbeat("gen-0", 5) == (1, False)
    buf.generator_hello("gen-0")  # a new process: its total starts again from 0
    buf.grant_credits("gen-0", 2)
    buf.add_groups("gen-0", [], filtered_total=1)
    assert buf.credits_of("gen-0") == 1 and buf.stats()["uncredited"] == 0


def test_a_filtered_count_the_journal_cannot_store_is_refused(tmp_path) -> None:
    """Regression: `filtered = 2**64 - 1` once pushed the uncredited counter past msgpack's largest
    integer, so the journal could not encode the credit record (or a later snapshot) and the buffer
    service stopped. Such a count is refused before anything changes."""
    from stream_dapo.buffer.journal import Journal
    from stream_dapo.transport.messages import MAX_FILTERED_TOTAL

    journal = Journal(tmp_path / "state.msgpack")
    journal.load()
    buf = ReplayBuffer(policy(), journal)
    for count in (2**64 - 1, 2**63, MAX_FILTERED_TOTAL + 1, -1, True):
        with pytest.raises(BufferInputError, match=r"filtered_total must be an int in \[0, "):
            buf.add_groups("gen-0", [make_group("a", samples=1)], filtered_total=count)
    buf.add_groups("gen-0", [], filtered_total=MAX_FILTERED_TOTAL)
    buf.add_groups("gen-1", [], filtered_total=MAX_FILTERED_TOTAL)
    assert buf.stats()["uncredited"] == 2 * MAX_FILTERED_TOTAL
    assert buf.stats()["rejected_groups"] == {}
    journal.sync()
    journal.compact(buf.snapshot_records())


def test_credits_of_a_silent_generator_expire_after_the_lease_and_it_is_told_once() -> None:
    clock = FakeClock()
    log = MemoryLog()
    buf = ReplayBuffer(policy(admission_capacity=6, generator_lease_s=30.0), log, clock)
    assert buf.grant_credits("gen-0", 4) == 4 and buf.grant_credits("gen-1", 2) == 2
    clock.now += 20
    assert buf.heartbeat("gen-1", 0) == (2, False)
    assert buf.expire_generators() == [] and buf.live_generators == 2
    clock.now += 11  # gen-0 silent for 31 s > 30, gen-1 for 11 s
    assert buf.expire_generators() == [("gen-0", 4)]
    assert buf.credits_of("gen-0") == 0 and buf.grantable == 4 and buf.live_generators == 1
    assert buf.grant_credits("gen-2", 10) == 4  # a newcomer gets the whole line back
    assert buf.heartbeat("gen-0", 0) == (0, True)  # back after all (a long pause): it drops its credits
    assert buf.heartbeat("gen-0", 0) == (0, False)  # told once
    stats = buf.stats()
    assert (stats["generators_expired"], stats["credits_released"]) == (1, 4)
    restored = ReplayBuffer.restore(buf.policy, log.records)
    assert restored.stats()["generators_expired"] == 1
    assert [restored.credits_of(g) for g in ("gen-0", "gen-1", "gen-2")] == [0, 2, 4]


def test_after_a_restart_every_generator_gets_a_full_lease_then_a_dead_one_expires() -> None:
    """Regression: credits outlived their holders across buffer restarts; after two replacements
    every credit was held by a dead generator and the learner waited forever."""
    clock = FakeClock()
    log = MemoryLog()
    buf = ReplayBuffer(policy(admission_capacity=6, generator_lease_s=30.0), log, clock)
    buf.grant_credits("dead", 6)
    clock.now += 1000  # the buffer was down a long time
    restored = ReplayBuffer.restore(buf.policy, log.records, clock=clock)
    assert restored.expire_generators() == [] and restored.credits_of("dead") == 6
    clock.now += 31
    assert restored.expire_generators() == [("dead", 6)] and restored.grantable == 6


def test_generator_hello_releases_its_credits() -> None:
    buf = ReplayBuffer(policy(admission_capacity=6))
    buf.grant_credits("gen-0", 4)
    buf.grant_credits("gen-1", 2)
    assert buf.generator_hello("gen-0") == 0
    assert buf.credits_of("gen-0") == 0 and buf.credits_of("gen-1") == 2
    assert buf.stats()["credits_released"] == 4
    assert buf.grant_credits("gen-0", 10) == 4


def test_a_second_process_with_a_live_generator_id_is_refused_and_changes_nothing() -> None:
    """Regression: a second generator with the same --index said hello, which reset the id's filtered
    total; the first one's next report was redeemed twice and the second's credits never came back, so
    24 of 24 credits stayed out with nothing in flight and the learner stopped. The id belongs to the
    live process that said hello first; the other is refused, naming both, and nothing changes."""
    clock = FakeClock()
    log = MemoryLog()
    buf = ReplayBuffer(policy(admission_capacity=6, generator_lease_s=30.0), log, clock)
    first, second = "host-a pid 10 (aa)", "host-b pid 20 (bb)"
    buf.generator_hello("gen-0", first)
    assert buf.grant_credits("gen-0", 6) == 6
    buf.add_groups("gen-0", [], filtered_total=2)
    clock.now += 5
    with pytest.raises(
        GeneratorIdTaken, match=r"'gen-0' is held by host-a pid 10 \(aa\).*host-b pid 20"
    ) as err:
        buf.generator_hello("gen-0", second)
    assert err.value.reason == "generator_id_taken" and "--index" in str(err.value)
    with pytest.raises(GeneratorIdTaken):
        buf.generator_hello("gen-0")  # a hello that names no process is no owner either
    assert buf.credits_of("gen-0") == 4 and buf.holder_of("gen-0") == first
    buf.add_groups("gen-0", [], filtered_total=6)  # the first one's count was not reset: exact
    assert buf.credits_of("gen-0") == 0 and buf.stats()["uncredited"] == 0 and buf.grantable == 6
    buf.generator_hello("gen-0", first)  # its own hello again is fine
    # Restored after a buffer restart, the holder still owns the id for a lease.
    restored = ReplayBuffer.restore(buf.policy, log.records, clock=clock)
    with pytest.raises(GeneratorIdTaken):
        restored.generator_hello("gen-0", second)
    snapshot = ReplayBuffer.restore(buf.policy, list(buf.snapshot_records()), clock=clock)
    assert snapshot.holder_of("gen-0") == first


def test_a_restarted_generator_takes_its_id_back_once_the_dead_ones_lease_runs_out() -> None:
    clock = FakeClock()
    buf = ReplayBuffer(policy(admission_capacity=6, generator_lease_s=30.0), MemoryLog(), clock)
    buf.generator_hello("gen-0", "pid 10")
    buf.grant_credits("gen-0", 4)
    clock.now += 29  # killed 29 s ago: its lease still runs
    with pytest.raises(GeneratorIdTaken, match=r"heard from 29\.0 s ago"):
        buf.generator_hello("gen-0", "pid 11")
    clock.now += 2
    assert buf.generator_hello("gen-0", "pid 11") == 0
    assert buf.holder_of("gen-0") == "pid 11" and buf.credits_of("gen-0") == 0 and buf.grantable == 6


def test_duplicates_do_not_redeem_credits_again() -> None:
    buf = ReplayBuffer(policy())
    buf.grant_credits("gen-0", 3)
    buf.add_groups("gen-0", [make_group("a")])
    buf.add_groups("gen-0", [make_group("a")])
    assert buf.credits_of("gen-0") == 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity_groups=st.integers(4, 30), line=st.integers(0, 12))
def test_credits_never_exceed_capacity(seed: int, capacity_groups: int, line: int) -> None:
    """Random traffic from generators that only send credited groups: every grant leaves the line
    within its limit, and waiting + leased + outstanding never exceeds capacity_groups."""
    rng = random.Random(seed)
    buf = ReplayBuffer(policy(admission_capacity=line, capacity_groups=capacity_groups, max_staleness=100))
    inflight: dict[str, list[str]] = {"gen-0": [], "gen-1": [], "gen-2": []}
    filtered = dict.fromkeys(inflight, 0)
    version, n = 0, 0
    for _ in range(150):
        gen = rng.choice(sorted(inflight))
        op = rng.random()
        if op < 0.3:
            granted = buf.grant_credits(gen, rng.randint(0, 6))
            if granted:
                assert buf.admitted <= buf.admission_limit
            inflight[gen].extend(f"g{n + i}" for i in range(granted))
            n += granted
        elif op < 0.55 and inflight[gen]:
            k = rng.randint(1, len(inflight[gen]))
            done, inflight[gen] = inflight[gen][:k], inflight[gen][k:]
            kept = [gid for gid in done if rng.random() < 0.7]
            filtered[gen] += len(done) - len(kept)
            buf.add_groups(gen, [make_group(gid, version) for gid in kept], filtered_total=filtered[gen])
        elif op < 0.75:
            buf.serve(version, max_groups=rng.randint(1, 4))
        elif op < 0.9:
            buf.commit(version, buf.leased_ids()[: rng.randint(0, 4)])
            version += 1
        elif op < 0.95:
            buf.learner_hello(version, version)
        else:
            buf.generator_hello(gen)
            inflight[gen].clear()  # a restarted generator lost what it was generating
            filtered[gen] = 0
        assert buf.stored + buf.credits_outstanding <= capacity_groups
        assert buf.credits_outstanding == sum(len(v) for v in inflight.values())
    assert buf.stats()["rejected_groups"] == {}


# --------------------------------------------------------------------------------------------------
# Groups in
# --------------------------------------------------------------------------------------------------


def test_duplicate_group_is_acked_but_stored_once() -> None:
    buf = ReplayBuffer(policy())
    first = buf.add_groups("gen-0", [make_group("a"), make_group("b"), make_group("a")])
    assert first.accepted == ["a", "b"] and first.duplicates == ["a"]
    again = buf.add_groups("gen-0", [make_group("b"), make_group("c")])
    assert again.accepted == ["c"] and again.duplicates == ["b"]
    assert buf.waiting_ids() == ["a", "b", "c"]
    buf.serve(0, max_groups=3)
    buf.commit(1, ["a", "b", "c"])
    late = buf.add_groups("gen-0", [make_group("a")])  # a resend after training: still a duplicate
    assert late.duplicates == ["a"] and buf.stored == 0
    stats = buf.stats()
    assert (stats["accepted"], stats["duplicates"]) == (3, 3)


def test_group_of_the_wrong_size_is_rejected_and_counted() -> None:
    buf = ReplayBuffer(policy())
    result = buf.add_groups("gen-0", [make_group("a", samples=3), make_group("b")])
    assert result.rejected == [("a", "wrong_group_size")] and result.accepted == ["b"]
    assert buf.stats()["rejected_groups"] == {"wrong_group_size": 1}
    assert buf.state_of("a") is None  # not remembered: a corrected resend is welcome


def test_uncredited_groups_beyond_capacity_groups_are_rejected_as_full() -> None:
    buf = ReplayBuffer(policy(capacity_groups=2))
    result = buf.add_groups("gen-0", [make_group(g) for g in "abc"])
    assert result.accepted == ["a", "b"] and result.rejected == [("c", "buffer_full")]
    assert buf.stats()["uncredited"] == 3


# --------------------------------------------------------------------------------------------------
# Serving, the staleness gate, commits and requeues
# --------------------------------------------------------------------------------------------------


def test_groups_of_one_policy_version_are_served_in_arrival_order() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "abcde"])
    assert [g.group_id for g in buf.serve(0, max_groups=2).groups] == ["a", "b"]
    assert [g.group_id for g in buf.serve(0, max_groups=2).groups] == ["c", "d"]
    assert buf.state_of("a") is GroupState.LEASED and buf.state_of("e") is GroupState.WAITING


def test_an_older_policys_group_that_finished_late_is_served_first() -> None:
    """A long group started on version 4 arrives after four short ones started on version 6. In
    arrival order it would be trained at version 8 (4 versions behind: dropped at max_staleness 3);
    oldest policy first, it is trained at 7 and the short ones behind it still fit."""
    buf = ReplayBuffer(policy(max_staleness=3, groups_per_version=2))
    buf.add_groups("gen-0", [make_group(f"short{i}", 6) for i in range(4)] + [make_group("long", 4)])
    result = buf.serve(7, max_groups=5)
    assert [g.group_id for g in result.groups] == ["long", "short0", "short1", "short2", "short3"]
    assert result.dropped_stale == [] and result.staleness == [3, 1, 2, 2, 3]


def test_stale_group_is_dropped_at_dequeue_and_counted() -> None:
    buf = ReplayBuffer(policy(max_staleness=3, groups_per_version=2))
    buf.add_groups(
        "gen-0", [make_group("old", 1), make_group("ok", 7), make_group("edge", 6), make_group("x", 6)]
    )
    result = buf.serve(10, max_groups=3)
    # Positions 0 and 1 train at version 10: "old" would be 9 versions behind, "edge" and "x" 4,
    # all over the limit of 3: dropped. "ok" is 3 behind: served.
    assert result.dropped_stale == ["old", "edge", "x"]
    assert [g.group_id for g in result.groups] == ["ok"] and result.staleness == [3]
    assert buf.state_of("old") is GroupState.COMMITTED  # forgotten but remembered as seen
    assert buf.add_groups("gen-0", [make_group("old", 1)]).duplicates == ["old"]
    stats = buf.stats()
    assert stats["dropped_stale"] == 3 and stats["served"] == 1 and stats["max_staleness_served"] == 3


def test_later_positions_in_a_batch_train_at_later_versions() -> None:
    buf = ReplayBuffer(policy(max_staleness=2, groups_per_version=2))
    buf.add_groups("gen-0", [make_group(f"g{i}", 8) for i in range(6)])
    result = buf.serve(10, max_groups=6)
    # Positions 0-1 train at 10 (staleness 2), 2-3 at 11 (3 > 2: dropped), and the rest can never
    # reach a lower position than 2: all dropped.
    assert [g.group_id for g in result.groups] == ["g0", "g1"]
    assert result.staleness == [2, 2] and len(result.dropped_stale) == 4


def test_positions_continue_across_partial_batches_at_one_version() -> None:
    buf = ReplayBuffer(policy(max_staleness=2, groups_per_version=2))
    buf.add_groups("gen-0", [make_group("a", 8), make_group("b", 8)])
    assert buf.serve(10, max_groups=4).staleness == [2, 2]
    buf.add_groups("gen-0", [make_group("c", 8), make_group("d", 9)])
    later = buf.serve(10, max_groups=4)  # same rollout: positions 2 and 3 train at version 11
    assert later.dropped_stale == ["c"] and later.staleness == [2]
    buf.add_groups("gen-0", [make_group("e", 10)])
    assert buf.serve(12, max_groups=4).staleness == [2]  # a new version starts at position 0


def test_token_budget_stops_before_exceeding_but_serves_at_least_one() -> None:
    buf = ReplayBuffer(policy())
    # num_tokens = prompt 2 * 2 samples + 2 * length
    buf.add_groups(
        "gen-0", [make_group("big", length=50), make_group("s1", length=3), make_group("s2", length=3)]
    )
    assert make_group("big", length=50).num_tokens == 104 and make_group("s1").num_tokens == 10
    first = buf.serve(0, max_groups=3, max_tokens=20)
    assert [g.group_id for g in first.groups] == ["big"]  # over budget alone, but never empty
    second = buf.serve(0, max_groups=3, max_tokens=20)
    assert [g.group_id for g in second.groups] == ["s1", "s2"]  # 10 + 10 = 20: not exceeding


def test_byte_budget_keeps_batches_under_the_message_limit() -> None:
    buf = ReplayBuffer(policy())
    groups = [make_group(f"g{i}", length=100) for i in range(4)]
    buf.add_groups("gen-0", groups)
    limit = 2 * wire_bytes(groups[0]) + 10
    served = buf.serve(0, max_groups=4, max_bytes=limit).groups
    assert len(served) == 2
    assert len(encode(Batch(served, 0))) <= limit


def test_empty_buffer_serves_nothing_and_records_the_learner_version() -> None:
    log = MemoryLog()
    buf = ReplayBuffer(policy(), log)
    result = buf.serve(7, max_groups=4)
    assert result.groups == [] and result.dropped_stale == []
    assert buf.learner_version == 7 and log.records == [{"kind": "version", "learner_version": 7}]


def test_leased_groups_return_to_front_on_learner_hello() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "abcdef"])
    buf.serve(0, max_groups=2)  # a, b
    buf.serve(0, max_groups=2)  # c, d
    buf.commit(1, ["a"])
    assert buf.learner_hello(1, 1) == 3
    assert buf.waiting_ids() == ["b", "c", "d", "e", "f"] and buf.leased_ids() == []
    assert [g.group_id for g in buf.serve(1, max_groups=6).groups] == ["b", "c", "d", "e", "f"]
    stats = buf.stats()
    assert stats["requeued"] == 3 and stats["committed_through"] == 1


def test_commit_forgets_groups_but_keeps_their_ids() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "abc"])
    buf.serve(0, max_groups=3)
    result = buf.commit(2, ["a", "b", "a", "zzz"])
    assert result.committed == ["a", "b"] and result.unknown == ["zzz"]
    assert buf.state_of("a") is GroupState.COMMITTED and buf.leased_ids() == ["c"]
    again = buf.commit(2, ["a", "b"])  # a resent commit changes nothing
    assert again.committed == [] and again.unknown == ["a", "b"]
    stats = buf.stats()
    assert (stats["committed"], stats["commit_unknown"], stats["learner_version"]) == (2, 3, 2)


def test_commit_after_hello_retires_requeued_groups() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "ab"])
    buf.serve(0, max_groups=2)
    buf.learner_hello(2, 2)  # the learner restarted before its commit got through...
    assert buf.commit(2, ["a"]).committed == ["a"]  # ...and resends it: "a" is not trained twice
    assert buf.waiting_ids() == ["b"]


def test_committed_group_is_served_again_up_to_max_reuse() -> None:
    buf = ReplayBuffer(policy(max_reuse=2, max_staleness=100))
    buf.add_groups("gen-0", [make_group("a"), make_group("b")])
    buf.serve(0, max_groups=1)
    assert buf.commit(1, ["a"]).reused == ["a"]
    assert buf.waiting_ids() == ["b", "a"]  # back of the queue
    buf.serve(1, max_groups=2)
    result = buf.commit(2, ["a", "b"])
    assert result.committed == ["a"] and result.reused == ["b"]
    assert buf.state_of("a") is GroupState.COMMITTED and buf.waiting_ids() == ["b"]
    assert buf.stats()["served"] == 3


def test_a_retried_batch_request_gets_the_same_lease_not_a_second_one() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "abcdef"])
    first = buf.serve(0, max_groups=2, request_id=11)
    again = buf.serve(0, max_groups=2, request_id=11)  # the learner gave up waiting and resent it
    assert [g.group_id for g in first.groups] == [g.group_id for g in again.groups] == ["a", "b"]
    assert again.retried and not first.retried and again.staleness == [] and again.dropped_stale == []
    assert buf.leased_ids() == ["a", "b"] and buf.waiting_ids() == ["c", "d", "e", "f"]
    nxt = buf.serve(0, max_groups=2, request_id=12)
    assert [g.group_id for g in nxt.groups] == ["c", "d"]  # positions 2, 3: the retry took no slot
    assert nxt.staleness == [1, 1]
    stats = buf.stats()
    assert (stats["served"], stats["retried_requests"]) == (4, 1)


def test_a_late_copy_of_an_empty_batch_request_leases_nothing() -> None:
    """Regression: the buffer answered a batch request "empty" and forgot its id; groups arrived, a
    late copy of the same request leased them, and the learner, which had read the first reply and
    moved on, dropped that lease's reply: the groups stayed leased until the learner restarted."""
    buf = ReplayBuffer(policy())
    assert buf.serve(0, max_groups=2, request_id=11).groups == []
    buf.add_groups("gen-0", [make_group(g) for g in "abc"])
    late = buf.serve(0, max_groups=2, request_id=11)
    assert late.groups == [] and late.retried
    assert buf.leased_ids() == [] and buf.waiting_ids() == ["a", "b", "c"]
    assert [g.group_id for g in buf.serve(0, max_groups=2, request_id=12).groups] == ["a", "b"]


def test_a_retried_lease_returns_only_what_is_still_leased_and_a_hello_forgets_it() -> None:
    buf = ReplayBuffer(policy())
    buf.add_groups("gen-0", [make_group(g) for g in "abcd"])
    buf.serve(0, max_groups=2, request_id=5)
    buf.commit(1, ["a"], request_id=6)
    assert [g.group_id for g in buf.serve(1, max_groups=2, request_id=5).groups] == ["b"]
    buf.learner_hello(1, 1)  # b back in line: a request with the old id now leases anew
    assert [g.group_id for g in buf.serve(1, max_groups=2, request_id=5).groups] == ["b", "c"]


def test_a_retried_commit_is_not_applied_twice() -> None:
    buf = ReplayBuffer(policy(max_reuse=3, max_staleness=100))
    buf.add_groups("gen-0", [make_group("a")])
    buf.serve(0, max_groups=1, request_id=1)
    assert buf.commit(1, ["a"], request_id=2).reused == ["a"]
    again = buf.commit(1, ["a"], request_id=2)
    assert again.retried and again.reused == [] and again.committed == []
    buf.serve(1, max_groups=1, request_id=3)
    # max_reuse=3 allows three uses; had the retry counted, this commit would be the third and last.
    assert buf.commit(2, ["a"], request_id=4).reused == ["a"]
    assert buf.stats()["committed"] == 2 and buf.stats()["retried_requests"] == 1


def test_request_ids_of_the_last_lease_and_commit_survive_a_restart() -> None:
    log = MemoryLog()
    live = ReplayBuffer(policy(), log)
    live.add_groups("gen-0", [make_group(g) for g in "abcd"])
    live.serve(0, max_groups=2, request_id=77)
    live.commit(0, ["zzz"], request_id=78)
    for records in (log.records, list(live.snapshot_records())):
        restored = ReplayBuffer.restore(live.policy, records)
        retry = restored.serve(0, max_groups=2, request_id=77)
        assert retry.retried and [g.group_id for g in retry.groups] == ["a", "b"]
        assert restored.commit(0, ["zzz"], request_id=78).retried
        assert restored.leased_ids() == ["a", "b"]


def test_a_repeated_credit_request_gets_the_same_grant_also_after_a_restart() -> None:
    """The buffer journaled a grant of 4 and died before its reply: the generator repeats the
    request (same id) and must get those 4, not 0 with 4 counted against the line forever."""
    log = MemoryLog()
    live = ReplayBuffer(policy(admission_capacity=6), log)
    assert live.grant_credits("gen-0", 4, request_id=11) == 4
    for records in (log.records, list(live.snapshot_records())):
        restored = ReplayBuffer.restore(live.policy, records)
        assert restored.grant_credits("gen-0", 4, request_id=11) == 4
        assert restored.credits_of("gen-0") == 4 and restored.grantable == 2, "granted once"
        assert restored.stats()["retried_requests"] == 1
        # a new request is a new grant, and another generator's id space is its own
        assert restored.grant_credits("gen-0", 4, request_id=12) == 2
        assert restored.grant_credits("gen-1", 4, request_id=12) == 0
        assert restored.credits_of("gen-0") == 6


def test_a_credit_request_repeated_after_hello_or_expiry_is_granted_anew() -> None:
    clock = FakeClock()
    buf = ReplayBuffer(policy(admission_capacity=6), clock=clock)
    assert buf.grant_credits("gen-0", 3, request_id=1) == 3
    buf.generator_hello("gen-0")  # restarted: holds none of them
    assert buf.grant_credits("gen-0", 3, request_id=1) == 3 and buf.credits_of("gen-0") == 3
    clock.now += buf.policy.generator_lease_s + 1
    assert buf.expire_generators() == [("gen-0", 3)]
    assert buf.grant_credits("gen-0", 3, request_id=1) == 3 and buf.credits_of("gen-0") == 3
    assert buf.stats()["retried_requests"] == 0


def test_oldest_waiting_age_uses_the_injected_clock() -> None:
    clock = FakeClock()
    buf = ReplayBuffer(policy(), clock=clock)
    assert buf.oldest_waiting_age_s() == 0.0
    buf.add_groups("gen-0", [make_group("a")])
    clock.now += 12.5
    buf.add_groups("gen-0", [make_group("b")])
    assert buf.oldest_waiting_age_s() == 12.5


def test_a_step_of_the_wall_clock_neither_expires_leases_nor_ages_groups() -> None:
    """Durations run on `clock` (monotonic in the service); the wall clock only stamps acceptance."""
    clock, wall = FakeClock(), FakeClock()
    log = MemoryLog()
    buf = ReplayBuffer(policy(admission_capacity=6, generator_lease_s=30.0), log, clock, wall)
    assert buf.grant_credits("gen-0", 4) == 4
    buf.add_groups("gen-0", [make_group("a")])
    wall.now += 3 * 3600  # an NTP step, a resumed VM
    clock.now += 5
    assert buf.expire_generators() == [] and buf.credits_of("gen-0") == 3
    assert buf.oldest_waiting_age_s() == 5.0
    assert buf.generator_leases()["gen-0"] == {"credits": 3, "silent_s": 5.0}
    wall.now -= 3 * 3600 + 180
    clock.now += 26
    assert buf.expire_generators() == [("gen-0", 3)], (
        "a lease is 30 s of the monotonic clock, whatever the wall"
    )
    (accepted,) = [r for r in log.records if r["kind"] == "accept"]
    assert accepted["accepted_at"] == 1000.0, "acceptance is stamped with wall time, for people"


def test_the_buffer_times_on_the_monotonic_clock_by_default() -> None:
    import inspect
    import time

    for signature in (inspect.signature(ReplayBuffer), inspect.signature(ReplayBuffer.restore)):
        assert signature.parameters["clock"].default is time.monotonic
        assert signature.parameters["wall_clock"].default is time.time


@pytest.mark.parametrize(
    ("call", "fix"),
    [
        (lambda b: b.grant_credits("gen-0", -1), "want must be an int >= 0"),
        (lambda b: b.grant_credits("", 1), "generator_id must be a non-empty string"),
        (lambda b: b.serve(0, max_groups=0), "max_groups must be an int >= 1"),
        (lambda b: b.serve(-1, max_groups=1), "learner_version must be an int >= 0"),
        (lambda b: b.serve(0, max_groups=1, max_tokens=-5), "max_tokens must be an int >= 0"),
        (lambda b: b.add_groups("gen-0", [], filtered_total=-1), "filtered_total must be an int in"),
        (lambda b: b.learner_hello(1, -1), "committed_through must be an int >= 0"),
    ],
)
def test_bad_arguments_raise_naming_the_fix(call, fix: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BufferInputError, match=fix):
        call(ReplayBuffer(policy()))


# --------------------------------------------------------------------------------------------------
# The admission argument, end to end
# --------------------------------------------------------------------------------------------------


def admission_argument_config(sync_every: int, slack: int) -> Config:
    """G = 2, B_v = 2, S = 3, the given sync_every, and max_staleness `slack` above the smallest
    that holds a rollout batch."""
    overrides = [
        "algo.group_size=2",
        "learner.mini_batch_samples=4",  # B_v = 2
        "learner.rollout_batch_prompts=6",  # S = 3
        f"learner.sync_every={sync_every}",
        "buffer.capacity_groups=1000",
    ]
    lowest = cfg_with(*overrides, "algo.max_staleness=50").admission.min_max_staleness()
    return cfg_with(*overrides, f"algo.max_staleness={lowest + slack}")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sync_every=st.integers(1, 3), slack=st.integers(0, 2))
def test_credited_groups_finished_in_order_are_never_too_stale(
    seed: int, sync_every: int, slack: int
) -> None:
    """A generator that starts groups only with credits, on weights at most sync_every - 1 versions
    old, and finishes them in order: whatever the interleaving with the learner, the gate never
    fires and no served group exceeds max_staleness."""
    cfg = admission_argument_config(sync_every, slack)
    buf = ReplayBuffer(cfg.admission_policy())
    rng = random.Random(seed)
    version, n, inflight = 0, 0, []
    for _ in range(300):
        op = rng.random()
        if op < 0.35:
            weights = version // sync_every * sync_every  # the latest published version
            for _ in range(buf.grant_credits("gen-0", rng.randint(0, 4))):
                inflight.append((f"g{n}", weights))
                n += 1
        elif op < 0.75 and inflight:
            gid, weights = inflight.pop(0)
            buf.add_groups("gen-0", [make_group(gid, weights)])
        elif buf.num_waiting >= 6:
            result = buf.serve(version, max_groups=6)
            assert result.dropped_stale == []
            assert max(result.staleness) <= cfg.algo.max_staleness
            buf.commit(version + 3, [g.group_id for g in result.groups])
            version += 3
    assert buf.stats()["dropped_stale"] == 0


# --------------------------------------------------------------------------------------------------
# Restore
# --------------------------------------------------------------------------------------------------


def random_session(buf: ReplayBuffer, seed: int) -> None:
    rng = random.Random(seed)
    version = 0
    filtered = {f"gen-{i}": buf._filtered.get(f"gen-{i}", 0) for i in range(3)}
    for _ in range(120):
        op = rng.random()
        gen = f"gen-{rng.randint(0, 2)}"
        if op < 0.2:
            buf.grant_credits(gen, rng.randint(0, 3))
        elif op < 0.5:
            ids = [f"g{rng.randint(0, 60)}" for _ in range(rng.randint(0, 3))]
            filtered[gen] += rng.randint(0, 1)
            buf.add_groups(
                gen, [make_group(g, max(0, version - rng.randint(0, 5))) for g in ids], filtered[gen]
            )
        elif op < 0.55:
            filtered[gen] += rng.randint(0, 1)
            buf.heartbeat(gen, filtered[gen])
        elif op < 0.7:
            buf.serve(version, rng.randint(1, 4), rng.choice([0, 30]))
        elif op < 0.85:
            buf.commit(version, rng.sample(buf.leased_ids(), min(2, buf.num_leased)) + ["nope"])
            version += 1
        elif op < 0.9:
            buf.learner_hello(version, max(0, version - 1))
        elif op < 0.95:
            buf.generator_hello(gen)
            filtered[gen] = 0
        else:
            buf.count_rejected_message(rng.choice(["malformed", "bad_version"]), rng.randint(1, 2))


def same_state(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert a.stats() == b.stats()
    assert a.waiting_ids() == b.waiting_ids() and a.leased_ids() == b.leased_ids()
    for gid in a.waiting_ids() + a.leased_ids():
        assert a.state_of(gid) is b.state_of(gid)
    for gen in ("gen-0", "gen-1", "gen-2"):
        assert a.credits_of(gen) == b.credits_of(gen)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), reuse=st.integers(1, 2))
def test_replaying_the_log_rebuilds_the_same_buffer(seed: int, reuse: int) -> None:
    log = MemoryLog()
    live = ReplayBuffer(policy(max_reuse=reuse, capacity_groups=40), log)
    random_session(live, seed)
    same_state(live, ReplayBuffer.restore(live.policy, log.records))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_snapshot_then_log_tail_rebuilds_the_same_buffer(seed: int) -> None:
    log = MemoryLog()
    live = ReplayBuffer(policy(max_reuse=2, capacity_groups=40), log)
    random_session(live, seed)
    snapshot = list(live.snapshot_records())
    log.records.clear()
    random_session(live, seed + 1)
    restored = ReplayBuffer.restore(live.policy, snapshot + log.records)
    same_state(live, restored)
    # The restored buffer keeps making the same decisions.
    assert [g.group_id for g in restored.serve(live.learner_version, 3).groups] == [
        g.group_id for g in live.serve(live.learner_version, 3).groups
    ]


def test_restore_refuses_records_it_does_not_understand() -> None:
    with pytest.raises(BufferInputError, match="record #1 .*'mystery'"):
        ReplayBuffer.restore(policy(), [{"kind": "version", "learner_version": 1}, {"kind": "mystery"}])


def test_lockstep_grants_one_rollout_batch_per_learner_version() -> None:
    """Sync mode: R credits per round; filtered groups free theirs; none while the learner trains."""
    policy = admission_policy(admission_capacity=100, max_staleness=8, lockstep=True, rollout_batch_prompts=4)
    buf = ReplayBuffer(policy)
    assert buf.grant_credits("g", 10) == 4
    assert buf.grant_credits("g", 10) == 0
    # Two groups arrive, one group was filtered by dynamic sampling: its credit comes back.
    buf.add_groups("g", [_lockstep_group("a"), _lockstep_group("b")], filtered_total=1)
    assert buf.grant_credits("g", 10) == 1
    assert len(buf.serve(0, max_groups=4).groups) == 2  # the learner takes what is there, waits for more
    assert buf.grant_credits("g", 10) == 0
    buf.add_groups("g", [_lockstep_group("c"), _lockstep_group("d")])
    assert len(buf.serve(0, max_groups=2).groups) == 2  # the full batch of 4 at version 0
    assert buf.grant_credits("g", 10) == 0  # learner training: no new work
    assert buf.serve(2, max_groups=4).groups == []  # it trained 2 steps and asks again
    assert buf.grant_credits("g", 10) == 4


def _lockstep_group(gid: str) -> Group:
    sample = Sample(
        tokens=np.array([1, 2], dtype=np.int32),
        logprobs=np.array([-0.5, -0.5], dtype=np.float32),
        versions=np.array([0, 0], dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.0,
    )
    return Group(gid, "p", "g", "1", np.array([3], dtype=np.int32), 0.0, [sample, sample])


# --------------------------------------------------------------------------------------------------
# Holding the learner for in-flight groups (buffer.in_flight_hold_s)
# --------------------------------------------------------------------------------------------------


def held_buffer(clock: FakeClock | None = None, **overrides: float) -> ReplayBuffer:
    values: dict[str, float] = {"max_staleness": 3, "groups_per_version": 2, "in_flight_hold_s": 60.0}
    return ReplayBuffer(policy(**{**values, **overrides}), clock=clock or FakeClock())


def test_the_learner_is_held_so_that_a_long_in_flight_group_is_still_trained() -> None:
    buf = held_buffer()
    buf.report_in_flight("gen-0", [5])  # a long group started at version 5 is still generating
    buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(6)])  # shorter, later ones finished
    # B_v = 2, max staleness 3: the long group must be trained at version <= 8, i.e. at a position
    # p with 7 + p // 2 <= 8 at learner version 7: p <= 3. So at most 3 groups go first.
    first = buf.serve(7, max_groups=6)
    assert [g.group_id for g in first.groups] == ["s0", "s1", "s2"] and first.held
    assert buf.serve(7, max_groups=3).groups == []  # asking again changes nothing while it runs
    buf.add_groups("gen-0", [make_group("long", 5)])
    buf.report_in_flight("gen-0", [])
    rest = buf.serve(7, max_groups=3)
    # Position 3 trains at 7 + 3 // 2 = 8: staleness 3, within the bound; s3 and s4 at 9.
    assert [g.group_id for g in rest.groups] == ["long", "s3", "s4"] and not rest.held
    assert rest.staleness == [3, 2, 2] and rest.dropped_stale == []
    assert buf.hold_stats()["holds"] == 2 and buf.stats()["dropped_stale"] == 0


def test_without_the_hold_the_same_long_group_is_dropped_as_stale() -> None:
    buf = held_buffer(in_flight_hold_s=0.0)
    buf.report_in_flight("gen-0", [5])
    buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(6)])
    assert len(buf.serve(7, max_groups=6).groups) == 6
    buf.add_groups("gen-0", [make_group("long", 5)])
    late = buf.serve(7, max_groups=2)  # position 6 trains at 7 + 3 = 10: 5 versions behind
    assert late.dropped_stale == ["long"] and buf.hold_stats()["holds"] == 0


def test_each_in_flight_group_keeps_a_position_of_its_own() -> None:
    buf = held_buffer()
    buf.report_in_flight("gen-0", [6])
    buf.report_in_flight("gen-1", [6, 7])
    buf.add_groups("gen-0", [make_group(f"s{i}", 8) for i in range(8)])
    # At version 7 the k-th in-flight group (starts 6, 6, 7) needs 7 + (n + k) // 2 <= start + 3:
    # n <= 5, n + 1 <= 5, n + 2 <= 7: n <= 4.
    assert len(buf.serve(7, max_groups=8).groups) == 4


def test_a_group_that_is_too_late_anyway_holds_nothing() -> None:
    buf = held_buffer()
    buf.report_in_flight("gen-0", [1])  # trained at 7 or later: 6 versions behind whatever happens
    buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(4)])
    result = buf.serve(7, max_groups=4)
    assert len(result.groups) == 4 and not result.held


def test_a_hold_lasts_at_most_in_flight_hold_s_then_that_group_holds_no_more() -> None:
    clock = FakeClock()
    buf = held_buffer(clock, in_flight_hold_s=60.0)
    buf.report_in_flight("gen-0", [5])
    buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(6)])
    assert len(buf.serve(7, max_groups=6).groups) == 3  # the hold starts
    clock.now += 30
    buf.heartbeat("gen-0", 0)
    assert buf.serve(7, max_groups=3).groups == []  # 30 s <= 60 s: still held
    clock.now += 31
    buf.heartbeat("gen-0", 0)
    assert len(buf.serve(7, max_groups=3).groups) == 3  # 61 s: the learner goes on
    assert buf.hold_stats()["holds_expired"] == 1
    buf.add_groups("gen-0", [make_group(f"t{i}", 8) for i in range(2)])
    buf.report_in_flight("gen-0", [5, 8])  # the version-5 group no longer holds; the new one does
    nxt = buf.serve(10, max_groups=2)
    # Start 8 at learner version 10: 10 + (n + 0) // 2 <= 11, n <= 3; both served.
    assert len(nxt.groups) == 2 and not nxt.held


def test_a_hold_for_another_group_starts_its_own_clock() -> None:
    clock = FakeClock()
    buf = held_buffer(clock, in_flight_hold_s=60.0)
    buf.report_in_flight("gen-0", [5])
    buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(6)])
    assert len(buf.serve(7, max_groups=6).groups) == 3  # held for the group started at 5
    clock.now += 50
    buf.add_groups("gen-0", [make_group("long", 5)])
    buf.report_in_flight("gen-0", [6])  # it arrived; another, started at 6, is still running
    # Position 3 onwards at version 7: start 6 allows n <= (6 + 3 - 7 + 1) * 2 - 1 - 3 = 2.
    assert [g.group_id for g in buf.serve(7, max_groups=3).groups] == ["long", "s3"]
    clock.now += 20  # 70 s since the first hold began, 20 s into this one
    assert buf.serve(7, max_groups=1).groups == [] and buf.hold_stats()["holds_expired"] == 0


def test_reports_of_a_silent_generator_stop_holding_after_its_lease() -> None:
    clock = FakeClock()
    buf = held_buffer(clock, in_flight_hold_s=1000.0, generator_lease_s=30.0)
    buf.heartbeat("gen-0", 0)
    buf.report_in_flight("gen-0", [5])
    buf.add_groups("gen-1", [make_group(f"s{i}", 7, gen="gen-1") for i in range(6)])
    assert len(buf.serve(7, max_groups=6).groups) == 3
    clock.now += 31  # gen-0 died with its group
    assert len(buf.serve(7, max_groups=3).groups) == 3


def test_a_new_process_and_an_empty_report_clear_the_holds_but_no_report_keeps_them() -> None:
    buf = held_buffer()
    buf.report_in_flight("gen-0", [5])
    buf.report_in_flight("gen-0", None)  # a message without the field: nothing changes
    assert buf.hold_stats()["in_flight_reported"] == 1
    buf.generator_hello("gen-0")
    assert buf.hold_stats()["in_flight_reported"] == 0
    buf.report_in_flight("gen-0", [5, 6])
    buf.report_in_flight("gen-0", [])
    assert buf.hold_stats()["in_flight_reported"] == 0
    with pytest.raises(BufferInputError, match="in_flight_versions"):
        buf.report_in_flight("gen-0", [-1])


def test_lockstep_and_a_zero_hold_never_hold() -> None:
    for buf in (held_buffer(in_flight_hold_s=0.0), held_buffer(lockstep=True)):
        buf.report_in_flight("gen-0", [5])
        buf.add_groups("gen-0", [make_group(f"s{i}", 7) for i in range(6)])
        assert len(buf.serve(7, max_groups=6).groups) == 6


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sync_every=st.integers(1, 3), slack=st.integers(0, 2))
def test_credited_groups_finished_out_of_order_are_never_too_stale_with_the_hold(
    seed: int, sync_every: int, slack: int
) -> None:
    """As the in-order test above, but groups finish in any order (long ones late) and the generator
    reports what it has in flight: the hold keeps every group trainable and the gate never fires;
    the learner gathers its rollout batch over several requests, as it does."""
    cfg = admission_argument_config(sync_every, slack)
    buf = ReplayBuffer(cfg.admission_policy())
    rng = random.Random(seed)
    inflight: list[tuple[str, int]]
    batch: list[str]
    version, n, inflight, batch, trained = 0, 0, [], [], 0
    for _ in range(400):
        op = rng.random()
        if op < 0.3:
            weights = version // sync_every * sync_every  # the latest published version
            for _ in range(buf.grant_credits("gen-0", rng.randint(0, 4))):
                inflight.append((f"g{n}", weights))
                n += 1
        elif op < 0.7 and inflight:
            gid, weights = inflight.pop(rng.randrange(len(inflight)))
            buf.add_groups("gen-0", [make_group(gid, weights)])
        else:
            result = buf.serve(version, max_groups=6 - len(batch))
            assert result.dropped_stale == []
            assert all(s <= cfg.algo.max_staleness for s in result.staleness)
            batch += [g.group_id for g in result.groups]
            if len(batch) == 6:
                buf.commit(version + 3, batch)
                version, batch, trained = version + 3, [], trained + 6
        buf.report_in_flight("gen-0", [w for _, w in inflight])
    assert buf.stats()["dropped_stale"] == 0 and trained > 0

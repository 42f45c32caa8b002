"""The buffer's own state stays bounded (issue 41 item 5): id horizons per generator process, and
compaction off the poll loop. Every test runs the real `ReplayBuffer` over the real `Journal`."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from stream_dapo.buffer.journal import Journal, JournalError
from stream_dapo.buffer.replay import SENDERS_PER_GENERATOR, GroupState, ReplayBuffer
from stream_dapo.generator.credits import UnackedGroups
from stream_dapo.testing.services import admission_policy
from stream_dapo.transport.messages import Group, Sample

POLICY = admission_policy(
    admission_capacity=1000, capacity_groups=1000, max_staleness=1000, generator_lease_s=30.0
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_group(gid: str, seq: int | None = None) -> Group:
    sample = Sample(
        tokens=np.arange(3, dtype=np.int32),
        logprobs=np.full(3, -0.5, dtype=np.float32),
        versions=np.zeros(3, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, "p", "gen-0", "7", np.array([1, 2], dtype=np.int32), 1.0, [sample, sample], seq=seq)


def open_buffer(path: Path, clock: Clock | None = None) -> tuple[ReplayBuffer, Journal]:
    journal = Journal(path)
    buf = ReplayBuffer.restore(POLICY, journal.load(), journal, clock or Clock())
    return buf, journal


def train(buf: ReplayBuffer, n: int) -> None:
    """The learner takes and commits `n` waiting groups."""
    served = buf.serve(buf.learner_version, n)
    buf.commit(buf.learner_version + 1, [g.group_id for g in served.groups])


def test_a_numbered_resend_is_a_duplicate_before_and_after_its_id_is_forgotten(tmp_path: Path) -> None:
    buf, journal = open_buffer(tmp_path / "state.msgpack")
    buf.generator_hello("gen-0", "A")
    groups = [make_group(f"g{i}", seq=i) for i in range(10)]
    assert buf.add_groups("gen-0", groups, holder="A", acked_below=0).accepted == [f"g{i}" for i in range(10)]
    train(buf, 10)
    assert buf.state_of("g3") is GroupState.COMMITTED and buf.seen_ids == 10
    assert buf.add_groups("gen-0", [groups[3]], holder="A", acked_below=0).duplicates == ["g3"]
    # Acks for 0..9 arrived: the next message says so, and the buffer forgets all ten ids.
    result = buf.add_groups("gen-0", [make_group("g10", seq=10)], holder="A", acked_below=10)
    assert result.accepted == ["g10"] and buf.seen_ids == 1
    assert buf.state_of("g3") is None
    # A resend of g3 that was already on its way (a lost ack, then the ack arrived): still a duplicate.
    assert buf.add_groups("gen-0", [groups[3]], holder="A", acked_below=10).duplicates == ["g3"]
    s = buf.stats()
    assert (s["accepted"], s["duplicates"], s["waiting"]) == (11, 2, 1)
    journal.close()


def test_unnumbered_groups_keep_their_ids_as_before(tmp_path: Path) -> None:
    buf, journal = open_buffer(tmp_path / "state.msgpack")
    buf.generator_hello("gen-0")
    buf.add_groups("gen-0", [make_group("old-a"), make_group("old-b")])
    train(buf, 2)
    assert buf.add_groups("gen-0", [make_group("old-a")], acked_below=100).duplicates == ["old-a"]
    assert buf.seen_ids == 2 and buf.state_of("old-b") is GroupState.COMMITTED
    journal.close()


def test_ids_kept_are_bounded_by_what_the_sender_has_not_had_acknowledged(tmp_path: Path) -> None:
    """5,000 groups through one process whose acks trail its sends by 8 groups: the buffer never
    keeps more than 8 + 4 ids (the batch in the message), and its snapshot does not grow."""
    buf, journal = open_buffer(tmp_path / "state.msgpack")
    buf.generator_hello("gen-0", "A")
    sizes = []
    most = 0
    for start in range(0, 5000, 4):
        batch = [make_group(f"g{i}", seq=i) for i in range(start, start + 4)]
        acked_below = max(0, start - 8)
        assert len(buf.add_groups("gen-0", batch, holder="A", acked_below=acked_below).accepted) == 4
        train(buf, 4)
        most = max(most, buf.seen_ids)
        if start % 1000 == 0:
            sizes.append(journal.compact(buf.snapshot_records()))
    assert most == 12
    assert max(sizes[1:]) - min(sizes[1:]) <= 16  # only the numbers in it change width
    journal.close()


def test_horizons_and_ids_survive_restarts_from_the_snapshot_and_from_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.generator_hello("gen-0", "A")
    buf.add_groups("gen-0", [make_group(f"g{i}", seq=i) for i in range(6)], holder="A", acked_below=0)
    train(buf, 6)
    buf.add_groups("gen-0", [], holder="A", acked_below=4)  # g0..g3 forgotten, g4, g5 kept
    journal.compact(buf.snapshot_records())
    buf.add_groups(
        "gen-0", [make_group("g6", seq=6)], holder="A", acked_below=5
    )  # journal tail: g4 forgotten
    journal.close()
    for _ in range(2):  # from snapshot + journal tail, then from the snapshot the first restore left
        again, journal = open_buffer(path)
        assert again.seen_ids == buf.seen_ids == 2
        assert again.stats() == buf.stats()
        assert again.state_of("g5") is GroupState.COMMITTED and again.state_of("g6") is GroupState.WAITING
        journal.compact(again.snapshot_records())
        journal.close()
    again, journal = open_buffer(path)
    resent = [make_group(f"g{i}", seq=i) for i in (0, 4, 5, 6)]
    result = again.add_groups("gen-0", [*resent, make_group("g7", seq=7)], holder="A", acked_below=5)
    assert result.duplicates == ["g0", "g4", "g5", "g6"] and result.accepted == ["g7"]
    journal.close()


def test_a_holder_retired_by_its_successors_is_refused_and_recent_ones_still_deduplicate(
    tmp_path: Path,
) -> None:
    clock = Clock()
    buf, journal = open_buffer(tmp_path / "state.msgpack", clock)
    holders = [f"H{i}" for i in range(SENDERS_PER_GENERATOR + 1)]
    for holder in holders:
        clock.now += POLICY.generator_lease_s + 1  # the previous holder went silent: its lease ran out
        buf.generator_hello("gen-0", holder)
        buf.add_groups("gen-0", [make_group(f"{holder}-0", seq=0)], holder=holder)
    train(buf, len(holders))
    assert buf.grant_credits("gen-0", 3) == 3  # to H4, the id's holder now
    # H0 lost the id to four successors: the buffer no longer knows what it sent.
    assert buf.add_groups("gen-0", [make_group("H0-1", seq=1)], holder="H0").rejected == [
        ("H0-1", "retired_sender")
    ]
    assert buf.credits_of("gen-0") == 3  # the retired sender's group took none of H4's credits
    # H1 is still one of the last four: its resend is a duplicate, its new group welcome.
    result = buf.add_groups("gen-0", [make_group("H1-0", seq=0), make_group("H1-1", seq=1)], holder="H1")
    assert (result.duplicates, result.accepted) == (["H1-0"], ["H1-1"])
    assert buf.stats()["rejected_groups"] == {"retired_sender": 1}
    journal.close()


def test_background_compaction_keeps_what_was_journaled_while_the_snapshot_was_written(
    tmp_path: Path,
) -> None:
    """The service's order of calls, interleaved by hand: mark, records, journaling goes on, the
    snapshot is written, the covered frames are dropped. A restart in between each step restores the
    same state as the live buffer."""
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.generator_hello("gen-0", "A")
    buf.add_groups("gen-0", [make_group(f"g{i}", seq=i) for i in range(4)], holder="A")
    train(buf, 2)
    mark = journal.begin_compaction()
    records = list(buf.snapshot_records())
    # The loop goes on while the compactor thread writes.
    buf.add_groups("gen-0", [make_group("g4", seq=4), make_group("g0", seq=0)], holder="A", acked_below=1)
    train(buf, 1)
    journal.sync()

    def restored() -> ReplayBuffer:
        reader = Journal(tmp_path / "copy" / "state.msgpack")
        (tmp_path / "copy").mkdir(exist_ok=True)
        for name in ("state.msgpack", "state.msgpack.journal"):
            if (path.parent / name).exists():
                (tmp_path / "copy" / name).write_bytes((path.parent / name).read_bytes())
        try:
            return ReplayBuffer.restore(POLICY, reader.load(), None, Clock())
        finally:
            reader.close()

    def same(other: ReplayBuffer) -> None:
        assert other.stats() == buf.stats()
        assert other.waiting_ids() == buf.waiting_ids() == ["g3", "g4"]
        assert other.seen_ids == buf.seen_ids == 4  # g1..g4: g0 is below the horizon

    journal.write_snapshot(records, mark)
    same(restored())  # crash before the journal is rewritten: the covered frames are skipped
    old = journal.finish_compaction(mark, rotate=True)  # as the service does
    assert old is not None
    old.close()  # the service closes it on its compactor thread
    assert journal.records_since_compaction == 6  # the accept x1, duplicate, horizon, credit, lease, commit
    same(restored())
    buf.add_groups("gen-0", [make_group("g5", seq=5)], holder="A", acked_below=1)
    journal.close()
    again, journal = open_buffer(path)
    assert again.waiting_ids() == ["g3", "g4", "g5"] and again.stats() == buf.stats()
    journal.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dedup_is_exact_over_lost_acks_resends_and_buffer_restarts(tmp_path: Path, seed: int) -> None:
    """A generator's real `UnackedGroups` against the buffer over its journal: acks are lost at
    random, resends follow, the buffer restarts now and then (compacting or not). Every group is
    accepted exactly once, and the buffer never keeps more ids than the generator has unacknowledged
    plus one message's worth."""
    rng = random.Random(seed)
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.generator_hello("gen-0", "A")
    unacked = UnackedGroups(resend_after_s=1.0)
    accepted: list[str] = []
    now = 0.0
    for step in range(600):
        now += 1.0
        fresh = [unacked.number(make_group(f"s{step}-{k}")) for k in range(rng.randint(0, 3))]
        for group in fresh:
            unacked.sent(group, now)
        batch = fresh + unacked.due(now)
        result = buf.add_groups("gen-0", batch, holder="A", acked_below=unacked.acked_below)
        journal.sync()
        accepted += result.accepted
        assert buf.seen_ids <= len(unacked) + len(batch)
        if rng.random() < 0.7:  # the ack arrives
            unacked.ack(result.accepted, result.duplicates, [])
        if buf.num_waiting > 20:
            train(buf, buf.num_waiting - rng.randint(0, 5))
        if rng.random() < 0.05:
            if rng.random() < 0.5:
                journal.compact(buf.snapshot_records())
            journal.close()
            buf, journal = open_buffer(path)
    assert len(accepted) == len(set(accepted))
    numbered = unacked.number(make_group("last")).seq
    assert numbered is not None and len(accepted) == numbered  # every group this process numbered
    journal.close()


def test_the_rewritten_journal_is_still_locked_against_a_second_buffer(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.generator_hello("gen-0", "A")
    mark = journal.begin_compaction()
    records = list(buf.snapshot_records())
    buf.add_groups("gen-0", [make_group("g0", seq=0)], holder="A")  # appended meanwhile: a tail to copy
    journal.write_snapshot(records, mark)
    old = journal.finish_compaction(mark, rotate=True)  # as the service does
    assert old is not None
    old.close()  # the service closes it on its compactor thread
    with pytest.raises(JournalError, match="locked by another process"):
        Journal(path).load()
    journal.close()
    again, journal = open_buffer(path)
    assert again.waiting_ids() == ["g0"]
    journal.close()

"""The buffer's journal and snapshots: durability, torn tails, atomic compaction."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from stream_dapo.buffer.journal import (
    JOURNAL_MAGIC,
    SNAPSHOT_MAGIC,
    Journal,
    JournalDiskFullError,
    JournalError,
)
from stream_dapo.buffer.replay import ReplayBuffer
from stream_dapo.testing.services import admission_policy
from stream_dapo.transport.messages import Group, Sample

REPO = Path(__file__).resolve().parents[2]


def make_group(gid: str, version: int = 0) -> Group:
    sample = Sample(
        tokens=np.arange(4, dtype=np.int32),
        logprobs=np.linspace(-1, 0, 4, dtype=np.float32),
        versions=np.full(4, version, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.25,
    )
    return Group(gid, "p", "gen-0", "7", np.array([5, 6], dtype=np.int32), 3.0, [sample, sample])


POLICY = admission_policy(admission_capacity=10, max_staleness=4)


def open_buffer(path: Path) -> tuple[ReplayBuffer, Journal]:
    journal = Journal(path)
    return ReplayBuffer.restore(POLICY, journal.load(), journal), journal


def records_of(path: Path) -> list[dict]:
    journal = Journal(path)
    try:
        return journal.load()
    finally:
        journal.close()


def test_records_round_trip_through_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    journal = Journal(path)
    assert journal.load() == []
    journal.append({"kind": "version", "learner_version": 3})
    journal.append({"kind": "blob", "data": np.arange(3, dtype=np.int32), "text": "é"})
    assert journal.dirty
    journal.sync()
    assert not journal.dirty
    journal.close()
    got = records_of(path)
    assert got[0] == {"kind": "version", "learner_version": 3}
    np.testing.assert_array_equal(got[1]["data"], np.arange(3, dtype=np.int32))
    assert got[1]["text"] == "é"
    assert Path(f"{path}.journal").read_bytes().startswith(JOURNAL_MAGIC)


def test_buffer_restored_from_its_files_matches_the_live_one(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    live, journal = open_buffer(path)
    live.grant_credits("gen-0", 6)
    live.add_groups("gen-0", [make_group(g, 2) for g in "abcde"], filtered_total=1)
    live.serve(3, max_groups=2)
    journal.compact(live.snapshot_records())
    live.commit(4, ["a"])
    live.add_groups("gen-0", [make_group("a"), make_group("f", 3)])
    live.learner_hello(4, 4)
    journal.sync()
    journal.close()

    restored, journal2 = open_buffer(path)
    assert restored.stats() == live.stats()
    assert restored.waiting_ids() == ["b", "c", "d", "e", "f"] == live.waiting_ids()
    assert restored.credits_of("gen-0") == 0
    assert journal2.report.snapshot_records > 0 and journal2.report.journal_records > 0
    journal2.close()


def test_compaction_empties_the_journal_and_keeps_the_state(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.add_groups("gen-0", [make_group(f"g{i}") for i in range(20)])
    grown = journal.journal_bytes
    size = journal.compact(buf.snapshot_records())
    assert journal.journal_bytes == len(JOURNAL_MAGIC) < grown
    assert journal.records_since_compaction == 0
    assert path.stat().st_size == size and path.read_bytes().startswith(SNAPSHOT_MAGIC)
    assert not path.with_name("state.msgpack.tmp").exists()
    journal.close()
    restored, journal = open_buffer(path)
    assert restored.waiting_ids() == [f"g{i}" for i in range(20)]
    journal.close()


@pytest.mark.parametrize("cut", [1, 7, 16, 17, 40, -1])
def test_truncated_tail_record_is_skipped_with_a_warning(
    tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.msgpack"
    journal = Journal(path)
    journal.load()
    journal.append({"kind": "version", "learner_version": 1})
    journal.sync()
    good_size = journal.journal_bytes
    journal.append({"kind": "version", "learner_version": 2, "pad": "x" * 100})
    journal.sync()
    journal.close()
    journal_path = Path(f"{path}.journal")
    data = journal_path.read_bytes()
    journal_path.write_bytes(data[: good_size + cut] if cut > 0 else data[:-1])  # a crash mid-write

    with caplog.at_level(logging.WARNING, logger="stream_dapo.buffer.journal"):
        journal = Journal(path)
        assert journal.load() == [{"kind": "version", "learner_version": 1}]
    assert "torn or corrupt tail" in caplog.text
    assert journal.report.skipped_tail_bytes > 0
    # The torn bytes are gone: what is appended now is readable after the next restart.
    journal.append({"kind": "version", "learner_version": 3})
    journal.sync()
    journal.close()
    assert records_of(path) == [
        {"kind": "version", "learner_version": 1},
        {"kind": "version", "learner_version": 3},
    ]


def test_corrupt_tail_record_is_detected_by_its_checksum(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    journal = Journal(path)
    journal.load()
    for v in range(3):
        journal.append({"kind": "version", "learner_version": v})
    journal.close()
    journal_path = Path(f"{path}.journal")
    data = bytearray(journal_path.read_bytes())
    data[-1] ^= 0xFF
    journal_path.write_bytes(bytes(data))
    assert records_of(path) == [
        {"kind": "version", "learner_version": 0},
        {"kind": "version", "learner_version": 1},
    ]


def test_garbled_length_is_a_torn_tail_not_a_huge_allocation(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    journal = Journal(path)
    journal.load()
    journal.append({"kind": "version", "learner_version": 0})
    journal.close()
    journal_path = Path(f"{path}.journal")
    # seq 2, length 4 GiB - 1, any checksum: the file ends long before.
    journal_path.write_bytes(
        journal_path.read_bytes() + (2).to_bytes(8, "little") + b"\xff\xff\xff\xff" + b"\0" * 8
    )
    assert records_of(path) == [{"kind": "version", "learner_version": 0}]


def test_frames_the_snapshot_already_holds_are_not_replayed_twice(tmp_path: Path) -> None:
    """A crash between the snapshot's rename and the journal reset leaves both: nothing doubles."""
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.add_groups("gen-0", [make_group("a"), make_group("b")])
    journal.sync()
    journal_path = Path(f"{path}.journal")
    before_reset = journal_path.read_bytes()
    journal.compact(buf.snapshot_records())
    buf.add_groups("gen-0", [make_group("c")])
    journal.sync()
    journal.close()
    # Put the pre-compaction frames back in front of the new one, as if the reset never happened.
    after = journal_path.read_bytes()[len(JOURNAL_MAGIC) :]
    journal_path.write_bytes(before_reset + after)

    restored, journal = open_buffer(path)
    assert restored.waiting_ids() == ["a", "b", "c"]
    assert restored.stats()["accepted"] == 3
    assert journal.report.journal_skipped_covered == 3  # two accepts and one credit record
    journal.close()


def test_leftover_temporary_snapshot_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.add_groups("gen-0", [make_group("a")])
    journal.close()
    tmp = path.with_name("state.msgpack.tmp")
    tmp.write_bytes(SNAPSHOT_MAGIC + b"half a snapshot")  # a compaction killed before its rename
    restored, journal = open_buffer(path)
    assert restored.waiting_ids() == ["a"] and not tmp.exists()
    journal.close()


def test_damaged_snapshot_is_an_error_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.add_groups("gen-0", [make_group("a")])
    journal.compact(buf.snapshot_records())
    journal.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match=rf"snapshot {re.escape(str(path))} is damaged .*move .* aside"):
        Journal(path).load()


def test_files_that_are_not_ours_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    path.write_bytes(b"something else entirely")
    with pytest.raises(JournalError, match="not a stream-dapo buffer snapshot"):
        Journal(path).load()
    path.unlink()
    Path(f"{path}.journal").write_bytes(b"#!/bin/sh\necho hi\n")
    with pytest.raises(JournalError, match="not a stream-dapo buffer journal"):
        Journal(path).load()


def test_a_second_buffer_on_the_same_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.msgpack"
    first = Journal(path)
    first.load()
    with pytest.raises(JournalError, match="locked by another process"):
        Journal(path).load()
    first.close()
    Journal(path).load()


def test_append_before_load_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match=r"call load\(\) first"):
        Journal(tmp_path / "s").append({"kind": "version", "learner_version": 1})


def test_unwritable_location_names_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="buffer.persist_path"):
        Journal(blocker / "sub" / "state.msgpack").load()


@pytest.mark.process
def test_restart_after_kill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """A child process accepts groups and syncs (the point where the service acks), keeps
    appending without syncing, and is killed with SIGKILL: every synced group comes back."""
    path = tmp_path / "state.msgpack"
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_buffer_journal import POLICY, make_group
        from stream_dapo.buffer.journal import Journal
        from stream_dapo.buffer.replay import ReplayBuffer
        journal = Journal({str(path)!r})
        buf = ReplayBuffer.restore(POLICY, journal.load(), journal)
        for i in range(30):
            buf.add_groups("gen-0", [make_group(f"g{{i}}")])
            journal.sync()  # the ack would be sent now
            if i == 14:
                journal.compact(buf.snapshot_records())
        buf.add_groups("gen-0", [make_group("unsynced")])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    restored, journal = open_buffer(path)
    acked = [f"g{i}" for i in range(30)]
    assert restored.waiting_ids()[:30] == acked
    assert restored.stats()["accepted"] >= 30
    journal.close()


def test_journal_files_are_created_with_their_directory(tmp_path: Path) -> None:
    path = tmp_path / "run" / "buffer" / "state.msgpack"
    journal = Journal(path)
    journal.load()
    journal.close()
    assert sorted(os.listdir(path.parent)) == ["state.msgpack.journal"]


# --------------------------------------------------------------------------------------------------
# A full disk (/dev/full behind the journal's file descriptors: every write fails with ENOSPC)
# --------------------------------------------------------------------------------------------------


class FullDisk:
    """Opens files for the journal module and, once `fill()` is called, puts /dev/full behind every
    descriptor it opened for writing (and every one it opens later): writes then fail with ENOSPC
    in the kernel, exactly as on a full disk, while the files stay in place."""

    def __init__(self) -> None:
        self.files: list = []
        self.full = False

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if any(c in mode for c in "wa+"):
            self.files.append(f)
            if self.full:
                self._fill(f)
        return f

    def fill(self) -> None:
        self.full = True
        for f in self.files:
            if not f.closed:
                self._fill(f)

    def free(self) -> None:
        """Space again for files opened from now on."""
        self.full = False

    @staticmethod
    def _fill(f) -> None:
        fd = os.open("/dev/full", os.O_WRONLY)
        try:
            os.dup2(fd, f.fileno())
        finally:
            os.close(fd)


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    from stream_dapo.buffer import journal as journal_module
    from stream_dapo.runtime import disk as disk_module

    disk = FullDisk()
    monkeypatch.setattr(journal_module, "open", disk.open, raising=False)
    monkeypatch.setattr(disk_module, "open", disk.open, raising=False)  # the snapshot's atomic_file
    return disk


def test_a_full_disk_fails_the_sync_naming_the_file_and_close_still_releases_it(
    tmp_path: Path, full_disk: FullDisk
) -> None:
    path = tmp_path / "state.msgpack"
    journal = Journal(path)
    journal.load()
    journal.append({"kind": "version", "learner_version": 1})
    journal.sync()
    full_disk.fill()
    journal.append({"kind": "version", "learner_version": 2})
    with pytest.raises(
        JournalDiskFullError, match=rf"^no space left on {re.escape(str(path))}\.journal .*fsync failed"
    ):
        journal.sync()
    journal.close()  # no second error: the failed write is not retried
    full_disk.free()
    assert records_of(path) == [
        {"kind": "version", "learner_version": 1}
    ]  # what was synced; the lock is released
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.msgpack.journal"]


def test_a_full_disk_during_compaction_keeps_the_old_snapshot_and_removes_the_temporary_file(
    tmp_path: Path, full_disk: FullDisk
) -> None:
    path = tmp_path / "state.msgpack"
    buf, journal = open_buffer(path)
    buf.add_groups("gen-0", [make_group("g0")])
    journal.compact(buf.snapshot_records())
    snapshot = path.read_bytes()
    buf.add_groups("gen-0", [make_group("g1")])
    journal.sync()
    full_disk.fill()
    with pytest.raises(
        JournalDiskFullError, match=rf"^no space left on {re.escape(str(tmp_path))} .*writing snapshot"
    ):
        journal.compact(buf.snapshot_records())
    assert path.read_bytes() == snapshot
    assert not path.with_name("state.msgpack.tmp").exists()
    journal.close()
    full_disk.free()
    restored, journal = open_buffer(path)  # the old snapshot + the journal still hold both groups
    assert restored.waiting_ids() == ["g0", "g1"]
    journal.close()

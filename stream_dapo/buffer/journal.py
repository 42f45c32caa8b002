"""Durable persistence of the replay buffer: an append-only journal plus compacted snapshots.

Files (both in the directory of `buffer.persist_path`)::

    state.msgpack            snapshot: the whole state, replaced atomically (write temp, fsync, rename)
    state.msgpack.journal    every state change since that snapshot, appended and fsynced

Both files start with an 8-byte magic, which carries the format version (`FORMAT_VERSION`), and
then hold frames::

    u64 seq | u32 length | u32 crc32(seq bytes + payload) | payload (msgpack, arrays as raw bytes)

Payloads are encoded with the transport codec's `pack_value` (numpy arrays as dtype + shape + raw
bytes, never pickle): one record each, a map whose "kind" says what it is (see `ReplayBuffer`). Sequence numbers grow across compactions; the snapshot's first frame
records the last sequence number it contains, so journal frames it already covers (left behind
by a crash between the rename and the journal reset) are skipped on load.

Crash behaviour: the service calls `sync()` (flush + fsync) before it acknowledges anything, so
every acknowledged change is in complete frames. A kill -9 or power loss can leave a torn or
garbled frame at the end of the journal; `load()` stops there, logs a warning with the number
of bytes skipped, and truncates the file so that new frames follow the last good one. A damaged
snapshot is different (it was fsynced before the rename): that is an error naming the file.

Compaction off the caller's thread: `begin_compaction` marks where a snapshot ends (its last
sequence number and the journal's size then), `write_snapshot` writes it on any thread (it touches
only the snapshot's files) while the owner goes on appending, and `finish_compaction(rotate=True)`
drops the covered frames by copying the newer ones into a fresh journal, locked, fsynced and renamed
over the old one, and hands back the old file to be closed off the owner's thread (closing it frees
its blocks, what a truncation would have cost). A crash at any point leaves files that `load()` restores: before the snapshot's rename the
old snapshot and the whole journal, after it the new snapshot and a journal whose covered frames are
skipped. `compact` does the three in one call.

Format versions: 1 (up to commit 289e6bd) used one-letter record keys ("k", "g", "t", "v", ...);
2 spells them out ("kind", "group", "accepted_at", "learner_version", ...). Files of version 1 still
load: `load()` renames their keys (`migrate_record`) and compacts at once, so the directory then
holds version 2 only and the old code's files are never appended to.

A full disk: a failed journal write raises `JournalDiskFullError` ("no space left on <file>") and
marks the journal failed, so `close()` releases the file without retrying the write (nothing more
is acknowledged; the frames already synced are the state a restart recovers). A failed snapshot
removes its temporary file and leaves the old snapshot and the journal as they were.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from stream_dapo.runtime.disk import NO_SPACE_ERRNOS, DiskFullError, atomic_file, fsync_dir, no_space_left
from stream_dapo.transport.codec import CodecError, pack_value, unpack_value

__all__ = [
    "FORMAT_VERSION",
    "CompactionMark",
    "JOURNAL_MAGIC",
    "SNAPSHOT_MAGIC",
    "Journal",
    "JournalDiskFullError",
    "JournalError",
    "LoadReport",
    "migrate_record",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
JOURNAL_MAGIC = b"SDAPOJ2\n"
SNAPSHOT_MAGIC = b"SDAPOS2\n"
_OLD_MAGICS = {b"SDAPOJ1\n": 1, b"SDAPOS1\n": 1}
"""Magics of earlier format versions that `load()` still reads (and migrates)."""
_FRAME = struct.Struct("<QII")
_SEQ = struct.Struct("<Q")
_META = "_snapshot"
_END = "_end"

Record = dict[str, Any]

V1_KEYS = {
    "k": "kind",
    "g": "group",
    "t": "accepted_at",
    "v": "learner_version",
    "n": "count",
    "gen": "generator",
    "out": "outstanding",
    "ft": "filtered_total",
    "rid": "request_id",
    "ids": "group_ids",
    "drop": "dropped",
    "reuse": "reused",
    "smax": "max_staleness_served",
    "through": "committed_through",
    "pos": "position",
    "last_commit_rid": "last_commit_request_id",
}
"""Format 1's record keys and what format 2 calls them (the same name in every record kind)."""


def migrate_record(record: Record, version: int) -> Record:
    """A record read from a file of format `version`, as format 2 writes it."""
    if version >= FORMAT_VERSION:
        return record
    out = {V1_KEYS.get(key, key): value for key, value in record.items()}
    if out.get("kind") == "state" and out.get("format") == 1:
        out["format"] = 2  # the state record's only change was its keys
    return out


@dataclass(frozen=True)
class CompactionMark:
    """Where a snapshot being written ends (`Journal.begin_compaction`)."""

    covered: int
    """The last sequence number the snapshot holds."""
    journal_bytes: int
    """The journal's size then: the frames after this offset are newer than the snapshot."""
    records: int
    """Records appended since the previous compaction, then."""


class JournalError(RuntimeError):
    """The state files cannot be read or written; the message names the file and the fix."""


class JournalDiskFullError(JournalError, DiskFullError):
    """A state file could not be written because its disk is full (restart once space is freed)."""


class _BadFrame(Exception):
    """A frame that is torn or corrupt; `offset` is where it starts."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


class LoadReport:
    """What `Journal.load` found."""

    def __init__(self) -> None:
        self.snapshot_records = 0
        self.journal_records = 0
        self.journal_skipped_covered = 0
        self.skipped_tail_bytes = 0
        self.last_seq = 0
        self.migrated_from: int | None = None
        """The older format version the files were in (they were rewritten in the current one)."""

    def __repr__(self) -> str:
        return (
            f"LoadReport(snapshot_records={self.snapshot_records}, journal_records={self.journal_records}, "
            f"skipped_tail_bytes={self.skipped_tail_bytes}, last_seq={self.last_seq})"
        )


def _encode_frame(seq: int, record: Record) -> bytes:
    try:
        payload = pack_value(record)
    except CodecError as exc:
        raise JournalError(f"cannot encode a buffer record of kind {record.get('kind')!r}: {exc}") from exc
    crc = zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq)))
    return _FRAME.pack(seq, len(payload), crc) + payload


def _read_frames(
    f: IO[bytes], start: int, size: int, version: int = FORMAT_VERSION
) -> Iterator[tuple[int, Record, int]]:
    """Yield (seq, record, end offset) from `start` of a file of `size` bytes and format `version`
    (records migrated to the current format); raise _BadFrame at the first bad frame."""
    offset = start
    while True:
        header = f.read(_FRAME.size)
        if not header:
            return
        if len(header) < _FRAME.size:
            raise _BadFrame(offset, f"torn frame header ({len(header)} of {_FRAME.size} bytes)")
        seq, length, crc = _FRAME.unpack(header)
        if offset + _FRAME.size + length > size:
            # Checked before reading: a garbled length must not make us allocate gigabytes.
            raise _BadFrame(offset, f"torn frame: {length} payload bytes announced, the file ends first")
        payload = f.read(length)
        if len(payload) < length:
            raise _BadFrame(offset, f"torn frame: {len(payload)} of {length} payload bytes")
        if zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))) != crc:
            raise _BadFrame(offset, "checksum mismatch")
        try:
            record = unpack_value(payload, max_bytes=max(1, length))
        except CodecError as exc:
            raise _BadFrame(offset, f"undecodable payload ({exc})") from None
        if not isinstance(record, dict):
            raise _BadFrame(offset, "payload is not a record")
        record = migrate_record(record, version)
        if not isinstance(record.get("kind"), str):
            raise _BadFrame(offset, "payload is not a record")
        offset += _FRAME.size + length
        yield seq, record, offset


class Journal:
    """Write-ahead journal + snapshot of the buffer's records (see the module docstring).

    Use: `records = journal.load()` once (it also takes an exclusive lock, so two buffers
    cannot share state files), then `append` records as they happen, `sync()` before replying
    to the message that caused them, and `compact(buffer.snapshot_records())` now and then.
    """

    def __init__(self, snapshot_path: str | Path, journal_path: str | Path | None = None) -> None:
        self.snapshot_path = Path(snapshot_path)
        self.journal_path = (
            Path(journal_path) if journal_path is not None else Path(f"{self.snapshot_path}.journal")
        )
        self._tmp_path = self.snapshot_path.with_name(self.snapshot_path.name + ".tmp")
        self._journal_tmp_path = self.journal_path.with_name(self.journal_path.name + ".tmp")
        self._file: IO[bytes] | None = None
        self._seq = 0
        self._dirty = False
        self._failed = False
        self._size = 0
        self.records_since_compaction = 0
        self.report = LoadReport()

    # ---------------------------------------------------------------------------------- load

    def load(self) -> list[Record]:
        """Open the files (creating them if needed) and return the records to restore from:
        the snapshot's, then the journal's newer ones. Call once, before `append`."""
        if self._file is not None:
            raise JournalError(f"{self.journal_path} is already loaded; load() is called once per Journal")
        self.report = LoadReport()
        try:
            self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(
                f"cannot create {self.snapshot_path.parent}: {exc.strerror}; set buffer.persist_path to a "
                "writable location"
            ) from exc
        for tmp in (self._tmp_path, self._journal_tmp_path):
            # A compaction was interrupted before its rename: the old snapshot + journal are intact.
            tmp.unlink(missing_ok=True)
        records, covered = self._load_snapshot()
        self._open_journal()
        records.extend(self._load_journal(covered))
        self._seq = max(covered, self.report.last_seq)
        self.report.last_seq = self._seq
        if self.report.migrated_from is not None:
            logger.info(
                "%s: state files of format %d, rewriting them in format %d",
                self.snapshot_path,
                self.report.migrated_from,
                FORMAT_VERSION,
            )
            self.compact(records)
        return records

    def _file_version(self, magic: bytes, current: bytes) -> int | None:
        """The format version a file's magic names (None: not a state file of ours)."""
        if magic == current:
            return FORMAT_VERSION
        version = _OLD_MAGICS.get(magic) if magic[:6] == current[:6] else None  # "SDAPOS" / "SDAPOJ"
        if version is not None:
            self.report.migrated_from = version
        return version

    def _load_snapshot(self) -> tuple[list[Record], int]:
        if not self.snapshot_path.exists():
            return [], 0
        fix = (
            f"move {self.snapshot_path} and {self.journal_path} aside to start an empty buffer (the groups "
            "they hold are then lost), or restore them from a backup"
        )
        try:
            with open(self.snapshot_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                version = self._file_version(f.read(len(SNAPSHOT_MAGIC)), SNAPSHOT_MAGIC)
                if version is None:
                    raise JournalError(f"{self.snapshot_path} is not a stream-dapo buffer snapshot; {fix}")
                frames = list(_read_frames(f, len(SNAPSHOT_MAGIC), size, version))
        except _BadFrame as bad:
            raise JournalError(
                f"snapshot {self.snapshot_path} is damaged at byte {bad.offset} ({bad.problem}); {fix}"
            ) from None
        except OSError as exc:
            raise JournalError(f"cannot read {self.snapshot_path}: {exc.strerror}") from exc
        if len(frames) < 2 or frames[0][1]["kind"] != _META or frames[-1][1]["kind"] != _END:
            raise JournalError(
                f"snapshot {self.snapshot_path} is incomplete (no header or end marker); {fix}"
            )
        body = [record for _, record, _ in frames[1:-1]]
        if frames[-1][1].get("count") != len(body):
            raise JournalError(
                f"snapshot {self.snapshot_path} holds {len(body)} records, its end marker says "
                f"{frames[-1][1].get('count')}; {fix}"
            )
        self.report.snapshot_records = len(body)
        return body, int(frames[0][1]["seq"])

    def _open_journal(self) -> None:
        try:
            f = open(self.journal_path, "a+b")  # noqa: SIM115 (kept open; closed in close())
        except OSError as exc:
            raise JournalError(
                f"cannot open {self.journal_path}: {exc.strerror}; set buffer.persist_path to a writable location"
            ) from exc
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            f.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise JournalError(
                    f"{self.journal_path} is locked by another process: another buffer is using this state. "
                    "Stop it, or give this one its own buffer.persist_path"
                ) from exc
            raise
        self._file = f

    def _load_journal(self, covered: int) -> list[Record]:
        f = self._file
        assert f is not None
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(0)
        magic = f.read(len(JOURNAL_MAGIC))
        if size < len(JOURNAL_MAGIC) and JOURNAL_MAGIC.startswith(magic):
            # New, or torn while its header was being written: nothing in it was acknowledged.
            self._truncate(0)
            self._write_raw(JOURNAL_MAGIC)
            self._sync_raw()
            self._size = len(JOURNAL_MAGIC)
            return []
        version = self._file_version(magic, JOURNAL_MAGIC)
        if version is None:
            raise JournalError(
                f"{self.journal_path} is not a stream-dapo buffer journal; move it aside or set "
                "buffer.persist_path to another file"
            )
        records: list[Record] = []
        good = len(JOURNAL_MAGIC)
        last_seq = covered
        try:
            for seq, record, end in _read_frames(f, good, size, version):
                if seq <= last_seq and seq > covered:
                    raise _BadFrame(good, f"sequence number {seq} after {last_seq}")
                good = end
                if seq <= covered:
                    self.report.journal_skipped_covered += 1
                    continue
                last_seq = seq
                records.append(record)
        except _BadFrame as bad:
            skipped = size - bad.offset
            logger.warning(
                "%s: dropping a torn or corrupt tail of %d bytes at byte %d (%s); a crash mid-write "
                "leaves one, and everything acknowledged was synced before it",
                self.journal_path,
                skipped,
                bad.offset,
                bad.problem,
            )
            self.report.skipped_tail_bytes = skipped
            self._truncate(bad.offset)
            self._sync_raw()
            good = bad.offset
        self._size = good
        self.report.journal_records = len(records)
        self.report.last_seq = last_seq
        self.records_since_compaction = len(records)
        return records

    # ---------------------------------------------------------------------------------- append

    def append(self, record: Record) -> None:
        """Buffer one record; it is durable after the next `sync()`."""
        if self._file is None:
            raise JournalError(
                "Journal.append before load(): call load() first (it opens and checks the files)"
            )
        self._seq += 1
        frame = _encode_frame(self._seq, record)
        self._write_raw(frame)
        self._size += len(frame)
        self._dirty = True
        self.records_since_compaction += 1

    def sync(self) -> None:
        """Flush and fsync what was appended. Call before acknowledging it to anyone."""
        if self._dirty:
            self._sync_raw()
            self._dirty = False

    @property
    def dirty(self) -> bool:
        """Records appended but not yet synced."""
        return self._dirty

    @property
    def journal_bytes(self) -> int:
        return self._size

    @property
    def last_seq(self) -> int:
        return self._seq

    # ---------------------------------------------------------------------------------- compact

    def compact(self, records: Iterable[Record]) -> int:
        """Write `records` (the whole current state) as the new snapshot, atomically, then empty
        the journal. Returns the snapshot's size in bytes. The three steps in one call; a service
        that must not stall runs `write_snapshot` on another thread (see `begin_compaction`)."""
        mark = self.begin_compaction()
        size = self.write_snapshot(records, mark)
        old = self.finish_compaction(mark)
        if old is not None:
            old.close()
        return size

    def begin_compaction(self) -> CompactionMark:
        """Sync, and mark where a snapshot of the state as of now ends. Then: take the state's
        records now (`ReplayBuffer.snapshot_records`, as a list), hand them to `write_snapshot`, which
        may run on another thread while this one goes on appending, and call `finish_compaction`
        with the mark once it returned."""
        if self._file is None:
            raise JournalError("Journal compaction before load(): call load() first")
        self.sync()
        return CompactionMark(self._seq, self._size, self.records_since_compaction)

    def write_snapshot(self, records: Iterable[Record], mark: CompactionMark) -> int:
        """Write the snapshot of the state as of `mark`, atomically (temp file, fsync, rename).
        Touches only the snapshot's files, never the journal's: safe on another thread while the
        journal is appended to. Returns its size in bytes. Until `finish_compaction`, the journal
        still holds the frames the snapshot covers; `load()` skips them."""
        covered = mark.covered
        n = 0
        try:
            with atomic_file(self.snapshot_path, tmp=self._tmp_path, sync_dir=True) as f:
                f.write(SNAPSHOT_MAGIC)
                f.write(_encode_frame(covered, {"kind": _META, "seq": covered, "created": time.time()}))
                for record in records:
                    f.write(_encode_frame(covered, record))
                    n += 1
                f.write(_encode_frame(covered, {"kind": _END, "count": n}))
                return f.tell()
        except OSError as exc:
            if exc.errno in NO_SPACE_ERRNOS:
                raise JournalDiskFullError(
                    f"{no_space_left(self.snapshot_path.parent)} writing snapshot {self.snapshot_path}; the "
                    "previous snapshot and the journal still hold everything: free space there and restart "
                    "the buffer",
                    self.snapshot_path.parent,
                ) from exc
            raise JournalError(
                f"cannot write snapshot {self.snapshot_path}: {exc.strerror}; free disk space or fix "
                "permissions (the journal still holds everything)"
            ) from exc

    def finish_compaction(self, mark: CompactionMark, *, rotate: bool = False) -> IO[bytes] | None:
        """The snapshot of `mark` is in place: drop the journal frames it covers and keep the ones
        appended since. In place (the default) when none were: truncate and a fresh magic, which
        costs time in proportion to the journal's size (about 14 ms for 32 MB here). With `rotate`,
        or when frames were appended since `mark`, the newer frames are copied into a fresh journal,
        locked, fsynced and renamed over the old one, which costs what was appended since `mark`; the
        old journal's file is returned open: closing it frees its blocks (the truncation's cost), so
        a caller that must not stall closes it on another thread. A crash before the rename leaves
        the old journal, whose covered frames `load()` skips."""
        if self._file is None:
            raise JournalError("Journal compaction before load(): call load() first")
        self.sync()
        self.records_since_compaction -= mark.records
        if rotate or self._size != mark.journal_bytes:
            return self._replace_with_tail(mark.journal_bytes)
        self._truncate(0)  # and a fresh magic: the journal may be of an older format
        self._write_raw(JOURNAL_MAGIC)
        # Not fsynced here: until the next sync() a crash leaves the old frames, which the snapshot
        # covers and load() skips, or an empty or magic-only journal, which load() starts afresh;
        # sync() runs before anything new is acknowledged.
        self._dirty = True
        self._size = len(JOURNAL_MAGIC)
        return None

    def _replace_with_tail(self, offset: int) -> IO[bytes]:
        """Replace the journal by one holding its frames from `offset` on; returns the old file."""
        old = self._file
        assert old is not None
        try:
            old.seek(offset)
            tail = old.read(self._size - offset)
            new = open(self._journal_tmp_path, "w+b")  # noqa: SIM115 (becomes self._file)
        except OSError as exc:
            raise self._io_error("rewrite", exc) from exc
        try:
            fcntl.flock(new.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            new.write(JOURNAL_MAGIC)
            new.write(tail)
            new.flush()
            os.fsync(new.fileno())
            os.replace(self._journal_tmp_path, self.journal_path)
            fsync_dir(self.journal_path.parent)
        except OSError as exc:
            new.close()
            self._journal_tmp_path.unlink(missing_ok=True)
            raise self._io_error("rewrite", exc) from exc
        self._file = new
        self._size = len(JOURNAL_MAGIC) + len(tail)
        return old

    def close(self) -> None:
        """Sync and close (releases the lock). Safe to call twice. After a failed write it only
        releases the file: the write already failed once and was reported."""
        if self._file is None:
            return
        try:
            if not self._failed:
                self.sync()
        finally:
            file, self._file = self._file, None
            try:
                file.close()  # closes the descriptor (and the lock) even when its final flush fails
            except OSError:
                if not self._failed:
                    raise

    # ---------------------------------------------------------------------------------- raw I/O

    def _write_raw(self, data: bytes) -> None:
        assert self._file is not None
        try:
            self._file.write(data)
        except OSError as exc:
            raise self._io_error("write", exc) from exc

    def _sync_raw(self) -> None:
        assert self._file is not None
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._io_error("fsync", exc) from exc

    def _truncate(self, size: int) -> None:
        assert self._file is not None
        try:
            self._file.flush()
            os.ftruncate(self._file.fileno(), size)
            self._file.seek(size)
        except OSError as exc:
            raise self._io_error("truncate", exc) from exc

    def _io_error(self, what: str, exc: OSError) -> JournalError:
        """The error for a failed write, fsync or truncate; the journal is failed from now on."""
        self._failed = True
        restart = "restart the buffer: it recovers everything it acknowledged from the journal"
        if exc.errno in NO_SPACE_ERRNOS:
            return JournalDiskFullError(
                f"{no_space_left(self.journal_path)}: {what} failed; free space there and {restart}",
                self.journal_path,
            )
        return JournalError(
            f"cannot {what} {self.journal_path}: {exc.strerror}; free disk space or fix permissions and {restart}"
        )

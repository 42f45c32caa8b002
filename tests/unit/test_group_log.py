"""The generator's group log: one JSON line per judged group, and a failed write stops only the log."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import pytest

from stream_dapo.generator.group_log import GroupLog, GroupRecord, read_group_log


def record(i: int, *, correct: int, kept: bool) -> GroupRecord:
    outcome = "mixed" if kept else ("all_correct" if correct == 8 else "all_wrong")
    return GroupRecord(
        f"g-{i}", f"p-{i % 2}", version=i, size=8, correct=correct, truncated=1, outcome=outcome, kept=kept
    )


def test_each_record_is_one_line_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "generators" / "generator-0.groups.jsonl"  # the folder does not exist yet
    log = GroupLog(path)
    written = [
        record(0, correct=0, kept=False),
        record(1, correct=3, kept=True),
        record(2, correct=8, kept=False),
    ]
    for r in written:
        log.write(r)
    log.close()
    back = list(read_group_log(path))
    assert len(path.read_text().splitlines()) == 3
    assert [{k: v for k, v in r.items() if k != "t"} for r in back] == [asdict(r) for r in written]
    assert all(isinstance(r["t"], float) for r in back)
    # appended, not truncated, by a restarted generator
    log = GroupLog(path)
    log.write(record(3, correct=5, kept=True))
    log.close()
    assert [r["group_id"] for r in read_group_log(path)] == ["g-0", "g-1", "g-2", "g-3"]


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    log = GroupLog(path)
    log.write(record(0, correct=2, kept=True))
    log.close()
    with path.open("a") as f:
        f.write('{"t": 1.0, "group_id": "g-1", "prom')
    assert [r["group_id"] for r in read_group_log(path)] == ["g-0"]


def test_a_write_that_fails_warns_once_and_stops_the_log_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "generators"
    blocker.write_text("a file where the log's folder should be")
    log = GroupLog(blocker / "generator-0.groups.jsonl")
    with caplog.at_level(logging.WARNING, logger="stream_dapo.generator"):
        for i in range(3):
            log.write(record(i, correct=1, kept=True))  # no exception reaches the generator
    log.close()
    warnings = [r.getMessage() for r in caplog.records if "group log" in r.getMessage()]
    assert len(warnings) == 1 and "generator.group_log = false" in warnings[0]
    assert blocker.read_text() == "a file where the log's folder should be"

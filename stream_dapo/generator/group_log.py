"""Every judged group, one JSON line each: which prompts a run trains on and which it filters.

Dynamic sampling drops a group whose samples are all right or all wrong, and the metrics count those
groups, not their prompts. When a run stalls on a kind of prompt (too hard: every group all wrong;
too easy: all correct), the counts do not say which kind. With ``generator.group_log`` on (the
default) each generator appends one line per group the verifier judged to
``run.out_dir/generators/<generator id>.groups.jsonl``::

    {"t": 1765000000.1, "group_id": "...", "prompt_id": "...", "version": 12, "size": 8,
     "correct": 3, "truncated": 0, "outcome": "mixed", "kept": true}

``prompt_id`` is the prompt's stable id (`stream_dapo.data.dataset.prompt_id_of` of its messages), so
the lines join back to the data file's rows and their ``extra_info`` (a template, a difficulty, a
source); ``version`` is the policy version the group started on; ``outcome`` is the group's class
(``mixed``, ``all_correct``, ``all_wrong``) and ``kept`` whether it went to the buffer. A line is about
120 bytes: a generator judging one group a second writes 10 MB a day.

The log is a record, not a delivery path: a write that fails (a full disk, a removed directory) is
logged once and the log stops, and the generator goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger("stream_dapo.generator")


@dataclass(frozen=True)
class GroupRecord:
    """One line of the log."""

    group_id: str
    prompt_id: str
    version: int
    size: int
    correct: int
    truncated: int
    outcome: str
    kept: bool
    source: str = "default"
    """The run's data source of the prompt."""
    mean_score: float | None = None
    """The mean of the group's scores before shaping (its reward's own scale)."""

    def line(self, t: float) -> str:
        return json.dumps({"t": round(t, 3), **asdict(self)}, separators=(",", ":")) + "\n"


class GroupLog:
    """Appends `GroupRecord`s to one file; opened on the first write, flushed per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._failed = False

    def write(self, record: GroupRecord) -> None:
        if self._failed:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(record.line(time.time()))
            self._file.flush()
        except OSError as exc:
            self._failed = True
            log.warning(
                "cannot write the group log %s (%s): it stops here, the generator goes on; free the disk "
                "or set generator.group_log = false",
                self.path,
                exc,
            )
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # a failed flush on close: the lines before it are on disk, nothing to do
            self._file = None


def read_group_log(path: Path) -> Iterator[dict]:
    """The records of a group log; a line cut short by a crash (the last one) is skipped."""
    with path.open(encoding="utf-8") as f:
        for raw in f:
            try:
                yield json.loads(raw)
            except ValueError:
                continue

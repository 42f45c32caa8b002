"""Read a W&B offline run file (`run-<id>.wandb`) back with W&B's own protobuf schema.

wandb 0.31 ships no Python reader of its transaction log (its core process, in Go, writes it). The
file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks
of chunks, each `crc32c (4) | length (2, LE) | type (1: full, 2: first, 3: middle, 4: last) | data`;
a record is one full chunk or first + middle... + last; a block tail shorter than a chunk header is
padding. Each record's bytes are a `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data.startswith(HEADER), f"{path} is not a W&B transaction log (header {data[:7]!r})"
    pos = len(HEADER)
    pending = b""
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        pos += CHUNK_HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == 0 and length == 0:  # zero padding at the end of a block or file
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = pb.Record()  # type: ignore[attr-defined]  # built at import (no stub names it)
            record.ParseFromString(pending)
            yield record
            pending = b""


def finished_records(path: Path, deadline_s: float = 120.0) -> list[Any]:
    """The file's records once it holds both the `run` record and the `exit` record that closes the
    log. `run.finish()` can return while W&B's core process still holds the tail of the log in its
    write buffer (seen under load: a file with no `run` record yet), so this waits for the records
    the readers need, not for a time; the deadline only turns a run that never finishes into a
    clear failure."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            found = list(records(path)) if path.is_file() and path.stat().st_size > len(HEADER) else []
        except Exception:  # a chunk still being written: read again
            found = []
        kinds = [r.WhichOneof("record_type") for r in found]
        if "exit" in kinds and "run" in kinds:
            return found
        assert time.monotonic() < give_up, f"{path} has no exit record after {deadline_s} s: {kinds}"
        time.sleep(0.1)


def read_offline_run(run_dir: Path) -> dict[str, Any]:
    """{'history': [{key: value, '_step': step}], 'config': {key: value}, 'tags': [...], 'name': ...}
    of the one `run-*.wandb` file in `run_dir` (an `offline-run-*` folder), once W&B has closed it."""
    give_up = time.monotonic() + 120.0
    while not (found := sorted(run_dir.glob("run-*.wandb"))):  # W&B's service may not have created it yet
        assert time.monotonic() < give_up, f"no run-*.wandb file in {run_dir} after 120 s"
        time.sleep(0.1)
    (path,) = found
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    run: dict[str, Any] = {}
    for record in finished_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                for item in record.history.item
            }
            row.setdefault("_step", record.history.step.num)
            history.append(row)
        elif kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            run = {
                "id": record.run.run_id,
                "name": record.run.display_name,
                "project": record.run.project,
                "tags": list(record.run.tags),
            }
            for item in record.run.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return {"history": history, "config": config, **run}

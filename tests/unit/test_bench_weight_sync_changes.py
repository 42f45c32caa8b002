"""bench/perf/weight_sync.py's changed-bytes figures on hand-made versions (no run): the bytes that
differ, counted by hand, and what the real server and receiver sent for them."""

from __future__ import annotations

import torch

from bench.perf.weight_sync import CHUNK, _changes
from stream_dapo.weights import serialize_weights

ELEMENTS = CHUNK // 4  # one chunk of fp32 per tensor


def _versions() -> list[tuple[int, bytes]]:
    """Three tensors of zeros, 12 MiB in all: version 1 sets a[:100] to 1.0, version 2 changes nothing
    but its number, which is not in the image."""
    zeros = {name: torch.zeros(ELEMENTS) for name in ("a", "b", "c")}
    one = {**zeros, "a": zeros["a"].clone()}
    one["a"][:100] = 1.0
    return [
        (0, serialize_weights(zeros, 0).data),
        (1, serialize_weights(one, 1).data),
        (2, serialize_weights(one, 2).data),
    ]


def test_changed_bytes_are_counted_and_only_the_changed_chunk_is_sent() -> None:
    images = _versions()
    out = _changes(images)
    for dtype, elem_bytes in (("fp32", 4), ("bf16", 2)):
        rows = out[dtype]
        assert [(r["from"], r["to"]) for r in rows] == [(0, 1), (1, 2)]
        size = rows[0]["bytes"]
        # 1.0 is 00 00 80 3f in fp32 and 80 3f in bf16: two bytes per element differ from 0.0, in
        # either dtype, and nothing else: the image does not carry its version.
        assert 3 * ELEMENTS * elem_bytes < size < 3 * ELEMENTS * elem_bytes + 1024
        assert round(rows[0]["changed_byte_fraction"] * size) == 2 * 100
        assert rows[1]["changed_byte_fraction"] == 0.0
        chunks = -(-size // CHUNK)
        # a[:100] lies in the first chunk: it alone goes (as a delta: a chunk of XOR zeros but 200
        # bytes compresses), every other chunk is the base's; the same state again sends no chunk.
        assert rows[0]["chunks"] == {"reused": chunks - 1, "delta": 1, "raw": 0}, (dtype, rows[0])
        assert 0 < rows[0]["sent_bytes"] < CHUNK // 100
        assert rows[1]["chunks"] == {"reused": chunks, "delta": 0, "raw": 0}, (dtype, rows[1])
        for r in rows:
            assert r["sent_fraction"] == r["sent_bytes"] / size

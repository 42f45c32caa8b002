"""bench/perf/weight_sync.py's changed-bytes figures on hand-made versions (no run): the bytes that
differ, counted by hand, and what the real server and receiver sent for them."""

from __future__ import annotations

import torch

from bench.perf.weight_sync import CHUNK, _changes
from stream_dapo.weights import serialize_weights

ELEMENTS = CHUNK // 4  # one chunk of fp32 per tensor
# {"stream_dapo_version":"1","format":"pt"} against {"format":"pt","stream_dapo_version":"2"}: the
# bytes that differ between the two orders, the version digit's included.
HEADER_KEYS_SWAPPED = 33


def _versions() -> list[tuple[int, bytes]]:
    """Three tensors of zeros, 12 MiB in all: version 1 sets a[:100] to 1.0, version 2 changes nothing
    but its number (the header's one digit)."""
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
        # either dtype. The header adds its version digit, or 33 bytes where the two images write
        # their two metadata keys in opposite orders (safetensors keeps metadata in a hash map).
        assert 3 * ELEMENTS * elem_bytes < size < 3 * ELEMENTS * elem_bytes + 1024
        assert round(rows[0]["changed_byte_fraction"] * size) - 2 * 100 in (1, HEADER_KEYS_SWAPPED)
        assert round(rows[1]["changed_byte_fraction"] * size) in (1, HEADER_KEYS_SWAPPED)
        chunks = -(-size // CHUNK)
        for r in rows:
            # The header and a[:100] both lie in the first chunk: it alone goes (as a delta, a
            # chunk of XOR zeros but a few bytes compresses), every other chunk is the base's.
            assert r["chunks"] == {"reused": chunks - 1, "delta": 1, "raw": 0}, (dtype, r)
            assert 0 < r["sent_bytes"] < CHUNK // 100
            assert r["sent_fraction"] == r["sent_bytes"] / size

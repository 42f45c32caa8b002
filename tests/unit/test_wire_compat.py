"""Messages on the wire are byte-for-byte what the code before the msgspec structs sent.

`tests/data/formats_289e6bd/wire/` holds one message of every type (`stream_dapo.testing.golden`)
encoded by the code at 289e6bd (hand-rolled schemas and msgpack-python). The structs must encode
the same messages to the same bytes (so an old peer decodes them) and decode the old bytes to equal
structs (so they decode an old peer's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dapo.testing.golden import golden_messages
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import decode, encode

WIRE = Path(__file__).resolve().parents[1] / "data" / "formats_289e6bd" / "wire"
GOLDEN = golden_messages()


def test_every_message_type_has_a_golden_message() -> None:
    assert {body.TYPE for body, _ in GOLDEN.values()} == set(m.MESSAGES)
    assert {p.stem for p in WIRE.glob("*.msgpack")} == set(GOLDEN)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_structs_encode_the_old_bytes(name: str) -> None:
    body, request_id = GOLDEN[name]
    assert encode(body, request_id) == (WIRE / f"{name}.msgpack").read_bytes()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_old_bytes_decode_to_equal_structs(name: str) -> None:
    body, request_id = GOLDEN[name]
    msg = decode((WIRE / f"{name}.msgpack").read_bytes(), max_bytes=1 << 20)
    assert (msg.type, msg.request_id) == (body.TYPE, request_id)
    assert type(msg.body) is type(body)
    assert msg.body == body


def test_a_sha256_manifest_is_sent_as_before_and_a_blake3_one_names_its_digest() -> None:
    digests = [bytes([i]) * 32 for i in range(3)]
    old = m.WeightsManifest.of(7, "ab" * 32, 10, 4, chunk_digests=digests, state_checksum="cd" * 32)
    assert old.digest == "sha256" and b"\xa6digest" not in encode(old)  # as servers before the field sent it
    new = m.WeightsManifest.of(
        7, "ab" * 32, 10, 4, chunk_digests=digests, state_checksum="cd" * 32, digest="blake3"
    )
    wire = encode(new)
    assert wire.endswith(b"\xa6digest\xa6blake3")  # the last field, after the ones older peers know
    assert decode(wire, max_bytes=1 << 20).body == new
    assert decode(encode(old), max_bytes=1 << 20).body.digest == "sha256"

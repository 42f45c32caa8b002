"""Streaming weight transfer over ZeroMQ (issue 38): windowed chunk fetch into memory, per-chunk and
full-state checks, deltas against a held version, and the safetensors view the engine loads from."""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
import zmq
from safetensors.torch import load, save

from stream_dapo.transport import messages
from stream_dapo.transport.codec import decode, encode
from stream_dapo.weights import ChecksumMismatch, WeightServer, serialize_weights
from stream_dapo.weights.delta import (
    DeltaError,
    DigestName,
    HeldWeights,
    apply_xor_delta,
    chunk_digest,
    chunk_digests,
    state_checksum,
    xor_delta,
)
from stream_dapo.weights.image import WeightImage
from stream_dapo.weights.safetensors_view import SafetensorsError, check_header, tensors_from_buffer
from stream_dapo.weights.zmq_chunks import (
    StreamedVersion,
    ZmqWeightSource,
    connect_weight_server,
    fetch_weights_stream,
)

CHUNK = 4096


def state(seed: int) -> dict[str, torch.Tensor]:
    """fp32, bf16 and an int64 buffer: 64 KiB + 32 KiB + 1 KiB of tensors."""
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(128, 128, generator=g),
        "b.weight": torch.randn(128, 128, generator=g).to(torch.bfloat16),
        "c.positions": torch.arange(128),
    }


def step(sd: dict[str, torch.Tensor], g: torch.Generator, fraction: float = 0.01) -> dict[str, torch.Tensor]:
    """A small optimizer-like step: ``fraction`` of a.weight and b.weight moved by 1e-3 relative; c never."""
    out = {}
    for name, t in sd.items():
        if not t.is_floating_point():
            out[name] = t.clone()
            continue
        mask = torch.rand(t.shape, generator=g) < fraction
        moved = t.float() * (1 + 1e-3 * torch.randn(t.shape, generator=g))
        out[name] = torch.where(mask, moved, t.float()).to(t.dtype)
    return out


@pytest.fixture
def server() -> Iterator[WeightServer]:
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as srv:
        yield srv


def fetch(
    address: str, have: int, base: HeldWeights | None = None, window: int = 4
) -> StreamedVersion | None:
    ep = connect_weight_server(address)
    try:
        return fetch_weights_stream(ep, have, 5.0, base=base, window=window, retries=1)
    finally:
        ep.close()


def held(got: StreamedVersion) -> HeldWeights:
    assert got.data is not None
    return HeldWeights(got.version, got.data.view, got.digests, got.chunk_bytes, owner=got.data)


# --------------------------------------------------------------------------------------------------
# Whole versions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 64])
def test_a_windowed_stream_assembles_the_published_bytes_exactly(server: WeightServer, window: int) -> None:
    payload = serialize_weights(state(0), 5)
    server.publish(payload)
    n = -(-payload.total_bytes // CHUNK)
    got = fetch(server.address, have=-1, window=window)
    assert got is not None and got.version == 5 and got.data is not None
    assert bytes(got.data) == payload.data
    assert (got.raw_chunks, got.delta_chunks, got.reused_chunks, got.retried_chunks) == (n, 0, 0, 0)
    assert got.wire_bytes == payload.total_bytes == server.stats["bytes"]
    assert server.stats["chunks"] == n
    assert got.digests == [
        blake3.blake3(payload.data[i : i + CHUNK]).digest() for i in range(0, len(payload.data), CHUNK)
    ]
    # Holding it, there is nothing to fetch; with nothing published, there is nothing at all.
    again = fetch(server.address, have=5)
    assert again is not None and again.data is None and server.stats["chunks"] == n
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as empty:
        assert fetch(empty.address, have=-1) is None


def _query(address: str) -> messages.Body:
    """The weight server's answer to one weights query."""
    ep = connect_weight_server(address)
    try:
        ep.send(messages.WeightsQuery(0), request_id=1)
        got = ep.recv(5000)
    finally:
        ep.close()
    assert got is not None
    return got[1].body


def test_the_manifest_carries_chunk_digests_and_the_full_state_checksum(server: WeightServer) -> None:
    payload = serialize_weights(state(1), 2)
    server.publish(payload)
    manifest = _query(server.address)
    assert isinstance(manifest, messages.WeightsManifest)
    digests = [
        blake3.blake3(payload.data[i : i + CHUNK]).digest() for i in range(0, payload.total_bytes, CHUNK)
    ]
    assert manifest.digest == "blake3"
    assert manifest.chunk_digests == digests
    assert manifest.state_checksum == hashlib.sha256(b"".join(digests)).hexdigest()
    assert manifest.checksum == hashlib.sha256(payload.data).hexdigest()
    assert manifest.published_at > 0


def test_a_server_with_sha256_digests_as_before_blake3_is_fetched_bit_for_bit() -> None:
    payload = serialize_weights(state(2), 3)
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK, digest="sha256") as old:
        old.publish(payload)
        # The manifest servers sent before the digest field: no "digest" key on the wire.
        assert b"\xa6digest" not in encode(_query(old.address))
        got = fetch(old.address, have=-1)
    assert got is not None and got.data is not None and bytes(got.data) == payload.data
    assert got.digests == [
        hashlib.sha256(payload.data[i : i + CHUNK]).digest() for i in range(0, payload.total_bytes, CHUNK)
    ]


# --------------------------------------------------------------------------------------------------
# Deltas
# --------------------------------------------------------------------------------------------------


def test_a_hundred_deltas_in_a_row_reproduce_every_version_bit_for_bit(server: WeightServer) -> None:
    g = torch.Generator().manual_seed(0)
    sd = state(0)
    first = serialize_weights(sd, 0)
    server.publish(first)
    got = fetch(server.address, have=-1)
    assert got is not None and got.data is not None and bytes(got.data) == first.data
    base = held(got)
    sent_before = server.stats["bytes"]
    full = wire = reused = deltas = 0
    for version in range(1, 101):
        sd = step(sd, g)
        payload = serialize_weights(sd, version)
        server.publish(payload)
        got = fetch(server.address, have=version - 1, base=base)
        assert got is not None and got.version == version and got.data is not None
        assert bytes(got.data) == payload.data, f"version {version} drifted"
        assert got.retried_chunks == 0
        base = held(got)  # the next delta is against what we assembled, not what was published
        full += payload.total_bytes
        wire += got.wire_bytes
        reused += got.reused_chunks
        deltas += got.delta_chunks
    # After 100 deltas the tensors are exactly the learner's.
    final = load(bytes(base.data))
    for name, t in sd.items():
        assert torch.equal(final[name], t), name
    # c.positions (1 KiB) and the header never change, so their chunks are never asked for; the
    # changed ones mostly come as deltas, and the whole chain moves a small part of the bytes.
    assert reused >= 100
    assert deltas > 0
    assert wire == server.stats["bytes"] - sent_before
    assert wire < 0.5 * full


def test_the_first_delta_request_prepares_every_changed_chunk_and_a_full_fetch_prepares_none(
    server: WeightServer,
) -> None:
    g = torch.Generator().manual_seed(3)
    v1 = serialize_weights(state(0), 1)
    v2 = serialize_weights(step(state(0), g), 2)
    server.publish(v1)
    got = fetch(server.address, have=-1)
    assert got is not None and got.version == 1
    server.publish(v2)
    # A receiver without a base fetches it whole: nothing is compressed for it.
    whole = fetch(server.address, have=-1)
    assert whole is not None and whole.data is not None and bytes(whole.data) == v2.data
    assert server.prepared_deltas(2, 1) == []
    d1, d2 = chunk_digests(v1.data, CHUNK), chunk_digests(v2.data, CHUNK)
    changed = [i for i, (a, b) in enumerate(zip(d1, d2, strict=True)) if a != b]
    assert 0 < len(changed) < len(d2)
    before = server.stats["delta_bytes"]
    delta = fetch(server.address, have=1, base=held(got))
    assert delta is not None and delta.data is not None and bytes(delta.data) == v2.data
    # Exactly the chunks that differ (the ones a receiver holding version 1 asks for) were prepared,
    # and what went out is what xor_delta makes of each (raw where that is smaller).
    assert server.prepared_deltas(2, 1) == changed
    expected = [
        xor_delta(v2.data[i * CHUNK : (i + 1) * CHUNK], v1.data[i * CHUNK : (i + 1) * CHUNK]) for i in changed
    ]
    sizes = [len(e) for e in expected if e is not None]
    assert delta.delta_chunks == len(sizes) > 0 and delta.raw_chunks == len(changed) - len(sizes)
    assert server.stats["delta_bytes"] - before == sum(sizes)
    # An older lineage published after (the learner resumed): the deltas of versions no longer
    # served are forgotten.
    server.publish(serialize_weights(state(5), 1))
    assert server.prepared_deltas(2, 1) == []


def test_a_receiver_without_a_usable_base_gets_the_full_image(server: WeightServer) -> None:
    g = torch.Generator().manual_seed(1)
    v1 = serialize_weights(state(0), 1)
    server.publish(v1)
    got = fetch(server.address, have=-1)
    assert got is not None
    mine = held(got)
    # Another lineage reuses version number 1 (the learner resumed from an older checkpoint and moved
    # on): a base named 1 with other content must not be used as the server's version 1.
    other = serialize_weights(step(state(7), g), 1)
    other_digests = chunk_digests(other.data, CHUNK)
    foreign = HeldWeights(1, bytearray(other.data), other_digests, CHUNK)
    v2 = serialize_weights(step(state(0), g), 2)
    server.publish(v2)
    got = fetch(server.address, have=1, base=foreign)
    assert got is not None and got.data is not None and bytes(got.data) == v2.data
    assert got.delta_chunks == 0 and got.retried_chunks == 0
    # A base the server no longer keeps (keep=2: version 1 is gone after 3) also gets raw chunks.
    server.publish(serialize_weights(step(state(0), g), 3))
    v4 = serialize_weights(step(state(0), g), 4)
    server.publish(v4)
    got = fetch(server.address, have=1, base=mine)
    assert got is not None and got.data is not None and bytes(got.data) == v4.data
    assert got.delta_chunks == 0 and got.retried_chunks == 0


def test_the_source_keeps_what_it_loaded_as_the_next_base_and_follows_an_older_lineage(
    server: WeightServer,
) -> None:
    g = torch.Generator().manual_seed(2)

    class Engine:
        def __init__(self) -> None:
            self.loaded: list[tuple[int, bytes]] = []

        def update_weights_from_image(self, image: WeightImage, version: int) -> float:
            self.loaded.append((version, bytes(image)))
            return 0.0

    engine = Engine()
    source = ZmqWeightSource(server.address, 5.0, None, window=2)
    sd = state(0)
    try:
        payloads = []
        for version in (1, 2):
            sd = step(sd, g)
            payloads.append(serialize_weights(sd, version))
            server.publish(payloads[-1])
            update = source(version - 1)
            assert (
                update is not None and update.version == version and update.nbytes == payloads[-1].total_bytes
            )
            source.load(engine, update)  # type: ignore[arg-type]
            assert source.latest_seen == version
        first, second = engine.loaded
        assert first == (1, payloads[0].data) and second == (2, payloads[1].data)
        # The first update came whole, the second as a delta against the first.
        assert update is not None
        assert update.wire_bytes is not None and update.wire_bytes < update.nbytes / 2
        # The learner resumes from version 1's checkpoint with other weights: follow it, in full.
        resumed = serialize_weights(state(9), 1)
        server.publish(resumed)
        update = source(2)
        assert update is not None and update.version == 1 and update.wire_bytes == resumed.total_bytes
        source.load(engine, update)  # type: ignore[arg-type]
        assert engine.loaded[-1] == (1, resumed.data)
    finally:
        source.close()


# --------------------------------------------------------------------------------------------------
# Corruption on the wire: a relay between the two ends that damages chunk replies
# --------------------------------------------------------------------------------------------------


class CorruptingRelay:
    """A ROUTER the receiver connects to, forwarding to the weight server through a DEALER, which
    flips one byte of the data of the chunk replies ``damage(index, attempt)`` selects."""

    def __init__(self, server_address: str, damage: Callable[[int, int], bool]) -> None:
        self.damage = damage
        self.seen: dict[int, int] = {}
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.bind("tcp://127.0.0.1:0")
        self.address = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.back = self.ctx.socket(zmq.DEALER)
        self.back.connect(server_address)
        self.stop = threading.Event()
        self.client: bytes | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        while not self.stop.is_set():
            for sock, _ in poller.poll(20):
                if sock is self.front:
                    self.client, data = self.front.recv_multipart()
                    self.back.send(data)
                else:
                    data = self.back.recv()
                    assert self.client is not None  # a reply answers a request the front forwarded
                    self.front.send_multipart([self.client, self.tamper(data)])

    def tamper(self, data: bytes) -> bytes:
        msg = decode(data, max_bytes=1 << 26)
        body = msg.body
        if not isinstance(body, messages.Chunk):
            return data
        attempt = self.seen.get(body.index, 0)
        self.seen[body.index] = attempt + 1
        if not self.damage(body.index, attempt):
            return data
        bad = bytearray(body.data)
        bad[len(bad) // 2] ^= 0x01
        damaged = messages.Chunk(body.version, body.index, memoryview(bad), body.encoding, body.base_version)
        return encode(damaged, msg.request_id)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.front.close(linger=0)
        self.back.close(linger=0)
        self.ctx.term()


@pytest.mark.parametrize("digest", ["blake3", "sha256"])
def test_a_chunk_damaged_once_is_asked_for_again_and_the_version_is_exact(digest: DigestName) -> None:
    payload = serialize_weights(state(3), 1)
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK, digest=digest) as server:
        server.publish(payload)
        relay = CorruptingRelay(server.address, lambda index, attempt: index == 2 and attempt == 0)
        try:
            got = fetch(relay.address, have=-1)
        finally:
            relay.close()
    assert got is not None and got.data is not None and bytes(got.data) == payload.data
    assert got.retried_chunks == 1
    assert relay.seen[2] == 2  # chunk 2 travelled twice, every other chunk once
    assert all(n == 1 for i, n in relay.seen.items() if i != 2)


def test_a_chunk_damaged_every_time_discards_the_transfer(server: WeightServer) -> None:
    g = torch.Generator().manual_seed(4)
    v1 = serialize_weights(state(4), 1)
    server.publish(v1)
    got = fetch(server.address, have=-1)
    assert got is not None
    base = held(got)
    server.publish(serialize_weights(step(state(4), g), 2))
    # Damage a delta (the first answer, against the base) and then the raw chunk asked for instead.
    relay = CorruptingRelay(server.address, lambda index, attempt: index == 1)
    try:
        with pytest.raises(ChecksumMismatch, match=r"version 2: chunk 1 failed its check twice"):
            fetch(relay.address, have=1, base=base)
    finally:
        relay.close()
    assert relay.seen[1] == 2


# --------------------------------------------------------------------------------------------------
# The pure parts: deltas and the safetensors view
# --------------------------------------------------------------------------------------------------


def test_xor_delta_round_trips_and_is_refused_where_it_does_not_pay() -> None:
    g = torch.Generator().manual_seed(5)
    base = torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=g).numpy().tobytes()
    new = bytearray(base)
    for i in (7, 100, 3000):
        new[i] ^= 0x5A
    delta = xor_delta(bytes(new), base)
    assert delta is not None and len(delta) < 0.9 * CHUNK
    out = bytearray(CHUNK)
    apply_xor_delta(delta, base, memoryview(out))
    assert out == new
    unrelated = torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=g).numpy().tobytes()
    assert xor_delta(unrelated, base) is None  # random bytes: the raw chunk is smaller
    assert xor_delta(bytes(new), base[:-1]) is None  # another layout: no delta


def test_a_delta_that_inflates_to_the_wrong_size_is_refused_without_inflating_it_all() -> None:
    base = bytes(CHUNK)
    with pytest.raises(DeltaError, match=f"not {CHUNK}"):
        apply_xor_delta(zlib.compress(bytes(100 * CHUNK)), base, memoryview(bytearray(CHUNK)))
    with pytest.raises(DeltaError, match=f"not {CHUNK}"):
        apply_xor_delta(zlib.compress(bytes(CHUNK - 1)), base, memoryview(bytearray(CHUNK)))
    with pytest.raises(DeltaError, match="not valid zlib"):
        apply_xor_delta(b"not zlib", base, memoryview(bytearray(CHUNK)))


def test_the_full_state_checksum_is_the_hash_of_the_chunk_digests() -> None:
    data = bytes(range(256)) * 40  # 10,240 bytes: chunks of 4096, 4096, 2048
    digests = chunk_digests(data, CHUNK)
    assert [len(d) for d in digests] == [32, 32, 32]
    assert digests[2] == blake3.blake3(data[8192:]).digest()
    assert state_checksum(digests) == hashlib.sha256(b"".join(digests)).hexdigest()


def test_chunk_digests_are_the_named_hash_of_each_chunk_in_order_on_any_number_of_threads() -> None:
    # The published empty-input vectors of BLAKE3 and sha256.
    assert (
        chunk_digest(b"", "blake3").hex()
        == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    )
    assert (
        chunk_digest(b"", "sha256").hex()
        == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    data = bytes(range(256)) * 81  # 20,736 bytes: five chunks of 4096 and one of 256
    for digest, hash_ in (("blake3", blake3.blake3), ("sha256", hashlib.sha256)):
        want = [hash_(data[lo : lo + CHUNK]).digest() for lo in range(0, len(data), CHUNK)]
        for threads in (1, 2, 7):
            assert chunk_digests(data, CHUNK, digest, threads) == want  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown chunk digest 'md5'"):
        chunk_digest(b"", "md5")  # type: ignore[arg-type]


def test_the_safetensors_view_gives_the_tensors_safetensors_loads_without_copying() -> None:
    sd: dict[str, Any] = {
        **state(6),
        "d.half": torch.randn(3, 5).half(),
        "e.flag": torch.tensor([True, False]),
    }
    image = bytearray(save(sd))
    buf = torch.frombuffer(image, dtype=torch.uint8)
    got = dict(tensors_from_buffer(buf))
    assert sorted(got) == sorted(load(bytes(image)))
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    # Views: changing the image changes the tensor.
    _, _, begin, _ = check_header(image)["a.weight"]
    image[begin : begin + 4] = torch.tensor([2.5]).numpy().tobytes()
    assert got["a.weight"][0, 0].item() == 2.5


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        (b"\x01\x02", "too short"),
        ((10**9).to_bytes(8, "little") + b"{}", "does not fit"),
        ((2).to_bytes(8, "little") + b"{x", "not json"),
        ((2).to_bytes(8, "little") + b"{}", "holds no tensors"),
        (
            (62).to_bytes(8, "little") + b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
            "past the",
        ),
        (
            (62).to_bytes(8, "little")
            + b'{"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}'
            + bytes(16),
            "do not match",
        ),
    ],
)
def test_a_damaged_image_is_refused_naming_the_problem(image: bytes, problem: str) -> None:
    with pytest.raises(SafetensorsError, match=problem):
        check_header(image)


def test_the_learner_counts_the_chunk_bytes_it_sends_by_encoding() -> None:
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    sent = Counter("sent_bytes", "chunk bytes sent", ["encoding"], registry=registry)
    g = torch.Generator().manual_seed(8)
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK, sent_metric=sent) as server:
        v1 = serialize_weights(state(8), 1)
        server.publish(v1)
        got = fetch(server.address, have=-1)
        assert got is not None
        assert registry.get_sample_value("sent_bytes_total", {"encoding": "raw"}) == v1.total_bytes
        server.publish(serialize_weights(step(state(8), g), 2))
        delta = fetch(server.address, have=1, base=held(got))
        assert delta is not None and delta.delta_chunks > 0
    raw_total = registry.get_sample_value("sent_bytes_total", {"encoding": "raw"})
    xor_total = registry.get_sample_value("sent_bytes_total", {"encoding": "xor_zlib"})
    assert xor_total == server.stats["delta_bytes"]
    assert raw_total is not None and xor_total is not None
    assert raw_total + xor_total == server.stats["bytes"] == v1.total_bytes + delta.wire_bytes


def test_a_version_larger_than_the_free_shared_memory_is_refused_naming_the_fix() -> None:
    import os

    from stream_dapo.weights import WeightsError
    from stream_dapo.weights.image import SHM_DIR

    if not os.path.isdir(SHM_DIR):
        pytest.skip("no /dev/shm on this OS")
    st = os.statvfs(SHM_DIR)
    with pytest.raises(WeightsError, match=r"does not fit in /dev/shm.*--shm-size.*sizeLimit"):
        WeightImage(st.f_bavail * st.f_frsize + 1)


@pytest.mark.process
def test_images_left_open_are_unlinked_when_the_process_exits(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from stream_dapo.weights.image import SHM_DIR

    if not os.path.isdir(SHM_DIR):
        pytest.skip("no /dev/shm on this OS")
    script = (
        "from stream_dapo.weights.image import WeightImage\n"
        "kept = WeightImage(4096)\n"
        "spare = WeightImage(8192)\n"
        "spare.recycle()\n"
        "print(kept.name, spare.name)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env)
    names = out.stdout.split()
    assert len(names) == 2
    for name in names:
        assert not (Path(SHM_DIR) / name).exists(), f"{name} outlived its process"

"""Fan-out of weight versions (issue 38, item 3): generators' relays pass each version on, so the
learner sends about one copy whatever the number of receivers; every chunk is still checked against
the learner's digests, and a relay that dies or lies costs a retry from the next source."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from stream_dapo.transport import messages
from stream_dapo.transport.curve import CLIENTS_DIR, generate_keys, load_client_keys, load_server_keys
from stream_dapo.transport.sockets import CurveKeys, open_endpoint, request
from stream_dapo.weights import WeightServer, serialize_weights
from stream_dapo.weights.base import WeightsPayload, WeightUpdate
from stream_dapo.weights.delta import chunk_span
from stream_dapo.weights.fanout import ChunkRelay, RelayTree
from stream_dapo.weights.image import WeightImage
from stream_dapo.weights.zmq_chunks import ZmqWeightSource, connect_weight_server

CHUNK = 4096
PEER_TIMEOUT_S = 0.5
"""What a receiver waits on a silent relay in these tests (the dead-relay tests wait it out once)."""


def payload(version: int, seed: int = 0, moved: int = 0) -> WeightsPayload:
    """~100 KiB of fp32 tensors: 25 chunks of 4 KiB; ``moved`` > 0 nudges every ``moved``-th element
    (an optimizer step's worth of change: every chunk differs, XOR deltas pay)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(160, 160, generator=g)
    if moved:
        weight.view(-1)[::moved] *= 1.001
    return serialize_weights({"a.weight": weight}, version)


class Engine:
    """A `WeightTarget` that keeps the bytes of each version it loads."""

    def __init__(self) -> None:
        self.loaded: list[tuple[int, bytes]] = []

    def update_weights_from_image(self, image: WeightImage, version: int) -> float:
        self.loaded.append((version, bytes(image)))
        return 0.0


def receiver(address: str, *, curve: CurveKeys | None = None, allowed: Path | None = None) -> ZmqWeightSource:
    relay_keys = CurveKeys(curve.public, curve.secret) if curve is not None else None
    relay = ChunkRelay("127.0.0.1", curve=relay_keys, allowed_clients_dir=allowed, hold_s=PEER_TIMEOUT_S)
    return ZmqWeightSource(address, 5.0, curve, window=4, relay=relay, peer_timeout_s=PEER_TIMEOUT_S)


def take(source: ZmqWeightSource, engine: Engine, have: int = 0) -> WeightUpdate:
    update = source(have)
    assert update is not None
    source.load(engine, update)
    return update


@pytest.fixture
def server() -> Iterator[WeightServer]:
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK, peer_fanout=2) as srv:
        yield srv


@pytest.fixture
def sources() -> Iterator[list[ZmqWeightSource]]:
    made: list[ZmqWeightSource] = []
    yield made
    for source in made:
        source.close()


# --------------------------------------------------------------------------------------------------
# The learner's tree
# --------------------------------------------------------------------------------------------------


def test_the_first_asker_fetches_from_the_learner_and_each_relay_feeds_at_most_k_children() -> None:
    tree = RelayTree(2)
    chains = {name: [p.address for p in tree.sources(7, f"tcp://{name}:1")] for name in "ABCDEFG"}
    assert chains["A"] == []
    assert chains["B"] == chains["C"] == ["tcp://A:1"]
    assert chains["D"] == chains["E"] == ["tcp://B:1", "tcp://A:1"]
    assert chains["F"] == chains["G"] == ["tcp://C:1", "tcp://A:1"]
    parents = [chain[0] for chain in chains.values() if chain]
    assert max(parents.count(p) for p in set(parents)) == 2
    assert [p.address for p in tree.sources(7, "tcp://B:1")] == ["tcp://A:1"]  # asking again: same place
    assert tree.holders(7) == [f"tcp://{name}:1" for name in "ABCDEFG"]


def test_a_failed_relay_is_skipped_until_it_asks_again_and_pruned_versions_are_forgotten() -> None:
    tree = RelayTree(1)
    for name in "ABC":
        tree.sources(3, f"tcp://{name}:1")
    tree.forget(["tcp://B:1"])
    assert [p.address for p in tree.sources(3, "tcp://C:1")] == ["tcp://A:1"]  # closed over B
    assert [p.address for p in tree.sources(3, "tcp://D:1")] == ["tcp://C:1", "tcp://A:1"]
    assert [p.address for p in tree.sources(3, "tcp://B:1")] == ["tcp://A:1"]  # B asks: alive again
    assert [p.address for p in tree.sources(3, "tcp://C:1")] == ["tcp://B:1", "tcp://A:1"]
    tree.keep_only({4})
    assert tree.holders(3) == []
    assert tree.sources(4, "") == []  # an asker without a relay, first: the learner


def test_a_learner_without_fan_out_names_no_peers(tmp_path: Path) -> None:
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as srv:
        srv.publish(payload(1))
        ep = connect_weight_server(srv.address)
        try:
            for _ in range(2):
                query = messages.WeightsQuery(0, relay="tcp://127.0.0.1:9")
                reply = request(ep, query, timeout_ms=5000, retries=0)
                assert reply.type == messages.WEIGHTS_MANIFEST and reply.body.peers == []
        finally:
            ep.close()


# --------------------------------------------------------------------------------------------------
# One relay
# --------------------------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Wait for an event (the limit only turns a hang into a failure)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def test_a_relay_holds_a_request_until_the_chunk_passed_its_check_and_refuses_a_withdrawn_version() -> None:
    data = bytearray(range(256)) * 64  # 4 chunks
    relay = ChunkRelay("127.0.0.1", hold_s=30.0).start()
    ep = open_endpoint(zmq.Context.instance(), zmq.DEALER, connect=relay.address, max_bytes=1 << 20)
    try:
        relay.offer(5, memoryview(data), CHUNK)
        ep.send(messages.ChunkRequest(5, 1), request_id=11)
        wait_for(lambda: relay.stats["held"] == 1, "the request is held")
        assert ep.recv(0) is None
        relay.ready(5, 1)
        got = ep.recv(30_000)
        assert got is not None and got[1].request_id == 11
        assert got[1].body.data == bytes(data[CHUNK : 2 * CHUNK])
        ep.send(messages.ChunkRequest(5, 2), request_id=12)
        wait_for(lambda: relay.stats["held"] == 2, "the second request is held")
        relay.withdraw(5)
        got = ep.recv(30_000)
        assert got is not None and got[1].type == messages.NOT_AVAILABLE
        ep.send(messages.ChunkRequest(4, 0), request_id=13)  # older than what it served: never coming
        got = ep.recv(30_000)
        assert got is not None and got[1].body.reason == "version_gone"
        assert relay.stats["chunks"] == 1 and relay.stats["bytes"] == CHUNK
    finally:
        ep.close()
        relay.close()


# --------------------------------------------------------------------------------------------------
# Receivers together
# --------------------------------------------------------------------------------------------------


def test_four_receivers_at_once_load_the_exact_version_while_the_learner_sends_at_most_two_copies(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    engines = [Engine() for _ in range(4)]
    sources.extend(receiver(server.address) for _ in engines)
    received: dict[int, int] = {}
    for version, moved in ((1, 0), (2, 997)):
        published = payload(version, moved=moved)
        sent_before = server.stats["bytes"]
        server.publish(published)
        errors: list[BaseException] = []

        updates: list[WeightUpdate] = []

        def run(
            i: int,
            have: int = version - 1,
            errors: list[BaseException] = errors,
            updates: list[WeightUpdate] = updates,
        ) -> None:
            try:
                updates.append(take(sources[i], engines[i], have))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for engine in engines:
            assert engine.loaded[-1] == (version, published.data)
        assert server.stats["bytes"] - sent_before <= 2 * published.total_bytes
        assert len(server.holders(version)) == 4
        received[version] = sum(update.wire_bytes or 0 for update in updates)
    assert received[1] == 4 * payload(1).total_bytes  # full images: from the learner and relays
    assert received[2] < received[1] / 4  # deltas, from the learner and from relays alike


def test_a_late_joiner_pulls_the_version_from_a_peer_not_the_learner(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    published = payload(1)
    server.publish(published)
    first, late = Engine(), Engine()
    sources.extend([receiver(server.address), receiver(server.address)])
    take(sources[0], first)
    sent = server.stats["bytes"]
    assert sent == published.total_bytes
    take(sources[1], late)
    assert late.loaded == [(1, published.data)]
    assert server.stats["bytes"] == sent  # all of it from the first receiver's relay
    assert sources[0].relay is not None and sources[0].relay.stats["bytes"] == published.total_bytes


class FakeRelay:
    """A relay that registers with the learner as its version's first receiver and then serves
    chunks from ``data``: ``serve`` of them, each passed through ``tamper``, then it dies: it never
    answers again (the chunks already sent are delivered; the requests queued are lost, as with a
    generator killed or hung mid-transfer). Its socket closes with `close`."""

    def __init__(
        self, server: WeightServer, data: bytes, serve: int, tamper: Callable[[int, bytes], bytes]
    ) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ep = open_endpoint(self.ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=1 << 20)
        self.address = self.ep.address
        self.served = 0
        self.closing = threading.Event()
        learner = connect_weight_server(server.address)
        try:
            request(learner, messages.WeightsQuery(0, relay=self.address), timeout_ms=5000, retries=0)
        finally:
            learner.close()
        self.thread = threading.Thread(target=self._serve, args=(data, serve, tamper), daemon=True)
        self.thread.start()

    def _serve(self, data: bytes, serve: int, tamper: Callable[[int, bytes], bytes]) -> None:
        while self.served < serve:
            got = self.ep.recv(30_000)
            if got is None:
                break
            ask = got[1].body
            lo, hi = chunk_span(ask.index, CHUNK, len(data))
            chunk = messages.Chunk(ask.version, ask.index, tamper(ask.index, data[lo:hi]))
            self.ep.send(chunk, to=got[0], request_id=got[1].request_id)
            self.served += 1
        self.closing.wait()  # dead: the requests still queued are never answered
        self.ep.close()

    def close(self) -> None:
        self.closing.set()
        self.thread.join(30)
        self.ctx.term()


def test_a_relay_that_dies_mid_transfer_costs_its_child_a_retry_from_the_learner_not_a_torn_load(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    published = payload(1)
    server.publish(published)
    dying = FakeRelay(server, published.data, serve=2, tamper=lambda _i, chunk: chunk)
    try:
        engine = Engine()
        sources.append(receiver(server.address))
        update = take(sources[0], engine)
        assert engine.loaded == [(1, published.data)]
        assert dying.served == 2
        assert update.wire_bytes == published.total_bytes
        assert server.stats["bytes"] == published.total_bytes - 2 * CHUNK  # the rest from the learner
        assert sources[0].unreachable == [dying.address]  # reported in the next query
        sources[0](1)
        assert sources[0].unreachable == []
        late = receiver(server.address)
        sources.append(late)
        take(late, Engine())
        assert (
            server.stats["bytes"] == published.total_bytes - 2 * CHUNK
        )  # the late one skipped the dead relay
    finally:
        dying.close()


def test_a_corrupted_chunk_from_a_relay_is_fetched_again_from_the_next_source(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    published = payload(1)
    server.publish(published)

    def flip_chunk_1(index: int, chunk: bytes) -> bytes:
        return bytes([chunk[0] ^ 0xFF]) + chunk[1:] if index == 1 else chunk

    liar = FakeRelay(server, published.data, serve=4, tamper=flip_chunk_1)
    try:
        engine = Engine()
        sources.append(receiver(server.address))
        take(sources[0], engine)
        assert engine.loaded == [(1, published.data)]
        assert liar.address in sources[0].unreachable
    finally:
        liar.close()


def test_relays_speak_curve_and_refuse_a_client_outside_the_allow_list(
    tmp_path: Path, sources: list[ZmqWeightSource]
) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys)
    client = load_client_keys(keys)
    published = payload(1)
    with WeightServer(
        "tcp://127.0.0.1:*",
        chunk_bytes=CHUNK,
        curve=load_server_keys(keys),
        allowed_clients_dir=keys / CLIENTS_DIR,
        peer_fanout=2,
    ) as srv:
        srv.publish(published)
        engines = [Engine() for _ in range(3)]
        sources.extend(receiver(srv.address, curve=client, allowed=keys / CLIENTS_DIR) for _ in engines)
        for source, engine in zip(sources, engines, strict=True):
            take(source, engine)
            assert engine.loaded == [(1, published.data)]
        assert srv.stats["bytes"] == published.total_bytes  # one copy: the others came from relays
        first = sources[0].relay
        assert first is not None and first.key == client.public.decode()
        assert first.stats["bytes"] == 2 * published.total_bytes  # both others are its children
        generate_keys(tmp_path / "stranger")
        stranger = load_client_keys(tmp_path / "stranger")
        assert handshake_refused(first.address, CurveKeys(stranger.public, stranger.secret, client.public))


def handshake_refused(address: str, keys: CurveKeys) -> bool:
    """Connect with ``keys`` and wait for the handshake's outcome (a monitor event, not a timer)."""
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
        keys.server_public,
        keys.public,
        keys.secret,
    )
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    monitor.rcvtimeo = 30_000
    try:
        sock.connect(address)
        event = recv_monitor_message(monitor)["event"]
        return bool(event == zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def test_a_relay_host_that_is_not_this_machines_names_the_key_to_set() -> None:
    from stream_dapo.errors import ConfigError

    # 192.0.2.1 (TEST-NET-1) is never an address of this machine: the bind fails.
    with pytest.raises(ConfigError, match=r"set weights.peer_host to an address of this generator's machine"):
        ChunkRelay("192.0.2.1").start()

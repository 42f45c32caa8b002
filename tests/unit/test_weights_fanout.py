"""Fan-out of weight versions (issue 38, item 3): generators' relays pass each version on, so the
learner sends about one copy whatever the number of receivers; every chunk is still checked against
the learner's digests, and a relay that dies or lies costs a retry from the next source.

No test here depends on the machine's speed: a healthy relay is waited for as long as it takes
(`PEER_TIMEOUT_S`, a bound that only turns a hang into a failure), so the exact byte counts hold in
every schedule; a relay that dies is dropped on its disconnect, an event; and the one relay left
silent on purpose is the only source a receiver could drop for silence, so its short timeout
(`SILENT_TIMEOUT_S`) decides when the test ends, never what it sees."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

import prometheus_client
import pytest
import torch
import zmq

from stream_dapo.runtime.metrics import GeneratorMetrics
from stream_dapo.transport import messages
from stream_dapo.transport.curve import CLIENTS_DIR, generate_keys, load_client_keys, load_server_keys
from stream_dapo.transport.sockets import CurveKeys, open_endpoint, request
from stream_dapo.weights import WeightServer, serialize_weights
from stream_dapo.weights.base import WeightsPayload, WeightTarget, WeightUpdate
from stream_dapo.weights.delta import chunk_span
from stream_dapo.weights.fanout import ChunkRelay, RelayTree
from stream_dapo.weights.image import WeightImage
from stream_dapo.weights.safetensors_view import tensors_from_buffer
from stream_dapo.weights.zmq_chunks import ZmqWeightSource, connect_weight_server
from stream_dapo.weights.zmq_chunks.peers import DROPPED

CHUNK = 4096
PEER_TIMEOUT_S = 600.0
"""What a receiver waits on a relay that is connected but silent, and a relay holds a request for a
chunk it does not have yet: far longer than any stall of a busy machine, so a healthy relay is never
dropped (and no test waits for it: a dead relay is dropped on its disconnect)."""
SILENT_TIMEOUT_S = 0.5
"""The timeout of the one test whose relay stays connected and silent: it waits this out once."""
LEARNER_TIMEOUT_S = 60.0
"""What a receiver waits on the learner before it gives up (a hang guard)."""


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


def receiver(
    address: str,
    *,
    curve: CurveKeys | None = None,
    allowed: Path | None = None,
    refused_metric: prometheus_client.Counter | None = None,
    peer_timeout_s: float = PEER_TIMEOUT_S,
    dropped_metric: prometheus_client.Counter | None = None,
) -> ZmqWeightSource:
    relay_keys = CurveKeys(curve.public, curve.secret) if curve is not None else None
    relay = ChunkRelay(
        "127.0.0.1",
        curve=relay_keys,
        allowed_clients_dir=allowed,
        hold_s=PEER_TIMEOUT_S,
        refused_metric=refused_metric,
    )
    return ZmqWeightSource(
        address,
        LEARNER_TIMEOUT_S,
        curve,
        window=4,
        relay=relay,
        peer_timeout_s=peer_timeout_s,
        dropped_metric=dropped_metric,
    )


def take(source: ZmqWeightSource, engine: Engine, have: int = 0) -> WeightUpdate:
    update = source(have)
    assert update is not None
    source.load(cast(WeightTarget, engine), update)  # only the method a zmq source calls
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
        assert [source.relays_dropped for source in sources] == [{}] * 4  # every relay delivered
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


def test_a_relay_that_refuses_is_dropped_and_the_generators_counter_says_so_by_reason(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    """A real relay that no longer serves the version the learner names it for (its generator let it
    go) answers `not_available`: the next receiver drops it as ``refused``, fetches everything from
    the learner, and the generator's Prometheus counter holds exactly what `relays_dropped` holds,
    every reason exported (at 0 where nothing was dropped for it)."""
    published = payload(1)
    server.publish(published)
    registry = prometheus_client.CollectorRegistry()
    metrics = GeneratorMetrics(registry)
    sources.extend(
        [receiver(server.address), receiver(server.address, dropped_metric=metrics.weight_relays_dropped)]
    )
    first, second = sources
    take(first, Engine())
    assert first.relay is not None and server.holders(1) == [first.relay.address]
    first.relay.withdraw(1)

    engine = Engine()
    take(second, engine)
    assert engine.loaded == [(1, published.data)]
    assert second.relays_dropped == {"refused": 1}
    assert second.unreachable == [first.relay.address]  # reported in the next query
    assert server.stats["bytes"] == 2 * published.total_bytes  # the second copy from the learner too
    exported = {
        reason: registry.get_sample_value(
            "stream_dapo_generator_weight_relays_dropped_total", {"reason": reason}
        )
        for reason in DROPPED
    }
    assert exported == {reason: float(second.relays_dropped[reason]) for reason in DROPPED}
    second(1)  # a poll that drops nothing adds nothing
    assert (
        registry.get_sample_value("stream_dapo_generator_weight_relays_dropped_total", {"reason": "refused"})
        == 1
    )


def keep(_index: int, chunk: bytes) -> bytes:
    return chunk


class FakeRelay:
    """A relay that registers with the learner as its version's first receiver and then serves
    chunks from ``data``: ``serve`` of them, each passed through ``tamper``, then it stops answering
    (the requests still queued are lost, as with a generator killed or hung mid-transfer): it closes
    its socket (after the chunks it sent went out: it dies), or with ``hang`` stays connected and
    silent until `close`. With ``curve`` (a generator's own keys) it serves over CurveZMQ."""

    def __init__(
        self,
        server_address: str,
        data: bytes,
        serve: int,
        tamper: Callable[[int, bytes], bytes] = keep,
        *,
        hang: bool = False,
        curve: CurveKeys | None = None,
    ) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ep = open_endpoint(
            self.ctx,
            zmq.ROUTER,
            bind="tcp://127.0.0.1:*",
            max_bytes=1 << 20,
            curve=CurveKeys(curve.public, curve.secret) if curve is not None else None,
            curve_server=curve is not None,
        )
        self.address = self.ep.address
        self.served = 0
        self.closing = threading.Event()
        learner = connect_weight_server(server_address, curve)
        key = curve.public.decode() if curve is not None else ""
        try:
            query = messages.WeightsQuery(0, relay=self.address, relay_key=key)
            request(learner, query, timeout_ms=int(LEARNER_TIMEOUT_S * 1000), retries=0)
        finally:
            learner.close()
        self.thread = threading.Thread(target=self._serve, args=(data, serve, tamper, hang), daemon=True)
        self.thread.start()

    def _serve(self, data: bytes, serve: int, tamper: Callable[[int, bytes], bytes], hang: bool) -> None:
        while self.served < serve:
            got = self.ep.recv(30_000)
            if got is None:
                break
            ask = got[1].body
            lo, hi = chunk_span(ask.index, CHUNK, len(data))
            chunk = messages.Chunk(ask.version, ask.index, memoryview(tamper(ask.index, data[lo:hi])))
            self.ep.send(chunk, to=got[0], request_id=got[1].request_id)
            self.served += 1
        if hang:
            self.closing.wait()  # connected, and never answers the requests still queued
        self.ep.socket.close(linger=30_000)  # the chunks sent go out, then the connection drops

    def close(self) -> None:
        self.closing.set()
        self.thread.join(30)
        self.ctx.term()


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_a_relay_that_dies_mid_transfer_is_dropped_on_its_disconnect_without_waiting_for_the_timeout(
    curve: bool, sources: list[ZmqWeightSource], tmp_path: Path
) -> None:
    """The receiver's peer timeout is `PEER_TIMEOUT_S` (10 minutes): the test ends when the relay's
    connection drops, and the receiver's counts say the relay was dropped for that, not for silence.
    The two chunks the relay sent before it closed arrive, and the learner sends only the rest."""
    keys = None
    allowed = None
    if curve:
        generate_keys(tmp_path / "keys")
        keys, allowed = load_client_keys(tmp_path / "keys"), tmp_path / "keys" / CLIENTS_DIR
    published = payload(1)
    with WeightServer(
        "tcp://127.0.0.1:*",
        chunk_bytes=CHUNK,
        curve=load_server_keys(tmp_path / "keys") if curve else None,
        allowed_clients_dir=allowed,
        peer_fanout=2,
    ) as server:
        server.publish(published)
        dying = FakeRelay(server.address, published.data, serve=2, curve=keys)
        try:
            engine = Engine()
            sources.append(receiver(server.address, curve=keys, allowed=allowed))
            update = take(sources[0], engine)
            assert engine.loaded == [(1, published.data)]
            assert dying.served == 2
            assert sources[0].relays_dropped == {"disconnected": 1}  # not "silent": no timeout passed
            assert update.wire_bytes == published.total_bytes
            assert server.stats["bytes"] == published.total_bytes - 2 * CHUNK  # the rest from the learner
            assert sources[0].unreachable == [dying.address]  # reported in the next query
            sources[0](1)
            assert sources[0].unreachable == []
            late = receiver(server.address, curve=keys, allowed=allowed)
            sources.append(late)
            take(late, Engine())
            assert server.stats["bytes"] == published.total_bytes - 2 * CHUNK  # it skipped the dead relay
            assert late.relays_dropped == {}
        finally:
            dying.close()


def test_a_relay_that_stays_connected_but_silent_is_dropped_after_its_timeout(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    """The timeout path, for a relay that is alive but never answers (a hung generator): the only
    relay here is the silent one, so its short `SILENT_TIMEOUT_S` decides when the receiver gives up
    on it, never what it loads or what the learner sends (the whole image, whatever the schedule)."""
    published = payload(1)
    server.publish(published)
    silent = FakeRelay(server.address, published.data, serve=0, hang=True)
    try:
        engine = Engine()
        sources.append(receiver(server.address, peer_timeout_s=SILENT_TIMEOUT_S))
        update = take(sources[0], engine)
        assert engine.loaded == [(1, published.data)] and update.wire_bytes == published.total_bytes
        assert sources[0].relays_dropped == {"silent": 1}
        assert server.stats["bytes"] == published.total_bytes
        assert sources[0].unreachable == [silent.address]  # reported in the next query
    finally:
        silent.close()


# --------------------------------------------------------------------------------------------------
# A real relay process, killed mid-transfer
# --------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
SERVED = 6
"""Chunks the relay process sends before it stops answering and is killed (of 25, 4 in flight)."""


class StopServingAfter:
    """A relay's sent-bytes counter, which the relay calls just before it sends each chunk: it lets
    ``serve`` chunks through, then says so on stdout and holds the serving thread for good, so the
    relay has sent exactly ``serve`` chunks when the test kills its process."""

    def __init__(self, serve: int) -> None:
        self.serve = serve
        self.sent = 0

    def inc(self, amount: float = 1) -> None:
        self.sent += 1
        if self.sent > self.serve:
            print(f"served {self.serve}", flush=True)
            threading.Event().wait()


def serve_as_relay(address: str, serve: int) -> None:
    """The relay process: a generator's `ZmqWeightSource` and `ChunkRelay` that fetch the learner's
    current version (announcing the relay, so the learner names it to the next receiver), load it,
    then serve it until killed. Prints ``holds <version> <relay address>`` once it does."""
    relay = ChunkRelay("127.0.0.1", sent_metric=StopServingAfter(serve))  # type: ignore[arg-type]
    source = ZmqWeightSource(address, 60.0, None, window=4, relay=relay)
    update = take(source, Engine())
    print(f"holds {update.version} {relay.address}", flush=True)
    sys.stdin.read()  # until killed (or the test ends without killing it)


class RelayProcess:
    """`serve_as_relay` in a child process; its stdout lines arrive on `lines` (a reader thread), its
    stderr goes to ``log``."""

    def __init__(self, address: str, serve: int, log: IO[str]) -> None:
        code = (
            "import sys\n"
            "from tests.unit.test_weights_fanout import serve_as_relay\n"
            "serve_as_relay(sys.argv[1], int(sys.argv[2]))\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, address, str(serve)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # end of output: the process is gone

    def says(self, limit_s: float = 120.0) -> list[str]:
        """The next line's words (the limit only turns a hang into a failure)."""
        line = self.lines.get(timeout=limit_s)
        assert line, f"the relay process ended (exit {self.proc.poll()}) before saying what it does"
        return line.split()

    def kill(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


class CheckedRelay(ChunkRelay):
    """A receiver's own relay that tells the test when ``n`` chunks have passed their checks here."""

    def __init__(self, n: int) -> None:
        super().__init__("127.0.0.1")
        self.n = n
        self.checked = 0
        self.reached = threading.Event()

    def ready(self, version: int, index: int) -> None:
        super().ready(version, index)
        self.checked += 1
        if self.checked >= self.n:
            self.reached.set()


class ModelEngine:
    """A `WeightTarget` that loads each version into a torch model, as vLLM's worker loads it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.versions: list[int] = []

    def update_weights_from_image(self, image: WeightImage, version: int) -> float:
        tensors = dict(tensors_from_buffer(torch.frombuffer(image.view, dtype=torch.uint8)))
        self.model.load_state_dict(tensors)  # strict: every tensor, nothing else
        self.versions.append(version)
        return 0.0


def small_model(seed: int) -> torch.nn.Module:
    """fp32 and bf16 layers, ~100 KiB: 25 chunks of 4 KiB."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64).to(torch.bfloat16))


@pytest.mark.process
def test_a_relay_process_killed_mid_transfer_costs_its_child_only_the_chunks_it_had_not_sent(
    server: WeightServer, sources: list[ZmqWeightSource], tmp_path: Path
) -> None:
    learner = small_model(seed=0)
    published = serialize_weights(learner.state_dict(), 1)
    num_chunks = -(-published.total_bytes // CHUNK)
    assert num_chunks > SERVED + 4  # requests still in flight at the relay when it dies
    server.publish(published)
    with open(tmp_path / "relay.log", "w") as log:
        relay = RelayProcess(server.address, SERVED, log)
        try:
            _, version, relay_address = relay.says()
            assert (int(version), server.holders(1)) == (1, [relay_address])
            sent, chunks = server.stats["bytes"], server.stats["chunks"]

            child_model = small_model(seed=1)
            engine, own = ModelEngine(child_model), CheckedRelay(SERVED)
            child = ZmqWeightSource(  # no timeout passes: the child drops the relay on its disconnect
                server.address, LEARNER_TIMEOUT_S, None, window=4, relay=own, peer_timeout_s=PEER_TIMEOUT_S
            )
            sources.append(child)
            updates: list[WeightUpdate] = []
            errors: list[BaseException] = []

            def fetch() -> None:
                try:
                    updates.append(take(child, engine))  # type: ignore[arg-type]
                except BaseException as exc:
                    errors.append(exc)

            fetching = threading.Thread(target=fetch)
            fetching.start()
            assert relay.says() == ["served", str(SERVED)]  # and holds the next requests unanswered
            assert own.reached.wait(120), f"the child never received the chunks the relay sent ({errors})"
            assert relay.kill() == -signal.SIGKILL
            fetching.join(120)
            assert not fetching.is_alive() and errors == []
        finally:
            relay.kill()

    assert engine.versions == [1] and updates[0].version == child.latest_seen == 1  # one load, exact
    loaded = child_model.state_dict()
    for name, tensor in learner.state_dict().items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert updates[0].wire_bytes == published.total_bytes  # every chunk arrived once
    assert server.stats["chunks"] - chunks == num_chunks - SERVED  # the learner sent only the rest
    assert server.stats["bytes"] - sent == published.total_bytes - SERVED * CHUNK
    assert child.unreachable == [relay_address]  # reported in the next query
    assert child.relays_dropped == {"disconnected": 1}


def test_a_chunk_checked_while_no_reply_arrives_is_offered_to_the_receivers_own_relay_at_once(
    server: WeightServer, sources: list[ZmqWeightSource], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its check finishes on a helper thread while the receiving thread waits for replies that do
    not come (its relay went quiet): the helper wakes that thread, which offers the chunk on to its
    own relay's children without waiting for a reply or a timeout. The check is held until the relay
    is quiet (wrapping the stream's private ``_place``: nothing else can hold it), so the wait-then-
    check order happens in every run."""
    from stream_dapo.weights.zmq_chunks import stream

    published = payload(1)
    server.publish(published)
    quiet = FakeRelay(server.address, published.data, serve=1, hang=True)
    checking = threading.Event()
    place = stream._ChunkStream._place

    def held_place(self: Any, body: messages.Chunk) -> str | None:
        checking.wait()
        return place(self, body)

    monkeypatch.setattr(stream._ChunkStream, "_place", held_place)
    own = CheckedRelay(1)
    child = ZmqWeightSource(
        server.address, LEARNER_TIMEOUT_S, None, window=4, relay=own, peer_timeout_s=PEER_TIMEOUT_S
    )
    sources.append(child)
    engine = Engine()
    fetching = threading.Thread(target=take, args=(child, engine))
    try:
        fetching.start()
        wait_for(lambda: quiet.served == 1, "the relay sends one chunk, then nothing")
        checking.set()
        assert own.reached.wait(120), "the checked chunk waits for a reply that never comes"
    finally:
        checking.set()
        quiet.close()  # its connection drops: the child fetches the rest from the learner
        fetching.join(120)
    assert engine.loaded == [(1, published.data)]
    assert child.relays_dropped == {"disconnected": 1}


def test_a_corrupted_chunk_from_a_relay_is_fetched_again_from_the_next_source(
    server: WeightServer, sources: list[ZmqWeightSource]
) -> None:
    published = payload(1)
    server.publish(published)

    def flip_chunk_1(index: int, chunk: bytes) -> bytes:
        return bytes([chunk[0] ^ 0xFF]) + chunk[1:] if index == 1 else chunk

    liar = FakeRelay(server.address, published.data, serve=4, tamper=flip_chunk_1, hang=True)
    try:
        engine = Engine()
        sources.append(receiver(server.address))
        take(sources[0], engine)
        assert engine.loaded == [(1, published.data)]
        assert liar.address in sources[0].unreachable
        assert sources[0].relays_dropped == {"bad_chunk": 1}
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
        registry = prometheus_client.CollectorRegistry()
        refused = GeneratorMetrics(registry).connections_refused
        sources.extend(
            receiver(srv.address, curve=client, allowed=keys / CLIENTS_DIR, refused_metric=refused)
            for _ in engines
        )
        for source, engine in zip(sources, engines, strict=True):
            take(source, engine)
            assert engine.loaded == [(1, published.data)]
        assert srv.stats["bytes"] == published.total_bytes  # one copy: the others came from relays
        first = sources[0].relay
        assert first is not None and first.key == client.public.decode()
        assert first.stats["bytes"] == 2 * published.total_bytes  # both others are its children
        generate_keys(tmp_path / "stranger")
        stranger = load_client_keys(tmp_path / "stranger")
        assert first.stats["refused"] == 0
        assert handshake_refused(first.address, CurveKeys(stranger.public, stranger.secret, client.public))
        wait_for(lambda: first.stats["refused"] == 1, "the relay counts the refused handshake")
        labels = {"socket": "weight_relay", "reason": "not_allowed"}
        assert registry.get_sample_value("stream_dapo_generator_connections_refused_total", labels) == 1


def handshake_refused(address: str, keys: CurveKeys) -> bool:
    """Connect with ``keys`` and wait for the handshake's outcome (a monitor event, not a timer)."""
    from zmq.utils.monitor import recv_monitor_message

    ctx: zmq.Context[Any] = zmq.Context.instance()
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

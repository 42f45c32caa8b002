"""Weights chunked over ZeroMQ, both ends: the learner's `WeightServer` and a generator's
`ZmqWeightSource` (`fetch_weights_stream`). Works everywhere; the CPU default (``weights.method = "zmq"``).

`WeightServer` serves the published versions from a background thread with its own ROUTER socket,
so generators fetch while the learner trains. Protocol (generator DEALER -> this ROUTER)::

    weights_query{have_version}  -> weights_manifest{version, checksum, total_bytes, chunk_bytes,
                                        num_chunks, format, chunk_digests, state_checksum,
                                        published_at}                        (the current version)
                                 -> not_available{reason="no_weights_yet"}  (nothing published)
    chunk_request{version, index[, base_version, base_checksum]}
                                 -> chunk{version, index, data[, encoding="xor_zlib", base_version]}
                                 -> not_available{reason="version_gone"}   (pruned: ask again)

The manifest always describes the current version, whatever ``have_version`` says; the client
compares (``have_version`` is informational, so a late joiner needs no special value). The last
``keep`` versions stay servable, so a fetch that straddles a publication still completes.

The generator's path (`fetch_weights_stream`) keeps ``window`` chunk requests in flight, checks each
chunk against its digest as it arrives, assembles the version in memory and checks the full-state
checksum; the engine then loads the tensors from that memory (no file). Chunks whose digest equals
the same chunk of the version the generator holds are not asked for at all; the others are asked
for with that version as a base, and the server answers with a zlib'd XOR delta where that is
smaller (`delta`), computed once per (version, base, chunk) and cached for every generator. A
chunk that fails its digest is asked for again, raw; failing twice discards the whole transfer
(the next poll starts over).

Fan-out (``peer_fanout`` > 0, `stream_dapo.weights.fanout`): a query may name the asker's relay, and
the manifest then names the peers to ask for the chunks first (the asker's parent in a relay tree,
then its ancestors); the learner serves what none of them delivers. Chunks from peers are checked
against the same digests. `fetch_weights_zmq` is the older path, kept for the benchmark's
baseline and for tools: one chunk at a time into a temporary file, renamed when its sha256 matches.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import zmq
from torch import Tensor

from stream_dapo.runtime.disk import atomic_file
from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import messages
from stream_dapo.transport.codec import Message
from stream_dapo.transport.curve import RefusedConnections
from stream_dapo.transport.sockets import (
    WEIGHTS_MAX_BYTES,
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    RemoteError,
    TransportTimeout,
    new_request_id,
    open_endpoint,
    request,
)
from stream_dapo.weights.base import (
    ChecksumMismatch,
    FileSource,
    WeightsError,
    WeightsPayload,
    WeightTarget,
    WeightUpdate,
    weights_file_name,
)
from stream_dapo.weights.delta import (
    DeltaError,
    HeldWeights,
    apply_xor_delta,
    chunk_digests,
    chunk_span,
    state_checksum,
    xor_delta,
)
from stream_dapo.weights.fanout import ChunkRelay, RelayTree
from stream_dapo.weights.image import WeightImage, close_all

if TYPE_CHECKING:
    import prometheus_client


__all__ = [
    "REQUEST_MAX_BYTES",
    "PeerOptions",
    "StreamedVersion",
    "WeightServer",
    "ZmqWeightSource",
    "connect_weight_server",
    "fetch_weights_stream",
    "fetch_weights_zmq",
]

log = logging.getLogger(__name__)

REQUEST_MAX_BYTES = 64 * 1024
"""Queries and chunk requests are tiny; anything bigger sent to the weight server is rejected."""
_CHUNK_OVERHEAD = 64 * 1024
CHECK_THREADS = 2
"""Helper threads a receiver places and hashes chunks on."""


@dataclass(frozen=True)
class _Published:
    """One servable version: the payload, its chunk digests and full-state checksum, when it came."""

    payload: WeightsPayload
    digests: list[bytes]
    state_checksum: str
    published_at: float


# --------------------------------------------------------------------------------------------------
# Learner end
# --------------------------------------------------------------------------------------------------


class WeightServer:
    """Serves published versions over a ROUTER socket from a daemon thread.

    ``bind`` is a ZeroMQ address (``tcp://0.0.0.0:5557``; ``tcp://127.0.0.1:*`` picks a free port,
    see `address`). The socket is created and bound in `start` (so a port clash fails there, in the
    caller) and used only by the serving thread afterwards. ``rejected_metric``, a Prometheus counter
    with a ``reason`` label (the learner's ``messages_rejected``), counts refused requests as
    `rejected` does; ``sent_metric`` (label ``encoding``: raw, xor_zlib) the chunk bytes sent.
    ``delta``: answer requests that name a base with XOR deltas where they are smaller.
    ``peer_fanout`` > 0: manifests name the peers (generators' relays) to fetch the chunks from, in
    a tree of that many children per relay (`stream_dapo.weights.fanout`); 0: every generator
    fetches from here.
    """

    def __init__(
        self,
        bind: str,
        *,
        chunk_bytes: int = 4 * 1024 * 1024,
        keep: int = 2,
        curve: CurveKeys | None = None,
        allowed_clients_dir: str | os.PathLike[str] | None = None,
        hwm: int = 1000,
        poll_ms: int = 50,
        rejected_metric: prometheus_client.Counter | None = None,
        use_fd: int | None = None,
        refused_metric: prometheus_client.Counter | None = None,
        sent_metric: prometheus_client.Counter | None = None,
        delta: bool = True,
        peer_fanout: int = 0,
    ) -> None:
        if not 4096 <= chunk_bytes <= WEIGHTS_MAX_BYTES - _CHUNK_OVERHEAD:
            raise ValueError(
                f"weights.chunk_bytes must be in [4096, {WEIGHTS_MAX_BYTES - _CHUNK_OVERHEAD}] so a chunk fits "
                f"the receivers' message limit, got {chunk_bytes}"
            )
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.bind = bind
        self.use_fd = use_fd  # a listening socket handed over for `bind` (`stream_dapo/runtime/ports.py`)
        self.chunk_bytes = chunk_bytes
        self.keep = keep
        self.curve = curve
        self.allowed_clients_dir = allowed_clients_dir
        if curve is not None and allowed_clients_dir is None:
            raise ValueError(
                "a Curve weight server needs allowed_clients_dir (transport.curve_dir/clients): without the "
                "allow-list any client that knows the server key could fetch the weights"
            )
        self.hwm = hwm
        self.poll_ms = max(10, poll_ms)
        self.delta = delta
        self._tree = RelayTree(peer_fanout) if peer_fanout else None  # serving thread only
        self._payloads: OrderedDict[int, _Published] = OrderedDict()
        self._deltas: dict[tuple[int, int], dict[int, bytes | None]] = {}
        """(version, base) -> chunk index -> its delta, or None where raw is smaller (serving thread only)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._endpoint: Endpoint | None = None
        self._auth: Any = None
        self.address = bind
        self.stats: Counter[str] = Counter()
        """queries, manifests, chunks, bytes (chunk data sent), delta_chunks, delta_bytes,
        not_available, errors (served by the thread)."""
        self.rejected: Counter[str] = Counter()
        """Requests refused, by reason: undecodable ones (the codec's reasons, answered with `error` by
        the endpoint), `unexpected_type` and `bad_chunk_index`."""
        self._rejected_metric = rejected_metric
        self._sent_metric = sent_metric
        self._refused_metric = refused_metric
        """Labels socket, reason: connections whose Curve handshake failed (`RefusedConnections`)."""
        self._refused: RefusedConnections | None = None
        self._endpoint_rejected: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> WeightServer:
        self._ctx = zmq.Context()
        if self.curve is not None and self.allowed_clients_dir is not None:
            from stream_dapo.transport.curve import start_authenticator

            self._auth = start_authenticator(self._ctx, self.allowed_clients_dir)
        self._endpoint = open_endpoint(
            self._ctx,
            zmq.ROUTER,
            bind=self.bind,
            use_fd=self.use_fd,
            max_bytes=REQUEST_MAX_BYTES,
            peer="generator",
            hwm=self.hwm,
            curve=self.curve,
            curve_server=self.curve is not None,
            send_timeout_ms=0,  # a generator that stops reading loses its reply, not everyone their chunks
        )
        self.address = self._endpoint.address  # resolves tcp://host:* to the port actually bound
        if self.curve is not None:
            metric = self._refused_metric
            self._refused = RefusedConnections(
                self._endpoint.socket,
                "weights",
                lambda reason: (
                    metric.labels(socket="weights", reason=reason).inc() if metric is not None else None
                ),
                log,
            )
        self._thread = threading.Thread(target=self._serve, name="weight-server", daemon=True)
        self._thread.start()
        log.info("weight server listening on %s (chunks of %d bytes)", self.address, self.chunk_bytes)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        release(
            self._refused and self._refused.close,
            self._endpoint and self._endpoint.close,
            self._auth and self._auth.stop,
            self._ctx and self._ctx.term,
        )
        self._thread = self._endpoint = self._ctx = self._auth = self._refused = None

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> WeightServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ publishing

    def bound_ports(self) -> dict[str, int]:
        """{"transport.weights_port": the port bound} once started."""
        from stream_dapo.runtime.ports import endpoint_port

        return {"transport.weights_port": endpoint_port(self.address)}

    def publish(self, payload: WeightsPayload, state_dict: Mapping[str, Tensor] | None = None) -> None:
        """Make ``payload`` the current version; older ones beyond ``keep`` stop being served.

        Hashes every chunk first (one pass over the payload, in the caller's thread)."""
        digests = chunk_digests(payload.data, self.chunk_bytes)
        published = _Published(payload, digests, state_checksum(digests), time.time())
        with self._lock:
            if self._payloads and payload.version < next(reversed(self._payloads)):
                log.warning(
                    "publishing version %d after %d: the learner went back to an older checkpoint",
                    payload.version,
                    next(reversed(self._payloads)),
                )
                self._payloads.clear()
            self._payloads[payload.version] = published
            self._payloads.move_to_end(payload.version)
            while len(self._payloads) > self.keep:
                self._payloads.popitem(last=False)

    @property
    def current_version(self) -> int | None:
        with self._lock:
            return next(reversed(self._payloads)) if self._payloads else None

    def _current(self) -> _Published | None:
        with self._lock:
            return self._payloads[next(reversed(self._payloads))] if self._payloads else None

    def _get(self, version: int) -> _Published | None:
        with self._lock:
            return self._payloads.get(version)

    # ------------------------------------------------------------------ serving

    def _serve(self) -> None:
        ep = self._endpoint
        assert ep is not None
        while not self._stop.is_set():
            try:
                got = ep.recv(self.poll_ms)
                self._count_endpoint_rejections(ep)
                if self._refused is not None:
                    self._refused.poll()
                if got is None:
                    continue
                peer, msg = got
                assert peer is not None
                reply = self._answer(msg)
                ep.send(reply, to=peer, request_id=msg.request_id)
            except (PeerUnreachable, TransportTimeout) as exc:
                # The generator went away or stopped reading; it will ask again when it comes back.
                self.stats["errors"] += 1
                log.debug("weight server: %s", exc)
            except zmq.ZMQError as exc:
                if self._stop.is_set():
                    return
                self.stats["errors"] += 1
                log.warning("weight server socket error: %s", exc)
                time.sleep(self.poll_ms / 1000)

    def _answer(self, msg: Message) -> messages.Body:
        body = msg.body
        if isinstance(body, messages.WeightsQuery):
            return self._answer_query(body)
        if isinstance(body, messages.ChunkRequest):
            return self._answer_chunk(body)
        return self._refuse(
            "unexpected_type", f"the weight server answers weights_query and chunk_request, not {msg.type}"
        )

    def _refuse(self, reason: str, detail: str) -> messages.Body:
        self.stats["errors"] += 1
        self._count_rejected(reason, 1)
        return messages.Error(reason, detail)

    def _count_endpoint_rejections(self, ep: Endpoint) -> None:
        """Forward the endpoint's decode failures (counted there, answered with `error`)."""
        for reason, total in ep.rejected.items():
            new = total - self._endpoint_rejected[reason]
            if new:
                self._endpoint_rejected[reason] = total
                self._count_rejected(reason, new)

    def _count_rejected(self, reason: str, n: int) -> None:
        self.rejected[reason] += n
        if self._rejected_metric is not None:
            self._rejected_metric.labels(reason=reason).inc(n)

    def _answer_query(self, query: messages.WeightsQuery) -> messages.Body:
        self.stats["queries"] += 1
        current = self._current()
        if current is None:
            self.stats["not_available"] += 1
            return messages.NotAvailable(query.have_version, 0, "no_weights_yet")
        self.stats["manifests"] += 1
        payload = current.payload
        return messages.WeightsManifest.of(
            payload.version,
            payload.checksum,
            payload.total_bytes,
            self.chunk_bytes,
            chunk_digests=current.digests,
            state_checksum=current.state_checksum,
            published_at=current.published_at,
            peers=self._peers(payload.version, query),
        )

    def _peers(self, version: int, query: messages.WeightsQuery) -> list[messages.PeerSource]:
        """The relays the asker fetches ``version`` from (none without fan-out)."""
        if self._tree is None:
            return []
        with self._lock:
            servable = set(self._payloads)
        self._tree.keep_only(servable)
        self._tree.forget(query.unreachable)
        return self._tree.sources(version, query.relay, query.relay_key)

    def holders(self, version: int) -> list[str]:
        """The relays in ``version``'s fan-out order, first asker first ([] without fan-out)."""
        return self._tree.holders(version) if self._tree is not None else []

    def _answer_chunk(self, ask: messages.ChunkRequest) -> messages.Body:
        version, index = ask.version, ask.index
        published = self._get(version)
        if published is None:
            self.stats["not_available"] += 1
            current = self.current_version
            return messages.NotAvailable(version, current if current is not None else 0, "version_gone")
        payload = published.payload
        num_chunks = len(published.digests)
        if index >= num_chunks:
            return self._refuse(
                "bad_chunk_index", f"version {version} has {num_chunks} chunks, asked for {index}"
            )
        lo, hi = chunk_span(index, self.chunk_bytes, payload.total_bytes)
        self.stats["chunks"] += 1
        delta = self._delta(published, ask, lo, hi)
        if delta is not None:
            self._count_sent("xor_zlib", len(delta))
            self.stats["delta_chunks"] += 1
            self.stats["delta_bytes"] += len(delta)
            return messages.Chunk(version, index, delta, "xor_zlib", ask.base_version)
        data = memoryview(payload.data)[lo:hi]
        self._count_sent("raw", len(data))
        return messages.Chunk(version, index, data)  # type: ignore[arg-type]  # a view, sent uncopied

    def _count_sent(self, encoding: str, n: int) -> None:
        self.stats["bytes"] += n
        if self._sent_metric is not None:
            self._sent_metric.labels(encoding=encoding).inc(n)

    def _delta(self, published: _Published, ask: messages.ChunkRequest, lo: int, hi: int) -> bytes | None:
        """The chunk as a delta against the asker's base, if the base is servable here (same content,
        same size) and the delta is smaller; cached for the next asker with that base."""
        if not self.delta or ask.base_version < 0 or ask.base_version == ask.version:
            return None
        base = self._get(ask.base_version)
        if (
            base is None
            or base.state_checksum != ask.base_checksum
            or base.payload.total_bytes != published.payload.total_bytes
        ):
            return None
        with self._lock:
            servable = set(self._payloads)
        for key in [k for k in self._deltas if k[0] not in servable or k[1] not in servable]:
            del self._deltas[key]
        cache = self._deltas.setdefault((ask.version, ask.base_version), {})
        if ask.index not in cache:
            new, old = memoryview(published.payload.data), memoryview(base.payload.data)
            cache[ask.index] = xor_delta(new[lo:hi], old[lo:hi])
        return cache[ask.index]


# --------------------------------------------------------------------------------------------------
# Generator end
# --------------------------------------------------------------------------------------------------


def connect_weight_server(address: str, curve: CurveKeys | None = None) -> Endpoint:
    """A DEALER to the learner's weight server at `address` (on the process-wide context)."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    return open_endpoint(
        ctx,
        zmq.DEALER,
        connect=address,
        max_bytes=WEIGHTS_MAX_BYTES,
        peer="learner weight server",
        curve=curve,
    )


def connect_relay(peer: messages.PeerSource, curve: CurveKeys | None) -> Endpoint | None:
    """A DEALER to another generator's relay, or None where the keys do not fit (one end runs Curve
    and the other does not): the chunks then come from the next source."""
    if (curve is not None) != bool(peer.key):
        log.warning("relay %s: Curve on one end only; fetching from the next source", peer.address)
        return None
    keys = CurveKeys(curve.public, curve.secret, server_public=peer.key.encode()) if curve else None
    return open_endpoint(
        zmq.Context.instance(),
        zmq.DEALER,
        connect=peer.address,
        max_bytes=WEIGHTS_MAX_BYTES,
        peer="generator relay",
        curve=keys,
        send_timeout_ms=1000,
    )


class ZmqWeightSource(FileSource):
    """Streams newer versions from the learner's weight server into memory (`fetch_weights_stream`);
    the engine loads them from there.

    With ``delta`` it keeps the version last loaded (one copy of the weights in this process's
    memory) as the base of the next transfer. With a ``relay`` (weights.peer_fanout) it keeps it
    too, and serves it, and the version being fetched, to other generators; its chunks then come
    from the peers the learner names first."""

    startup: Literal["look", "answer", "announcement"] = "answer"

    def __init__(
        self,
        address: str,
        timeout_s: float,
        curve: CurveKeys | None,
        *,
        window: int = 4,
        delta: bool = True,
        relay: ChunkRelay | None = None,
        peer_timeout_s: float = 5.0,
    ) -> None:
        if window < 1:
            raise ValueError(f"weights.fetch_window must be >= 1, got {window}")
        self.address = address
        self.timeout_s = timeout_s
        self.curve = curve
        self.window = window
        self.delta = delta
        self.relay = relay
        self.peer_timeout_s = peer_timeout_s
        self.latest_seen = -1
        self.unreachable: list[str] = []
        """Relays that failed this generator since its last query (reported in the next one)."""
        self._endpoint: Endpoint | None = None
        self._held: HeldWeights | None = None
        self._fetched: HeldWeights | None = None
        self._retired: HeldWeights | None = None
        """With a relay: the version held before the current one, still served (children fetching
        deltas against it) until the next poll."""

    def _ep(self) -> Endpoint:
        if self.relay is not None and not self.relay.address:
            self.relay.start()
        if self._endpoint is None:
            self._endpoint = connect_weight_server(self.address, self.curve)
        return self._endpoint

    def __call__(self, have: int) -> WeightUpdate | None:
        start = time.perf_counter()
        self._drop_unloaded()
        retired, self._retired = self._retired, None
        if retired is not None:
            self._release(retired, keep_offered=False)
        try:
            got = fetch_weights_stream(
                self._ep(),
                have,
                self.timeout_s,
                base=self._held,
                window=self.window,
                retries=0,
                peers=PeerOptions(self.relay, self.curve, self.peer_timeout_s, self.unreachable),
            )
        except TransportTimeout:
            # A DEALER that timed out may still get late replies: start the next poll on a fresh socket.
            self._drop_endpoint()
            raise
        if got is None:
            return None
        self.latest_seen = got.version
        if got.data is None:
            return None
        self._fetched = HeldWeights(got.version, got.data.view, got.digests, got.chunk_bytes, owner=got.data)
        return WeightUpdate(
            got.version,
            None,
            len(got.data),
            time.perf_counter() - start,
            data=got.data,
            wire_bytes=got.wire_bytes,
            published_at=got.published_at,
        )

    def load(self, engine: WeightTarget, update: WeightUpdate) -> float:
        seconds = super().load(engine, update)
        fetched, self._fetched = self._fetched, None
        if (
            (self.delta or self.relay is not None)
            and fetched is not None
            and fetched.version == update.version
        ):
            old, self._held = self._held, fetched  # the base of the next transfer, served to peers
            if old is not None and self.relay is not None and old.version != fetched.version:
                self._retired = old  # children may still ask for deltas against it
            elif old is not None:
                self._release(old, keep_offered=old.version == fetched.version)
        elif isinstance(update.data, WeightImage):
            self._release(HeldWeights(update.version, b"", [], 1, owner=update.data), keep_offered=False)
        return seconds

    def _drop_unloaded(self) -> None:
        """A version fetched but never loaded (the engine refused it) is not served any more."""
        fetched, self._fetched = self._fetched, None
        if fetched is not None:
            held = self._held.version if self._held is not None else None
            self._release(fetched, keep_offered=fetched.version == held)

    def _release(self, weights: HeldWeights, *, keep_offered: bool) -> None:
        """Done with ``weights``: the relay stops serving it (unless the same version is served from
        newer memory), then its pages become the spare image."""
        if self.relay is not None and not keep_offered:
            self.relay.withdraw(weights.version)
        if isinstance(weights.owner, WeightImage):
            weights.owner.recycle()

    def _drop_endpoint(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None

    def close(self) -> None:
        """Shut down: the relay, the socket, and every weight image of this process (held, fetched,
        spare)."""
        if self.relay is not None:
            self.relay.close()
        self._drop_endpoint()
        self._held = self._fetched = self._retired = None
        close_all()


@dataclass
class PeerOptions:
    """What `fetch_weights_stream` needs for fan-out (weights.peer_fanout): this generator's relay
    (announced to the learner, and offered each chunk as it passes its check), its Curve keys (to
    connect to other relays), how long a silent relay is waited for, and the relays that failed
    (reported in the next query, then cleared; appended to during the transfer)."""

    relay: ChunkRelay | None = None
    curve: CurveKeys | None = None
    timeout_s: float = 5.0
    unreachable: list[str] = field(default_factory=list)

    def query(self, have_version: int) -> messages.WeightsQuery:
        failed, self.unreachable[:] = self.unreachable[: messages.MAX_PEERS], []
        relay = self.relay
        if relay is None or not relay.address:
            return messages.WeightsQuery(have_version, unreachable=failed)
        return messages.WeightsQuery(have_version, relay.address, relay.key, failed)


@dataclass(frozen=True)
class StreamedVersion:
    """What `fetch_weights_stream` found: the server's current version and, when it differs from
    the caller's, its bytes (checked) with the transfer's figures."""

    version: int
    data: WeightImage | None
    """The version's bytes in shared memory (`weights.image`), checked; None: nothing new."""
    digests: list[bytes]
    chunk_bytes: int
    wire_bytes: int = 0
    """Chunk data received (deltas count their compressed size), from the learner and peers."""
    reused_chunks: int = 0
    """Chunks copied from the base because their digest matched (not asked for)."""
    delta_chunks: int = 0
    raw_chunks: int = 0
    retried_chunks: int = 0
    """Chunks that failed their digest once and were asked for again (raw, or from the next source)."""
    published_at: float = 0.0
    peer_bytes: int = 0
    """Of ``wire_bytes``, what came from other generators' relays."""


def fetch_weights_stream(
    ep: Endpoint,
    have_version: int,
    timeout: float = 30.0,
    *,
    base: HeldWeights | None = None,
    window: int = 4,
    retries: int = 2,
    peers: PeerOptions | None = None,
) -> StreamedVersion | None:
    """Ask the learner's weight server for its current version and stream it into memory if it
    differs from ``have_version``.

    Args:
        ep: a connected DEALER `Endpoint` to the weight server (`connect_weight_server`).
        have_version: the version the caller holds, -1 for none.
        timeout: seconds to wait for any reply before the requests in flight are sent again.
        base: a version the caller holds in memory; chunks equal to its chunks are copied from it,
            the others are asked for as deltas against it. None: every chunk comes whole.
        window: chunk requests kept in flight.
        retries: how many times requests in flight are sent again after ``timeout`` of silence.
        peers: fan-out (`PeerOptions`): the chunks come from the relays the manifest names first,
            and the caller's relay serves them on. None: from the learner only.

    Returns:
        None when the server has published nothing yet; a `StreamedVersion` with ``data`` None
        when its version equals ``have_version``; else with the checked bytes.

    Raises:
        ChecksumMismatch: a chunk failed its digest twice, or the full state did not match
            (nothing is kept).
        TransportTimeout: the server did not answer (is the learner running at that address?).
        WeightsError: the version kept disappearing mid-transfer (publications faster than fetches),
            or the server is too old to send chunk digests.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    timeout_ms = max(1, int(timeout * 1000))
    opts = peers if peers is not None else PeerOptions()
    for _attempt in range(3):
        query = opts.query(max(have_version, 0))  # see _fetch: 0 stands in for "nothing"
        reply = request(
            ep,
            query,
            timeout_ms=timeout_ms,
            retries=retries,
            accept=lambda m: m.type in (messages.WEIGHTS_MANIFEST, messages.NOT_AVAILABLE),
        )
        if reply.type == messages.NOT_AVAILABLE:
            return None
        manifest: messages.WeightsManifest = reply.body
        if manifest.version == have_version:
            return StreamedVersion(manifest.version, None, [], manifest.chunk_bytes)
        _check_manifest(manifest, have_version, ep.address)
        sources = _sources(ep, manifest, opts, timeout_ms)
        got = _ChunkStream(sources, manifest, base, window, retries, opts).run()
        if got is not None:
            return got
        log.info("version %d was superseded while streaming; asking again", manifest.version)
    raise WeightsError(
        "the weight server replaced its version during three transfers in a row; raise learner.sync_every "
        "or weights.chunk_bytes, or check the link to the learner"
    )


def _check_manifest(manifest: messages.WeightsManifest, have_version: int, address: str) -> None:
    if not manifest.chunk_digests:
        raise WeightsError(
            f"the weight server at {address} sends no chunk digests: it runs an older stream-dapo than "
            "this generator; run the same version on the learner and the generators"
        )
    if have_version > manifest.version:
        log.warning(
            "learner serves version %d, older than ours (%d): following it", manifest.version, have_version
        )


@dataclass
class _Source:
    """Where chunks are asked for: a peer's relay, or the learner's weight server (always last)."""

    ep: Endpoint
    timeout_ms: int
    peer: bool
    in_flight: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    """request id -> (chunk index, this source's place in the list, raw only)."""
    heard: float = 0.0
    """When it last answered, or was asked after a quiet spell (monotonic seconds)."""
    silent: int = 0
    dead: bool = False


def _sources(
    ep: Endpoint, manifest: messages.WeightsManifest, opts: PeerOptions, timeout_ms: int
) -> list[_Source]:
    """The manifest's relays (nearest first, this generator's own left out), then the learner."""
    out: list[_Source] = []
    own = opts.relay.address if opts.relay is not None else ""
    peer_ms = max(1, int(opts.timeout_s * 1000))
    for peer in manifest.peers:
        if peer.address == own:
            continue
        peer_ep = connect_relay(peer, opts.curve)
        if peer_ep is not None:
            out.append(_Source(peer_ep, peer_ms, peer=True))
    return [*out, _Source(ep, timeout_ms, peer=False)]


class _ChunkStream:
    """One version's transfer: ``window`` chunk requests in flight, each chunk checked on arrival.

    Each chunk is asked for from the first live source (the relays the manifest names, then the
    learner); a relay that stays silent for its timeout, refuses, or sends a chunk that fails its
    digest is dropped for the rest of the transfer (and reported), and its chunks go to the next
    source. This thread sends requests and receives replies; placing a chunk (copy, or inflate and
    XOR) and hashing it run on ``CHECK_THREADS`` helper threads (sha256, zlib and numpy release the
    GIL), so the next chunks arrive while earlier ones are checked. Each chunk that passes is
    offered to this generator's own relay at once, so its children need not wait for the whole
    version."""

    def __init__(
        self,
        sources: list[_Source],
        manifest: messages.WeightsManifest,
        base: HeldWeights | None,
        window: int,
        retries: int,
        opts: PeerOptions,
    ) -> None:
        self.sources, self.manifest, self.window = sources, manifest, window
        self.learner = sources[-1]
        self.retries, self.opts = retries, opts
        self.out = WeightImage.new(manifest.total_bytes)
        self.view = self.out.view
        usable = (
            base is not None
            and len(base.data) == manifest.total_bytes
            and base.chunk_bytes == manifest.chunk_bytes
        )
        self.base = base if usable else None
        self.base_view = memoryview(base.data) if base is not None and usable else None
        self.digests: list[bytes] = [b""] * manifest.num_chunks
        self.todo: deque[tuple[int, int, bool]] = deque()
        """(chunk index, first source it may come from, raw only) still to ask for."""
        self.counts: Counter[str] = Counter()
        self.placing: dict[Future[str | None], tuple[int, int, bool, int, bool]] = {}
        """A chunk being placed and checked -> (index, source, raw only, wire bytes, was a delta)."""
        self.poller = zmq.Poller()
        for source in sources:
            self.poller.register(source.ep.socket, zmq.POLLIN)
        self.pool = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="weights-check")

    def run(self) -> StreamedVersion | None:
        """The checked version, or None when the server dropped it meanwhile; on any failure the
        shared memory assembled so far is withdrawn from the relay and freed."""
        relay, version = self.opts.relay, self.manifest.version
        if relay is not None:
            relay.offer(
                version, self.view, self.manifest.chunk_bytes, state_checksum=self.manifest.state_checksum
            )
        try:
            got = self._run()
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self._discard()
            raise
        finally:
            self.pool.shutdown(wait=True)
            if self.base_view is not None:
                self.base_view.release()
            for source in self.sources[:-1]:
                source.ep.close()
        if got is None:
            self._discard()
        return got

    def _discard(self) -> None:
        if self.opts.relay is not None:
            self.opts.relay.withdraw(self.manifest.version)
        self.out.close()

    def _run(self) -> StreamedVersion | None:
        m = self.manifest
        self._reuse_base()
        while self.todo or self._in_flight() or self.placing:
            while self.todo and self._in_flight() < self.window:
                self._ask(*self.todo.popleft())
            self._harvest(block=not self._in_flight())
            if not self._in_flight():
                continue
            got = self._recv()
            if got is None:
                self._expire()
            elif not self._take(*got):
                return None
        if state_checksum(self.digests) != m.state_checksum:
            raise ChecksumMismatch(
                f"weights version {m.version}: the assembled state's checksum does not match the announced "
                f"{m.state_checksum[:16]}...; discarded. A corrupting link or a buggy publisher: the next "
                "poll retries"
            )
        c = self.counts
        return StreamedVersion(
            m.version,
            self.out,
            self.digests,
            m.chunk_bytes,
            wire_bytes=c["wire_bytes"],
            reused_chunks=c["reused"],
            delta_chunks=c["delta"],
            raw_chunks=c["raw"],
            retried_chunks=c["retried"],
            published_at=m.published_at,
            peer_bytes=c["peer_bytes"],
        )

    def _reuse_base(self) -> None:
        """Copy the chunks the base already holds; queue the others."""
        m = self.manifest
        for i in range(m.num_chunks):
            if self.base is not None and self.base.digests[i] == m.chunk_digests[i]:
                lo, hi = self._span(i)
                self.view[lo:hi] = self.base_view[lo:hi]  # type: ignore[index]
                self.digests[i] = m.chunk_digests[i]
                self.counts["reused"] += 1
                self._ready(i)
            else:
                self.todo.append((i, 0, False))

    def _ready(self, index: int) -> None:
        if self.opts.relay is not None:
            self.opts.relay.ready(self.manifest.version, index)

    def _in_flight(self) -> int:
        return sum(len(s.in_flight) for s in self.sources)

    def _span(self, index: int) -> tuple[int, int]:
        return chunk_span(index, self.manifest.chunk_bytes, self.manifest.total_bytes)

    def _ask(self, index: int, first: int, raw_only: bool) -> None:
        place = next(i for i in range(first, len(self.sources)) if not self.sources[i].dead)
        source = self.sources[place]
        rid = new_request_id()
        if self.base is None or raw_only:
            ask = messages.ChunkRequest(self.manifest.version, index)
        else:
            ask = messages.ChunkRequest(
                self.manifest.version, index, self.base.version, self.base.state_checksum
            )
        if not source.in_flight:
            source.heard = time.monotonic()
        source.in_flight[rid] = (index, place, raw_only)
        try:
            source.ep.send(ask, request_id=rid)
        except TransportTimeout:
            if not source.peer:
                raise
            self._drop_peer(source, "its queue is full")

    def _recv(self) -> tuple[_Source, Message] | None:
        """The next reply from any source asked, or None when the nearest deadline passed first."""
        waiting = [s for s in self.sources if s.in_flight]
        deadline = min(s.heard + s.timeout_ms / 1000 for s in waiting)
        ready = dict(self.poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
        for source in waiting:
            if source.ep.socket in ready:
                got = source.ep.recv(0)
                if got is not None:
                    source.heard, source.silent = time.monotonic(), 0
                    return source, got[1]
        return None

    def _expire(self) -> None:
        """Sources silent past their timeout: a relay is dropped, the learner asked again."""
        now = time.monotonic()
        for source in self.sources:
            if not source.in_flight or now < source.heard + source.timeout_ms / 1000:
                continue
            if source.peer:
                self._drop_peer(source, f"silent for {source.timeout_ms} ms")
                continue
            source.silent += 1
            if source.silent > self.retries:
                raise TransportTimeout(
                    f"no chunk of weights version {self.manifest.version} from {source.ep.address} within "
                    f"{source.timeout_ms} ms ({source.silent} time(s)): is the learner running at "
                    f"{source.ep.address}?"
                )
            self.todo.extendleft(reversed(list(source.in_flight.values())))
            source.in_flight.clear()  # late replies to these ids are dropped as unknown
            source.heard = now

    def _drop_peer(self, source: _Source, why: str) -> None:
        """Stop asking ``source`` (a relay) for this version: its chunks go to the next source."""
        if source.dead:
            return
        log.warning(
            "weights version %d: relay %s %s; fetching its chunks from the next source",
            self.manifest.version,
            source.ep.address,
            why,
        )
        source.dead = True
        self.poller.unregister(source.ep.socket)
        self.opts.unreachable.append(source.ep.address)
        self.todo.extendleft(reversed(list(source.in_flight.values())))
        source.in_flight.clear()

    def _take(self, source: _Source, msg: Message) -> bool:
        """Place one reply; False when the version is gone from the learner."""
        asked = source.in_flight.pop(msg.request_id, None) if msg.request_id is not None else None
        if msg.type in (messages.ERROR, messages.NOT_AVAILABLE) and source.peer:
            if asked is not None:
                self.todo.appendleft(asked)
            self._drop_peer(source, f"answered {msg.type} ({getattr(msg.body, 'reason', '')})")
            return True
        if msg.type == messages.ERROR:
            raise RemoteError(msg.body.reason, msg.body.detail, source.ep.address)
        if asked is None:
            source.ep.discarded += 1  # a late reply to a request sent again since
            return True
        if msg.type == messages.NOT_AVAILABLE:
            return False
        index, place, raw_only = asked
        body = msg.body
        if not isinstance(body, messages.Chunk) or (body.version, body.index) != (
            self.manifest.version,
            index,
        ):
            self._retry(
                index,
                place,
                raw_only,
                f"a {msg.type} that is not chunk {index} of version {self.manifest.version}",
            )
            return True
        future = self.pool.submit(self._place, body)
        self.placing[future] = (index, place, raw_only, len(body.data), body.encoding != "raw")
        return True

    def _harvest(self, block: bool) -> None:
        """Account for the chunks placed and checked (waiting for one when ``block``)."""
        if not self.placing:
            return
        done, _ = wait(list(self.placing), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            index, place, raw_only, wire, delta = self.placing.pop(future)
            problem = future.result()
            if problem is not None:
                self._retry(index, place, raw_only, problem)
                continue
            self.counts["wire_bytes"] += wire
            self.counts["delta" if delta else "raw"] += 1
            if self.sources[place].peer:
                self.counts["peer_bytes"] += wire
            self._ready(index)

    def _place(self, body: messages.Chunk) -> str | None:
        """Write chunk ``body`` into the image and check its digest (a helper thread); the problem
        if it fails."""
        lo, hi = self._span(body.index)
        with self.view[lo:hi] as out:  # released at once: the image may be freed after a failure
            return self._place_into(body, out, lo, hi)

    def _place_into(self, body: messages.Chunk, out: memoryview, lo: int, hi: int) -> str | None:
        try:
            if body.encoding == "raw":
                if len(body.data) != hi - lo:
                    return f"{len(body.data)} bytes, expected {hi - lo}"
                np.copyto(np.frombuffer(out, dtype=np.uint8), np.frombuffer(body.data, dtype=np.uint8))
            else:
                if self.base_view is None or self.base is None or body.base_version != self.base.version:
                    return (
                        f"a delta against version {body.base_version}, which this generator did not ask for"
                    )
                with self.base_view[lo:hi] as base:
                    apply_xor_delta(body.data, base, out)
        except DeltaError as exc:
            return str(exc)
        digest = hashlib.sha256(out).digest()
        want = self.manifest.chunk_digests[body.index]
        if digest != want:
            return f"sha256 {digest.hex()[:16]}..., announced {want.hex()[:16]}..."
        self.digests[body.index] = digest
        return None

    def _retry(self, index: int, place: int, raw_only: bool, problem: str) -> None:
        """A chunk failed its check. From a relay: the relay is dropped and the chunk asked for from
        the next source. From the learner: once more, raw; a second failure discards the transfer."""
        version = self.manifest.version
        self.counts["retried"] += 1
        source = self.sources[place]
        if source.peer:
            self.todo.appendleft((index, place + 1, False))
            self._drop_peer(source, f"sent chunk {index} that failed its check ({problem})")
            return
        if raw_only:
            raise ChecksumMismatch(
                f"weights version {version}: chunk {index} failed its check twice ({problem}); the transfer is "
                "discarded. A corrupting link or a buggy publisher: the next poll retries"
            )
        log.warning(
            "weights version %d: chunk %d failed its check (%s); asking for it again", version, index, problem
        )
        self.todo.appendleft((index, place, True))


def fetch_weights_zmq(
    endpoint_or_addr: Endpoint | str,
    have_version: int,
    timeout: float = 30.0,
    *,
    dest_dir: str | os.PathLike[str] | None = None,
    retries: int = 2,
    curve: CurveKeys | None = None,
    keep: int = 2,
) -> tuple[int, Path | None]:
    """Ask the learner's weight server for its current version and download it if it differs.

    Args:
        endpoint_or_addr: a connected DEALER `Endpoint` (reused across calls), or an address such
            as ``tcp://learner:5557`` (a socket is opened and closed for this call).
        have_version: the version the caller holds, -1 for none.
        timeout: seconds to wait for each reply before a retry.
        dest_dir: where ``v{version:08d}.safetensors`` is written (temp + rename); default a
            per-process directory under the system temp dir. Older files there are pruned to ``keep``.

    Returns:
        (version, path): the server's current version and the verified local file, or
        (version, None) when it equals ``have_version``; (have_version, None) when the server has
        published nothing yet.

    Raises:
        ChecksumMismatch: the download did not match the announced checksum (nothing is kept).
        TransportTimeout: the server did not answer (is the learner running at that address?).
        WeightsError: the version kept disappearing mid-download (publications faster than fetches).
    """
    if isinstance(endpoint_or_addr, Endpoint):
        return _fetch(endpoint_or_addr, have_version, timeout, dest_dir, retries, keep)
    ep = connect_weight_server(endpoint_or_addr, curve)
    try:
        return _fetch(ep, have_version, timeout, dest_dir, retries, keep)
    finally:
        ep.close()


def _fetch(
    ep: Endpoint, have_version: int, timeout: float, dest_dir: Any, retries: int, keep: int
) -> tuple[int, Path | None]:
    timeout_ms = max(1, int(timeout * 1000))
    out_dir = (
        Path(dest_dir)
        if dest_dir is not None
        else Path(tempfile.gettempdir()) / f"stream-dapo-weights-{os.getpid()}"
    )
    # The wire schema has no "nothing" version; the server answers with the current manifest whatever
    # have_version says, so 0 stands in for -1 and the comparison below stays local.
    query = messages.WeightsQuery(max(have_version, 0))
    for _attempt in range(3):
        reply = request(
            ep,
            query,
            timeout_ms=timeout_ms,
            retries=retries,
            accept=lambda m: m.type in (messages.WEIGHTS_MANIFEST, messages.NOT_AVAILABLE),
        )
        if reply.type == messages.NOT_AVAILABLE:
            return have_version, None
        manifest: messages.WeightsManifest = reply.body
        version = manifest.version
        if version == have_version:
            return version, None
        if have_version > version:
            log.warning(
                "learner serves version %d, older than ours (%d): following it", version, have_version
            )
        path = _download(ep, manifest, out_dir, timeout_ms, retries)
        if path is not None:
            _prune(out_dir, keep, path)
            return version, path
        log.info("version %d was superseded while downloading; asking again", version)
    raise WeightsError(
        "the weight server replaced its version during three downloads in a row; raise learner.sync_every "
        "or weights.chunk_bytes, or check the link to the learner"
    )


def _download(
    ep: Endpoint, manifest: messages.WeightsManifest, out_dir: Path, timeout_ms: int, retries: int
) -> Path | None:
    """Fetch every chunk into a temp file, verify, rename. None if the version disappeared."""
    version, num_chunks = manifest.version, manifest.num_chunks
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / weights_file_name(version)
    digest = hashlib.sha256()
    received = 0
    try:
        with atomic_file(final) as f:  # raising inside abandons the temporary file
            for index in range(num_chunks):
                reply = request(
                    ep,
                    messages.ChunkRequest(version, index),
                    timeout_ms=timeout_ms,
                    retries=retries,
                    accept=_chunk_filter(version, index),
                )
                if reply.type == messages.NOT_AVAILABLE:
                    raise _VersionGone
                data = reply.body.data
                digest.update(data)
                f.write(data)
                received += len(data)
            if received != manifest.total_bytes or digest.hexdigest() != manifest.checksum:
                raise ChecksumMismatch(
                    f"weights version {version}: received {received} bytes with sha256 "
                    f"{digest.hexdigest()[:16]}..., announced {manifest.total_bytes} bytes with "
                    f"{manifest.checksum[:16]}...; discarded. A corrupting link or a buggy publisher: the "
                    "next poll retries"
                )
    except _VersionGone:
        return None
    return final


class _VersionGone(Exception):
    """The server no longer has the version being downloaded (a newer one replaced it)."""


def _chunk_filter(version: int, index: int) -> Callable[[Message], bool]:
    """Accept only the chunk asked for (a late reply to an earlier retry is dropped) or a refusal."""

    def accept(msg: Message) -> bool:
        if msg.type == messages.NOT_AVAILABLE:
            return True
        body = msg.body
        return isinstance(body, messages.Chunk) and (body.version, body.index) == (version, index)

    return accept


def _prune(directory: Path, keep: int, current: Path) -> None:
    """Keep ``current`` and the newest ``keep - 1`` other versions (the caller may still hold one)."""
    others = sorted(p for p in directory.glob("v*.safetensors") if p.name[1:9].isdigit() and p != current)
    for p in others[: max(0, len(others) - (keep - 1))]:
        p.unlink(missing_ok=True)

"""Fan-out of weight versions (``weights.peer_fanout``): generators serve the chunks they hold to
other generators, so the learner sends about one copy of each version whatever the fleet size.

Two parts, one per end:

- `RelayTree` (the learner's weight server): per version, the receivers in the order they asked
  for its manifest. Receiver ``i`` fetches from its parent ``(i - 1) // k`` (``k`` = the fan-out),
  then from that parent's ancestors, then from the learner; receiver 0 fetches from the learner.
  So each relay feeds at most ``k`` children, the tree is ``log_k N`` deep, and the learner sends
  one copy plus whatever the relays failed to deliver. A late joiner or a replaced generator is
  simply the next receiver in the order: its parent already holds the version.
- `ChunkRelay` (each generator): a small ROUTER of its own (bound to a free port; the address and
  Curve key travel to the learner in the generator's queries) that answers `chunk_request`s for the
  versions this generator holds or is fetching. A chunk is served only once it passed its digest
  check here; a request for a chunk not here yet is held (the tree is a pipeline: a child asks
  while its parent is still receiving) until it arrives, or answered `not_available` after
  ``hold_s`` or when the version is withdrawn (its transfer failed or it was dropped). A request
  that names as its base a version the relay holds whole (same state checksum) gets a zlib'd XOR
  delta where that is smaller, as from the learner.

A receiver checks every chunk against the digests of the learner's manifest, whoever sent it, and
the assembled state against the state checksum, so a relay can delay a transfer but never corrupt
one: a relay whose connection drops (the receiver hears it from ZeroMQ at once), that is silent
for ``weights.peer_timeout_s`` while connected, refuses, or sends a chunk that fails its digest
costs the receiver a retry from the next source (the relay's ancestors, then the
learner), and is reported to the learner in the next query so later receivers skip it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from stream_dapo.errors import ConfigError
from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import messages
from stream_dapo.transport.curve import RefusedConnections
from stream_dapo.transport.sockets import (
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    TransportError,
    TransportTimeout,
    open_endpoint,
)
from stream_dapo.weights.delta import chunk_span, xor_delta

if TYPE_CHECKING:
    import os

    import prometheus_client

__all__ = ["PEER_CHAIN", "REQUEST_MAX_BYTES", "ChunkRelay", "RelayTree"]

log = logging.getLogger(__name__)

PEER_CHAIN = 3
"""Sources a manifest names at most: the parent and up to two more ancestors, then the learner."""
REQUEST_MAX_BYTES = 64 * 1024
"""Queries and chunk requests are tiny; anything bigger sent to the learner's weight server or to a
generator's relay is rejected (both read requests with this limit)."""
_PENDING_POLL_MS = 2
"""How often a relay with held requests looks for newly arrived chunks."""
_GONE_KEEP = 16
RELAY_SOCKET = "weight_relay"
"""The ``socket`` label of a relay's refused Curve handshakes."""


# --------------------------------------------------------------------------------------------------
# Learner end
# --------------------------------------------------------------------------------------------------


class RelayTree:
    """Who fetches a version from whom (see the module docstring). Used by one thread.

    Example with ``fanout = 2``: receivers A, B, C, D ask for version 7 in that order. A gets no
    peers (it fetches from the learner), B and C get [A], D gets [B, A]. Places are counted over the
    relays not reported as failed, so the tree closes over a dead one for the next askers (those
    mid-transfer already have their list, and fall back along it)."""

    def __init__(self, fanout: int) -> None:
        if fanout < 1:
            raise ValueError(f"weights.peer_fanout must be >= 1 for a relay tree, got {fanout}")
        self.fanout = fanout
        self._order: dict[int, list[str]] = {}
        self._keys: dict[str, str] = {}
        self._dead: set[str] = set()

    def sources(self, version: int, relay: str = "", key: str = "") -> list[messages.PeerSource]:
        """The peers the asker fetches ``version`` from, nearest first. An asker with a relay
        takes the next place in the version's order (the same place when it asks again); one
        without (it cannot serve) gets the parent of the next place."""
        order = self._order.setdefault(version, [])
        if relay:
            self._dead.discard(relay)  # it asks, so it is alive
            self._keys[relay] = key
            if relay not in order:
                order.append(relay)
        live = [a for a in order if a not in self._dead]  # the tree closes over failed relays
        place = live.index(relay) if relay else len(live)
        chain: list[messages.PeerSource] = []
        while place > 0 and len(chain) < PEER_CHAIN:
            place = (place - 1) // self.fanout
            chain.append(messages.PeerSource(live[place], self._keys.get(live[place], "")))
        return chain

    def forget(self, addresses: list[str]) -> None:
        """Relays a receiver could not fetch from: skipped from now on, until they ask again."""
        self._dead.update(a for a in addresses if a)

    def keep_only(self, versions: set[int]) -> None:
        """Drop the orders of versions no longer servable."""
        for version in [v for v in self._order if v not in versions]:
            del self._order[version]
        live = {a for order in self._order.values() for a in order}
        self._keys = {a: k for a, k in self._keys.items() if a in live}
        self._dead &= live

    def holders(self, version: int) -> list[str]:
        """The receivers in ``version``'s order (for tests and logs)."""
        return list(self._order.get(version, []))


# --------------------------------------------------------------------------------------------------
# Generator end
# --------------------------------------------------------------------------------------------------


@dataclass
class _Offered:
    """A version this relay can serve: its bytes (a view of the receiver's image) and which of its
    chunks passed their digest check."""

    view: memoryview
    chunk_bytes: int
    total_bytes: int
    ready: bytearray
    state_checksum: str = ""

    def whole(self, checksum: str) -> bool:
        """Every chunk here and checked, and the content ``checksum`` names (usable as a base)."""
        return bool(checksum) and checksum == self.state_checksum and self.ready.count(0) == 0


@dataclass
class _Held:
    """A request for a chunk not here yet."""

    peer: bytes
    request_id: int | None
    ask: messages.ChunkRequest
    deadline: float = field(default=0.0)


class ChunkRelay:
    """Serves the chunks of the versions this generator holds or is fetching, from a daemon thread.

    ``host`` is the address it binds (a free port) and advertises: other generators must reach it
    there (0.0.0.0 binds every interface and advertises this machine's host name). With ``curve``
    (this generator's own key pair) the socket is a Curve server that admits the clients of
    ``allowed_clients_dir``, the allow-list the learner uses. ``sent_metric``, a counter, counts
    the chunk bytes sent to other generators; ``refused_metric`` (labels socket, reason) the
    connections whose Curve handshake failed (`RefusedConnections`, as the learner's weight server
    counts them; socket ``weight_relay``).

    Thread safety: `offer`, `ready` and `withdraw` are called by the receiving thread; the serving
    thread copies a chunk out under the same lock, so once `withdraw` returns the relay never
    touches that version's memory again."""

    def __init__(
        self,
        host: str,
        *,
        curve: CurveKeys | None = None,
        allowed_clients_dir: str | os.PathLike[str] | None = None,
        hold_s: float = 5.0,
        hwm: int = 1000,
        poll_ms: int = 50,
        sent_metric: prometheus_client.Counter | None = None,
        refused_metric: prometheus_client.Counter | None = None,
    ) -> None:
        if curve is not None and allowed_clients_dir is None:
            raise ValueError(
                "a Curve relay needs allowed_clients_dir (transport.curve_dir/clients, copied to the "
                "generator hosts): without the allow-list any client that knows its key could fetch the weights"
            )
        self.host = host
        self.curve = curve
        self.allowed_clients_dir = allowed_clients_dir
        self.hold_s = hold_s
        self.hwm = hwm
        self.poll_ms = max(10, poll_ms)
        self.sent_metric = sent_metric
        self.refused_metric = refused_metric
        self.address = ""
        """The advertised address once started (tcp://host:port)."""
        self.stats: Counter[str] = Counter()
        """chunks, bytes (chunk data sent), held (requests that waited), not_available, errors,
        refused (connections whose Curve handshake failed)."""
        self._offered: dict[int, _Offered] = {}
        self._gone: list[int] = []
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._endpoint: Endpoint | None = None
        self._auth: Any = None
        self._refused: RefusedConnections | None = None

    @property
    def key(self) -> str:
        """This relay's Curve public key (Z85), or "" without Curve."""
        return self.curve.public.decode() if self.curve is not None else ""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ChunkRelay:
        self._ctx = zmq.Context()
        if self.curve is not None and self.allowed_clients_dir is not None:
            from stream_dapo.transport.curve import start_authenticator

            self._auth = start_authenticator(self._ctx, self.allowed_clients_dir)
        try:
            self._endpoint = open_endpoint(
                self._ctx,
                zmq.ROUTER,
                bind=f"tcp://{self.host}:*",
                max_bytes=REQUEST_MAX_BYTES,
                peer="generator",
                hwm=self.hwm,
                curve=self.curve,
                curve_server=self.curve is not None,
                send_timeout_ms=0,
            )
        except (zmq.ZMQError, TransportError) as exc:
            self.close()
            raise ConfigError(
                f"the weight relay cannot bind {self.host!r} ({exc}): set weights.peer_host to an address of "
                "this generator's machine that the other generators reach, or weights.peer_fanout = 0"
            ) from exc
        self.address = advertised(self._endpoint.address)
        if self.curve is not None:
            self._refused = RefusedConnections(self._endpoint.socket, RELAY_SOCKET, self._count_refused, log)
        self._thread = threading.Thread(target=self._serve, name="weight-relay", daemon=True)
        self._thread.start()
        log.info("weight relay serving held versions on %s", self.address)
        return self

    def close(self, timeout_s: float = 5.0) -> None:
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
        with self._lock:
            self._offered.clear()

    # ------------------------------------------------------------------ the receiver's side

    def offer(
        self,
        version: int,
        view: memoryview,
        chunk_bytes: int,
        *,
        complete: bool = False,
        state_checksum: str = "",
    ) -> None:
        """Serve ``version`` from ``view``: every chunk when ``complete``, else each once `ready`.
        ``state_checksum`` (the manifest's) lets a request that names this version as its base get
        XOR deltas against it, as the learner's server sends them."""
        num_chunks = -(-len(view) // chunk_bytes)
        with self._lock:
            self._offered[version] = _Offered(
                view, chunk_bytes, len(view), bytearray([1 if complete else 0]) * num_chunks, state_checksum
            )
            if version in self._gone:
                self._gone.remove(version)

    def ready(self, version: int, index: int) -> None:
        """Chunk ``index`` of ``version`` passed its check: servable from now on."""
        with self._lock:
            offered = self._offered.get(version)
            if offered is not None and index < len(offered.ready):
                offered.ready[index] = 1

    def withdraw(self, version: int) -> None:
        """Stop serving ``version`` (its memory is about to be freed or reused)."""
        with self._lock:
            if self._offered.pop(version, None) is not None:
                self._gone = [*self._gone[-_GONE_KEEP:], version]

    def serves(self) -> list[int]:
        with self._lock:
            return sorted(self._offered)

    # ------------------------------------------------------------------ serving

    def _serve(self) -> None:
        ep = self._endpoint
        assert ep is not None
        while not self._stop.is_set():
            try:
                got = ep.recv(_PENDING_POLL_MS if self._held else self.poll_ms)
                if got is not None:
                    self._take(ep, got[0], got[1].request_id, got[1].body)
                self._answer_held(ep)
                if self._refused is not None:
                    self._refused.poll()
            except (PeerUnreachable, TransportTimeout) as exc:
                self.stats["errors"] += 1  # the asker went away: it retries elsewhere
                log.debug("weight relay: %s", exc)
            except zmq.ZMQError as exc:
                if self._stop.is_set():
                    return
                self.stats["errors"] += 1
                log.warning("weight relay socket error: %s", exc)
                time.sleep(self.poll_ms / 1000)

    def _count_refused(self, reason: str) -> None:
        self.stats["refused"] += 1
        if self.refused_metric is not None:
            self.refused_metric.labels(socket=RELAY_SOCKET, reason=reason).inc()

    def _take(self, ep: Endpoint, peer: bytes | None, request_id: int | None, body: messages.Body) -> None:
        assert peer is not None
        if not isinstance(body, messages.ChunkRequest):
            self.stats["errors"] += 1
            ep.send(
                messages.Error("unexpected_type", "a weight relay answers chunk_request only"),
                to=peer,
                request_id=request_id,
            )
            return
        reply = self._lookup(body)
        if reply is None:
            self.stats["held"] += 1
            self._held.append(_Held(peer, request_id, body, time.monotonic() + self.hold_s))
            return
        self._send(ep, peer, request_id, reply)

    def _answer_held(self, ep: Endpoint) -> None:
        if not self._held:
            return
        now = time.monotonic()
        waiting: list[_Held] = []
        for held in self._held:
            reply = self._lookup(held.ask)
            if reply is None and now < held.deadline:
                waiting.append(held)
                continue
            if reply is None:
                reply = messages.NotAvailable(held.ask.version, 0, "not_held")
            try:
                self._send(ep, held.peer, held.request_id, reply)
            except (PeerUnreachable, TransportTimeout):
                self.stats["errors"] += 1
        self._held = waiting

    def _send(self, ep: Endpoint, peer: bytes, request_id: int | None, reply: messages.Body) -> None:
        if isinstance(reply, messages.Chunk):
            self.stats["chunks"] += 1
            self.stats["bytes"] += len(reply.data)
            if self.sent_metric is not None:
                self.sent_metric.inc(len(reply.data))
        else:
            self.stats["not_available"] += 1
        ep.send(reply, to=peer, request_id=request_id)

    def _lookup(self, ask: messages.ChunkRequest) -> messages.Body | None:
        """The chunk (copied out under the lock), a refusal, or None: not here yet, may come."""
        with self._lock:
            offered = self._offered.get(ask.version)
            if offered is None:
                newest = max([*self._offered, *self._gone], default=-1)
                if ask.version in self._gone or ask.version < newest:
                    return messages.NotAvailable(ask.version, max(newest, 0), "version_gone")
                return None  # a version this generator is about to fetch
            if ask.index >= len(offered.ready):
                return messages.NotAvailable(ask.version, ask.version, "bad_chunk_index")
            if not offered.ready[ask.index]:
                return None
            lo, hi = chunk_span(ask.index, offered.chunk_bytes, offered.total_bytes)
            base = self._offered.get(ask.base_version) if ask.base_version != ask.version else None
            if base is not None and not (
                base.whole(ask.base_checksum) and base.total_bytes == offered.total_bytes
            ):
                base = None
            try:
                data = bytes(offered.view[lo:hi])
                old = bytes(base.view[lo:hi]) if base is not None else None
            except ValueError:  # the image was closed under us: serve nothing from it
                return messages.NotAvailable(ask.version, ask.version, "version_gone")
        delta = xor_delta(data, old) if old is not None else None
        if delta is not None:
            return messages.Chunk(ask.version, ask.index, memoryview(delta), "xor_zlib", ask.base_version)
        return messages.Chunk(ask.version, ask.index, memoryview(data))


def advertised(bound: str) -> str:
    """The address other hosts reach a socket bound at ``bound`` by: a wildcard host becomes this
    machine's host name."""
    scheme, _, rest = bound.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::"):
        host = socket.getfqdn()
    return f"{scheme}://{host}:{port}"

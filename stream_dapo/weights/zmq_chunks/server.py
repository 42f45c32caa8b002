"""The learner's end of the chunked ZeroMQ method: `WeightServer` serves the published versions
(the protocol is in the package docstring) from a background thread with its own ROUTER socket,
so generators fetch while the learner trains. With ``peer_fanout`` its manifests also name the
generators' relays to fetch from first (`stream_dapo.weights.fanout.RelayTree`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq
from torch import Tensor

from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import messages
from stream_dapo.transport.codec import Message
from stream_dapo.transport.curve import RefusedConnections
from stream_dapo.transport.sockets import (
    WEIGHTS_MAX_BYTES,
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    TransportTimeout,
    open_endpoint,
)
from stream_dapo.weights.base import WeightsPayload
from stream_dapo.weights.delta import (
    DIGEST,
    HASH_THREADS,
    DigestName,
    chunk_digests,
    chunk_span,
    state_checksum,
    xor_delta,
)
from stream_dapo.weights.fanout import REQUEST_MAX_BYTES, RelayTree

if TYPE_CHECKING:
    import os

    import prometheus_client

__all__ = ["REQUEST_MAX_BYTES", "WeightServer"]

log = logging.getLogger(__name__)

_CHUNK_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class _Published:
    """One servable version: the payload, its chunk digests and full-state checksum, when it came."""

    payload: WeightsPayload
    digests: list[bytes]
    state_checksum: str
    published_at: float


class WeightServer:
    """Serves published versions over a ROUTER socket from a daemon thread.

    ``bind`` is a ZeroMQ address (``tcp://0.0.0.0:5557``; ``tcp://127.0.0.1:*`` picks a free port,
    see `address`). The socket is created and bound in `start` (so a port clash fails there, in the
    caller) and used only by the serving thread afterwards. ``rejected_metric``, a Prometheus counter
    with a ``reason`` label (the learner's ``messages_rejected``), counts refused requests as
    `rejected` does; ``sent_metric`` (label ``encoding``: raw, xor_zlib) the chunk bytes sent.
    ``delta``: answer requests that name a base with XOR deltas where they are smaller. The first
    request for a (version, base) pair starts the deltas of every chunk that differs on
    `HASH_THREADS` threads, so the later requests find theirs made or under way, instead of the
    serving thread compressing one chunk per request; nothing is compressed that no one asks for
    (a fleet of generators without a base, the late joiners).
    ``peer_fanout`` > 0: manifests name the peers (generators' relays) to fetch the chunks from, in
    a tree of that many children per relay (`stream_dapo.weights.fanout`); 0: every generator
    fetches from here. ``digest``: the chunk digest its manifests use (`stream_dapo.weights.delta`;
    "sha256" serves generators older than BLAKE3 digests).
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
        digest: DigestName = DIGEST,
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
        self.digest: DigestName = digest
        self._tree = RelayTree(peer_fanout) if peer_fanout else None  # serving thread only
        self._payloads: OrderedDict[int, _Published] = OrderedDict()
        self._deltas: dict[tuple[int, int], dict[int, Future[bytes | None]]] = {}
        """(version, base) -> chunk index -> its delta, or None where raw is smaller; every chunk
        that differs, started when the pair is first asked for (`_prepare_deltas`; under _lock)."""
        self._delta_pool: ThreadPoolExecutor | None = None
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
        if self.delta:
            self._delta_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="weights-delta")
        self._thread = threading.Thread(target=self._serve, name="weight-server", daemon=True)
        self._thread.start()
        log.info("weight server listening on %s (chunks of %d bytes)", self.address, self.chunk_bytes)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        pool, self._delta_pool = self._delta_pool, None
        release(
            pool and (lambda: pool.shutdown(wait=True, cancel_futures=True)),
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

        Hashes every chunk first, before it returns (one pass over the payload, on
        `stream_dapo.weights.delta.HASH_THREADS` threads)."""
        digests = chunk_digests(payload.data, self.chunk_bytes, self.digest)
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
            self._forget_deltas()

    def _prepare_deltas(self, new: _Published, base: _Published) -> dict[int, Future[bytes | None]]:
        """Start computing ``new``'s deltas against ``base`` for the chunks that differ (the ones a
        generator holding ``base`` asks for), in chunk order on the delta threads (call under _lock)."""
        jobs: dict[int, Future[bytes | None]] = {}
        pool = self._delta_pool
        if pool is None:
            return jobs
        now, old = memoryview(new.payload.data), memoryview(base.payload.data)
        for i, (a, b) in enumerate(zip(new.digests, base.digests, strict=True)):
            if a != b:
                lo, hi = chunk_span(i, self.chunk_bytes, new.payload.total_bytes)
                try:
                    jobs[i] = pool.submit(xor_delta, now[lo:hi], old[lo:hi])
                except RuntimeError:  # the server is stopping: the rest are made when asked, if ever
                    break
        return jobs

    def prepared_deltas(self, version: int, base: int) -> list[int]:
        """The chunks of ``version`` whose delta against ``base`` is computed or being computed."""
        with self._lock:
            return sorted(self._deltas.get((version, base), {}))

    def _forget_deltas(self) -> None:
        """Drop (and cancel) the deltas of versions no longer served (call under _lock)."""
        for key in [k for k in self._deltas if k[0] not in self._payloads or k[1] not in self._payloads]:
            for job in self._deltas.pop(key).values():
                job.cancel()

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
            digest=self.digest,
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
            return messages.Chunk(version, index, memoryview(delta), "xor_zlib", ask.base_version)
        data = memoryview(payload.data)[lo:hi]
        self._count_sent("raw", len(data))
        return messages.Chunk(version, index, data)  # a view, sent uncopied

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
            self._forget_deltas()
            cache = self._deltas.get((ask.version, ask.base_version))
            if cache is None:
                cache = self._deltas[(ask.version, ask.base_version)] = self._prepare_deltas(published, base)
            job = cache.get(ask.index)
            if job is None:
                job = cache[ask.index] = Future()
                job.set_running_or_notify_cancel()
                compute = True
            else:
                compute = False
        if compute:
            new, old = memoryview(published.payload.data), memoryview(base.payload.data)
            job.set_result(xor_delta(new[lo:hi], old[lo:hi]))
        try:
            return job.result()
        except CancelledError:  # its version stopped being served meanwhile: send what we hold, raw
            return None

"""Weights chunked over ZeroMQ, both ends: the learner's `WeightServer` and a generator's
`ZmqWeightSource` (`fetch_weights_zmq`). Works everywhere; the CPU default (``weights.method = "zmq"``).

`WeightServer` serves the published versions from a background thread with its own ROUTER socket,
so generators fetch while the learner trains. Protocol (generator DEALER -> this ROUTER)::

    weights_query{have_version}  -> weights_manifest{version, checksum, total_bytes, chunk_bytes,
                                                     num_chunks, format}    (the current version)
                                 -> not_available{reason="no_weights_yet"}  (nothing published)
    chunk_request{version, index} -> chunk{version, index, data}
                                 -> not_available{reason="version_gone"}   (pruned: ask again)

The manifest always describes the current version, whatever ``have_version`` says; the client
compares (``have_version`` is informational, so a late joiner needs no special value). The last
``keep`` versions stay servable, so a fetch that straddles a publication still completes. A
download is written to a temporary file and renamed into place only when its sha256 matches the
manifest, so a generator never loads a torn or corrupted copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

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
    TransportTimeout,
    open_endpoint,
    request,
)
from stream_dapo.weights.base import (
    ChecksumMismatch,
    FileSource,
    WeightsError,
    WeightsPayload,
    WeightUpdate,
    weights_file_name,
)

if TYPE_CHECKING:
    import prometheus_client

__all__ = [
    "REQUEST_MAX_BYTES",
    "WeightServer",
    "ZmqWeightSource",
    "connect_weight_server",
    "fetch_weights_zmq",
]

log = logging.getLogger(__name__)

REQUEST_MAX_BYTES = 64 * 1024
"""Queries and chunk requests are tiny; anything bigger sent to the weight server is rejected."""
_CHUNK_OVERHEAD = 64 * 1024


# --------------------------------------------------------------------------------------------------
# Learner end
# --------------------------------------------------------------------------------------------------


class WeightServer:
    """Serves published versions over a ROUTER socket from a daemon thread.

    ``bind`` is a ZeroMQ address (``tcp://0.0.0.0:5557``; ``tcp://127.0.0.1:*`` picks a free port,
    see `address`). The socket is created and bound in `start` (so a port clash fails there, in the
    caller) and used only by the serving thread afterwards. ``rejected_metric``, a Prometheus counter
    with a ``reason`` label (the learner's ``messages_rejected``), counts refused requests as
    `rejected` does.
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
        self._payloads: OrderedDict[int, WeightsPayload] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._endpoint: Endpoint | None = None
        self._auth: Any = None
        self.address = bind
        self.stats: Counter[str] = Counter()
        """queries, manifests, chunks, bytes, not_available, errors (served by the thread)."""
        self.rejected: Counter[str] = Counter()
        """Requests refused, by reason: undecodable ones (the codec's reasons, answered with `error` by
        the endpoint), `unexpected_type` and `bad_chunk_index`."""
        self._rejected_metric = rejected_metric
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
                lambda reason: metric.labels(socket="weights", reason=reason).inc() if metric is not None else None,
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
        """Make ``payload`` the current version; older ones beyond ``keep`` stop being served."""
        with self._lock:
            if self._payloads and payload.version < next(reversed(self._payloads)):
                log.warning(
                    "publishing version %d after %d: the learner went back to an older checkpoint",
                    payload.version,
                    next(reversed(self._payloads)),
                )
                self._payloads.clear()
            self._payloads[payload.version] = payload
            self._payloads.move_to_end(payload.version)
            while len(self._payloads) > self.keep:
                self._payloads.popitem(last=False)

    @property
    def current_version(self) -> int | None:
        with self._lock:
            return next(reversed(self._payloads)) if self._payloads else None

    def _current(self) -> WeightsPayload | None:
        with self._lock:
            return self._payloads[next(reversed(self._payloads))] if self._payloads else None

    def _get(self, version: int) -> WeightsPayload | None:
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
            return self._answer_query(body.have_version)
        if isinstance(body, messages.ChunkRequest):
            return self._answer_chunk(body.version, body.index)
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

    def _answer_query(self, have_version: int) -> messages.Body:
        self.stats["queries"] += 1
        current = self._current()
        if current is None:
            self.stats["not_available"] += 1
            return messages.NotAvailable(have_version, 0, "no_weights_yet")
        self.stats["manifests"] += 1
        return messages.WeightsManifest.of(
            current.version, current.checksum, current.total_bytes, self.chunk_bytes
        )

    def _answer_chunk(self, version: int, index: int) -> messages.Body:
        payload = self._get(version)
        if payload is None:
            self.stats["not_available"] += 1
            current = self.current_version
            return messages.NotAvailable(version, current if current is not None else 0, "version_gone")
        num_chunks = -(-payload.total_bytes // self.chunk_bytes)
        if index >= num_chunks:
            return self._refuse(
                "bad_chunk_index", f"version {version} has {num_chunks} chunks, asked for {index}"
            )
        lo = index * self.chunk_bytes
        data = memoryview(payload.data)[lo : lo + self.chunk_bytes]
        self.stats["chunks"] += 1
        self.stats["bytes"] += len(data)
        return messages.Chunk(version, index, data)  # type: ignore[arg-type]  # a view, sent uncopied


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


class ZmqWeightSource(FileSource):
    """Downloads newer versions from the learner's weight server into ``dest_dir`` (verified)."""

    startup: Literal["look", "answer", "announcement"] = "answer"

    def __init__(self, address: str, timeout_s: float, dest_dir: Path, curve: CurveKeys | None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.dest_dir = dest_dir
        self.curve = curve
        self._endpoint: Endpoint | None = None

    def _ep(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = connect_weight_server(self.address, self.curve)
        return self._endpoint

    def __call__(self, have: int) -> WeightUpdate | None:
        start = time.perf_counter()
        try:
            version, path = fetch_weights_zmq(
                self._ep(), have, self.timeout_s, dest_dir=self.dest_dir, retries=0
            )
        except TransportTimeout:
            # A DEALER that timed out may still get the late reply: start the next poll on a fresh socket.
            self.close()
            raise
        if path is None:
            return None
        return WeightUpdate(version, path, path.stat().st_size, time.perf_counter() - start)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None


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

"""A generator's windowed fetch of one version (`fetch_weights_stream`): ``window`` chunk requests
in flight across the sources `chunk_sources` lists (other generators' relays first, the learner
last), each chunk checked against its digest as it arrives and assembled in shared memory
(`stream_dapo.weights.image`), then the full state against the manifest's checksum.

Chunks whose digest equals the same chunk of the version the generator holds are not asked for
at all; the others are asked for with that version as a base, and the sender answers with a
zlib'd XOR delta where that is smaller (`stream_dapo.weights.delta`). A chunk that fails its
digest is asked for again from the next source, or raw from the learner; failing twice there
discards the whole transfer (the next poll starts over). A relay whose connection drops (ZeroMQ
says so at once: the relay died or closed), that is silent for ``weights.peer_timeout_s`` while
connected, refuses, or lies is dropped for the rest of the transfer and reported in the next query.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import zmq

from stream_dapo.transport import messages
from stream_dapo.transport.codec import Message
from stream_dapo.transport.sockets import (
    Endpoint,
    RemoteError,
    TransportTimeout,
    new_request_id,
)
from stream_dapo.weights.base import ChecksumMismatch, WeightsError
from stream_dapo.weights.delta import (
    DeltaError,
    HeldWeights,
    apply_xor_delta,
    chunk_digest,
    chunk_span,
    state_checksum,
)
from stream_dapo.weights.image import WeightImage
from stream_dapo.weights.zmq_chunks.download import ask_manifest
from stream_dapo.weights.zmq_chunks.peers import ChunkSource, PeerOptions, chunk_sources

__all__ = ["CHECK_THREADS", "StreamedVersion", "fetch_weights_stream"]

log = logging.getLogger(__name__)

CHECK_THREADS = 2
"""Helper threads a receiver places and hashes chunks on."""


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
        # 0 stands in for "nothing" (download._fetch says why)
        manifest = ask_manifest(ep, opts.query(max(have_version, 0)), timeout_ms, retries)
        if manifest is None:
            return None
        if manifest.version == have_version:
            return StreamedVersion(manifest.version, None, [], manifest.chunk_bytes)
        _check_manifest(manifest, have_version, ep.address)
        sources = chunk_sources(ep, manifest, opts, timeout_ms)
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


class _ChunkStream:
    """One version's transfer: ``window`` chunk requests in flight, each chunk checked on arrival.

    Each chunk is asked for from the first live source (the relays the manifest names, then the
    learner); a relay whose connection drops (as soon as ZeroMQ sees it, once the replies it sent
    before are read), that stays silent for its timeout, refuses, or sends a chunk that fails its
    digest is dropped for the rest of the transfer (and reported), and its chunks go to the next
    source. This thread sends requests and receives replies; placing a chunk (copy, or inflate and
    XOR) and hashing it run on ``CHECK_THREADS`` helper threads (BLAKE3, sha256, zlib and numpy
    release the GIL), so the next chunks arrive while earlier ones are checked; a helper that
    finishes wakes this thread (a pipe in its poll), so each chunk that passes is offered to this
    generator's own relay at once, even while no reply arrives, and its children need not wait for
    the whole version."""

    def __init__(
        self,
        sources: list[ChunkSource],
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
        self.checked_r, self.checked_w = os.pipe()
        """A byte per chunk checked (written by the helper threads), so `_recv` wakes to harvest it."""
        os.set_blocking(self.checked_r, False)
        os.set_blocking(self.checked_w, False)
        self.poller.register(self.checked_r, zmq.POLLIN)
        for source in sources:
            self.poller.register(source.ep.socket, zmq.POLLIN)
            if source.watch is not None:
                self.poller.register(source.watch.socket, zmq.POLLIN)
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
            os.close(self.checked_r)
            os.close(self.checked_w)
            if self.base_view is not None:
                self.base_view.release()
            for source in self.sources[:-1]:
                source.close()
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
        place = next(
            i for i in range(first, len(self.sources)) if not (self.sources[i].dead or self.sources[i].gone)
        )
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
            self._drop_peer(source, "queue_full", "its queue is full")

    def _recv(self) -> tuple[ChunkSource, Message] | None:
        """The next reply from any source asked, or None when the nearest deadline passed first, a
        relay's connection dropped (it is dropped here, after the replies it sent before), or a
        chunk finished its check (to be harvested)."""
        waiting = [s for s in self.sources if s.in_flight]
        deadline = min(s.heard + s.timeout_ms / 1000 for s in waiting)
        draining = any(s.gone and not s.dead for s in self.sources)
        wait_ms = 0 if draining else max(0, int((deadline - time.monotonic()) * 1000))
        ready = dict(self.poller.poll(wait_ms))
        for source in waiting:
            if source.ep.socket in ready:
                got = self._reply(source)
                if got is not None:
                    return got
        for source in self.sources:
            if source.watch is not None and source.watch.socket in ready:
                source.gone |= source.watch.seen()
            if source.gone and not source.dead:
                # Replies it sent before its connection dropped are already readable: take them first.
                got = self._reply(source) if source.in_flight else None
                if got is not None:
                    return got
                self._drop_peer(source, "disconnected", "closed its connection")
        if self.checked_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.checked_r, 4096):
                    pass  # emptied: the caller harvests every chunk checked so far
        return None

    def _checked(self, _future: Future[str | None]) -> None:
        """A helper thread finished a chunk: wake `_recv` (a full pipe is awake already)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.checked_w, b"\0")

    def _reply(self, source: ChunkSource) -> tuple[ChunkSource, Message] | None:
        got = source.ep.recv(0)
        if got is None:
            return None
        source.heard, source.silent = time.monotonic(), 0
        return source, got[1]

    def _expire(self) -> None:
        """Sources silent past their timeout: a relay is dropped, the learner asked again."""
        now = time.monotonic()
        for source in self.sources:
            if not source.in_flight or now < source.heard + source.timeout_ms / 1000:
                continue
            if source.peer:
                self._drop_peer(source, "silent", f"connected but silent for {source.timeout_ms} ms")
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

    def _drop_peer(self, source: ChunkSource, reason: str, why: str) -> None:
        """Stop asking ``source`` (a relay) for this version: its chunks go to the next source.
        ``reason`` is counted (`peers.DROPPED`), ``why`` logged."""
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
        if source.watch is not None:
            self.poller.unregister(source.watch.socket)
        self.opts.unreachable.append(source.ep.address)
        self.opts.dropped[reason] += 1
        self.todo.extendleft(reversed(list(source.in_flight.values())))
        source.in_flight.clear()

    def _take(self, source: ChunkSource, msg: Message) -> bool:
        """Place one reply; False when the version is gone from the learner."""
        asked = source.in_flight.pop(msg.request_id, None) if msg.request_id is not None else None
        if msg.type in (messages.ERROR, messages.NOT_AVAILABLE) and source.peer:
            if asked is not None:
                self.todo.appendleft(asked)
            self._drop_peer(source, "refused", f"answered {msg.type} ({getattr(msg.body, 'reason', '')})")
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
        future.add_done_callback(self._checked)
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
        digest = chunk_digest(out, self.manifest.digest)
        want = self.manifest.chunk_digests[body.index]
        if digest != want:
            return f"{self.manifest.digest} {digest.hex()[:16]}..., announced {want.hex()[:16]}..."
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
            self._drop_peer(source, "bad_chunk", f"sent chunk {index} that failed its check ({problem})")
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

"""Where a generator's chunks come from: the learner's weight server and, with fan-out
(``weights.peer_fanout``), the relays of other generators that its manifest names, nearest first
(`stream_dapo.weights.fanout`). `chunk_sources` turns a manifest into that list, the learner last;
`PeerOptions` is what a transfer needs to know about this generator's own relay. Each relay's
connection is watched (`Disconnects`), so a relay that dies is dropped when its connection does,
not after ``weights.peer_timeout_s`` of silence.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq

from stream_dapo.transport import messages
from stream_dapo.transport.sockets import WEIGHTS_MAX_BYTES, CurveKeys, Endpoint, open_endpoint
from stream_dapo.weights.fanout import ChunkRelay

__all__ = [
    "ChunkSource",
    "Disconnects",
    "PeerOptions",
    "chunk_sources",
    "connect_relay",
    "connect_weight_server",
]

log = logging.getLogger(__name__)

_WATCH_IDS = itertools.count()


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


@dataclass
class PeerOptions:
    """What `fetch_weights_stream` needs for fan-out (weights.peer_fanout): this generator's relay
    (announced to the learner, and offered each chunk as it passes its check), its Curve keys (to
    connect to other relays), how long a relay that is connected but silent is waited for, the
    relays that failed (reported in the next query, then cleared; appended to during the transfer),
    and how many relays were dropped, by why (`DROPPED`; added to, never cleared)."""

    relay: ChunkRelay | None = None
    curve: CurveKeys | None = None
    timeout_s: float = 5.0
    unreachable: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)

    def query(self, have_version: int) -> messages.WeightsQuery:
        failed, self.unreachable[:] = self.unreachable[: messages.MAX_PEERS], []
        relay = self.relay
        if relay is None or not relay.address:
            return messages.WeightsQuery(have_version, unreachable=failed)
        return messages.WeightsQuery(have_version, relay.address, relay.key, failed)


DROPPED = ("disconnected", "silent", "refused", "bad_chunk", "queue_full")
"""Why a transfer stops asking a relay: its connection dropped (the relay died, closed, or refused
our Curve keys); connected but no answer within ``weights.peer_timeout_s``; it answered an error or
`not_available`; it sent a chunk that failed its digest; our queue to it stayed full."""


class Disconnects:
    """ZeroMQ's word that a relay's connection is gone, as an event: a monitor of the DEALER's
    ``EVENT_DISCONNECTED`` (an established connection dropped: the relay process died or closed its
    socket, or a Curve handshake failed) and ``EVENT_CLOSED`` (a connection attempt failed: nothing
    listens there any more). Poll `socket` with the DEALER, from the thread that owns it.

    It is attached just after the connect; an event missed in between is followed by the failed
    reconnects' ``EVENT_CLOSED`` (libzmq retries every ``ZMQ_RECONNECT_IVL``, 100 ms)."""

    EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        # An address of its own: pyzmq's default names the socket's fd, which a socket opened while
        # a closed one's monitor is still being torn down (asynchronously) may reuse.
        addr = f"inproc://weights-relay-watch-{next(_WATCH_IDS)}"
        self.socket: zmq.Socket[Any] = sock.get_monitor_socket(self.EVENTS, addr=addr)

    def seen(self) -> bool:
        """Whether the connection dropped since the last call (reads the events waiting)."""
        from zmq.utils.monitor import recv_monitor_message

        gone = False
        while self.socket.poll(0):
            gone |= bool(recv_monitor_message(self.socket)["event"] & self.EVENTS)
        return gone

    def close(self) -> None:
        self._sock.disable_monitor()
        self.socket.close(linger=0)


@dataclass
class ChunkSource:
    """Where chunks are asked for: a peer's relay, or the learner's weight server (always last)."""

    ep: Endpoint
    timeout_ms: int
    peer: bool
    watch: Disconnects | None = None
    """A relay's connection monitor (None for the learner, whose silence is retried instead)."""
    in_flight: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    """request id -> (chunk index, this source's place in the list, raw only)."""
    heard: float = 0.0
    """When it last answered, or was asked after a quiet spell (monotonic seconds)."""
    silent: int = 0
    gone: bool = False
    """Its connection dropped (`Disconnects`); it is dropped once the replies it sent before are read."""
    dead: bool = False

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        self.ep.close()


def chunk_sources(
    ep: Endpoint, manifest: messages.WeightsManifest, opts: PeerOptions, timeout_ms: int
) -> list[ChunkSource]:
    """The manifest's relays (nearest first, this generator's own left out), then the learner."""
    out: list[ChunkSource] = []
    own = opts.relay.address if opts.relay is not None else ""
    peer_ms = max(1, int(opts.timeout_s * 1000))
    for peer in manifest.peers:
        if peer.address == own:
            continue
        peer_ep = connect_relay(peer, opts.curve)
        if peer_ep is not None:
            out.append(ChunkSource(peer_ep, peer_ms, peer=True, watch=Disconnects(peer_ep.socket)))
    return [*out, ChunkSource(ep, timeout_ms, peer=False)]

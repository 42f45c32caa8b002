"""The generator's end of the chunked ZeroMQ method: `ZmqWeightSource`, the `WeightSource` a
generator polls. It streams each newer version into memory (`fetch_weights_stream`), keeps the
version last loaded as the base of the next transfer, and with a relay serves what it holds and
what it is fetching to other generators.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Literal

from stream_dapo.transport.sockets import CurveKeys, Endpoint, TransportTimeout
from stream_dapo.weights.base import FileSource, WeightTarget, WeightUpdate
from stream_dapo.weights.delta import HeldWeights
from stream_dapo.weights.fanout import ChunkRelay
from stream_dapo.weights.image import WeightImage, close_all
from stream_dapo.weights.zmq_chunks.peers import DROPPED, PeerOptions, connect_weight_server
from stream_dapo.weights.zmq_chunks.stream import fetch_weights_stream

if TYPE_CHECKING:
    import prometheus_client

__all__ = ["ZmqWeightSource"]


class ZmqWeightSource(FileSource):
    """Streams newer versions from the learner's weight server into memory (`fetch_weights_stream`);
    the engine loads them from there.

    With ``delta`` it keeps the version last loaded (one copy of the weights in this process's
    memory) as the base of the next transfer. With a ``relay`` (weights.peer_fanout) it keeps it
    too, and serves it, and the version being fetched, to other generators; its chunks then come
    from the peers the learner names first. ``dropped_metric`` (label reason) counts the relays a
    transfer stopped asking, as `relays_dropped` does, once each poll ends."""

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
        dropped_metric: prometheus_client.Counter | None = None,
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
        self.relays_dropped: Counter[str] = Counter()
        """Relays a transfer stopped asking, by why (`peers.DROPPED`: disconnected, silent, ...)."""
        self.dropped_metric = dropped_metric
        self._dropped_exported: Counter[str] = Counter()
        if dropped_metric is not None and relay is not None:
            for reason in DROPPED:  # every reason exported from the start, at 0: rate() sees the first
                dropped_metric.labels(reason=reason)
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
                peers=PeerOptions(
                    self.relay, self.curve, self.peer_timeout_s, self.unreachable, self.relays_dropped
                ),
            )
        except TransportTimeout:
            # A DEALER that timed out may still get late replies: start the next poll on a fresh socket.
            self._drop_endpoint()
            raise
        finally:
            self._export_dropped()
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

    def _export_dropped(self) -> None:
        """Add the relays dropped since the last poll to ``dropped_metric``."""
        for reason, total in self.relays_dropped.items():
            new = total - self._dropped_exported[reason]
            if new and self.dropped_metric is not None:
                self.dropped_metric.labels(reason=reason).inc(new)
            self._dropped_exported[reason] = total

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

"""The one place that turns ``weights.method`` into a publisher (learner) and a source (generator).

Each method's module holds both of its ends (`zmq_chunks`, `shared_dir`, `nccl`); the services
only see the `WeightPublisher` / `WeightSource` interfaces of `base`.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stream_dapo.config import Config
from stream_dapo.runtime.ports import require_bound, zmq_listen
from stream_dapo.transport.curve import CLIENTS_DIR, curve_client, curve_server
from stream_dapo.transport.sockets import CurveKeys, TransportError
from stream_dapo.weights.base import RelayMetrics, WeightPublisher, WeightSource

if TYPE_CHECKING:
    import prometheus_client

    from stream_dapo.weights.fanout import ChunkRelay
    from stream_dapo.weights.zmq_chunks import WeightServer

__all__ = ["delta_wanted", "is_local_host", "make_publisher", "make_source", "shared_dir_path"]

log = logging.getLogger(__name__)

NCCL_TIMEOUT_FLOOR_S = 300.0
"""A broadcast waits for every worker, whose load can take minutes: never less than this."""


def shared_dir_path(cfg: Config) -> Path:
    """weights.shared_dir, default run.out_dir/weights."""
    w = cfg.weights
    return Path(w.shared_dir) if w.shared_dir else Path(cfg.run.out_dir) / "weights"


def is_local_host(host: str) -> bool:
    """Whether connecting to ``host`` stays on this machine: a loopback or unspecified address, or a
    name that resolves only to such. A name that does not resolve counts as remote."""
    name = host.strip("[]")
    try:
        addresses = [ipaddress.ip_address(name)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(name, None)
        except (OSError, UnicodeError):
            return False
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    return bool(addresses) and all(a.is_loopback or a.is_unspecified for a in addresses)


def delta_wanted(cfg: Config) -> bool:
    """Whether a generator asks for deltas: weights.delta, with auto resolved to "unless the learner
    is on this machine" (on loopback a delta version arrived at 0.29-0.46x the rate of a full image:
    docs/operations.md, "When not to use deltas")."""
    delta = cfg.weights.delta
    if delta != "auto":
        return bool(delta)
    t = cfg.transport
    return not is_local_host(t.learner_host or t.host)


def make_publisher(
    cfg: Config,
    rejected_metric: prometheus_client.Counter | None = None,
    refused_metric: prometheus_client.Counter | None = None,
    sent_metric: prometheus_client.Counter | None = None,
) -> WeightPublisher:
    """The learner's publisher for weights.method, started (a taken port fails here, naming it).
    `rejected_metric` counts requests the ZeroMQ weight server refuses, by reason; `refused_metric`
    (labels socket, reason) the connections whose Curve handshake failed; `sent_metric` (label
    encoding) the chunk bytes the weight server sent."""
    return _PUBLISHERS[cfg.weights.method](cfg, rejected_metric, refused_metric, sent_metric)


def make_source(cfg: Config, index: int, relay_metrics: RelayMetrics | None = None) -> WeightSource:
    """Generator `index`'s source for weights.method (nothing is contacted until the first poll).
    `relay_metrics` count what fan-out does (method zmq with weights.peer_fanout)."""
    if cfg.weights.method == "zmq":
        return _zmq_source(cfg, index, relay_metrics)
    return _SOURCES[cfg.weights.method](cfg, index)


# --------------------------------------------------------------------------------------------------
# One builder per method
# --------------------------------------------------------------------------------------------------


def _weight_server(
    cfg: Config,
    rejected_metric: prometheus_client.Counter | None,
    refused_metric: prometheus_client.Counter | None = None,
    sent_metric: prometheus_client.Counter | None = None,
) -> WeightServer:
    from stream_dapo.weights.zmq_chunks import WeightServer

    t = cfg.transport
    curve, allowed = curve_server(t.curve_dir) or (None, None)
    address, fd = zmq_listen("transport.weights_port", t.host, t.weights_port)
    server = WeightServer(
        address,
        use_fd=fd,
        chunk_bytes=cfg.weights.chunk_bytes,
        curve=curve,
        allowed_clients_dir=allowed,
        hwm=t.hwm,
        rejected_metric=rejected_metric,
        refused_metric=refused_metric,
        sent_metric=sent_metric,
        delta=cfg.weights.delta is not False,  # auto: served to the generators that ask
        peer_fanout=cfg.weights.peer_fanout,
    )
    try:
        return server.start()
    except TransportError as exc:
        raise TransportError(f"{exc} (the learner's weights socket: transport.weights_port)") from exc


def _nccl_publisher(
    cfg: Config,
    rejected_metric: prometheus_client.Counter | None,
    refused_metric: prometheus_client.Counter | None = None,
    _sent: prometheus_client.Counter | None = None,
) -> WeightPublisher:
    from stream_dapo.weights.nccl import NcclPublisher, NcclWeightSender, nccl_group_spec

    server = _weight_server(cfg, rejected_metric, refused_metric)  # announcements: late joiners, checksums
    try:
        timeout_s = max(NCCL_TIMEOUT_FLOOR_S, cfg.transport.timeout_s)
        sender = NcclWeightSender(nccl_group_spec(cfg), timeout_s=timeout_s).connect()
    except BaseException:
        server.stop()
        raise
    return NcclPublisher(server, sender)


def _shared_dir_publisher(
    cfg: Config,
    _rejected: prometheus_client.Counter | None,
    _refused: prometheus_client.Counter | None = None,
    _sent: prometheus_client.Counter | None = None,
) -> WeightPublisher:
    from stream_dapo.weights.shared_dir import SharedDirPublisher

    return SharedDirPublisher(shared_dir_path(cfg))


def _zmq_source(cfg: Config, index: int, relay_metrics: RelayMetrics | None = None) -> WeightSource:
    from stream_dapo.weights.zmq_chunks import ZmqWeightSource

    t, w = cfg.transport, cfg.weights
    require_bound("transport.weights_port", t.weights_port, "learner")
    curve = curve_client(t.curve_dir)
    relay_metrics = relay_metrics or RelayMetrics()
    delta = delta_wanted(cfg)
    if w.delta == "auto":
        log.info(
            "weights.delta = auto: %s (the learner at %s is %s)",
            "on" if delta else "off, full images",
            t.learner_host or t.host,
            "remote" if delta else "on this machine, where a full image is faster than a delta",
        )
    return ZmqWeightSource(
        t.weights_address(),
        t.timeout_s,
        curve,
        window=w.fetch_window,
        delta=delta,
        relay=_relay(cfg, curve, relay_metrics),
        peer_timeout_s=w.peer_timeout_s,
        dropped_metric=relay_metrics.dropped,
    )


def _relay(cfg: Config, curve: CurveKeys | None, relay_metrics: RelayMetrics) -> ChunkRelay | None:
    """A generator's relay for weights.peer_fanout (None when off); it binds at the first poll."""
    from stream_dapo.weights.fanout import ChunkRelay

    t, w = cfg.transport, cfg.weights
    if w.peer_fanout == 0:
        return None
    return ChunkRelay(
        w.peer_host or t.host,
        curve=CurveKeys(curve.public, curve.secret) if curve is not None else None,
        allowed_clients_dir=Path(t.curve_dir) / CLIENTS_DIR if t.curve_dir else None,
        hold_s=w.peer_timeout_s,
        hwm=t.hwm,
        sent_metric=relay_metrics.sent,
        refused_metric=relay_metrics.refused,
    )


def _nccl_source(cfg: Config, index: int) -> WeightSource:
    from stream_dapo.weights.nccl import NcclAnnouncementSource, nccl_group_spec

    t = cfg.transport
    require_bound("transport.weights_port", t.weights_port, "learner")
    return NcclAnnouncementSource(
        t.weights_address(),
        t.timeout_s,
        curve_client(t.curve_dir),
        spec=nccl_group_spec(cfg),
        rank_base=1 + index * cfg.generator.tensor_parallel_size,
        receive_timeout_s=max(NCCL_TIMEOUT_FLOOR_S, t.timeout_s),
    )


def _shared_dir_source(cfg: Config, _index: int) -> WeightSource:
    from stream_dapo.weights.shared_dir import SharedDirWeightSource

    return SharedDirWeightSource(shared_dir_path(cfg))


_PUBLISHERS: dict[
    str,
    Callable[
        [
            Config,
            prometheus_client.Counter | None,
            prometheus_client.Counter | None,
            prometheus_client.Counter | None,
        ],
        WeightPublisher,
    ],
] = {
    "zmq": _weight_server,
    "shared_dir": _shared_dir_publisher,
    "nccl": _nccl_publisher,
}
_SOURCES: dict[str, Callable[[Config, int], WeightSource]] = {
    "zmq": _zmq_source,
    "shared_dir": _shared_dir_source,
    "nccl": _nccl_source,
}

"""ZeroMQ sockets with the codec attached: one factory, one `Endpoint`, one `request` helper.

Topology: every service pair is DEALER (client) -> ROUTER (server). A ROUTER frame list is
[peer identity, payload]; a DEALER's is [payload]. There is no empty delimiter frame.

Back-pressure: sockets never block without a bound. High-water marks cap how many messages
queue per peer, and a send that cannot be queued within `send_timeout_ms` raises
`TransportTimeout` instead of growing memory; the real pacing of samples is the buffer's
credit protocol, so the high-water mark is only a safety net.

Bad input never stops a service: `Endpoint.recv` counts a malformed message in
`rejected[reason]`, logs it (rate-limited), optionally tells the peer, and keeps receiving.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from stream_dapo.transport.codec import CodecError, Message, encode
from stream_dapo.transport.codec import decode as _decode
from stream_dapo.transport.messages import ERROR, Body, Error

logger = logging.getLogger(__name__)

MIB = 1 << 20
WEIGHTS_MAX_BYTES = 256 * MIB
OVERSIZE_SLACK_BYTES = 64 * 1024
"""A sensible `max_bytes` for weight-chunk endpoints; sample and batch endpoints choose their own."""


class TransportError(Exception):
    """A socket could not be set up or used; the message names the address and the fix."""


class BindError(TransportError):
    """The address could not be bound (most often: already in use)."""


class TransportTimeout(TransportError, TimeoutError):
    """No reply (or no room to send) within the time allowed."""


class PeerUnreachable(TransportError):
    """A ROUTER send named a peer that is not connected (it went away, or never said hello)."""

    def __init__(self, peer_id: bytes, address: str) -> None:
        super().__init__(
            f"peer {peer_id!r} is not connected to {address}; it disconnected or restarted, "
            "so forget its state and wait for it to say hello again"
        )
        self.peer_id = peer_id


class PeerUnavailable(TransportError):
    """A peer a service needs at start-up (the buffer, the learner's weights) did not answer in time.

    Services exit with `ExitCode.PEER_UNAVAILABLE` (69) on it: restarting later may help, unlike a
    configuration error (2).
    """


class RemoteError(TransportError):
    """The peer answered with an `error` message."""

    def __init__(self, reason: str, detail: str, address: str) -> None:
        super().__init__(f"peer at {address} answered error {reason!r}: {detail}")
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------------------------
# Socket factory
# --------------------------------------------------------------------------------------------


def _check_key(name: str, key: Any) -> None:
    # libzmq takes a Curve key as 32 raw bytes or 40 Z85 characters (what curve_keypair returns).
    if not isinstance(key, bytes) or len(key) not in (32, 40):
        got = f"{len(key)} bytes" if isinstance(key, bytes) else type(key).__name__
        raise ValueError(
            f"CurveKeys.{name} must be a 40-byte Z85 key (zmq.curve_keypair()) or 32 raw bytes, got {got}"
        )


@dataclass(frozen=True)
class CurveKeys:
    """CurveZMQ keys of one socket. A client also needs the server's public key."""

    public: bytes
    secret: bytes = field(repr=False)
    server_public: bytes | None = None

    def __post_init__(self) -> None:
        _check_key("public", self.public)
        _check_key("secret", self.secret)
        if self.server_public is not None:
            _check_key("server_public", self.server_public)


def make_socket(
    ctx: zmq.Context[Any],
    sock_type: int,
    *,
    bind: str | None = None,
    connect: str | None = None,
    hwm: int = 1000,
    curve: CurveKeys | None = None,
    curve_server: bool = False,
    identity: bytes | None = None,
    max_message_bytes: int = 0,
    use_fd: int | None = None,
) -> zmq.Socket[Any]:
    """Create a socket that binds or connects (exactly one), with linger 0 and bounded queues.

    `max_message_bytes` > 0 sets ZMQ_MAXMSGSIZE: libzmq drops the connection of a peer that sends a
    larger frame instead of reading it whole into memory first (it reconnects).

    `hwm` bounds queued messages per peer in each direction. ROUTER sockets get
    ROUTER_MANDATORY, so a send to a peer that is gone raises (see `Endpoint.send`) instead of
    being dropped silently. With `curve`, a server (`curve_server=True`) needs the secret key;
    a client needs its own keys plus `curve.server_public`. All security options are set
    before bind/connect, which is when libzmq reads them. `use_fd`: a listening socket's fd that the
    bind adopts (ZMQ_USE_FD; `bind` must be its address), handed over by a supervisor or systemd.
    """
    if (bind is None) == (connect is None):
        raise ValueError("make_socket needs exactly one of bind= or connect=")
    if not isinstance(hwm, int) or hwm < 0:
        raise ValueError(f"hwm must be an int >= 0 (0 means unbounded), got {hwm!r}")
    if curve_server and curve is None:
        raise ValueError("curve_server=True needs curve=CurveKeys(public, secret)")
    if curve is not None and not zmq.has("curve"):
        raise TransportError(
            "this libzmq was built without CURVE support; install a pyzmq wheel with libsodium "
            "(the PyPI wheels have it) or turn off curve in the config"
        )
    if curve is not None and not curve_server and curve.server_public is None:
        raise ValueError("a Curve client needs the server's public key: CurveKeys(..., server_public=...)")

    sock = ctx.socket(sock_type)
    try:
        sock.linger = 0
        sock.sndhwm = hwm
        sock.rcvhwm = hwm
        if identity is not None:
            sock.routing_id = identity
        if max_message_bytes > 0:
            sock.maxmsgsize = max_message_bytes
        if sock_type == zmq.ROUTER:
            sock.router_mandatory = 1
        if curve is not None:
            if curve_server:
                sock.curve_server = True
                sock.curve_secretkey = curve.secret
            else:
                assert curve.server_public is not None
                sock.curve_serverkey = curve.server_public
                sock.curve_publickey = curve.public
                sock.curve_secretkey = curve.secret
        if use_fd is not None:
            sock.setsockopt(zmq.USE_FD, use_fd)
        if bind is not None:
            _bind(sock, bind)
        else:
            assert connect is not None
            try:
                sock.connect(connect)
            except zmq.ZMQError as e:
                raise TransportError(
                    f"cannot connect to {connect}: {e.strerror}; use an address like tcp://host:5555 or ipc:///path"
                ) from e
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def _bind(sock: zmq.Socket[Any], address: str) -> None:
    try:
        sock.bind(address)
    except zmq.ZMQError as e:
        if e.errno == zmq.EADDRINUSE:
            raise BindError(
                f"cannot bind {address}: address already in use. Another process holds it (often an "
                "earlier instance of this service that is still running): stop it, or configure a free port."
            ) from e
        raise BindError(
            f"cannot bind {address}: {e.strerror}. Use an address like tcp://0.0.0.0:5555 (all interfaces), "
            "tcp://127.0.0.1:* (any free port) or ipc:///run/stream-dapo/buffer.sock"
        ) from e


# --------------------------------------------------------------------------------------------
# Endpoint
# --------------------------------------------------------------------------------------------


class RateLimitedWarnings:
    """At most one warning per key per interval, reporting how many were suppressed: a peer that
    sends a flood of bad or misrouted messages must not flood the log too."""

    def __init__(
        self, log: logging.Logger = logger, interval_s: float = 10.0, level: int = logging.WARNING
    ) -> None:
        self.log = log
        self.interval_s = interval_s
        self.level = level
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warn(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] += 1
            return
        self._last[key] = now
        n = self._suppressed.pop(key, 0)
        if n:
            msg += " (%d more like it in the last %.0f s)"
            args = (*args, n, self.interval_s)
        self.log.log(self.level, msg, *args)


class Endpoint:
    """One socket plus the codec.

    `peer` names the service on the other side ("buffer", "learner", "generator") for error
    messages. `max_bytes` caps accepted message size: large for weight-chunk endpoints (e.g.
    256 MiB), small elsewhere. `reply_errors` makes a ROUTER answer a bad message with an
    `error` message so the sender learns what it did wrong. `send_timeout_ms` bounds how long a
    send may wait for room in a full queue (0: fail at once).

    Like the ZeroMQ socket it wraps, an Endpoint belongs to one thread.
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        *,
        max_bytes: int,
        peer: str = "peer",
        reply_errors: bool = True,
        send_timeout_ms: int = 5000,
        log_interval_s: float = 10.0,
    ) -> None:
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if send_timeout_ms < 0:
            raise ValueError(f"send_timeout_ms must be >= 0, got {send_timeout_ms}")
        self.socket = sock
        self.max_bytes = max_bytes
        self.peer = peer
        self.reply_errors = reply_errors
        self.routing = sock.type == zmq.ROUTER
        # For a bind to port * this is the port actually chosen; for a connect, the peer's address.
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        self.address: str = (last.decode() if isinstance(last, bytes) else str(last)) or "<unbound>"
        self.curve = sock.mechanism == zmq.CURVE
        self.rejected: Counter[str] = Counter()
        """Bad messages received, by CodecError reason (a wrong frame count counts as "malformed")."""
        self.discarded = 0
        """Replies `request` dropped: answers to another request id (one it gave up on), or refused
        by `accept`."""
        sock.sndtimeo = send_timeout_ms
        self._send_timeout_ms = send_timeout_ms
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._warnings = RateLimitedWarnings(logger, log_interval_s)
        self._closed = False

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the socket, dropping unsent messages (linger 0). Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._poller.unregister(self.socket)
            self.socket.close(linger=0)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"endpoint {self.address} is closed")

    def send(self, body: Body, *, to: bytes | None = None, request_id: int | None = None) -> None:
        """Encode and send one message (`messages.Hello(...)`, ...). A ROUTER needs `to` (the peer
        identity from `recv`); others must not.
        `request_id`: the request's id, on a request (see `request`) and on the reply to it.

        Raises CodecError if `body` is not a message struct, PeerUnreachable if `to` is gone,
        TransportTimeout if the peer's queue stays full for send_timeout_ms.
        """
        self._check_open()
        if self.routing and to is None:
            raise ValueError("a ROUTER endpoint must be told which peer to send to: send(..., to=peer_id)")
        if not self.routing and to is not None:
            raise ValueError("only a ROUTER endpoint sends to a peer identity; drop to=")
        self._send_frames(encode(body, request_id), to, what=body.TYPE)

    def _send_frames(self, data: bytes, to: bytes | None, *, what: str) -> None:
        frames = [data] if to is None else [to, data]
        try:
            # copy=False hands large payloads to libzmq without a copy (bytes are immutable).
            self.socket.send_multipart(frames, copy=False)
        except zmq.Again:
            raise TransportTimeout(
                f"could not queue {what!r} to the {self.peer} via {self.address} within "
                f"{self._send_timeout_ms} ms: its queue is full (high-water mark). Is the {self.peer} "
                "running and keeping up?"
            ) from None
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH and to is not None:
                raise PeerUnreachable(to, self.address) from None
            raise

    def recv(self, timeout_ms: int) -> tuple[bytes | None, Message] | None:
        """Wait up to `timeout_ms` for one valid message: (peer identity or None, message).

        Returns None on timeout. Bad messages are counted and skipped, not returned; when
        one arrives the wait continues for the rest of `timeout_ms`.
        """
        self._check_open()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._poller.poll(remaining_ms):
                return None
            frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            got = self._decode_frames(frames)
            if got is not None:
                return got
            if time.monotonic() >= deadline:
                return None

    def _decode_frames(self, frames: list[zmq.Frame]) -> tuple[bytes | None, Message] | None:
        peer_id: bytes | None = None
        if self.routing:
            peer_id = frames[0].bytes
            if len(frames) != 2:
                self._reject(
                    "malformed", f"expected 2 frames [identity, payload], got {len(frames)}", peer_id
                )
                return None
        elif len(frames) != 1:
            self._reject("malformed", f"expected 1 frame, got {len(frames)}", None)
            return None
        try:
            return peer_id, _decode(frames[-1].buffer, max_bytes=self.max_bytes)
        except CodecError as e:
            self._reject(e.reason, e.detail, peer_id)
            return None

    def _reject(self, reason: str, detail: str, peer_id: bytes | None) -> None:
        self.rejected[reason] += 1
        who = f"peer {peer_id!r}" if peer_id is not None else f"the {self.peer}"
        self._warnings.warn(
            reason, "%s: rejected a message from %s (%s): %s", self.address, who, reason, detail
        )
        if self.reply_errors and self.routing and peer_id is not None:
            try:
                reply = encode(Error(reason, detail[:4096]))
                self.socket.send_multipart([peer_id, reply], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the peer is gone or its queue is full: the error reply is best effort


# --------------------------------------------------------------------------------------------
# Request / reply for DEALER clients
# --------------------------------------------------------------------------------------------


_request_ids = itertools.count(random.SystemRandom().getrandbits(62))
"""Request ids of this process: a random start, so that a restarted client does not reuse the ids
(and so the replies) of the process before it."""


def new_request_id() -> int:
    """A request id unique to this process; retries of one request reuse it."""
    return next(_request_ids)


def request(
    endpoint: Endpoint,
    body: Body,
    *,
    timeout_ms: int,
    retries: int,
    backoff_ms: int = 100,
    max_backoff_ms: int = 2000,
    accept: Callable[[Message], bool] | None = None,
    request_id: int | None = None,
) -> Message:
    """Send a request and wait for its reply, retrying up to `retries` times.

    Every attempt carries the same request id (`request_id`, or a new one), and only a reply that
    names it is returned: replies to other ids (a late answer to an earlier request the caller gave
    up on) are discarded and counted in `endpoint.discarded`, so a request never reads another's
    reply. Servers must treat a repeated id as one request (the buffer answers a retried
    `batch_request` with the same lease). A caller that retries beyond `retries` passes the same
    `request_id` again.

    Only two failures are retried, with exponential back-off and jitter: no reply within
    `timeout_ms`, and a send queue that stays full. An `error` reply raises RemoteError (the
    peer decided; asking again will not change its mind); an `error` without an id answers a
    message the peer could not decode, which can only be this one. `accept` filters further.
    """
    if endpoint.routing:
        raise ValueError("request() is for DEALER clients; a ROUTER answers with endpoint.send(..., to=peer)")
    if timeout_ms <= 0 or retries < 0:
        raise ValueError(f"need timeout_ms > 0 and retries >= 0, got {timeout_ms} and {retries}")
    rid = new_request_id() if request_id is None else request_id
    attempts = retries + 1
    delay_ms = float(backoff_ms)
    for attempt in range(attempts):
        try:
            endpoint.send(body, request_id=rid)
            reply = _await_reply(endpoint, timeout_ms, rid, accept)
        except TransportTimeout:
            reply = None
        if reply is not None:
            if reply.type == ERROR:
                raise RemoteError(reply.body.reason, reply.body.detail, endpoint.address)
            return reply
        if attempt + 1 < attempts:
            # Jitter spreads out many generators retrying against one restarting buffer.
            time.sleep(delay_ms * random.uniform(0.5, 1.0) / 1000)
            delay_ms = min(delay_ms * 2, max_backoff_ms)
    hint = " and that both sides use matching Curve keys" if endpoint.curve else ""
    raise TransportTimeout(
        f"no reply to {body.TYPE!r} from {endpoint.address} after {attempts} attempt(s) of {timeout_ms} ms: "
        f"is the {endpoint.peer} running at {endpoint.address}? Check the address in the config{hint}."
    )


def _await_reply(
    endpoint: Endpoint, timeout_ms: int, request_id: int, accept: Callable[[Message], bool] | None
) -> Message | None:
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            return None
        got = endpoint.recv(remaining_ms)
        if got is None:
            return None
        msg = got[1]
        if msg.request_id is None and msg.type == ERROR:
            return msg
        if msg.request_id == request_id and (accept is None or msg.type == ERROR or accept(msg)):
            return msg
        endpoint.discarded += 1


def open_endpoint(
    ctx: zmq.Context[Any],
    sock_type: int,
    *,
    max_bytes: int,
    bind: str | None = None,
    connect: str | None = None,
    peer: str = "peer",
    hwm: int = 1000,
    curve: CurveKeys | None = None,
    curve_server: bool = False,
    identity: bytes | None = None,
    reply_errors: bool = True,
    send_timeout_ms: int = 5000,
    use_fd: int | None = None,
) -> Endpoint:
    """`make_socket` + `Endpoint` in one call."""
    sock = make_socket(
        ctx,
        sock_type,
        bind=bind,
        connect=connect,
        hwm=hwm,
        curve=curve,
        curve_server=curve_server,
        identity=identity,
        use_fd=use_fd,
        # Up to twice the limit a frame is read and answered `oversized` (the sender learns why);
        # beyond that it is never buffered: the connection drops.
        max_message_bytes=2 * max_bytes + OVERSIZE_SLACK_BYTES,
    )
    try:
        return Endpoint(
            sock, max_bytes=max_bytes, peer=peer, reply_errors=reply_errors, send_timeout_ms=send_timeout_ms
        )
    except BaseException:
        sock.close(linger=0)
        raise

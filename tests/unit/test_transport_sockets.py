"""Endpoints over real ZeroMQ sockets on loopback TCP (and ipc, where a test counts every rejection)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import encode
from stream_dapo.transport.messages import Group, Sample
from stream_dapo.transport.sockets import (
    OVERSIZE_SLACK_BYTES,
    BindError,
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    RemoteError,
    TransportTimeout,
    make_socket,
    new_request_id,
    open_endpoint,
    request,
)

WAIT_MS = 5000  # generous: only reached when something is broken
ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@contextlib.contextmanager
def unserved_tcp_address() -> Iterator[str]:
    """An address nobody serves: its port is bound (never listening) and held until the block ends,
    so no other process can start listening there meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def private(tmp_path: Path) -> str:
    """An ipc address only this test can reach. Tests that count every rejection exactly bind it: on
    TCP any process on the machine may connect to a (reused) port and send something."""
    return f"ipc://{tmp_path}/server"


def server(ctx: zmq.Context[Any], address: str = ANY_PORT, **kwargs: Any) -> Endpoint:
    kwargs.setdefault("max_bytes", 1 << 20)
    return open_endpoint(ctx, zmq.ROUTER, bind=address, peer="generator", **kwargs)


def client(ctx: zmq.Context[Any], address: str, **kwargs: Any) -> Endpoint:
    kwargs.setdefault("max_bytes", 1 << 20)
    return open_endpoint(ctx, zmq.DEALER, connect=address, peer="buffer", **kwargs)


def a_group(group_id: str) -> Group:
    sample = Sample(
        tokens=np.arange(5, dtype=np.int32),
        logprobs=np.linspace(-2.0, 0.0, 5, dtype=np.float32),
        versions=np.array([3, 3, 3, 4, 4], dtype=np.int32),
        reward=-1.0,
        correct=False,
        truncated=True,
        advantage=-0.5,
        loss_weight=0.0,
    )
    return Group(group_id, "p-1", "gen-0", "7", np.array([9, 8], dtype=np.int32), 12.5, [sample, sample])


def test_groups_request_reply_round_trips_between_dealer_and_router(
    ctx: zmq.Context[Any], private: str
) -> None:
    with server(ctx, private) as srv, client(ctx, srv.address) as cli:
        sent = [a_group("g-1"), a_group("g-2")]
        cli.send(m.Groups("gen-0", sent))
        got = srv.recv(WAIT_MS)
        assert got is not None
        peer_id, msg = got
        assert msg.type == m.GROUPS
        assert msg.body.groups == sent
        srv.send(m.Ack(["g-1"], duplicates=["g-2"]), to=peer_id)
        reply = cli.recv(WAIT_MS)
        assert reply is not None
        assert reply[0] is None
        assert m.to_map(reply[1].body) == {"accepted": ["g-1"], "duplicates": ["g-2"], "rejected": []}
        assert srv.rejected == {} and cli.rejected == {}


def test_a_garbage_frame_is_counted_answered_and_the_next_message_still_arrives(
    ctx: zmq.Context[Any], private: str
) -> None:
    with server(ctx, private) as srv, client(ctx, srv.address) as cli:
        cli.socket.send(b"\xc1 not msgpack")
        cli.send(m.Hello("gen-0", 1))
        got = srv.recv(WAIT_MS)
        assert got is not None
        assert m.to_map(got[1].body) == {"generator_id": "gen-0", "policy_version": 1}
        assert srv.rejected == {"malformed": 1}
        # The sender learns why its message was dropped.
        err = cli.recv(WAIT_MS)
        assert err is not None and err[1].type == m.ERROR
        assert err[1].body.reason == "malformed"


def test_oversized_and_multi_frame_messages_are_counted_by_reason(
    ctx: zmq.Context[Any], private: str
) -> None:
    with server(ctx, private, max_bytes=1000, reply_errors=False) as srv, client(ctx, srv.address) as cli:
        cli.send(m.Chunk(1, 0, memoryview(b"x" * 2000)))
        cli.socket.send_multipart(
            [b"", encode(m.Hello("gen-0", 1))]
        )  # REQ-style delimiter: 3 frames at the ROUTER
        cli.send(m.Hello("gen-0", 2))
        got = srv.recv(WAIT_MS)
        assert got is not None and got[1].body.policy_version == 2
        assert srv.rejected == {"oversized": 1, "malformed": 1}
        assert cli.recv(0) is None  # reply_errors=False: nothing was sent back


def test_a_frame_far_beyond_the_limit_is_never_read_whole_the_connection_drops(
    ctx: zmq.Context[Any], private: str
) -> None:
    """ZMQ_MAXMSGSIZE: up to twice the limit a message is read and refused as `oversized`; a larger
    frame makes libzmq drop the connection instead of buffering it (the peer reconnects)."""
    with server(ctx, private, max_bytes=1000, reply_errors=False) as srv, client(ctx, srv.address) as cli:
        assert srv.socket.maxmsgsize == 2 * 1000 + OVERSIZE_SLACK_BYTES
        cli.send(m.Chunk(1, 0, memoryview(b"x" * 1500)))  # over the limit, under the socket's bound
        cli.socket.send(b"\0" * (4 << 20))  # 4 MiB: far beyond both
        cli.send(m.Hello("gen-0", 3))  # after the reconnect
        got = srv.recv(WAIT_MS)
        assert got is not None and got[1].body.policy_version == 3
        assert srv.rejected == {"oversized": 1}  # the 4 MiB frame never reached the decoder


def test_rejections_are_logged_once_per_interval(
    ctx: zmq.Context[Any], caplog: pytest.LogCaptureFixture, private: str
) -> None:
    with server(ctx, private, reply_errors=False) as srv, client(ctx, srv.address) as cli:
        for _ in range(5):
            cli.socket.send(b"\xc1")
        cli.send(m.Hello("gen-0", 1))
        with caplog.at_level(logging.WARNING, logger="stream_dapo.transport.sockets"):
            assert srv.recv(WAIT_MS) is not None
    assert srv.rejected == {"malformed": 5}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "malformed" in warnings[0].getMessage()


def test_recv_returns_none_when_nothing_arrives(ctx: zmq.Context[Any]) -> None:
    with server(ctx) as srv:
        assert srv.recv(20) is None
        assert srv.recv(0) is None


def test_request_names_the_address_when_no_server_is_there(ctx: zmq.Context[Any]) -> None:
    with unserved_tcp_address() as address, client(ctx, address) as cli:
        with pytest.raises(TransportTimeout) as info:
            request(cli, m.Hello("gen-0", 0), timeout_ms=30, retries=2, backoff_ms=1)
    text = str(info.value)
    assert f"is the buffer running at {address}?" in text
    assert "after 3 attempt(s)" in text


def test_request_retries_until_the_server_answers(ctx: zmq.Context[Any]) -> None:
    with server(ctx) as srv, client(ctx, srv.address) as cli:
        seen: list[tuple[int, int | None]] = []

        def serve() -> None:
            # Ignore the first request, as if the buffer had been restarting; answer the second.
            for _ in range(2):
                got = srv.recv(WAIT_MS)
                assert got is not None
                seen.append((got[1].body.want, got[1].request_id))
            assert got is not None  # the loop ran
            srv.send(m.Credit(4, 9), to=got[0], request_id=got[1].request_id)

        thread = threading.Thread(target=serve)
        thread.start()
        reply = request(cli, m.CreditRequest("gen-0", 4), timeout_ms=300, retries=5, backoff_ms=1)
        thread.join(WAIT_MS / 1000)
        assert m.to_map(reply.body) == {"granted": 4, "learner_version": 9}
        # Both copies carry one id: the server can tell a retry from a second request.
        assert [want for want, _ in seen] == [4, 4]
        assert seen[0][1] is not None and seen[0][1] == seen[1][1] == reply.request_id


def test_a_request_never_reads_the_reply_of_an_earlier_request(ctx: zmq.Context[Any]) -> None:
    """The stalled-buffer case: the client gave up on request A, the server answers A late (twice,
    one per copy it queued), and then B. B must get B's reply; the copies of A's are discarded."""
    with server(ctx) as srv, client(ctx, srv.address) as cli:
        with pytest.raises(TransportTimeout):
            request(cli, m.BatchRequest(3, 8), timeout_ms=50, retries=1, backoff_ms=1)
        copies = [srv.recv(WAIT_MS) for _ in range(2)]
        assert all(c is not None for c in copies)
        rid_a = copies[0][1].request_id  # type: ignore[index]
        assert copies[1][1].request_id == rid_a  # type: ignore[index]
        peer = copies[0][0]  # type: ignore[index]

        def serve() -> None:
            for _ in copies:
                srv.send(m.Empty("no_waiting_groups"), to=peer, request_id=rid_a)
            got = srv.recv(WAIT_MS)
            assert got is not None and got[1].type == m.COMMIT
            srv.send(m.Empty("committed"), to=peer, request_id=got[1].request_id)

        thread = threading.Thread(target=serve)
        thread.start()
        reply = request(cli, m.Commit(3, ["g-1"]), timeout_ms=WAIT_MS, retries=0)
        thread.join(WAIT_MS / 1000)
        assert m.to_map(reply.body) == {"reason": "committed"} and reply.request_id != rid_a
        assert cli.discarded == 2


def test_request_ids_differ_between_requests_and_name_the_reply(ctx: zmq.Context[Any]) -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2**63 for i in ids)
    with server(ctx) as srv, client(ctx, srv.address) as cli:
        cli.send(m.Hello("gen-0", 0), request_id=7)
        got = srv.recv(WAIT_MS)
        assert got is not None and got[1].request_id == 7
        srv.send(m.Credit(0, 0), to=got[0], request_id=7)
        back = cli.recv(WAIT_MS)
        assert back is not None and back[1].request_id == 7
        cli.send(m.Hello("gen-0", 0))  # one-way messages carry no id
        got = srv.recv(WAIT_MS)
        assert got is not None and got[1].request_id is None


def test_request_raises_remote_error_on_an_error_reply_and_skips_unaccepted_replies(
    ctx: zmq.Context[Any],
) -> None:
    with server(ctx) as srv, client(ctx, srv.address) as cli:
        cli.send(m.Hello("gen-0", 0))
        got = srv.recv(WAIT_MS)
        assert got is not None
        peer = got[0]
        rid = new_request_id()
        # A reply with the right id that `accept` refuses, then the one it takes.
        srv.send(m.Chunk(5, 0, memoryview(b"old")), to=peer, request_id=rid)
        srv.send(m.Chunk(5, 1, memoryview(b"new")), to=peer, request_id=rid)
        reply = request(
            cli,
            m.ChunkRequest(5, 1),
            timeout_ms=WAIT_MS,
            retries=0,
            accept=lambda r: r.body.index == 1,
            request_id=rid,
        )
        assert reply.body.data == b"new"
        assert cli.discarded == 1
        # An error that names no id answers a message the server could not decode: this one.
        srv.send(m.Error("draining", "buffer is shutting down"), to=peer)
        with pytest.raises(RemoteError, match="draining") as info:
            request(cli, m.Hello("gen-0", 0), timeout_ms=WAIT_MS, retries=3)
        assert info.value.detail == "buffer is shutting down"


def test_router_send_to_a_vanished_peer_raises(ctx: zmq.Context[Any]) -> None:
    with server(ctx) as srv:
        with pytest.raises(PeerUnreachable, match="b'gone'"):
            srv.send(m.Credit(1, 0), to=b"gone")
        with pytest.raises(ValueError, match="to=peer_id"):
            srv.send(m.Credit(1, 0))


def test_binding_an_address_in_use_names_it(ctx: zmq.Context[Any]) -> None:
    with server(ctx) as srv:
        with pytest.raises(BindError) as info:
            make_socket(ctx, zmq.ROUTER, bind=srv.address)
    assert f"cannot bind {srv.address}: address already in use" in str(info.value)
    assert "configure a free port" in str(info.value)


def test_make_socket_argument_errors_name_the_fix(ctx: zmq.Context[Any]) -> None:
    with pytest.raises(ValueError, match="exactly one of bind= or connect="):
        make_socket(ctx, zmq.DEALER)
    public, secret = zmq.curve_keypair()
    with pytest.raises(ValueError, match="server_public"):
        make_socket(ctx, zmq.DEALER, connect="tcp://127.0.0.1:1", curve=CurveKeys(public, secret))
    with pytest.raises(ValueError, match="40-byte Z85 key"):
        CurveKeys(public, b"short")
    assert secret.decode() not in repr(CurveKeys(public, secret))


def test_close_is_idempotent_and_closed_endpoints_refuse_work(ctx: zmq.Context[Any]) -> None:
    srv = server(ctx)
    srv.close()
    srv.close()
    assert srv.closed and srv.socket.closed
    with pytest.raises(Exception, match="is closed"):
        srv.recv(0)


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")
def test_curve_client_with_the_right_server_key_talks_and_one_with_a_wrong_key_does_not(
    ctx: zmq.Context[Any],
) -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    srv = server(ctx, curve=CurveKeys(server_public, server_secret), curve_server=True)
    good = client(ctx, srv.address, curve=CurveKeys(client_public, client_secret, server_public))
    wrong_public, _ = zmq.curve_keypair()
    bad = client(ctx, srv.address, curve=CurveKeys(client_public, client_secret, wrong_public))
    try:
        assert good.curve
        good.send(m.Hello("gen-0", 2))
        got = srv.recv(WAIT_MS)
        assert got is not None and m.to_map(got[1].body) == {"generator_id": "gen-0", "policy_version": 2}
        srv.send(m.Credit(1, 2), to=got[0])
        reply = good.recv(WAIT_MS)
        assert reply is not None and m.to_map(reply[1].body) == {"granted": 1, "learner_version": 2}
        # The handshake fails with the wrong server key: nothing gets through.
        with pytest.raises(TransportTimeout, match="matching Curve keys"):
            request(bad, m.Hello("gen-1", 0), timeout_ms=200, retries=0)
        assert srv.recv(0) is None
    finally:
        for ep in (srv, good, bad):
            ep.close()

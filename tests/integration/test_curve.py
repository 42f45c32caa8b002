"""CurveZMQ over real sockets: known clients get through, everyone else is refused at the handshake.

The refusals are observed on the server's socket monitor (handshake failure events), never by
waiting a fixed time: every wait below ends as soon as its event arrives and its timeout is only
reached when something is broken.

A refused client connects once (`one_shot`: ZMQ_RECONNECT_IVL -1). Whether libzmq reconnects after
a failed handshake depends on which the client sees first, the server's error or its closed
connection (a race), and every reconnection is refused and counted again; with one connection
each, every refusal count below is exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from stream_dapo.cli import keys as keys_cli
from stream_dapo.transport.curve import (
    CurveKeyError,
    generate_keys,
    load_client_keys,
    load_server_keys,
    start_authenticator,
)
from stream_dapo.transport.sockets import CurveKeys, make_socket

WAIT_MS = 10_000
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keys(tmp_path / "keys")
    return tmp_path / "keys"


class Monitor:
    """Counts handshake events of one socket."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        self.seen: list[int] = []

    def wait_for(self, event: int, count: int = 1) -> None:
        """Block until `event` has been seen `count` times in total."""
        while self.seen.count(event) < count:
            if not self.sock.poll(WAIT_MS):
                names = [zmq.Event(e).name for e in self.seen]
                raise AssertionError(f"no {zmq.Event(event).name} within {WAIT_MS} ms; saw {names}")
            self.seen.append(recv_monitor_message(self.sock)["event"])

    def drain(self) -> None:
        """Record the events already queued, without waiting for more."""
        while self.sock.poll(0):
            self.seen.append(recv_monitor_message(self.sock)["event"])

    def failures(self) -> int:
        return sum(e != zmq.EVENT_HANDSHAKE_SUCCEEDED for e in self.seen)

    def wait_for_failures(self, count: int) -> None:
        while self.failures() < count:
            if not self.sock.poll(WAIT_MS):
                raise AssertionError(f"fewer than {count} handshake failures within {WAIT_MS} ms")
            self.seen.append(recv_monitor_message(self.sock)["event"])


def _recv(sock: zmq.Socket[Any]) -> list[bytes]:
    assert sock.poll(WAIT_MS), "no message within the timeout"
    return sock.recv_multipart()


def _client(ctx: zmq.Context[Any], address: str, **curve: Any) -> zmq.Socket[Any]:
    sock = make_socket(ctx, zmq.DEALER, connect=address, **curve)
    return sock


def one_shot(ctx: zmq.Context[Any], keys: CurveKeys | None = None) -> zmq.Socket[Any]:
    """A DEALER, not yet connected, that never reconnects (libzmq reads the option at connect), with
    Curve client keys or none (the NULL mechanism). Connect it after attaching any monitor."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.reconnect_ivl = -1
    if keys is not None:
        assert keys.server_public is not None
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret
    return sock


def test_known_client_talks_and_strangers_are_refused_without_delivering_anything(
    ctx: zmq.Context[Any], keys: Path, tmp_path: Path
) -> None:
    auth = start_authenticator(ctx, keys / "clients")
    try:
        server = make_socket(
            ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", curve=load_server_keys(keys), curve_server=True
        )
        address = cast(bytes, server.last_endpoint).decode()  # a bytes option
        monitor = Monitor(server)

        # A plain (NULL mechanism) client and a Curve client whose key is not in the allow-list,
        # though it knows the server's public key. Both send at once: the messages wait in their
        # queues and must never reach the server. One connection each: one refusal each.
        plain = one_shot(ctx)
        plain.connect(address)
        generate_keys(tmp_path / "stranger")
        stranger_keys = dataclasses.replace(
            load_client_keys(tmp_path / "stranger"), server_public=load_server_keys(keys).public
        )
        stranger = one_shot(ctx, stranger_keys)
        stranger_monitor = Monitor(stranger)  # attached before it connects: no event is missed
        stranger.connect(address)
        for sock, payload in ((plain, b"from the plain client"), (stranger, b"from the stranger")):
            try:
                sock.send(payload, zmq.NOBLOCK)
            except zmq.Again:
                pass  # its handshake already failed and left no pipe to queue on: refused even earlier

        monitor.wait_for(zmq.EVENT_HANDSHAKE_FAILED_AUTH)  # the authenticator said no to the stranger
        stranger_monitor.wait_for(zmq.EVENT_HANDSHAKE_FAILED_AUTH)  # and the stranger was told so
        monitor.wait_for_failures(2)  # ... and the plain client failed too (mechanism mismatch)
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in monitor.seen

        # The known client gets through, both ways, encrypted.
        friend = _client(ctx, address, curve=load_client_keys(keys))
        friend.send(b"hello")
        peer, payload = _recv(server)
        assert payload == b"hello"
        server.send_multipart([peer, b"welcome"])
        assert _recv(friend) == [b"welcome"]
        monitor.wait_for(zmq.EVENT_HANDSHAKE_SUCCEEDED)

        # The only thing the server receives after "hello" is the friend's next message: ROUTER
        # fair-queues across peers, so anything a stranger had delivered would be waiting here too.
        friend.send(b"second")
        assert _recv(server) == [peer, b"second"]
        assert not server.poll(0), "the server received something from a refused client"
        monitor.drain()
        assert monitor.seen.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1  # only the friend ever got in
        # Two connections refused, once each: the stranger by the authenticator, the plain client
        # by its mechanism (not by the authenticator, which it never reached).
        assert monitor.failures() == 2, [zmq.Event(e).name for e in monitor.seen]
        assert monitor.seen.count(zmq.EVENT_HANDSHAKE_FAILED_AUTH) == 1
    finally:
        auth.stop()


def test_generated_layout_matches_what_servers_and_clients_load(keys: Path) -> None:
    server = load_server_keys(keys)
    client = load_client_keys(keys)
    assert client.server_public == server.public
    allowed = sorted(p.name for p in (keys / "clients").iterdir())
    assert allowed == ["client.key"]
    assert (keys / "clients" / "client.key").read_bytes() == (keys / "client.key").read_bytes()
    for secret in keys.glob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert not list(keys.glob(".keys-*")), "the staging directory was left behind"


def test_existing_keys_are_not_replaced_without_force(keys: Path) -> None:
    before = (keys / "server.key_secret").read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        generate_keys(keys)
    assert (keys / "server.key_secret").read_bytes() == before
    generate_keys(keys, overwrite=True)
    assert (keys / "server.key_secret").read_bytes() != before


def test_missing_keys_name_the_command_that_creates_them(tmp_path: Path, ctx: zmq.Context[Any]) -> None:
    with pytest.raises(CurveKeyError, match="stream-dapo keys generate"):
        load_server_keys(tmp_path)
    with pytest.raises(CurveKeyError, match="stream-dapo keys generate"):
        load_client_keys(tmp_path)
    (tmp_path / "clients").mkdir()
    with pytest.raises(CurveKeyError, match="every client would be refused"):
        start_authenticator(ctx, tmp_path / "clients")


def test_keys_command_writes_several_clients(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    keys_cli.add_arguments(parser)
    out = tmp_path / "curve"
    args = parser.parse_args(["generate", "--out", str(out), "--client", "gen", "--client", "learner"])
    assert keys_cli.run(args) == 0
    assert sorted(p.name for p in (out / "clients").iterdir()) == ["gen.key", "learner.key"]
    assert load_client_keys(out, "learner").server_public == load_server_keys(out).public
    assert "transport.curve_dir" in capsys.readouterr().out
    assert keys_cli.run(args) == 2  # a second run refuses to replace them
    assert "--force" in capsys.readouterr().err


def test_the_weight_server_counts_and_logs_refused_connections(
    ctx: zmq.Context[Any], keys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: rogue connections to the learner's weights port were refused with no counter or log
    line. A plain client (protocol or handshake, as libzmq sees it) and an unknown Curve key
    (not_allowed) are each counted."""
    import time

    from prometheus_client import CollectorRegistry, Counter

    from stream_dapo.weights.zmq_chunks import WeightServer

    registry = CollectorRegistry()
    refused = Counter("refused", "", ["socket", "reason"], registry=registry)
    server = WeightServer(
        "tcp://127.0.0.1:*",
        curve=load_server_keys(keys),
        allowed_clients_dir=keys / "clients",
        refused_metric=refused,
    )
    stranger_dir = keys.parent / "stranger"
    generate_keys(stranger_dir)
    stranger = dataclasses.replace(
        load_client_keys(stranger_dir), server_public=load_server_keys(keys).public
    )
    with caplog.at_level("WARNING"), server.start():
        # Both stay open (the fixture's context closes them): a socket dropped here would be closed
        # by the garbage collector, perhaps before its handshake was refused and counted. Each
        # connects once, so each is refused (and counted) exactly once.
        rogues = [one_shot(ctx, c) for c in (None, stranger)]
        for sock in rogues:
            sock.connect(server.address)
            try:
                sock.send(b"x", zmq.NOBLOCK)
            except zmq.Again:
                pass  # refused already, leaving no pipe to queue on
        deadline = time.monotonic() + 60  # only reached when a refusal is never counted
        counts: dict[str, float] = {}
        while sum(counts.values()) < 2:
            assert time.monotonic() < deadline, counts
            time.sleep(0.05)
            counts = {
                s.labels["reason"]: s.value
                for s in next(iter(registry.collect())).samples
                if s.name == "refused_total" and s.labels["socket"] == "weights"
            }
    # The stranger's key is not allowed; the plain client failed its handshake (libzmq says
    # protocol or handshake). One refusal each, each counted once.
    assert counts.pop("not_allowed") == 1, counts
    assert list(counts.values()) == [1] and set(counts) <= {"protocol", "handshake"}, counts
    assert "refused a connection to the weights socket: Curve handshake failed" in caplog.text

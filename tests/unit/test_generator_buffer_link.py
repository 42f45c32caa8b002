"""`BufferLink` over a real loopback socket, this test playing the buffer's ROUTER: the hello, a
sampling refusal, credits, a group sent, numbered and acknowledged, the filtered tally, a resend."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from stream_dapo.config import load_config
from stream_dapo.generator.buffer_link import BufferLink
from stream_dapo.generator.errors import StartupError
from stream_dapo.runtime.metrics import GeneratorMetrics, Health
from stream_dapo.testing.services import wire_group
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import Message
from stream_dapo.transport.sockets import Endpoint, open_endpoint


@pytest.fixture
def buffer() -> Iterator[Endpoint]:
    ctx: zmq.Context[Any] = zmq.Context()
    router = open_endpoint(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=1 << 24, peer="generator")
    try:
        yield router
    finally:
        router.close()
        ctx.destroy(linger=0)


def make_link(buffer: Endpoint, *overrides: str) -> tuple[BufferLink, Callable[[str], float | None], Health]:
    port = int(buffer.address.rsplit(":", 1)[1])
    cfg = load_config(
        overrides=[f"transport.samples_port={port}", "transport.timeout_s=5", *overrides], environ={}
    )
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics, health = GeneratorMetrics(registry), Health()
    link = BufferLink(
        "generator-0",
        "host pid 1 (ab)",
        transport=cfg.transport,
        generator=cfg.generator,
        lease_s=cfg.buffer.generator_lease_s,
        metrics=metrics,
        health=health,
        stop=threading.Event(),
        rollouts=lambda: dict.fromkeys(m.ROLLOUT_FIELDS, 0),
        in_flight_versions=lambda: [2],
    )
    return link, registry.get_sample_value, health


def answer_hello(buffer: Endpoint, reply: m.Body) -> threading.Thread:
    """Answer the next message (the hello) with `reply`, on a thread (`connect` blocks)."""

    def run() -> None:
        got = buffer.recv(5000)
        assert got is not None and isinstance(got[1].body, m.Hello)
        buffer.send(reply, to=got[0], request_id=got[1].request_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def recv(buffer: Endpoint) -> tuple[bytes | None, Message]:
    got = buffer.recv(5000)
    assert got is not None
    return got


def test_the_link_says_hello_asks_for_credits_sends_a_numbered_group_and_takes_its_ack(
    buffer: Endpoint,
) -> None:
    link, sample, _ = make_link(buffer, "generator.max_groups_in_flight=2")
    try:
        hello = answer_hello(buffer, m.Credit(0, 5))
        link.connect()
        hello.join(10)
        link.ask_for_credits(in_flight=0)
        peer, msg = recv(buffer)
        assert isinstance(msg.body, m.CreditRequest) and msg.body.want == 2
        buffer.send(m.Credit(2, 4), to=peer, request_id=msg.request_id)
        link.read(timeout_ms=5000)
        assert link.credits.held == 2 and link.credit_version == 4
        assert link.credits.take()

        link.send_group(wire_group("a"))
        _, msg = recv(buffer)
        body = msg.body
        assert isinstance(body, m.Groups)
        assert [(g.group_id, g.seq) for g in body.groups] == [("a", 0)]
        assert body.in_flight_versions == [2] and body.holder == "host pid 1 (ab)" and body.acked_below == 0
        assert "a" in link.unacked and sample("stream_dapo_generator_groups_sent_total") == 1

        link.report_filtered()  # nothing redeemed without a group: nothing to say
        link.credits.redeem_without_group()
        link.report_filtered()
        _, msg = recv(buffer)
        assert isinstance(msg.body, m.Groups) and msg.body.groups == [] and msg.body.filtered_total == 1
        link.report_filtered()
        assert buffer.recv(100) is None, "the tally goes once per change"

        buffer.send(m.Ack(accepted=["a"]), to=peer)
        link.read(timeout_ms=5000)
        assert len(link.unacked) == 0 and sample("stream_dapo_generator_groups_acked_total") == 1
        link.update_gauges()
        assert (
            sample("stream_dapo_generator_unacked_groups") == 0
            and sample("stream_dapo_generator_credits_available") == 1
        )
    finally:
        link.close()


def test_an_unacknowledged_group_is_resent_and_the_drain_returns_unused_credits(buffer: Endpoint) -> None:
    link, sample, _ = make_link(buffer)
    try:
        hello = answer_hello(buffer, m.Credit(0, 0))
        link.connect()
        hello.join(10)
        link.credits.held = 3
        link.send_group(wire_group("a"))
        recv(buffer)
        link.unacked.expire()  # as after a reconnect
        link.resend_unacked()
        peer, msg = recv(buffer)
        assert isinstance(msg.body, m.Groups) and [g.group_id for g in msg.body.groups] == ["a"]
        assert sample("stream_dapo_generator_groups_sent_total") == 2 and link.unacked.resent == 1
        link.return_credits(aborted=2)
        assert link.credits.held == 0 and link.credits.filtered_total == 5
        buffer.send(m.Ack(accepted=["a"]), to=peer)
        assert link.await_acks(budget_s=5.0) == 0
    finally:
        link.close()


def test_a_sampling_refusal_ends_the_start_up_with_the_buffers_message(buffer: Endpoint) -> None:
    link, _, _ = make_link(buffer)
    try:
        answer_hello(buffer, m.Error("sampling_mismatch", "generator.temperature = 0.7 there, 1.0 here"))
        with pytest.raises(StartupError, match=r"refused this generator: generator\.temperature = 0\.7"):
            link.connect()
    finally:
        link.close()

"""A hung buffer, then a resumed one: the real buffer process, the real learner service (DeepSpeed,
tiny Qwen2) and a generator stand-in over real sockets.

The buffer is paused with SIGSTOP while the learner waits on it, long enough for the learner to
resend its request twice, then resumed. What the protocol promises, and this test checks: every
resend of a request carries its id and nothing else does; the learner reads one reply per request,
the one naming it, and the replies it drops (counted) answer requests it no longer waits for; a
retried `batch_request` gets the same lease (no group leased to two requests, nothing left leased);
every step trains a full mini-batch, no group is trained twice, staleness stays within the bound,
and while the buffer hung the learner was live but not ready.

How many copies of the hung request reach the buffer, and which of them the buffer counts as
retries, depends on scheduling (what the sockets still hold when it resumes; a copy of a request
answered `empty` is not a retry of a lease), so those are bounds, never counts. What the learner
sent and read is recorded at its one call of `request` (`LearnerWire`) and checked exactly.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq

from stream_dapo.config import load_config
from stream_dapo.learner import service as learner_service
from stream_dapo.learner.root import build_learner
from stream_dapo.testing.services import tiny_qwen2
from stream_dapo.transport import codec
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import Endpoint, TransportTimeout, open_endpoint, request
from tests.integration.test_buffer_service import metric, scrape, start_buffer, wait_ready
from tests.integration.test_learner import make_groups

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 8
TIMEOUT_S = 2.0  # transport.timeout_s: how long one attempt waits before it is resent


def overrides(tmp: Path) -> list[str]:
    # G = 2, B_v = 4 / 2 = 2 groups per step, S = 4 / 2 = 2 steps per rollout, max_staleness 4:
    # admission capacity (4 - 2 - 0 + 1) * 2 = 6 groups.
    return [
        f"model.path={tmp / 'model'}",
        "model.max_prompt_len=8",
        f'run.out_dir="{tmp / "run"}"',
        "algo.group_size=2",
        "algo.max_response_len=32",
        "algo.overlong_cache_len=4",
        "algo.max_staleness=4",
        "learner.mini_batch_samples=4",
        "learner.rollout_batch_prompts=4",
        "learner.micro_batch_tokens=64",
        f"learner.total_steps={STEPS}",
        "learner.checkpoint_every=2",
        "learner.sync_every=1",
        f"transport.timeout_s={TIMEOUT_S}",
        # Any free ports: the buffer reports what it bound (`buffer_ports`), the learner is told.
        "transport.samples_port=0",
        "transport.batches_port=0",
        "transport.weights_port=0",
        "metrics.buffer_port=0",
        "metrics.learner_port=0",
    ]


def peer_overrides(ports: dict[str, int]) -> list[str]:
    """What a peer of the buffer needs of the ports it reported: where to connect."""
    return [f"{key}={port}" for key, port in ports.items() if key.startswith("transport.")]


class Feeder:
    """A generator stand-in: asks for credits and sends groups generated "at" the credit's learner
    version. Its requests wait long (60 s) so that it sends no copies during the stall."""

    def __init__(self, address: str) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ep = open_endpoint(self.ctx, zmq.DEALER, connect=address, max_bytes=64 << 20, peer="buffer")
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _ask(self, outgoing: m.Body) -> m.Message:  # type: ignore[name-defined]
        return request(self.ep, outgoing, timeout_ms=60_000, retries=0)

    def _run(self) -> None:
        self._ask(m.Hello("feeder", 0))
        seed = 1000
        while not self.stop.is_set():
            try:
                credit = self._ask(m.CreditRequest("feeder", 4))
                n, version = credit.body.granted, credit.body.learner_version
                if n == 0:
                    time.sleep(0.05)
                    continue
                seed += 1
                groups = make_groups(seed, n=n, version=version, group_size=2)
                for g in groups:
                    g.generator_id = "feeder"
                self._ask(m.Groups("feeder", groups))
                self.sent += n
            except TransportTimeout:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(90)
        self.ep.close()
        self.ctx.term()


@dataclass
class Attempt:
    """One send of a request by the learner, and what came of it."""

    request_id: int
    body: Any
    reply: codec.Message | None = None
    """The reply `request` returned; None: none within transport.timeout_s (resent, or given up)."""


class LearnerWire:
    """Stands in for `request` in the learner service (its one call site) and wraps its endpoint's
    `recv`: every attempt the learner sent, with its request id, and every message it read, with
    the id it was waiting for then. This is what the learner itself did, whatever the scheduling.

    `hang(body)` is asked before each first send of a request; when it returns True (once), the
    buffer has just been stopped and this request is the one that hangs (`hung`)."""

    def __init__(self, real: Callable[..., codec.Message], hang: Callable[[Any], bool]) -> None:
        self._real = real
        self._hang = hang
        self.attempts: list[Attempt] = []
        self.received: list[tuple[int | None, int | None, codec.Message]] = []
        """(the request id a message named, the id the learner was waiting for, the message)."""
        self.hung: int | None = None
        self._waiting: int | None = None
        self._wrapped: set[int] = set()

    def __call__(self, endpoint: Endpoint, body: Any, **kwargs: Any) -> codec.Message:
        if id(endpoint) not in self._wrapped:
            self._wrapped.add(id(endpoint))
            recv = endpoint.recv

            def recording_recv(timeout_ms: int) -> Any:
                got = recv(timeout_ms)
                if got is not None:
                    self.received.append((got[1].request_id, self._waiting, got[1]))
                return got

            endpoint.recv = recording_recv  # type: ignore[method-assign]
        rid = kwargs["request_id"]
        if self.hung is None and rid != self._waiting and self._hang(body):
            self.hung = rid
        attempt = Attempt(rid, body)
        self.attempts.append(attempt)
        self._waiting = rid
        attempt.reply = self._real(endpoint, body, **kwargs)  # TransportTimeout leaves reply None
        return attempt.reply

    def sends(self, rid: int | None) -> int:
        return sum(a.request_id == rid for a in self.attempts)

    def requests(self) -> dict[int, list[Attempt]]:
        """The attempts by request id, in the order the requests were first sent. A request's
        attempts are consecutive: an id that came back after another request started was reused."""
        runs = [rid for rid, _ in itertools.groupby(a.request_id for a in self.attempts)]
        assert len(runs) == len(set(runs)), f"a later request reused a request id: {runs}"
        return {rid: [a for a in self.attempts if a.request_id == rid] for rid in runs}


def total(counter: Any) -> float:
    """A prometheus_client Counter's value, through its public collect()."""
    return next(s.value for s in counter.collect()[0].samples if s.name.endswith("_total"))


def wait_for(cond: Any, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_hung_buffer_neither_mixes_up_replies_nor_leases_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_qwen2(0).save_pretrained(tmp_path / "model")
    items = overrides(tmp_path)
    log_path = tmp_path / "buffer.log"
    buffer = start_buffer([arg for item in items for arg in ("--set", item)], log_path)
    ports = wait_ready(buffer, tmp_path / "run", log_path)
    cfg = load_config(overrides=[*items, *peer_overrides(ports)], environ={})

    def hang(body: Any) -> bool:
        """Stop the buffer just before a batch request (from step 2 on) while a group waits: the
        first copy will lease it, and every copy after it must get that lease again. Only the
        learner takes groups out of the queue, and it is here, so they are still waiting when the
        buffer resumes."""
        if not isinstance(body, m.BatchRequest) or body.learner_version < 2:
            return False
        status, text = scrape(ports["metrics.buffer_port"])
        if status != 200 or metric(text, 'stream_dapo_buffer_depth_groups{state="waiting"}') < 1:
            return False
        buffer.send_signal(signal.SIGSTOP)
        return True

    wire = LearnerWire(request, hang)
    monkeypatch.setattr(learner_service, "request", wire)
    feeder = Feeder(f"tcp://127.0.0.1:{cfg.transport.samples_port}")
    svc = build_learner(cfg)
    codes: list[int] = []
    errors: list[BaseException] = []

    def train() -> None:
        try:
            codes.append(svc.run())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    learner = threading.Thread(target=train)
    readiness_while_hung: dict[str, Any] = {}
    try:
        feeder.thread.start()
        learner.start()
        try:
            wait_for(lambda: errors or wire.hung is not None, "a batch request at step 2 or later")
            assert not errors, errors
            # Three sends of the hung request: it was resent twice.
            wait_for(lambda: errors or wire.sends(wire.hung) >= 3, "the learner to resend its request twice")
            assert svc.health is not None
            readiness_while_hung = {
                "live": svc.health.status("live")[0],
                "ready": svc.health.status("ready")[0],
            }
        finally:
            buffer.send_signal(signal.SIGCONT)
        learner.join(300)
        assert not learner.is_alive(), "the learner did not finish after the buffer resumed"
        assert not errors, errors
        stale_replies = total(svc.metrics.stale_replies)
        retries = total(svc.metrics.request_retries)
    finally:
        if learner.is_alive():
            svc.request_stop()
            learner.join(120)
        feeder.close()
        buffer.send_signal(signal.SIGCONT)
        buffer.send_signal(signal.SIGTERM)
        buffer.wait(30)
    assert codes == [0]
    assert readiness_while_hung == {"live": 200, "ready": 503}

    rows = [
        json.loads(line)
        for line in (tmp_path / "run" / "learner" / "trained_groups.jsonl").read_text().splitlines()
    ]
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    assert [len(r["group_ids"]) for r in rows] == [
        cfg.admission.groups_per_version
    ] * STEPS  # full mini-batches
    trained = [gid for r in rows for gid in r["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert max(r["max_staleness"] for r in rows) <= cfg.algo.max_staleness

    # What the learner sent: each request under one id, resent as it was; as many resends as its
    # own counter says.
    sent = wire.requests()
    for rid, tries in sent.items():
        assert all(t.body is tries[0].body for t in tries), f"request {rid} was resent as another request"
        assert all(t.reply is None for t in tries[:-1]), f"request {rid} was resent after its reply"
    assert retries == sum(len(tries) - 1 for tries in sent.values())
    # What it read: one reply per answered request, naming it; every reply it dropped (counted)
    # answers a request sent before the one it waited for, and no request got more replies than
    # it had copies.
    answered = {rid: tries[-1].reply for rid, tries in sent.items() if tries[-1].reply is not None}
    assert all(reply.request_id == rid for rid, reply in answered.items())
    order = {rid: i for i, rid in enumerate(sent)}
    dropped = [(got, waiting, msg) for got, waiting, msg in wire.received if got != waiting]
    assert sum(got == waiting for got, waiting, _ in wire.received) == len(answered)
    assert all(
        got in order and waiting in order and order[got] < order[waiting] for got, waiting, _ in dropped
    ), [(got, waiting) for got, waiting, _ in dropped]
    assert stale_replies == len(dropped)
    copies = Counter(got for got, _, _ in wire.received)
    assert all(n <= len(sent[rid]) for rid, n in copies.items()), "the buffer answered a copy twice"

    # The hung batch request was leased groups, and every copy of it the buffer answered (however
    # many reached it: scheduling decides) got that same lease, and was dropped by the learner.
    hung = answered[wire.hung]
    assert isinstance(hung.body, m.Batch) and hung.body.groups, hung
    lease = [g.group_id for g in hung.body.groups]
    again = [msg for got, _, msg in dropped if got == wire.hung]
    assert all(isinstance(msg.body, m.Batch) for msg in again), again
    assert all([g.group_id for g in msg.body.groups] == lease for msg in again), "a copy got another lease"
    # No group went to two requests, and every trained group came in a reply the learner read.
    leased = [
        g.group_id
        for reply in answered.values()
        if isinstance(reply.body, m.Batch)
        for g in reply.body.groups
    ]
    assert len(leased) == len(set(leased)), "a group was leased to two requests"
    assert set(trained) <= set(leased)

    stats = json.loads((tmp_path / "run" / "buffer" / "stats.json").read_text())
    # The buffer counts the copies it recognised as retries: as many as reached it, never more
    # than the learner sent (its own resends), at least those whose replies the learner dropped.
    assert len(again) <= stats["retried_requests"] <= retries
    assert stats["served"] == len(trained) + stats["requeued"]
    assert stats["leased"] == 0, "groups were leased and never trained"
    assert stats["dropped_stale"] == 0
    assert stats["commit_unknown"] == 0

"""A hung buffer, then a resumed one: the real buffer process, the real learner service (DeepSpeed,
tiny Qwen2) and a generator stand-in over real sockets.

The buffer is paused with SIGSTOP while the learner waits on it, long enough for the learner to
resend its request twice, then resumed. The buffer then answers every queued copy. What the
protocol promises, and this test checks: the learner reads only the reply to the request it is
waiting for (the copies are dropped and counted), a retried `batch_request` gets the same lease
(nothing leased twice, nothing left leased), every step trains a full mini-batch, no group is
trained twice, staleness stays within the bound, and while the buffer hung the learner was live
but not ready.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from stream_dapo.config import load_config
from stream_dapo.learner.root import build_learner
from stream_dapo.testing.services import tiny_qwen2
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import TransportTimeout, open_endpoint, request
from tests.integration.test_buffer_service import start_buffer, wait_ready
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


def total(counter: Any) -> float:
    """A prometheus_client Counter's value, through its public collect()."""
    return next(s.value for s in counter.collect()[0].samples if s.name.endswith("_total"))


def wait_for(cond: Any, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_hung_buffer_neither_mixes_up_replies_nor_leases_twice(tmp_path: Path) -> None:
    tiny_qwen2(0).save_pretrained(tmp_path / "model")
    items = overrides(tmp_path)
    log_path = tmp_path / "buffer.log"
    buffer = start_buffer([arg for item in items for arg in ("--set", item)], log_path)
    ports = wait_ready(buffer, tmp_path / "run", log_path)
    cfg = load_config(overrides=[*items, *peer_overrides(ports)], environ={})
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
        wait_for(lambda: errors or (svc.learner is not None and svc.learner.version >= 2), "step 2")
        assert not errors, errors
        buffer.send_signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: errors or total(svc.metrics.request_retries) >= 2,
                "the learner to resend its request twice",
            )
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

    stats = json.loads((tmp_path / "run" / "buffer" / "stats.json").read_text())
    # The resent request was answered as the first copy was: the learner got one lease per request.
    assert stats["retried_requests"] >= 2
    assert stale_replies >= 2  # the copies' replies reached the learner and were dropped
    assert stats["served"] == len(trained) + stats["requeued"]
    assert stats["leased"] == 0, "groups were leased and never trained"
    assert stats["dropped_stale"] == 0
    assert stats["commit_unknown"] == 0

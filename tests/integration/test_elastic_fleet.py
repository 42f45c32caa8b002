"""Generators join and leave during one run: the real buffer process, the real learner service
(DeepSpeed, tiny Qwen2) and generator stand-ins that speak the generator's protocol (hello,
credits, groups, heartbeats with a running filtered total) over real sockets.

The fleet goes 1 -> 3 -> 1 and then its last member is replaced by one with a new index: one
stand-in leaves as a draining generator does (it reports its unused credits), one dies holding
credits (it goes silent), then the first dies and a fifth id joins. What the protocol promises, and
this test checks: the buffer needs no restart and no generator count; a dead generator's credits
return to the admission line when its lease expires, so the newcomers get the whole line; the run
goes on; every acknowledged group is trained, held or dropped as stale, and none is trained twice.
Regression: credits were reclaimed only by a hello from the same id, so after replacements every
credit was held by dead generators and the learner stalled for good.

The same drill with real vLLM generators is `python -m bench.drills.drill --elastic`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import zmq

from stream_dapo.buffer.journal import Journal
from stream_dapo.buffer.replay import ReplayBuffer
from stream_dapo.buffer.service import persist_path
from stream_dapo.config import load_config
from stream_dapo.learner.root import build_learner
from stream_dapo.testing.services import tiny_qwen2
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import TransportTimeout, open_endpoint, request
from tests.integration.test_buffer_service import start_buffer, wait_ready
from tests.integration.test_learner import make_groups
from tests.integration.test_learner_buffer_stall import overrides as stall_overrides
from tests.integration.test_learner_buffer_stall import peer_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LEASE_S = 3.0
HEARTBEAT_S = 0.5


class StandIn:
    """One generator's protocol: hello, then credits -> groups (generated "at" the credit's learner
    version), a heartbeat every HEARTBEAT_S carrying the running total of credits spent without a
    group. `leave()` drains (reports what it holds); `die()` goes silent with its credits."""

    def __init__(self, gen_id: str, address: str) -> None:
        self.gen_id = gen_id
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ep = open_endpoint(self.ctx, zmq.DEALER, connect=address, max_bytes=64 << 20, peer="buffer")
        self.held = 0
        self.filtered_total = 0
        self.acked: list[str] = []
        self.expired_told = 0
        self._leave = threading.Event()
        self._die = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ask(self, outgoing: m.Body) -> m.Message:  # type: ignore[name-defined]
        return request(self.ep, outgoing, timeout_ms=60_000, retries=0)

    def _run(self) -> None:
        try:
            self._ask(m.Hello(self.gen_id, 0))
            seed = abs(hash(self.gen_id)) % 10_000
            next_beat = 0.0
            while not self._leave.is_set():
                if self._die.is_set() and self.held > 0:
                    break  # dies holding credits it was granted, as a killed generator does
                if time.monotonic() >= next_beat:
                    lease = self._ask(m.Heartbeat(self.gen_id, self.filtered_total))
                    if lease.body.expired:
                        self.expired_told += 1
                        self.held = 0
                    next_beat = time.monotonic() + HEARTBEAT_S
                if self.held == 0:
                    credit = self._ask(m.CreditRequest(self.gen_id, 2))
                    self.held, version = credit.body.granted, credit.body.learner_version
                    if self.held == 0:
                        time.sleep(0.02)
                        continue
                seed += 1
                (group,) = make_groups(seed, n=1, version=version, group_size=2)
                group.generator_id = self.gen_id
                self.held -= 1
                ack = self._ask(m.Groups(self.gen_id, [group], filtered_total=self.filtered_total))
                self.acked += ack.body.accepted
            if self._leave.is_set():  # a drain: the credits it still holds go back with the total
                self.filtered_total += self.held
                self.held = 0
                self._ask(m.Heartbeat(self.gen_id, self.filtered_total))
        except TransportTimeout:
            pass
        finally:
            self.ep.close()
            self.ctx.term()
            self.done.set()

    def hold_credits_and_die(self) -> None:
        """Stop right after a grant, before using it: it dies holding credits."""
        self._die.set()
        assert self.done.wait(120), f"{self.gen_id} got no credits to die with"

    def leave(self) -> None:
        self._leave.set()
        self.done.wait(30)


def credits(port: int, gen: str) -> int:
    """The credits the buffer counts as `gen`'s, from the leases its /healthz lists (an expired
    generator holding none is no longer listed)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    return int(body.get("generators", {}).get(gen, {}).get("credits", 0))


def wait_for(cond: Any, what: str, errors: list[BaseException], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert not errors, errors
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_generators_join_and_leave_and_a_dead_ones_credits_come_back(tmp_path: Path) -> None:
    tiny_qwen2(0).save_pretrained(tmp_path / "model")
    items = [
        *stall_overrides(tmp_path),
        "learner.total_steps=100000",
        f"buffer.generator_lease_s={LEASE_S}",
        f"generator.heartbeat_s={HEARTBEAT_S}",
    ]
    log_path = tmp_path / "buffer.log"
    buffer = start_buffer([arg for item in items for arg in ("--set", item)], log_path)
    ports = wait_ready(buffer, tmp_path / "run", log_path)
    cfg = load_config(overrides=[*items, *peer_overrides(ports)], environ={})
    address = f"tcp://127.0.0.1:{cfg.transport.samples_port}"
    port = ports["metrics.buffer_port"]
    svc = build_learner(cfg)
    errors: list[BaseException] = []
    codes: list[int] = []

    def train() -> None:
        try:
            codes.append(svc.run())
        except BaseException as exc:  # surfaced by wait_for
            errors.append(exc)

    learner = threading.Thread(target=train)
    fleet: dict[str, StandIn] = {}
    version = lambda: svc.learner.version if svc.learner is not None else 0  # noqa: E731
    try:
        fleet["generator-0"] = StandIn("generator-0", address)
        learner.start()
        wait_for(lambda: version() >= 2, "step 2", errors)

        # 1 -> 3: two ids the buffer has never seen (no generator count anywhere).
        for gen in ("generator-1", "generator-2"):
            fleet[gen] = StandIn(gen, address)
        wait_for(
            lambda: all(fleet[g].acked for g in ("generator-1", "generator-2")),
            "the newcomers' groups",
            errors,
        )

        # 3 -> 1: one drains, one dies holding credits.
        fleet["generator-1"].leave()
        assert credits(port, "generator-1") == 0  # handed back at once, no lease wait
        fleet["generator-2"].hold_credits_and_die()
        held = fleet["generator-2"].held
        assert held > 0 and credits(port, "generator-2") == held
        step = version()
        wait_for(lambda: credits(port, "generator-2") == 0, "generator-2's lease to expire", errors)
        wait_for(lambda: version() > step, "a step after the departures", errors)

        # The last original dies and an id never seen before takes over: it gets the whole line.
        fleet["generator-0"].hold_credits_and_die()
        fleet["generator-7"] = StandIn("generator-7", address)
        wait_for(lambda: credits(port, "generator-0") == 0, "generator-0's lease to expire", errors)
        step = version()
        wait_for(
            lambda: len(fleet["generator-7"].acked) >= 8 and version() >= step + 2,
            "the replacement to carry the run",
            errors,
        )
    finally:
        svc.request_stop()
        learner.join(120)
        for standin in fleet.values():
            standin.leave()
        buffer.terminate()
        buffer.wait(30)
    assert not errors, errors
    assert codes == [0]

    stats = json.loads((tmp_path / "run" / "buffer" / "stats.json").read_text())
    assert stats["generators_expired"] >= 2  # generator-2 and generator-0, after LEASE_S of silence
    rows = [
        json.loads(line)
        for line in (tmp_path / "run" / "learner" / "trained_groups.jsonl").read_text().splitlines()
    ]
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1))
    trained = [gid for r in rows for gid in r["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert max(r["max_staleness"] for r in rows) <= cfg.algo.max_staleness
    journal = Journal(persist_path(cfg))
    try:
        restored = ReplayBuffer.restore(cfg.admission_policy(), journal.load())
    finally:
        journal.close()
    held_ids = set(restored.waiting_ids()) | set(restored.leased_ids())
    acked = {gid for s in fleet.values() for gid in s.acked}
    lost = acked - set(trained) - held_ids
    assert len(lost) == stats["dropped_stale"] == 0, f"acknowledged groups neither trained nor held: {lost}"

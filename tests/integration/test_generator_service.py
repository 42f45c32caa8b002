"""The generator service end to end over real sockets: a scripted buffer (ROUTER), the learner's real
``WeightServer``, the real vLLM engine on the tiny model.

Checks the late-joiner rule (weights published before the generator starts are loaded before its
first prompt), credits (never more groups than granted), a lost acknowledgement followed by a buffer
restart (the group is resent on reconnect and the buffer sees it twice), a weight update while
running (later tokens carry the new version),
/metrics and /healthz, and the drain (everything acknowledged, unused credits reported back).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import zmq  # noqa: E402

from stream_dapo.config import Config  # noqa: E402
from stream_dapo.generator.group_log import read_group_log  # noqa: E402
from stream_dapo.generator.root import build_generator  # noqa: E402
from stream_dapo.model.tiny import init_model  # noqa: E402
from stream_dapo.testing.services import HeldPorts  # noqa: E402
from stream_dapo.transport import messages as m  # noqa: E402
from stream_dapo.transport.sockets import open_endpoint  # noqa: E402
from stream_dapo.weights import WeightServer, serialize_weights  # noqa: E402

pytestmark = pytest.mark.slow

G = 4
CREDIT_BUDGET = 6


class ScriptedBuffer:
    """Answers like `stream-dapo buffer`: grants at most CREDIT_BUDGET credits in all, swallows the
    first ack (so the generator must resend), records everything."""

    def __init__(self, listening: socket.socket) -> None:
        """Serves on `listening`, a socket the test holds: a restart adopts it again (ZMQ_USE_FD), so
        the port is the buffer's throughout, as a supervisor's socket is across a service's restarts."""
        self.listening = listening
        self.address = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        self.ctx = zmq.Context()
        self.granted = 0
        self.received: list[Any] = []
        self.filtered = 0
        self.hellos = 0
        self.heartbeats = 0
        self.acks_dropped = 0
        self._start()

    def _start(self) -> None:
        self.ep = open_endpoint(
            self.ctx,
            zmq.ROUTER,
            bind=self.address,
            use_fd=os.dup(self.listening.fileno()),  # libzmq closes its copy with the socket
            max_bytes=64 << 20,
            peer="generator",
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def restart(self) -> None:
        """Like a buffer process restarting: connections drop, state (here: in memory) survives."""
        self.stop.set()
        self.thread.join(5)
        self.ep.close()
        self._start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            got = self.ep.recv(20)
            if got is None:
                continue
            peer, msg = got
            reply = self._answer(msg.type, msg.body)
            if reply is not None:
                self.ep.send(reply, to=peer, request_id=msg.request_id)

    def _answer(self, msg_type: str, body: Any) -> m.Body | None:
        if msg_type == m.HELLO:
            self.hellos += 1
            return m.Credit(0, 0)
        if msg_type == m.HEARTBEAT:
            self.heartbeats += 1
            self.filtered = body.filtered_total
            return m.Lease(CREDIT_BUDGET - self.granted, False, 0)
        if msg_type == m.CREDIT_REQUEST:
            grant = min(body.want, CREDIT_BUDGET - self.granted)
            self.granted += grant
            return m.Credit(grant, 0)
        assert msg_type == m.GROUPS
        self.filtered = body.filtered_total
        groups = body.groups
        self.received.extend(groups)
        if groups and self.acks_dropped == 0:
            self.acks_dropped += 1
            return None  # lost on the way back
        return m.Ack([g.group_id for g in groups])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.ep.close()
        self.ctx.term()


def state_dict(model_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_generator_service_end_to_end(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    m0 = init_model(tmp_path / "m0", seed=0)
    m1 = init_model(tmp_path / "m1", seed=1)
    held = HeldPorts("transport.samples_port", "transport.weights_port")
    samples_port, weights_port = held.ports["transport.samples_port"], held.ports["transport.weights_port"]
    cfg = Config.model_validate(
        {
            "model": {"path": str(m0)},
            "data": {"synthetic": {"num_train": 40, "num_eval": 5}},
            "algo": {
                "group_size": G,
                "max_response_len": 16,
                "overlong_cache_len": 4,
                "dynamic_sampling": False,
            },
            "generator": {
                "max_groups_in_flight": 2,
                "kv_cache_gib": 0.25,
                "max_num_seqs": 16,
                "weight_poll_s": 0.2,
            },
            "learner": {"rollout_batch_prompts": 4, "mini_batch_samples": 16},
            # A long timeout: within this test only a reconnect can trigger the resend.
            "transport": {"samples_port": samples_port, "weights_port": weights_port, "timeout_s": 120.0},
            "metrics": {"generator_port": 0},
            "run": {"out_dir": str(tmp_path / "run")},
        }
    )
    buffer = ScriptedBuffer(held.sockets["transport.samples_port"])
    weights_fd = os.dup(held.sockets["transport.weights_port"].fileno())
    weights = WeightServer(f"tcp://127.0.0.1:{weights_port}", chunk_bytes=1 << 20, use_fd=weights_fd).start()
    weights.publish(serialize_weights(state_dict(m1), 3))  # the learner is already at version 3
    service = build_generator(cfg, index=0)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            service.start()
            service.serve()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    try:
        wait_for(lambda: service.health.ready or errors, 240, "start-up")
        assert not errors, errors
        assert service.engine is not None and service.engine.version == 3, (
            "the published version is loaded before the first prompt"
        )
        assert buffer.hellos == 1

        wait_for(lambda: len(buffer.received) >= 2, 120, "two groups")
        first = buffer.received[0].group_id  # its ack was lost
        assert first in service.link.unacked
        buffer.restart()
        wait_for(
            lambda: [g.group_id for g in buffer.received].count(first) == 2, 60, "the resend after reconnect"
        )
        weights.publish(serialize_weights(state_dict(m0), 4))
        wait_for(
            lambda: service.engine is not None and service.engine.version == 4, 60, "the version-4 update"
        )
        wait_for(
            lambda: (
                buffer.granted == CREDIT_BUDGET
                and len({g.group_id for g in buffer.received}) == CREDIT_BUDGET
                and len(service.link.unacked) == 0
                and not errors
            ),
            120,
            "all acks",
        )
        assert service.metrics_server is not None  # started with the service (metrics.generator_port=0)
        status, health = scrape(service.metrics_server.port, "/healthz")
        status_metrics, text = scrape(service.metrics_server.port, "/metrics")
    finally:
        service.request_stop()
        thread.join(120)
        service.close()
        weights.stop()
        buffer.close()
        held.close()
    assert not errors, errors
    assert not thread.is_alive()

    # Credits: exactly the granted number of groups were generated. The first was resent once, on the
    # reconnect; another may have been too, if its ack was on the way when the buffer went down.
    ids = Counter(g.group_id for g in buffer.received)
    assert len(ids) == CREDIT_BUDGET
    assert ids[first] == 2 and set(ids.values()) <= {1, 2}
    assert buffer.filtered == 0  # dynamic sampling is off, nothing was left over at the drain
    versions = set()
    for g in buffer.received:
        assert g.generator_id == "generator-0" and len(g.samples) == G
        for s in g.samples:
            assert 1 <= len(s) <= 16 and len(s.logprobs) == len(s) == len(s.versions)
            versions.update(s.versions.tolist())
            assert s.loss_weight == 1.0
    assert versions <= {3, 4} and 3 in versions

    assert status == 200 and json.loads(health)["ready"] is True
    assert status_metrics == 200
    assert "stream_dapo_generator_groups_acked_total 6.0" in text
    # Every group is sent once, plus once per resend (the reconnect's, and any timeout's); a send
    # that raced the buffer's restart may never have arrived, so the buffer received at most that.
    sent = CREDIT_BUDGET + service.link.unacked.resent
    assert f"stream_dapo_generator_groups_sent_total {float(sent)}" in text
    assert len(buffer.received) <= sent
    assert "stream_dapo_generator_policy_version 4.0" in text
    outcomes = [line for line in text.splitlines() if line.startswith("stream_dapo_generator_groups_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in outcomes) == CREDIT_BUDGET

    # The group log: one line per judged group, joined to what the buffer received by group id.
    lines = list(read_group_log(tmp_path / "run" / "generators" / "generator-0.groups.jsonl"))
    assert len(lines) == CREDIT_BUDGET and {r["group_id"] for r in lines} == set(ids)
    received = {g.group_id: g for g in buffer.received}
    for r in lines:
        g = received[r["group_id"]]
        assert r["prompt_id"] == g.prompt_id and r["size"] == G and r["kept"] is True
        assert r["correct"] == sum(s.correct for s in g.samples)
        assert r["truncated"] == sum(s.truncated for s in g.samples)
        # the version the group started on: its first tokens' or, with an update before they were
        # sampled, an older one
        assert r["version"] in {3, 4} and r["version"] <= min(int(s.versions[0]) for s in g.samples)

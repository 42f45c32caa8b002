"""The buffer service over real ZeroMQ sockets on loopback: a fake generator and a fake learner
built from the transport's Endpoint, the service in a thread or in its own process."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth

from stream_dapo.buffer import service as buffer_service
from stream_dapo.buffer.journal import Journal, JournalError
from stream_dapo.buffer.service import BufferService, build_buffer, persist_path
from stream_dapo.cli import buffer as buffer_cli
from stream_dapo.config import Config, load_config
from stream_dapo.runtime.ports import ServiceExited
from stream_dapo.testing.services import HeldPorts, wait_ports
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import SCHEMA_VERSION, encode, pack_value
from stream_dapo.transport.curve import CurveKeyError
from stream_dapo.transport.messages import Group, Sample
from stream_dapo.transport.sockets import (
    CurveKeys,
    Endpoint,
    TransportError,
    TransportTimeout,
    open_endpoint,
    request,
)

REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 5000  # only reached when something is broken
MAX_BYTES = 256 * 1024


def overrides(out_dir: Path) -> list[str]:
    # G = 2, B_v = 4 / 2 = 2 groups per step, S = 4 / 2 = 2 steps per rollout, max_staleness 4:
    # admission capacity (4 - 2 - 0 + 1) * 2 = 6 groups.
    # Every port 0: the buffer binds ports of the kernel's choosing; tests read them back.
    return [
        "transport.samples_port=0",
        "transport.batches_port=0",
        "transport.weights_port=0",
        f"transport.max_message_bytes={MAX_BYTES}",
        "metrics.buffer_port=0",
        f'run.out_dir="{out_dir}"',
        "algo.group_size=2",
        "learner.mini_batch_samples=4",
        "learner.rollout_batch_prompts=4",
        "algo.max_staleness=4",
    ]


def make_group(gid: str, version: int = 0, samples: int = 2) -> Group:
    sample = Sample(
        tokens=np.arange(6, dtype=np.int32),
        logprobs=np.full(6, -0.25, dtype=np.float32),
        versions=np.full(6, version, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, f"p-{gid}", "gen-0", "12", np.array([3, 4, 5], dtype=np.int32), 1.0, [sample] * samples)


class Peers:
    """A fake generator and a fake learner: DEALER endpoints on the buffer's two ports (`ports`: what
    the buffer bound, by setting, e.g. `BufferService.bound_ports`)."""

    def __init__(self, ports: Mapping[str, int], host: str = "127.0.0.1") -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.gen, self.learner = (
            open_endpoint(
                self.ctx, zmq.DEALER, connect=f"tcp://{host}:{port}", max_bytes=MAX_BYTES, peer="buffer"
            )
            for port in (ports["transport.samples_port"], ports["transport.batches_port"])
        )

    def ask(
        self, endpoint: Endpoint, outgoing: m.Body, retries: int = 0, request_id: int | None = None
    ) -> m.Message:  # type: ignore[name-defined]
        return request(endpoint, outgoing, timeout_ms=WAIT_MS, retries=retries, request_id=request_id)

    def close(self) -> None:
        self.gen.close()
        self.learner.close()
        self.ctx.term()

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def service_in_thread(cfg: Config) -> Iterator[BufferService]:
    svc = build_buffer(cfg)
    stop = threading.Event()
    thread = threading.Thread(target=svc.serve_forever, args=(stop,), kwargs={"poll_ms": 20}, daemon=True)
    thread.start()
    try:
        yield svc
    finally:
        stop.set()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the buffer did not drain"


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


# --------------------------------------------------------------------------------------------------
# In a thread
# --------------------------------------------------------------------------------------------------


def test_groups_in_acked_batch_out_committed(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc:
        status, health = scrape(svc.metrics_port, "/healthz")
        assert status == 200 and json.loads(health)["ready"] is True
        # The staleness alert reads the bound from here (algo.max_staleness=4 above).
        assert metric(scrape(svc.metrics_port)[1], "stream_dapo_buffer_max_staleness_versions") == 4.0
        peers = Peers(svc.bound_ports)
        try:
            hello = peers.ask(peers.gen, m.Hello("gen-0", 0))
            assert (hello.type, hello.body) == (m.CREDIT, m.Credit(0, 0))
            assert m.to_map(peers.ask(peers.learner, m.LearnerHello(0, 0)).body) == {"reason": "ready"}

            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 10)).body.granted == 6  # the capacity
            sent = [make_group(f"g{i}") for i in range(4)]
            ack = peers.ask(peers.gen, m.Groups("gen-0", sent))
            assert m.to_map(ack.body) == {
                "accepted": ["g0", "g1", "g2", "g3"],
                "duplicates": [],
                "rejected": [],
            }
            resend = peers.ask(peers.gen, m.Groups("gen-0", sent[:2]))
            assert m.to_map(resend.body) == {"accepted": [], "duplicates": ["g0", "g1"], "rejected": []}
            # The two other credits went to groups the dynamic-sampling filter dropped.
            assert peers.ask(peers.gen, m.Groups("gen-0", [], filtered_total=2)).body.accepted == []
            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 10)).body.granted == 2  # 4 waiting

            got = peers.ask(peers.learner, m.BatchRequest(0, 3, 0))
            assert got.type == m.BATCH and got.body.dropped_stale == 0
            assert got.body.groups == sent[:3]
            # A token budget below one group still serves one group.
            rest = peers.ask(peers.learner, m.BatchRequest(0, 3, max_tokens=1))
            assert [g.group_id for g in rest.body.groups] == ["g3"]
            assert m.to_map(peers.ask(peers.learner, m.BatchRequest(1, 3, 0)).body) == {
                "reason": "no_waiting_groups"
            }
            assert m.to_map(peers.ask(peers.learner, m.Commit(2, [g.group_id for g in sent])).body) == {
                "reason": "committed"
            }
            assert m.to_map(peers.ask(peers.gen, m.CreditRequest("gen-0", 10)).body) == {
                "granted": 4,
                "learner_version": 2,
            }
        finally:
            peers.close()
        _, text = scrape(svc.metrics_port)
        assert metric(text, "stream_dapo_buffer_groups_accepted_total") == 4
        assert metric(text, "stream_dapo_buffer_groups_duplicate_total") == 2
        assert metric(text, "stream_dapo_buffer_groups_served_total") == 4
        assert metric(text, "stream_dapo_buffer_groups_committed_total") == 4
        assert metric(text, "stream_dapo_buffer_credits_outstanding") == 6
        assert metric(text, "stream_dapo_buffer_learner_version") == 2
    stats = json.loads((tmp_path / "buffer" / "stats.json").read_text())
    assert (stats["accepted"], stats["served"], stats["committed"], stats["credits_granted"]) == (4, 4, 4, 12)
    # g2 and g3 sat at positions 2 and 3 of the rollout at version 0: trained at version 1.
    assert stats["max_staleness_served"] == 1 and stats["waiting"] == 0
    assert (tmp_path / "buffer" / "state.msgpack").is_file()


def test_stale_group_is_dropped_at_dequeue_and_counted(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc:
        peers = Peers(svc.bound_ports)
        try:
            peers.ask(peers.gen, m.Groups("gen-0", [make_group("old", 1), make_group("fresh", 6)]))
            reply = peers.ask(peers.learner, m.BatchRequest(8, 4, 0))  # "old" is 7 versions behind
            assert reply.body.dropped_stale == 1
            assert [g.group_id for g in reply.body.groups] == ["fresh"]
            peers.ask(peers.gen, m.Groups("gen-0", [make_group("older", 0)]))
            assert m.to_map(peers.ask(peers.learner, m.BatchRequest(9, 4, 0)).body) == {"reason": "all_stale"}
        finally:
            peers.close()
        _, text = scrape(svc.metrics_port)
        assert metric(text, "stream_dapo_buffer_dropped_stale_groups_total") == 2
        assert metric(text, "stream_dapo_buffer_staleness_versions_count") == 1


def test_the_learner_is_held_for_a_reported_in_flight_group_then_trains_it(tmp_path: Path) -> None:
    """B_v = 2, max_staleness 4: a group started at version 5 must be trained at version <= 9, i.e.
    at a position p with 7 + p // 2 <= 9 at learner version 7 (p <= 5): five groups may go first."""
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc:
        peers = Peers(svc.bound_ports)
        try:
            assert isinstance(peers.ask(peers.gen, m.Heartbeat("gen-0", 0, None, [5])).body, m.Lease)
            fresh = [make_group(f"s{i}", 7) for i in range(6)]
            peers.ask(peers.gen, m.Groups("gen-0", fresh, in_flight_versions=[5]))
            assert len(peers.ask(peers.learner, m.BatchRequest(7, 4, 0)).body.groups) == 4
            assert [g.group_id for g in peers.ask(peers.learner, m.BatchRequest(7, 4, 0)).body.groups] == [
                "s4"
            ]
            held = peers.ask(peers.learner, m.BatchRequest(7, 4, 0)).body
            assert m.to_map(held) == {"reason": "held_for_in_flight"}
            peers.ask(peers.gen, m.Groups("gen-0", [make_group("long", 5)], in_flight_versions=[]))
            batch = peers.ask(peers.learner, m.BatchRequest(7, 4, 0)).body
            assert [g.group_id for g in batch.groups] == ["long", "s5"] and batch.dropped_stale == 0
        finally:
            peers.close()
        _, text = scrape(svc.metrics_port)
        assert metric(text, "stream_dapo_buffer_learner_holds_total") == 2
        assert metric(text, "stream_dapo_buffer_dropped_stale_groups_total") == 0


# The hostile-message test counts every rejection exactly, so its buffer listens on a loopback
# address no other test uses: a DEALER left reconnecting by another test (or another run) to a port
# number the kernel hands out again reaches 127.0.0.1 only, and would add its own "malformed".
PRIVATE_LOOPBACK = "127.0.0.77"


def test_hostile_messages_are_rejected_counted_and_the_service_keeps_serving(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path) + [f'transport.host="{PRIVATE_LOOPBACK}"'], environ={})
    with service_in_thread(cfg) as svc:
        assert svc.samples.socket.getsockopt_string(zmq.LAST_ENDPOINT).startswith(
            f"tcp://{PRIVATE_LOOPBACK}:"
        )
        peers = Peers(svc.bound_ports, host=PRIVATE_LOOPBACK)
        try:
            raw = peers.gen.socket
            raw.send(b"\xc1 certainly not msgpack")
            raw.send(msgpack.packb({"v": 99, "t": "hello", "b": {"generator_id": "g", "policy_version": 0}}))
            raw.send(b"\0" * (MAX_BYTES + 1))
            replies = [peers.gen.recv(WAIT_MS) for _ in range(3)]
            assert [r[1].body.reason for r in replies if r] == ["malformed", "bad_version", "oversized"]
            # Valid messages the buffer cannot act on: on the wrong socket, or a wrong-sized group.
            peers.gen.send(m.BatchRequest(0, 1, 0))
            wrong = peers.gen.recv(WAIT_MS)
            assert (
                wrong is not None and wrong[1].type == m.ERROR and wrong[1].body.reason == "unexpected_type"
            )
            ack = peers.ask(peers.gen, m.Groups("gen-0", [make_group("three", samples=3), make_group("ok")]))
            assert ack.body.rejected == [m.Rejection("three", "wrong_group_size")]
            # Still serving, on both sockets.
            assert peers.ask(peers.gen, m.Hello("gen-0", 0)).type == m.CREDIT
            batch = peers.ask(peers.learner, m.BatchRequest(0, 4, 0))
            assert [g.group_id for g in batch.body.groups] == ["ok"]
        finally:
            peers.close()
        _, text = scrape(svc.metrics_port)
        for reason in ("malformed", "bad_version", "oversized", "unexpected_type"):
            assert f'stream_dapo_buffer_messages_rejected_total{{reason="{reason}"}} 1.0' in text
        assert 'stream_dapo_buffer_groups_rejected_total{reason="wrong_group_size"} 1.0' in text
    stats = json.loads((tmp_path / "buffer" / "stats.json").read_text())
    assert stats["rejected_messages"] == {
        "malformed": 1,
        "bad_version": 1,
        "oversized": 1,
        "unexpected_type": 1,
    }


def test_an_absurd_filtered_count_is_refused_and_the_buffer_keeps_running(tmp_path: Path) -> None:
    """Regression (found by bench/drills/fuzz.py): `groups{filtered: 2**64 - 1}` decoded as valid, and the
    buffer's journal could not encode the overflowing credit counter, so the service stopped."""
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc:
        peers = Peers(svc.bound_ports)
        try:
            odd = m.to_map(make_group("odd", samples=3))  # a refused group: redeemed is then 2**64
            for groups in ([odd], [], []):
                body = {"generator_id": "gen-0", "groups": groups, "filtered_total": 2**64 - 1}
                peers.gen.socket.send(
                    pack_value({"v": SCHEMA_VERSION, "t": "groups", "b": body})
                )  # unchecked
                reply = peers.gen.recv(WAIT_MS)
                assert reply is not None and reply[1].type == m.ERROR
                assert reply[1].body.reason == "bad_schema"
            ack = peers.ask(peers.gen, m.Groups("gen-0", [make_group("ok")]))
            assert ack.body.accepted == ["ok"]
            svc.persist()  # a snapshot of the counters still encodes
        finally:
            peers.close()
    stats = json.loads((tmp_path / "buffer" / "stats.json").read_text())
    assert stats["accepted"] == 1 and stats["uncredited"] == 1
    assert stats["rejected_messages"] == {"bad_schema": 3}


def test_a_peer_that_never_reads_its_replies_does_not_stall_the_others(tmp_path: Path) -> None:
    """Regression: a reply waited up to 5 s for room in its peer's full queue, so one peer asking
    without reading (here for batches of ~200 KB) made the buffer answer no one else."""
    cfg = load_config(overrides=overrides(tmp_path) + ["transport.hwm=10"], environ={})
    with service_in_thread(cfg) as svc:
        peers = Peers(svc.bound_ports)
        flooder = peers.ctx.socket(zmq.DEALER)
        flooder.linger, flooder.rcvhwm, flooder.rcvbuf = 0, 1, 4096  # reads (almost) nothing
        flooder.connect(svc.batches.address)
        try:
            big = [_long_group(f"big{i}") for i in range(2)]
            for group in big:
                assert peers.ask(peers.gen, m.Groups("gen-0", [group])).body.accepted == [group.group_id]
            again = [encode(m.LearnerHello(0, 0)), encode(m.BatchRequest(0, 2, 0))]
            for _ in range(100):  # each batch_request is answered with both groups
                flooder.send_multipart(again[:1])
                flooder.send_multipart(again[1:])
            time.sleep(1.0)  # its replies fill every queue on the way to it
            t0 = time.monotonic()
            assert peers.ask(peers.gen, m.Hello("gen-0", 0)).type == m.CREDIT
            assert time.monotonic() - t0 < 3.0
        finally:
            flooder.close(linger=0)
            peers.close()


def _long_group(gid: str, tokens: int = 8000) -> Group:
    sample = Sample(
        tokens=np.zeros(tokens, dtype=np.int32),
        logprobs=np.full(tokens, -0.5, dtype=np.float32),
        versions=np.zeros(tokens, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, f"p-{gid}", "gen-0", "1", np.array([1], dtype=np.int32), 1.0, [sample, sample])


def test_a_taken_port_fails_at_start_naming_the_setting(tmp_path: Path) -> None:
    """A fixed port (systemd, Kubernetes) that another process holds is refused, naming the key."""
    ctx: zmq.Context[Any] = zmq.Context()
    squatter = ctx.socket(zmq.ROUTER)
    squatter.bind("tcp://127.0.0.1:*")
    taken = int(squatter.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
    cfg = load_config(overrides=[*overrides(tmp_path), f"transport.batches_port={taken}"], environ={})
    try:
        with pytest.raises(TransportError, match=r"transport\.batches_port"):
            build_buffer(cfg)
    finally:
        squatter.close(linger=0)
        ctx.term()
    build_buffer(load_config(overrides=overrides(tmp_path), environ={})).close()  # nothing left open


def test_the_command_exits_2_when_it_cannot_start(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    bad = cfg.model_copy(
        update={"buffer": cfg.buffer.model_copy(update={"persist_path": str(blocker / "s")})}
    )
    assert buffer_cli.run(argparse.Namespace(cfg=bad)) == 2


def test_unreadable_state_fails_at_start_naming_the_files(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    journal = Journal(persist_path(cfg))
    journal.load()
    journal.append({"kind": "from-a-future-release"})
    journal.close()
    with pytest.raises(
        JournalError, match=r"cannot restore the buffer from .*state\.msgpack.*Move both aside"
    ):
        build_buffer(cfg)


# --------------------------------------------------------------------------------------------------
# In its own process: kill -9, restart, SIGTERM
# --------------------------------------------------------------------------------------------------


BUFFER_PORTS = ("transport.samples_port", "transport.batches_port", "metrics.buffer_port")


def start_buffer(args: list[str], log_path: Path, held: HeldPorts | None = None) -> subprocess.Popen[bytes]:
    """`stream-dapo buffer`; with `held`, on those listening sockets (the test's, kept across restarts),
    else on the ports of its config (0: any free port, see `wait_ready`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DAPO__")}
    env["PYTHONPATH"] = str(REPO)
    if held is not None:
        env.update(held.env(*BUFFER_PORTS))
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "stream_dapo.cli", "buffer", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=held.fds(*BUFFER_PORTS) if held is not None else (),
        )


def wait_ready(
    proc: subprocess.Popen[bytes], out: Path, log_path: Path, timeout_s: float = 120.0
) -> dict[str, int]:
    """Until the buffer has reported its ports (every socket bound) and answers /healthz; returns
    the ports, by setting."""
    try:
        ports = wait_ports(out, "buffer", proc, timeout_s)
    except (ServiceExited, TimeoutError) as exc:
        raise AssertionError(f"{exc}:\n{log_path.read_text()}") from None
    assert scrape(ports["metrics.buffer_port"], "/healthz")[0] == 200, log_path.read_text()
    return ports


def kill_and_restart(
    proc: subprocess.Popen[bytes], args: list[str], out: Path, log_path: Path, held: HeldPorts
) -> subprocess.Popen[bytes]:
    """SIGKILL the buffer (nothing flushed, nothing drained), start it again on the same state and
    the same listening sockets (peers find it where it was), and wait until it serves."""
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc = start_buffer(args, log_path, held)
    try:
        wait_ready(proc, out, log_path)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


class BufferProcess:
    """`stream-dapo buffer` in a subprocess on `overrides(tmp_path)`, logging to buffer.log, on
    listening sockets the test holds (`ports`, kept across kills): ready on entering, killed on
    leaving if still running."""

    def __init__(self, tmp_path: Path) -> None:
        items = overrides(tmp_path)
        self.cfg = load_config(overrides=items, environ={})
        self.out = Path(self.cfg.run.out_dir)
        self.held = HeldPorts(*BUFFER_PORTS)
        self.ports = self.held.ports
        self.args = [arg for item in items for arg in ("--set", item)]
        self.log_path = tmp_path / "buffer.log"
        self.proc = start_buffer(self.args, self.log_path, self.held)

    def __enter__(self) -> BufferProcess:
        try:
            wait_ready(self.proc, self.out, self.log_path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def kill_and_restart(self) -> None:
        self.proc = kill_and_restart(self.proc, self.args, self.out, self.log_path, self.held)

    def drain(self) -> None:
        """SIGTERM: the buffer drains, persists its state and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=20) == 0, self.log_path.read_text()

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.held.close()


def test_restart_after_kill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with BufferProcess(tmp_path) as buffer:
        sent = [make_group(f"g{i}", 0) for i in range(6)]
        with Peers(buffer.ports) as peers:
            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 6)).body.granted == 6
            for i in range(0, 6, 2):
                assert peers.ask(peers.gen, m.Groups("gen-0", sent[i : i + 2])).body.accepted == [
                    f"g{i}",
                    f"g{i + 1}",
                ]
            leased = peers.ask(peers.learner, m.BatchRequest(0, 2, 0))
            assert [g.group_id for g in leased.body.groups] == ["g0", "g1"]
        buffer.kill_and_restart()
        with Peers(buffer.ports) as peers:
            # The generator cannot tell what survived, so it resends everything: all duplicates.
            resend = peers.ask(peers.gen, m.Groups("gen-0", sent))
            assert resend.body.duplicates == [g.group_id for g in sent] and resend.body.accepted == []
            # Its credits were redeemed before the crash and stay redeemed.
            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 6)).body.granted == 2
            # The learner restarted too: its lease returns to the front, then every group is served once.
            assert m.to_map(peers.ask(peers.learner, m.LearnerHello(0, 0)).body) == {"reason": "ready"}
            batch = peers.ask(peers.learner, m.BatchRequest(0, 6, 0))
            assert batch.body.groups == sent
        buffer.drain()
    log_path = buffer.log_path
    state = tmp_path / "buffer"
    assert (state / "state.msgpack").is_file()
    stats = json.loads((state / "stats.json").read_text())
    assert (stats["accepted"], stats["duplicates"], stats["requeued"], stats["served"]) == (6, 6, 2, 8)
    assert stats["leased"] == 6 and stats["waiting"] == 0
    text = log_path.read_text()
    assert "received SIGTERM: draining" in text and "state persisted" in text


def test_a_credit_grant_journaled_before_a_crash_is_granted_again_to_its_repeated_request(
    tmp_path: Path,
) -> None:
    """Regression (a fault drill stalled on it): the buffer journaled a grant of 6 and was killed
    before its reply arrived. The generator repeats the request with its id after the reconnect and
    must get those 6 back; a fresh grant of 0 would leave the 6 counted against the line forever."""
    with BufferProcess(tmp_path) as buffer:
        with Peers(buffer.ports) as peers:
            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 6), request_id=900).body.granted == 6
        buffer.kill_and_restart()
        with Peers(buffer.ports) as peers:
            repeat = peers.ask(peers.gen, m.CreditRequest("gen-0", 6), request_id=900)
            assert repeat.request_id == 900 and repeat.body.granted == 6
            assert peers.ask(peers.gen, m.CreditRequest("gen-0", 6), request_id=901).body.granted == 0
            status, text = scrape(buffer.ports["metrics.buffer_port"])
            assert status == 200
            assert metric(text, "stream_dapo_buffer_credits_outstanding") == 6, "granted once, not twice"
            assert metric(text, "stream_dapo_buffer_retried_requests_total") == 1
        buffer.drain()


def test_curve_admits_only_clients_whose_keys_are_listed(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    (keys / "clients").mkdir(parents=True)
    zmq.auth.create_certificates(keys, "server")
    zmq.auth.create_certificates(keys, "gen-0")
    zmq.auth.create_certificates(keys, "rogue")
    shutil.copy(keys / "gen-0.key", keys / "clients" / "gen-0.key")
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    cfg = load_config(overrides=[*overrides(tmp_path), f'transport.curve_dir="{keys}"'], environ={})
    with service_in_thread(cfg) as svc:
        address = svc.samples.address
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            for name, admitted in (("gen-0", True), ("rogue", False)):
                public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
                assert secret is not None
                curve = CurveKeys(public, secret, server_public)
                with open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=MAX_BYTES, curve=curve) as ep:
                    if admitted:
                        assert request(ep, m.Hello(name, 0), timeout_ms=WAIT_MS, retries=0).type == m.CREDIT
                    else:
                        with pytest.raises(TransportTimeout):
                            request(ep, m.Hello(name, 0), timeout_ms=500, retries=0)
        finally:
            ctx.term()


def test_missing_curve_keys_fail_at_start_naming_the_fix(tmp_path: Path) -> None:
    cfg = load_config(overrides=[*overrides(tmp_path), f'transport.curve_dir="{tmp_path}"'], environ={})
    # The same CurveKeyError (a TransportError: exit 2 at start-up) as the learner's and the generators'.
    with pytest.raises(
        CurveKeyError, match=r"server\.key_secret; create them with `stream-dapo keys generate"
    ):
        build_buffer(cfg)


def test_the_periodic_status_line_names_every_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a status key that only the service's stats() has crashed the buffer after 60 s."""
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    svc = build_buffer(cfg)
    try:
        svc._last_status = float("-inf")  # due now
        with caplog.at_level("INFO", logger="stream_dapo.buffer"):
            svc.step(0)
    finally:
        svc.close()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("status: ")]
    assert all(f"{key} " in line for key in buffer_service.STATUS_KEYS)
    assert "live_generators 0" in line


def test_a_flood_of_misrouted_messages_is_answered_and_counted_but_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: every misrouted message logged its own warning, so one confused peer flooded
    the log. Each still gets its `error` reply and is counted."""
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with caplog.at_level("WARNING", logger="stream_dapo.buffer"), service_in_thread(cfg) as svc:
        peers = Peers(svc.bound_ports)
        try:
            for _ in range(50):
                peers.gen.send(m.BatchRequest(0, 1, 0))  # the learner's request, on the wrong socket
                reply = peers.gen.recv(WAIT_MS)
                assert reply is not None and reply[1].type == m.ERROR
                assert reply[1].body.reason == "unexpected_type"
        finally:
            peers.close()
        _, text = scrape(svc.metrics_port)
    assert 'stream_dapo_buffer_messages_rejected_total{reason="unexpected_type"} 50.0' in text
    refusals = [r for r in caplog.records if "refused a message" in r.getMessage()]
    # One warning per 10 s: 50 round trips on loopback take far less than the 50 s that five need.
    assert 1 <= len(refusals) <= 5, [r.getMessage() for r in refusals]


# --------------------------------------------------------------------------------------------------
# One generator id, one live process
# --------------------------------------------------------------------------------------------------


def test_a_second_generator_with_a_live_id_exits_2_naming_the_holder_and_credits_stay_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: two generators started with the same --index both got in; the second one's hello
    reset the id's filtered total, so credits were redeemed twice on one side and never returned on the
    other (24 of 24 out, nothing in flight, the learner stopped). The real GeneratorService is refused
    by the real buffer while the holder is live, waits out one lease (a restarted process would get in
    then), and exits 2 naming the id and the holder; the holder's credits come back in full."""
    from stream_dapo.cli import generator as generator_service
    from stream_dapo.runtime import service_runner

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the model directory is checked before the hello
    lease = ["buffer.generator_lease_s=1.5", "generator.heartbeat_s=0.5"]
    cfg = load_config(overrides=[*overrides(tmp_path), *lease], environ={})
    holder = "host-a pid 4242 (0badcafe)"
    monkeypatch.setattr(service_runner, "on_stop_signal", lambda *args: None)  # no handlers in pytest
    with service_in_thread(cfg) as svc, Peers(svc.bound_ports) as peers:
        assert peers.ask(peers.gen, m.Hello("generator-0", 0, holder)).type == m.CREDIT
        capacity = peers.ask(peers.gen, m.CreditRequest("generator-0", 100)).body.granted
        assert capacity == 6
        sent = [make_group(f"g{i}") for i in range(2)]
        assert peers.ask(peers.gen, m.Groups("generator-0", sent)).body.accepted == ["g0", "g1"]
        stop = threading.Event()

        def keep_heartbeating() -> None:  # the live holder; its own thread, its own socket
            with open_endpoint(
                peers.ctx, zmq.DEALER, connect=svc.samples.address, max_bytes=MAX_BYTES, peer="buffer"
            ) as beat:
                while not stop.wait(0.2):
                    request(beat, m.Heartbeat("generator-0", 0), timeout_ms=WAIT_MS, retries=0)

        beating = threading.Thread(target=keep_heartbeating, daemon=True)
        beating.start()
        gen_cfg = load_config(
            overrides=[
                *overrides(tmp_path),
                *lease,
                f"model.path={model}",
                f"transport.samples_port={svc.bound_ports['transport.samples_port']}",
                "transport.weights_port=1",  # never reached: the hello is refused first
                "metrics.generator_port=0",
            ],
            environ={},
        )
        try:
            with caplog.at_level("WARNING", logger="stream_dapo"):
                code = generator_service.run(argparse.Namespace(cfg=gen_cfg, index=0))
        finally:
            stop.set()
            beating.join(10)
        assert code == 2
        refused = [
            r.getMessage()
            for r in caplog.records
            if "generator_id 'generator-0' is held by" in r.getMessage()
        ]
        assert refused and holder in refused[-1] and "--index" in refused[-1], caplog.text
        assert "Traceback" not in caplog.text
        # The holder's accounting is untouched: its 4 unused credits come back with its filtered total.
        assert peers.ask(peers.gen, m.Heartbeat("generator-0", 4)).body.credits == 0
        _, text = scrape(svc.metrics_port)
        assert metric(text, "stream_dapo_buffer_credits_outstanding") == 0
        assert 'stream_dapo_buffer_messages_rejected_total{reason="generator_id_taken"}' in text
        assert svc.buffer.stats()["uncredited"] == 0
        batch = peers.ask(peers.learner, m.BatchRequest(0, 2, 0)).body.groups
        assert [g.group_id for g in batch] == ["g0", "g1"]
        peers.ask(peers.learner, m.Commit(1, ["g0", "g1"]))
        assert peers.ask(peers.gen, m.CreditRequest("generator-0", 100)).body.granted == capacity


def test_a_client_repeating_hello_is_answered_every_time_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: an allowed client repeating `hello` wrote 6,807 log lines in 69 s."""
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with caplog.at_level("INFO", logger="stream_dapo.buffer"), service_in_thread(cfg) as svc:
        with Peers(svc.bound_ports) as peers:
            for _ in range(200):
                assert peers.ask(peers.gen, m.Hello("gen-0", 0, "one process")).type == m.CREDIT
    lines = [r for r in caplog.records if "generator gen-0 connected" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


def test_the_buffer_writes_its_final_figures_when_it_drains(tmp_path: Path) -> None:
    """Regression: after a SIGTERM the run's summary read the buffer's last scrape (groups_accepted
    104 below groups_trained 128): the buffer wrote no final-metrics file."""
    from stream_dapo.runtime.metrics import final_metrics_path

    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc, Peers(svc.bound_ports) as peers:
        assert peers.ask(peers.gen, m.Groups("gen-0", [make_group("g0"), make_group("g1")])).type == m.ACK
    final = json.loads(final_metrics_path(cfg.run.out_dir, "buffer").read_text())
    assert final["stream_dapo_buffer_groups_accepted_total"] == 2


def test_refused_curve_connections_are_counted_and_logged_by_socket_and_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: with CurveZMQ on, rogue connections (no keys, an unknown client key, a wrong server
    key) got no replies, but no counter, log line or alert recorded a single rejection.

    What libzmq guarantees, and so what is asserted: a client the ZAP handler refuses gets an ERROR
    and never retries (exactly one not_allowed); a client with the wrong server key only sees the
    connection drop and reconnects every 100 ms while it is open, so it is refused at least once,
    and how many times depends on how long it stays open (an exact count of 1 failed under load)."""
    keys = tmp_path / "keys"
    (keys / "clients").mkdir(parents=True)
    for name in ("server", "gen-0", "rogue", "other-server"):
        zmq.auth.create_certificates(keys, name)
    shutil.copy(keys / "gen-0.key", keys / "clients" / "gen-0.key")
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    wrong_server, _ = zmq.auth.load_certificate(keys / "other-server.key")
    rogue_public, rogue_secret = zmq.auth.load_certificate(keys / "rogue.key_secret")
    gen_public, gen_secret = zmq.auth.load_certificate(keys / "gen-0.key_secret")
    assert rogue_secret is not None and gen_secret is not None
    attempts = [
        CurveKeys(rogue_public, rogue_secret, server_public),  # not_allowed
        CurveKeys(gen_public, gen_secret, wrong_server),  # protocol or handshake, as libzmq sees it
    ]
    cfg = load_config(overrides=[*overrides(tmp_path), f'transport.curve_dir="{keys}"'], environ={})
    ctx: zmq.Context[Any] = zmq.Context()

    def refused() -> dict[str, float]:
        text = scrape(svc.metrics_port)[1]
        prefix = "stream_dapo_buffer_connections_refused_total{"
        return {
            line.split('reason="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix) and 'socket="batches"' in line
        }

    def refused_once_more(before: dict[str, float]) -> dict[str, float]:
        """The counts once the open attempt has been refused (the event, polled: no fixed wait)."""
        deadline = time.monotonic() + 60  # only reached when a refusal is never counted
        while sum((counts := refused()).values()) <= sum(before.values()):
            assert time.monotonic() < deadline, counts
            time.sleep(0.05)
        return counts

    counts: list[dict[str, float]] = [{}]
    with caplog.at_level("WARNING", logger="stream_dapo.buffer"), service_in_thread(cfg) as svc:
        try:
            for curve in attempts:
                with open_endpoint(
                    ctx, zmq.DEALER, connect=svc.batches.address, max_bytes=MAX_BYTES, curve=curve
                ) as ep:
                    ep.send(m.LearnerHello(0, 0))
                    counts.append(refused_once_more(counts[-1]))
        finally:
            ctx.destroy(linger=0)
    unknown_client, wrong_server_key = counts[1], counts[2]
    assert unknown_client == {"not_allowed": 1}, counts
    assert wrong_server_key.pop("not_allowed") == 1, counts  # the refused client did not come back
    assert wrong_server_key and set(wrong_server_key) <= {"protocol", "handshake"}, counts
    assert "refused a connection to the batches socket: Curve handshake failed (not_allowed" in caplog.text


def test_numbered_groups_are_forgotten_past_their_horizon_and_background_snapshots_restore(
    tmp_path: Path,
) -> None:
    """Issue 41 item 5 over real sockets: a generator process numbers its groups and says what was
    acknowledged; the buffer keeps only the ids it may still resend, snapshots on its compactor
    thread every 10 ms while serving, and a restart from those files still drops every resend."""
    cfg = load_config(overrides=[*overrides(tmp_path), "buffer.persist_every_s=0.01"], environ={})
    sent = [m.from_map(Group, {**m.to_map(make_group(f"g{i}", i // 2)), "seq": i}) for i in range(12)]
    with service_in_thread(cfg) as svc:
        with Peers(svc.bound_ports) as peers:
            peers.ask(peers.gen, m.Hello("gen-0", 0, "proc-A"))
            peers.ask(peers.learner, m.LearnerHello(0, 0))
            for i in range(0, 12, 2):
                assert peers.ask(peers.gen, m.CreditRequest("gen-0", 2)).body.granted == 2
                ack = peers.ask(peers.gen, m.Groups("gen-0", sent[i : i + 2], holder="proc-A", acked_below=i))
                assert ack.body.accepted == [f"g{i}", f"g{i + 1}"]
                batch = peers.ask(peers.learner, m.BatchRequest(i // 2, 2, 0))
                peers.ask(peers.learner, m.Commit(i // 2 + 1, [g.group_id for g in batch.body.groups]))
            # Wait for the event, not for time: snapshots written on the compactor thread.
            deadline = time.monotonic() + 60
            while metric(scrape(svc.metrics_port)[1], "stream_dapo_buffer_persist_seconds_count") < 2:
                assert time.monotonic() < deadline, "no background snapshot within 60 s"
                time.sleep(0.01)
            # g0..g9 acknowledged: the buffer keeps g10 and g11 only.
            assert (
                peers.ask(peers.gen, m.Groups("gen-0", [], holder="proc-A", acked_below=10)).body.accepted
                == []
            )
            assert svc.stats()["seen_ids"] == 2
            assert metric(scrape(svc.metrics_port)[1], "stream_dapo_buffer_seen_ids") == 2
    with service_in_thread(cfg) as svc:
        with Peers(svc.bound_ports) as peers:
            resend = peers.ask(peers.gen, m.Groups("gen-0", sent, holder="proc-A", acked_below=10))
            assert resend.body.duplicates == [g.group_id for g in sent] and resend.body.accepted == []
            s = svc.stats()
            assert (s["accepted"], s["committed"], s["duplicates"], s["seen_ids"]) == (12, 12, 12, 2)


def test_the_service_takes_its_settings_and_journal_from_its_composition_root(tmp_path: Path) -> None:
    """`build_buffer(cfg)` composes; the service itself takes what it reads (issue 39: narrow inputs),
    so a caller can hand it another journal without touching the config."""
    from stream_dapo.buffer.service import BufferSettings

    cfg = load_config(overrides=overrides(tmp_path), environ={})
    settings = BufferSettings.from_config(cfg)
    assert settings.policy == cfg.admission_policy() and settings.out_dir == str(tmp_path)
    elsewhere = Journal(tmp_path / "elsewhere" / "state.msgpack")
    svc = BufferService(settings, elsewhere)
    try:
        assert svc.journal is elsewhere
    finally:
        svc.close()
    assert (tmp_path / "elsewhere" / "state.msgpack").is_file(), "the state went to the injected journal"
    assert not persist_path(cfg).exists(), "not to the one the config names"

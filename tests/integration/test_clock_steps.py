"""A step of the real-time clock neither expires a live generator's lease nor keeps a dead one's.

Regression: the buffer timed generator leases with `time.time`. With the real-time clock stepped
+3 h (an NTP step, a resumed VM) the only, live generator's lease expired at once (its credits
dropped, its groups arrived uncredited) and the oldest-waiting gauge read 10,805 s; stepped back
3 minutes after a generator was killed, its lease ran 213 s instead of 30 and /healthz showed
`silent_s` -174.8. Every duration is on the monotonic clock now; wall time only stamps.

The buffer runs in its own process under an LD_PRELOAD shim (tests/data/realtime_shift.c) that
shifts only CLOCK_REALTIME, gettimeofday and time, by an offset the test rewrites while it runs.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from stream_dapo.testing.services import port_overrides, wait_ports
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import open_endpoint, request
from tests.conftest import REPO
from tests.integration.ops_helpers import require_tool

SHIM = REPO / "tests" / "data" / "realtime_shift.c"
LEASE_S = 10.0
HOURS_3_NS = 3 * 3600 * 10**9
WAIT_S = 60.0  # only reached when something is broken; a lease stretched by the step needs 190 s


def build_shim(tmp: Path) -> Path:
    gcc = require_tool("gcc", "apt-get install -y gcc")
    lib = tmp / "realtime_shift.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(SHIM), "-ldl"], check=True)
    return lib


def step_to(offset_file: Path, offset_ns: int) -> None:
    with offset_file.open("r+b") as f:
        f.write(struct.pack("<q", offset_ns))


def shifted_env(lib: Path, offset_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DAPO__")}
    env.update(PYTHONPATH=str(REPO), LD_PRELOAD=str(lib), REALTIME_SHIFT_FILE=str(offset_file))
    return env


def buffer_argv(out: Path) -> list[str]:
    """`stream-dapo buffer` on ports of its choosing, G = 2, a lease of LEASE_S."""
    sets = [
        *port_overrides(),
        f'run.out_dir="{out}"',
        f"buffer.generator_lease_s={LEASE_S}",
        f"generator.heartbeat_s={LEASE_S / 3}",
        "algo.group_size=2",
        "learner.mini_batch_samples=4",
        "learner.rollout_batch_prompts=4",
        "algo.max_staleness=4",
    ]
    return [sys.executable, "-m", "stream_dapo.cli", "buffer", *(a for s in sets for a in ("--set", s))]


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def wait_until(what: str, cond: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    """Poll `cond` (an event the buffer reports) until it holds; fail after WAIT_S or if it exits."""
    import time

    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert proc.poll() is None, f"the buffer exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_shim_steps_only_the_real_time_clock(tmp_path: Path) -> None:
    lib, offset = build_shim(tmp_path), tmp_path / "offset"
    offset.write_bytes(struct.pack("<q", HOURS_3_NS))
    probe = "import time, json; print(json.dumps([time.time(), time.monotonic()]))"
    env = shifted_env(lib, offset)
    shifted = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    plain = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert abs(shifted[0] - plain[0] - 3 * 3600) < 60
    assert abs(shifted[1] - plain[1]) < 60


def test_leases_and_ages_ignore_steps_of_the_real_time_clock(tmp_path: Path) -> None:
    lib, offset = build_shim(tmp_path), tmp_path / "offset"
    offset.write_bytes(struct.pack("<q", 0))
    out = tmp_path / "run"
    argv = buffer_argv(out)
    log = tmp_path / "buffer.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=shifted_env(lib, offset))
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        ports = wait_ports(out, "buffer", proc, timeout_s=120)
        metrics_port = ports["metrics.buffer_port"]
        address = f"tcp://127.0.0.1:{ports['transport.samples_port']}"
        gen = open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=1 << 24, peer="buffer")

        def ask(body: m.Body) -> Any:
            return request(gen, body, timeout_ms=30_000, retries=0).body

        def lease() -> dict[str, float]:
            return dict(healthz(metrics_port)["generators"].get("gen-0", {}))

        from tests.integration.test_buffer_service import make_group, metric, scrape

        ask(m.Hello("gen-0", 0, "the live one"))
        assert ask(m.CreditRequest("gen-0", 4)).granted == 4
        assert ask(m.Groups("gen-0", [make_group("g0")])).accepted == ["g0"]

        # +3 h while gen-0 is live and quiet. Two round trips of another generator make sure the buffer
        # has run its periodic chores (lease expiry among them) on the stepped clock since.
        step_to(offset, HOURS_3_NS)
        other = open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=1 << 24, peer="buffer")
        for _ in range(2):
            request(other, m.Heartbeat("gen-1", 0), timeout_ms=30_000, retries=0)
        other.close()
        seen = lease()
        assert seen.get("credits") == 3 and 0 <= seen["silent_s"] < LEASE_S, seen
        assert ask(m.Heartbeat("gen-0", 0)) == m.Lease(3, False, 0), "a live lease expired on a clock step"
        age = metric(scrape(metrics_port)[1], "stream_dapo_buffer_oldest_waiting_seconds")
        assert 0 <= age < 600, f"a group aged {age:.0f} s by the step"

        # Back 3 min, and the generator dies: its credits return one lease later, not 183 s later.
        step_to(offset, HOURS_3_NS - 180 * 10**9)
        gen.close()
        silences: list[float] = []

        def released() -> bool:
            now = lease()
            silences.append(now.get("silent_s", 0.0))
            return now.get("credits", 0.0) == 0.0

        wait_until("the dead generator's credits to come back", released, proc)
        assert min(silences) >= 0, f"silent_s went negative: {min(silences)}"
        assert metric(scrape(metrics_port)[1], "stream_dapo_buffer_credits_outstanding") == 0
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        proc.wait(timeout=60)
    stats = json.loads((out / "buffer" / "stats.json").read_text())
    assert stats["uncredited"] == 0 and stats["generators_expired"] == 1, stats


@pytest.mark.parametrize("step_ns", [HOURS_3_NS, -180 * 10**9])
def test_the_shim_is_loaded_into_the_buffer(tmp_path: Path, step_ns: int) -> None:
    """Guards the test above: the buffer really runs on the shifted clock (its acceptance stamps, wall
    time for people, move with the step)."""
    import time

    from stream_dapo.buffer.journal import Journal

    lib, offset = build_shim(tmp_path), tmp_path / "offset"
    offset.write_bytes(struct.pack("<q", step_ns))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        buffer_argv(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=shifted_env(lib, offset)
    )
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        ports = wait_ports(out, "buffer", proc, timeout_s=120)
        address = f"tcp://127.0.0.1:{ports['transport.samples_port']}"
        from tests.integration.test_buffer_service import make_group

        with open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=1 << 24, peer="buffer") as gen:
            assert request(
                gen, m.Groups("gen-0", [make_group("g0")]), timeout_ms=30_000, retries=0
            ).body.accepted == ["g0"]
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        proc.wait(timeout=60)
    journal = Journal(out / "buffer" / "state.msgpack")
    records = [r for r in journal.load() if r.get("kind") in ("accept", "group")]
    journal.close()
    (stamp,) = [r["accepted_at"] for r in records]
    assert abs(stamp - time.time() - step_ns / 1e9) < 120

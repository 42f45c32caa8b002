"""Protocol fuzzer: random and mutated messages against every socket a service reads from.

    .venv/bin/python -m bench.drills.fuzz [--messages 100000] [--seed 0] [--json OUT]
                                   [--sockets samples,batches,weights,credits]

Each socket gets `--messages` messages over real ZeroMQ sockets, from a real service:

    samples  the buffer's generator-facing ROUTER    `stream-dapo buffer` in its own process
    batches  the buffer's learner-facing ROUTER      `stream-dapo buffer` in its own process
    weights  the learner's weight server (ROUTER)    `WeightServer` publishing a small state dict,
                                                     in its own process, with the learner's metrics
    credits  what a generator reads from the buffer  `GeneratorService`'s `BufferLink` (its DEALER,
                                                     decode, `on_message`, metrics) in its own
                                                     process; only the vLLM engine is left out (a stub
                                                     with nothing in flight), and this script plays
                                                     the buffer's ROUTER

Mutations of valid encoded messages: random bytes, truncations, bit flips, byte edits, wrong
schema versions, wrong types in fields, missing and unknown fields, huge declared sizes (msgpack
lengths, array shapes, and ZMTP frames declaring terabytes on a raw TCP connection), arrays of
inconsistent lengths or forbidden dtypes, duplicate ids and duplicate map keys, message types the
socket does not serve, broken envelopes, extra frames, and messages over the size limit.

Every message is judged first by an oracle: the codec's own `decode` plus the service's rule for
what it serves. A mutant that is still a valid message is sent only when it cannot change what the
service holds (a `groups` message with a group of the right size, or a `credit` granting credits,
is skipped and counted), so "nothing fuzzed was accepted" can be checked exactly. Sent messages
always total `--messages` per socket.

Per socket the report gives: messages sent and per second, crashes (the process died, or a valid
request went unanswered: must be 0), the service's own rejection counters by reason read from its
/metrics (`*_messages_rejected_total`, `*_groups_rejected_total`) next to what the oracle expected,
and the check after fuzzing: valid groups are accepted, acknowledged once (a resend is a duplicate)
and served to a learner intact; the weights download and verify; credits and acks still land.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import zmq  # noqa: E402

from bench.report import save_json  # noqa: E402
from stream_dapo.config import config_to_toml, load_config  # noqa: E402
from stream_dapo.runtime.metrics import (  # noqa: E402
    BufferMetrics,
    GeneratorMetrics,
    LearnerMetrics,
    catalogue,
    sample_name,
)
from stream_dapo.runtime.ports import endpoint_port, read_bound_ports, zmq_bind_address  # noqa: E402
from stream_dapo.tools.launch import tail  # noqa: E402
from stream_dapo.tools.prometheus import metric_sum, scrape  # noqa: E402
from stream_dapo.transport import messages as m  # noqa: E402
from stream_dapo.transport.codec import SCHEMA_VERSION, CodecError, Message, decode, encode, pack_value  # noqa: E402
from stream_dapo.transport.messages import Group, Sample  # noqa: E402
from stream_dapo.transport.sockets import open_endpoint, request  # noqa: E402

SOCKETS = ("samples", "batches", "weights", "credits")
GROUP_SIZE = 2
MAX_MESSAGE_BYTES = 1 << 20
"""transport.max_message_bytes of the fuzzed buffer and generator: small, so oversized cases are cheap."""
WEIGHTS_VERSION = 3
WEIGHTS_CHUNK_BYTES = 4096
REPLY_WINDOW = 1000
"""Messages sent to a ROUTER before its replies must catch up (a stall longer than STALL_S is a crash)."""
STALL_S = 20.0
START_TIMEOUT_S = 120.0
RECENT_CASES = 1000
"""Cases kept to write out when a service crashes, to replay the failure."""


# --------------------------------------------------------------------------------------------------
# Seeds: valid messages of every type
# --------------------------------------------------------------------------------------------------


def make_group(samples: int = GROUP_SIZE, version: int = 0, rng: np.random.Generator | None = None) -> Group:
    rng = rng or np.random.default_rng()
    length = int(rng.integers(1, 12))
    out = [
        Sample(
            tokens=rng.integers(0, 1000, length, dtype=np.int32),
            logprobs=-rng.random(length, dtype=np.float32),
            versions=np.full(length, version, dtype=np.int32),
            reward=1.0 if i % 2 else -1.0,
            correct=bool(i % 2),
            truncated=False,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(samples)
    ]
    prompt = rng.integers(0, 1000, int(rng.integers(1, 8)), dtype=np.int32)
    gid = rng.bytes(16).hex()  # from the seed, so a run can be replayed
    return Group(gid, f"p-{gid[:8]}", "generator-0", "42", prompt, 1.7e9, out)


def seed_messages(rng: np.random.Generator) -> dict[str, list[m.Body]]:
    """Valid messages of every type, by the socket that serves them."""

    def fuzz_ids(n: int) -> list[str]:
        return [f"fuzz-{rng.bytes(6).hex()}" for _ in range(n)]

    return {
        "samples": [
            m.Hello("generator-0", 0),
            m.CreditRequest("generator-0", 4),
            m.Groups("generator-0", [make_group(rng=rng)]),
            m.Groups("generator-0", [make_group(rng=rng), make_group(rng=rng)], filtered_total=1),
            m.Groups("generator-0", [make_group(samples=GROUP_SIZE + 1, rng=rng)]),
            m.Groups("generator-0", [], filtered_total=2),
            m.Heartbeat("generator-0", 3),
        ],
        "batches": [
            m.LearnerHello(0, 0),
            m.BatchRequest(0, 4, 0),
            m.BatchRequest(3, 2, 4096),
            m.Commit(1, fuzz_ids(3)),
        ],
        "weights": [
            m.WeightsQuery(0),
            m.WeightsQuery(WEIGHTS_VERSION),
            m.ChunkRequest(WEIGHTS_VERSION, 0),
            m.ChunkRequest(WEIGHTS_VERSION, 2),
        ],
        "credits": [
            m.Credit(0, 0),
            m.Ack(fuzz_ids(2), fuzz_ids(1), [m.Rejection(fuzz_ids(1)[0], "wrong_group_size")]),
            m.Error("bad_request", "fuzz"),
        ],
        "other": [
            m.Batch([make_group(rng=rng)], 0),  # buffer -> learner; no fuzzed socket serves it
            m.Empty("ready"),
            m.WeightsManifest.of(1, "0" * 64, 8192, 4096),
            m.Chunk(1, 0, memoryview(b"abc")),
            m.NotAvailable(0, 0, "no_weights_yet"),
        ],
    }


# --------------------------------------------------------------------------------------------------
# Mutations
# --------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzzed message: its frames, and which mutation made it."""

    kind: str
    frames: list[bytes]
    raw_tcp_size: int = 0
    """For `zmtp_huge_frame`: the frame size declared on a raw TCP connection (frames unused)."""


def _raw_array(dtype: bytes, shape: tuple[int, ...], payload: bytes) -> msgpack.ExtType:
    """An ndarray ext built by hand, so it can lie about its dtype, shape or size."""
    header = struct.pack(f"<B{len(dtype)}sB{len(shape)}q", len(dtype), dtype, len(shape), *shape)
    return msgpack.ExtType(1, header + payload)


BAD_ARRAYS: tuple[Callable[[], Any], ...] = (
    lambda: _raw_array(b"<i4", (5,), b"\x00" * 16),  # shape says 20 bytes, 16 sent
    lambda: _raw_array(b"<i4", (1 << 40,), b"\x00" * 8),  # a terabyte declared
    lambda: _raw_array(b"<f4", (1 << 62, 1 << 62), b""),  # product overflows int64
    lambda: _raw_array(b"<i4", (-1,), b""),
    lambda: _raw_array(b"<i4", (1, 1, 1, 1, 1), b"\x00" * 4),  # 5 dimensions
    lambda: _raw_array(b"<c8", (1,), b"\x00" * 8),  # complex: not allowed
    lambda: _raw_array(b"|O", (1,), b"\x00" * 8),  # objects: never
    lambda: _raw_array(b">i4", (2,), b"\x00" * 8),  # big-endian
    lambda: _raw_array(b"|b1", (3,), b"\x00\x01\x02"),  # bool byte 2
    lambda: _raw_array(b"<i4\xff", (1,), b"\x00" * 4),  # not ascii
    lambda: msgpack.ExtType(1, b"\x09<i4"),  # header claims more than the payload holds
    lambda: msgpack.ExtType(1, b""),
    lambda: msgpack.ExtType(7, b"abc"),  # unknown ext code
)

WRONG_VALUES: tuple[Callable[[], Any], ...] = (
    lambda: None,
    lambda: True,
    lambda: -1,
    lambda: 0,
    lambda: 2**64 - 1,
    lambda: -(2**63),
    lambda: 1.5,
    lambda: float("nan"),
    lambda: float("inf"),
    lambda: -0.0,
    lambda: "",
    lambda: "x" * 300,
    lambda: "\u00e9\u2603",
    lambda: b"\x00\xff",
    lambda: [],
    lambda: [1, "a", None],
    lambda: {},
    lambda: {"k": 1},
    lambda: {b"bytes-key": 1},
    lambda: np.zeros(3, np.float64),
    lambda: np.zeros(3, np.int64),
    lambda: np.zeros((2, 2), np.int32),
    lambda: np.zeros(0, np.int32),
    lambda: np.array([-1, 2], np.int32),
    lambda: np.array([np.nan, 0.0], np.float32),
    lambda: np.array([True, False]),
    *BAD_ARRAYS,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position inside a body: map keys and list indices, nested."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def _copy(value: Any) -> Any:
    """Deep copy of dicts and lists (arrays and scalars are shared: mutations replace, never edit)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _parent(body: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    """The container holding `path`, and the key or index in it."""
    node = body
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    node, key = _parent(body, path)
    return node[key]


def _envelope(msg_type: Any, body: Any, version: Any = SCHEMA_VERSION) -> bytes:
    return pack_value({"v": version, "t": msg_type, "b": body})


class Mutator:
    """Makes fuzz cases from the seeds of one socket (and, for wrong types, of the others)."""

    def __init__(self, rng: random.Random, seeds: list[m.Body], others: list[m.Body], max_bytes: int):
        self.rng = rng
        self.seeds = seeds
        self.others = others
        self.max_bytes = max_bytes
        self.encoded = [encode(body) for body in seeds]
        kinds = {
            "bit_flip": 18,
            "truncate": 8,
            "byte_edit": 6,
            "random_bytes": 8,
            "bad_version": 6,
            "wrong_field_type": 16,
            "missing_or_unknown_field": 5,
            "huge_declared_size": 5,
            "bad_array": 8,
            "inconsistent_lengths": 4,
            "duplicate_ids": 5,
            "wrong_message_type": 5,
            "bad_envelope": 4,
            "extra_frames": 2,
            "oversized": 0.15,
            "zmtp_huge_frame": 0.05,
        }
        self.kinds = list(kinds)
        self.weights = list(kinds.values())

    def next(self) -> Case:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        return getattr(self, f"_{kind}")()

    # -- byte-level mutations of valid encoded messages

    def _valid(self) -> bytearray:
        return bytearray(self.rng.choice(self.encoded))

    def _bit_flip(self) -> Case:
        data = self._valid()
        for _ in range(self.rng.randint(1, 8)):
            i = self.rng.randrange(len(data))
            data[i] ^= 1 << self.rng.randrange(8)
        return Case("bit_flip", [bytes(data)])

    def _truncate(self) -> Case:
        data = self._valid()
        return Case("truncate", [bytes(data[: self.rng.randrange(len(data))])])

    def _byte_edit(self) -> Case:
        data = self._valid()
        for _ in range(self.rng.randint(1, 4)):
            i = self.rng.randrange(len(data))
            op = self.rng.randrange(3)
            if op == 0:
                data[i] = self.rng.randrange(256)
            elif op == 1:
                del data[i]
            else:
                data[i:i] = self.rng.randbytes(self.rng.randint(1, 8))
        return Case("byte_edit", [bytes(data)])

    def _random_bytes(self) -> Case:
        n = self.rng.choice((0, 1, 2, 8, 64, 512, 4096))
        data = self.rng.randbytes(self.rng.randint(0, n))
        if data and self.rng.random() < 0.5:
            data = b"\x83" + data  # starts like the envelope map
        return Case("random_bytes", [data])

    # -- structural mutations, packed without schema checks

    def _seed(self) -> tuple[str, dict[str, Any]]:
        body = self.rng.choice(self.seeds)
        return body.TYPE, _copy(m.to_map(body))

    def _bad_version(self) -> Case:
        msg_type, body = self._seed()
        version = self.rng.choice((0, 2, 3, 255, -1, 2**64 - 1, True, 1.0, "1", None, b"\x01"))
        return Case("bad_version", [_envelope(msg_type, body, version)])

    def _wrong_field_type(self) -> Case:
        msg_type, body = self._seed()
        paths = list(_paths(body))
        if paths:
            node, key = _parent(body, self.rng.choice(paths))
            node[key] = self.rng.choice(WRONG_VALUES)()
        return Case("wrong_field_type", [_envelope(msg_type, body)])

    def _missing_or_unknown_field(self) -> Case:
        msg_type, body = self._seed()
        maps = [body] + [node for p in _paths(body) if isinstance(node := _get(body, p), dict)]
        target = self.rng.choice(maps)
        if target and self.rng.random() < 0.5:
            del target[self.rng.choice(list(target))]
        else:
            target[self.rng.choice(("extra", "v", "group_id", "x" * 100))] = 1
        return Case("missing_or_unknown_field", [_envelope(msg_type, body)])

    def _huge_declared_size(self) -> Case:
        msg_type, _ = self._seed()
        head = (
            b"\x83"
            + pack_value("v")
            + pack_value(SCHEMA_VERSION)
            + pack_value("t")
            + pack_value(msg_type)
            + pack_value("b")
        )
        huge = self.rng.choice((0xFFFFFFFF, 0x7FFFFFFF, self.max_bytes + 1, 1 << 24))
        n4 = struct.pack(">I", huge)
        tail_bytes = self.rng.randbytes(self.rng.randint(0, 32))
        crafted = self.rng.choice(
            (
                b"\xc6" + n4 + tail_bytes,  # bin32
                b"\xdb" + n4 + tail_bytes,  # str32
                b"\xdd" + n4 + b"\xc0" * 4,  # array32
                b"\xdf" + n4 + b"\xa1a\x01",  # map32
                b"\xc9" + n4 + b"\x01" + tail_bytes,  # ext32
                b"\x91" * self.rng.choice((100, 2000, 20000)) + b"\xc0",  # nesting depth
                b"\xd6\xff" + tail_bytes[:4].ljust(4, b"\x00"),  # a msgpack timestamp (ext -1)
                b"\xc7\x0c\xff" + tail_bytes[:12].ljust(12, b"\xff"),  # timestamp96, nanoseconds out of range
            )
        )
        data = head + crafted if self.rng.random() < 0.8 else crafted
        return Case("huge_declared_size", [data])

    def _bad_array(self) -> Case:
        msg_type, body = self._seed()
        arrays = [p for p in _paths(body) if isinstance(_get(body, p), np.ndarray)]
        paths = arrays or list(_paths(body))
        if paths:
            node, key = _parent(body, self.rng.choice(paths))
            node[key] = self.rng.choice(BAD_ARRAYS)()
        return Case("bad_array", [_envelope(msg_type, body)])

    def _inconsistent_lengths(self) -> Case:
        """Valid-looking groups whose per-token arrays disagree in length (elsewhere: an array where a
        scalar or a list goes)."""
        msg_type, body = self._seed()
        samples = [s for g in body.get("groups", []) for s in g["samples"]]
        if samples:
            sample = self.rng.choice(samples)
            key = self.rng.choice(("tokens", "logprobs", "versions"))
            length = len(sample["tokens"])
            n = length + self.rng.choice((-1, 1, 5))
            sample[key] = np.resize(sample[key], n if n >= 1 else length + 1)
        else:  # no arrays in this socket's messages: a real array where a list or int goes
            paths = list(_paths(body))
            if paths:
                node, key = _parent(body, self.rng.choice(paths))
                node[key] = np.arange(self.rng.randint(1, 5), dtype=np.int32)
        return Case("inconsistent_lengths", [_envelope(msg_type, body)])

    def _duplicate_ids(self) -> Case:
        msg_type, body = self._seed()
        if msg_type == m.GROUPS and body["groups"]:
            g = body["groups"][0]
            g["samples"] = g["samples"][:1] if GROUP_SIZE > 1 else g["samples"] * 2  # never acceptable
            body["groups"] = [g, _copy(g)]  # one id twice: both refused, and counted twice
        elif msg_type == m.COMMIT:
            body["group_ids"] = body["group_ids"] * 2
        elif msg_type == m.ACK:
            ids = body["accepted"] + body["duplicates"]
            body["accepted"], body["duplicates"] = ids * 2, ids
        else:  # a duplicate map key: msgpack keeps the last value, so order decides what arrives
            first, last = (body, {}) if self.rng.random() < 0.5 else ({}, body)
            keys = ("v", 1, "t", msg_type, "b", first, "b", last)
            return Case("duplicate_ids", [b"\x84" + b"".join(pack_value(x) for x in keys)])
        return Case("duplicate_ids", [_envelope(msg_type, body)])

    def _wrong_message_type(self) -> Case:
        roll = self.rng.random()
        if roll < 0.6:
            return Case("wrong_message_type", [encode(self.rng.choice(self.others))])
        msg_type, body = self._seed()
        bogus = self.rng.choice(
            ("", "GROUPS", "groups ", "pickle", "x" * 1000, 7, None, b"groups", ["groups"])
        )
        return Case("wrong_message_type", [_envelope(bogus, body)])

    def _bad_envelope(self) -> Case:
        msg_type, body = self._seed()
        env = self.rng.choice(
            (
                [1, msg_type, body],
                1,
                "envelope",
                None,
                {"v": SCHEMA_VERSION, "t": msg_type},
                {"v": SCHEMA_VERSION, "b": body},
                {"v": SCHEMA_VERSION, "t": msg_type, "b": body, "x": 0},
                {b"v": SCHEMA_VERSION, b"t": msg_type, b"b": body},
                {"v": SCHEMA_VERSION, "t": msg_type, "b": [body]},
                {"v": SCHEMA_VERSION, "t": msg_type, "b": "body"},
            )
        )
        data = pack_value(env)
        if self.rng.random() < 0.2:
            data += b"\xc0"  # trailing bytes after a whole message
        return Case("bad_envelope", [data])

    def _extra_frames(self) -> Case:
        data = bytes(self._valid())
        return Case("extra_frames", self.rng.choice(([data, data], [data, b""], [b"", data], [data] * 3)))

    def _oversized(self) -> Case:
        msg_type, body = self._seed()
        data = _envelope(msg_type, body)
        pad = self.max_bytes + 1 - len(data) + self.rng.randint(0, 64)
        return Case("oversized", [data + b"\x00" * pad])

    def _zmtp_huge_frame(self) -> Case:
        size = self.rng.choice((1 << 62, 1 << 40, 1 << 33, self.max_bytes * 4))
        return Case("zmtp_huge_frame", [], raw_tcp_size=size)


def send_zmtp_huge_frame(host: str, port: int, size: int) -> None:
    """Speak ZMTP 3.0 by hand as a DEALER and announce one frame of `size` bytes, then hang up.

    libzmq allocates a frame as its header declares; this checks that a lying header neither kills
    the service nor leaves it stuck.
    """
    greeting = (
        b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    )
    props = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + props
    command = b"\x04" + bytes([len(ready)]) + ready
    frame = b"\x02" + struct.pack(">Q", size) + b"\x83\xa1v\x01" + b"\x00" * 64
    with socket.create_connection((host, port), timeout=2.0) as s:
        s.sendall(greeting)
        try:
            s.recv(64)
        except OSError:
            return
        s.sendall(command + frame)
        time.sleep(0.002)


# --------------------------------------------------------------------------------------------------
# Oracle
# --------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the service should do with a case: reject it (reason), answer it, or (skip) it is a
    valid message that could change the service's state, which is not sent."""

    outcome: str  # "rejected" | "valid" | "skip"
    reason: str = ""
    groups_rejected: int = 0
    """Valid `groups` messages: groups the buffer will refuse (wrong_group_size)."""


def judge_codec(frames: list[bytes], max_bytes: int) -> Message | Verdict:
    if len(frames) != 1:
        return Verdict("rejected", "malformed")
    try:
        return decode(frames[0], max_bytes=max_bytes)
    except CodecError as exc:
        return Verdict("rejected", exc.reason)


# --------------------------------------------------------------------------------------------------
# Processes and metrics
# --------------------------------------------------------------------------------------------------


class Crash(Exception):
    """The service died or stopped answering valid requests."""


@dataclass
class Proc:
    """A service process in its own session (killed with its whole group)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, name: str, argv: list[str], workdir: Path) -> Proc:
        log_path = workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
            )
        return cls(name, popen, log_path)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> int | None:
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode


def wait_until(what: str, cond: Callable[[], bool], proc: Proc, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if not proc.alive():
            raise Crash(
                f"{proc.name} exited ({proc.popen.returncode}) while waiting for {what}:\n{tail(proc.log_path)}"
            )
        time.sleep(0.1)
    raise Crash(f"timed out waiting for {what}:\n{tail(proc.log_path)}")


def by_reason(samples: dict[str, float], name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in samples.items():
        base, _, labels = key.partition("{")
        if base == name and 'reason="' in labels:
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0) + int(value)
    return out


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


# --------------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------------


@dataclass
class Result:
    socket: str
    service: str
    messages: int = 0
    seconds: float = 0.0
    mutations: Counter[str] = field(default_factory=Counter)
    skipped_valid: int = 0
    expected_rejections: Counter[str] = field(default_factory=Counter)
    expected_groups_rejected: int = 0
    valid_sent: int = 0
    replies: Counter[str] = field(default_factory=Counter)
    zmtp_connections: int = 0
    probes: int = 0
    crashes: int = 0
    crash_detail: str = ""
    rejections: dict[str, int] = field(default_factory=dict)
    groups_rejected: dict[str, int] = field(default_factory=dict)
    rejections_match: bool = False
    after: dict[str, Any] = field(default_factory=dict)
    after_ok: bool = False
    exit_code: int | None = None
    """The service's exit code after SIGTERM (0: it drained and persisted its state)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "socket": self.socket,
            "service": self.service,
            "messages": self.messages,
            "seconds": round(self.seconds, 2),
            "messages_per_s": round(self.messages / self.seconds) if self.seconds else 0,
            "mutations": dict(sorted(self.mutations.items())),
            "skipped_valid_stateful": self.skipped_valid,
            "valid_sent": self.valid_sent,
            "expected_rejections": dict(sorted(self.expected_rejections.items())),
            "expected_groups_rejected": self.expected_groups_rejected,
            "rejections": self.rejections,
            "groups_rejected": self.groups_rejected,
            "rejections_match_oracle": self.rejections_match,
            "replies": dict(sorted(self.replies.items())),
            "zmtp_huge_frame_connections": self.zmtp_connections,
            "probes_answered": self.probes,
            "crashes": self.crashes,
            "exit_code_on_sigterm": self.exit_code,
            "crash_detail": self.crash_detail,
            "after_fuzzing": self.after,
            "after_fuzzing_ok": self.after_ok,
        }


class Target:
    """One fuzzed socket: how to start its service, judge a case, send it, probe and check it."""

    socket_name: str
    service: str
    max_bytes: int
    proc: Proc
    ctx: zmq.Context[Any]
    tcp_port: int
    metrics_url: str
    rejected_metric: str
    binds = True
    """The service binds `tcp_port` (raw ZMTP cases connect to it); False when it connects out."""

    def judge(self, case: Case) -> Verdict:
        raise NotImplementedError

    def send(self, frames: list[bytes]) -> None:
        raise NotImplementedError

    def pump(self, result: Result, block_s: float = 0.0) -> None:
        """Read what the service sent back (replies, or the generator's own requests)."""
        raise NotImplementedError

    def backlog(self, result: Result) -> int:
        return 0

    def probe(self) -> None:
        """A valid request answered correctly; raise Crash otherwise."""
        raise NotImplementedError

    def check_after(self) -> dict[str, Any]:
        raise NotImplementedError

    def group_rejections(self, scraped: dict[str, float]) -> dict[str, int]:
        return {}

    def close(self) -> int | None:
        """Stop the service with SIGTERM (it drains) and return its exit code."""
        code = self.proc.stop()
        self.ctx.destroy(linger=0)
        return code


def _dealer(ctx: zmq.Context[Any], port: int) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = int(STALL_S * 1000)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


class RouterTarget(Target):
    """A service that binds a ROUTER: the fuzzer is a DEALER client and reads every reply."""

    served: frozenset[str]

    def connect(self) -> None:
        self.sock = _dealer(self.ctx, self.tcp_port)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def send(self, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart(frames)
        except zmq.Again:
            raise Crash(f"the {self.service} stopped reading: a send waited {STALL_S:.0f} s") from None

    def pump(self, result: Result, block_s: float = 0.0) -> None:
        timeout = int(block_s * 1000)
        while self.poller.poll(timeout):
            timeout = 0
            reply = self.sock.recv_multipart()
            try:
                result.replies[decode(reply[-1], max_bytes=1 << 30).type] += 1
            except CodecError:
                result.replies["undecodable"] += 1

    def backlog(self, result: Result) -> int:
        return result.messages - sum(result.replies.values())

    def judge(self, case: Case) -> Verdict:
        got = judge_codec(case.frames, self.max_bytes)
        if isinstance(got, Verdict):
            return got
        if got.type not in self.served:
            return Verdict("rejected", "unexpected_type")
        return self.judge_valid(got)

    def judge_valid(self, msg: Message) -> Verdict:
        return Verdict("valid")


# -- buffer: samples and batches ------------------------------------------------------------------


class BufferTarget(RouterTarget):
    rejected_metric = sample_name(catalogue(BufferMetrics).messages_rejected)

    def __init__(self, socket_name: str, workdir: Path) -> None:
        self.socket_name = socket_name
        self.service = f"stream-dapo buffer ({socket_name} socket)"
        self.max_bytes = MAX_MESSAGE_BYTES
        self.served = frozenset(
            (m.HELLO, m.CREDIT_REQUEST, m.GROUPS, m.HEARTBEAT)
            if socket_name == "samples"
            else (m.LEARNER_HELLO, m.BATCH_REQUEST, m.COMMIT)
        )
        cfg = load_config(
            overrides=[
                "transport.samples_port=0",  # every port 0: the buffer binds and reports them
                "transport.batches_port=0",
                f"transport.max_message_bytes={MAX_MESSAGE_BYTES}",
                "metrics.buffer_port=0",
                f'run.out_dir="{workdir / socket_name}"',
                f"algo.group_size={GROUP_SIZE}",
                "learner.mini_batch_samples=4",
                "learner.rollout_batch_prompts=4",
                "algo.max_staleness=4",
            ],
            environ={},
        )
        config = workdir / f"buffer-{socket_name}.toml"
        config.write_text(config_to_toml(cfg))
        self.cfg = cfg
        self.ctx = zmq.Context()
        argv = [
            sys.executable,
            "-m",
            "stream_dapo.cli",
            "--log-level",
            "WARNING",
            "buffer",
            "--config",
            str(config),
        ]
        self.proc = Proc.start(f"buffer-{socket_name}", argv, workdir)
        out = workdir / socket_name
        wait_until("the buffer's ports", lambda: read_bound_ports(out, "buffer") is not None, self.proc)
        ports = read_bound_ports(out, "buffer") or {}
        samples_port, batches_port = ports["transport.samples_port"], ports["transport.batches_port"]
        self.tcp_port = samples_port if socket_name == "samples" else batches_port
        self.metrics_url = f"http://127.0.0.1:{ports['metrics.buffer_port']}/metrics"
        wait_until("the buffer's /metrics", lambda: bool(scrape(self.metrics_url)), self.proc)
        self.gen = open_endpoint(
            self.ctx, zmq.DEALER, connect=f"tcp://127.0.0.1:{samples_port}", max_bytes=1 << 30
        )
        self.learner = open_endpoint(
            self.ctx, zmq.DEALER, connect=f"tcp://127.0.0.1:{batches_port}", max_bytes=1 << 30
        )
        self.connect()

    def judge_valid(self, msg: Message) -> Verdict:
        if msg.type != m.GROUPS:
            return Verdict("valid")
        sizes = [len(g.samples) for g in msg.body.groups]
        if GROUP_SIZE in sizes:
            return Verdict("skip")  # the buffer would rightly accept it
        return Verdict("valid", groups_rejected=len(sizes))

    def group_rejections(self, scraped: dict[str, float]) -> dict[str, int]:
        return by_reason(scraped, sample_name(catalogue(BufferMetrics).groups_rejected))

    def probe(self) -> None:
        if not self.proc.alive():
            raise Crash(f"the buffer exited ({self.proc.popen.returncode}):\n{tail(self.proc.log_path)}")
        try:
            if self.socket_name == "samples":
                reply = request(self.gen, m.Hello("probe", 0), timeout_ms=int(STALL_S * 1000), retries=0)
                ok = reply.type == m.CREDIT
            else:
                reply = request(self.learner, m.LearnerHello(0, 0), timeout_ms=int(STALL_S * 1000), retries=0)
                ok = reply.type == m.EMPTY
        except Exception as exc:  # noqa: BLE001 (any failure to answer is the finding)
            raise Crash(
                f"the buffer did not answer a valid request: {exc}\n{tail(self.proc.log_path)}"
            ) from exc
        if not ok:
            raise Crash(f"the buffer answered a valid request with {reply.type}: {reply.body}")

    def check_after(self) -> dict[str, Any]:
        """Valid groups after the fuzzing: accepted once, acknowledged, served intact, committed."""
        before = scrape(self.metrics_url)
        accepted_before = int(metric_sum(before, sample_name(catalogue(BufferMetrics).groups_accepted)))
        rng = np.random.default_rng(0)
        groups = [make_group(rng=rng) for _ in range(3)]
        ids = [g.group_id for g in groups]
        timeout = int(STALL_S * 1000)
        request(self.gen, m.Hello("generator-0", 0), timeout_ms=timeout, retries=0)
        credit = request(self.gen, m.CreditRequest("generator-0", len(groups)), timeout_ms=timeout, retries=0)
        ack = request(self.gen, m.Groups("generator-0", groups), timeout_ms=timeout, retries=0)
        resend = request(self.gen, m.Groups("generator-0", groups[:1]), timeout_ms=timeout, retries=0)
        request(self.learner, m.LearnerHello(0, 0), timeout_ms=timeout, retries=0)
        batch = request(self.learner, m.BatchRequest(0, 16, 0), timeout_ms=timeout, retries=0)
        served = batch.body.groups if batch.type == m.BATCH else []
        commit = request(self.learner, m.Commit(1, ids), timeout_ms=timeout, retries=0)
        after = scrape(self.metrics_url)
        out = {
            "accepted_before_check": accepted_before,
            "valid_groups_sent": len(groups),
            "credits_granted": getattr(credit.body, "granted", None),
            "acked_accepted": getattr(ack.body, "accepted", None) == ids,
            "resend_acked_as_duplicate": getattr(resend.body, "duplicates", None) == ids[:1]
            and not resend.body.accepted,
            "served_intact": served == groups,
            "committed": commit.type == m.EMPTY and commit.body.reason == "committed",
            "accepted_total": int(metric_sum(after, sample_name(catalogue(BufferMetrics).groups_accepted))),
            "duplicates_total": int(
                metric_sum(after, sample_name(catalogue(BufferMetrics).groups_duplicate))
            ),
        }
        out["ok"] = (
            out["accepted_before_check"] == 0
            and out["accepted_total"] == len(groups)
            and out["acked_accepted"]
            and out["resend_acked_as_duplicate"]
            and out["served_intact"]
            and out["committed"]
        )
        return out

    def close(self) -> int | None:
        self.gen.close()
        self.learner.close()
        self.sock.close(linger=0)
        return super().close()


# -- weights ----------------------------------------------------------------------------------------


class WeightsTarget(RouterTarget):
    rejected_metric = sample_name(catalogue(LearnerMetrics).messages_rejected)
    served = frozenset((m.WEIGHTS_QUERY, m.CHUNK_REQUEST))

    def __init__(self, workdir: Path) -> None:
        from stream_dapo.weights.zmq_chunks import REQUEST_MAX_BYTES

        self.socket_name = "weights"
        self.service = "WeightServer (learner's weight socket)"
        self.max_bytes = REQUEST_MAX_BYTES
        self.workdir = workdir
        info_path = workdir / "weights-info.json"
        argv = [sys.executable, "-m", __spec__.name, "--host", "weights", "--port", "0"]
        argv += ["--metrics-port", "0", "--info", str(info_path)]
        self.ctx = zmq.Context()
        self.proc = Proc.start("weight-server", argv, workdir)
        wait_until("the weight server", info_path.is_file, self.proc)
        self.info = json.loads(info_path.read_text())
        self.tcp_port = self.info["port"]  # what it bound
        self.metrics_url = f"http://127.0.0.1:{self.info['metrics_port']}/metrics"
        self.connect()

    def judge_valid(self, msg: Message) -> Verdict:
        body = msg.body
        if isinstance(body, m.ChunkRequest) and body.version == self.info["version"]:
            if body.index >= self.info["num_chunks"]:
                return Verdict("rejected", "bad_chunk_index")
        return Verdict("valid")

    def probe(self) -> None:
        if not self.proc.alive():
            raise Crash(f"the weight server exited:\n{tail(self.proc.log_path)}")
        with open_endpoint(
            self.ctx, zmq.DEALER, connect=f"tcp://127.0.0.1:{self.tcp_port}", max_bytes=1 << 30
        ) as ep:
            try:
                reply = request(ep, m.WeightsQuery(0), timeout_ms=int(STALL_S * 1000), retries=0)
            except Exception as exc:  # noqa: BLE001
                raise Crash(f"the weight server did not answer weights_query: {exc}") from exc
        if reply.type != m.WEIGHTS_MANIFEST or reply.body.checksum != self.info["checksum"]:
            raise Crash(f"the weight server answered weights_query with {reply.type}: {reply.body}")

    def check_after(self) -> dict[str, Any]:
        from stream_dapo.weights.base import sha256_file
        from stream_dapo.weights.zmq_chunks import fetch_weights_zmq

        version, path = fetch_weights_zmq(
            f"tcp://127.0.0.1:{self.tcp_port}", -1, timeout=STALL_S, dest_dir=self.workdir / "fetched"
        )
        digest = sha256_file(path) if path is not None else None
        out = {
            "version": version,
            "published_version": self.info["version"],
            "downloaded_sha256_matches": digest == self.info["checksum"],
            "bytes": path.stat().st_size if path is not None else 0,
        }
        out["ok"] = version == self.info["version"] and out["downloaded_sha256_matches"]
        return out

    def close(self) -> int | None:
        self.sock.close(linger=0)
        return super().close()


# -- credits: the generator's buffer client ------------------------------------------------------------


class CreditsTarget(Target):
    """This script binds the buffer's samples ROUTER; a generator connects and is fuzzed."""

    rejected_metric = sample_name(catalogue(GeneratorMetrics).messages_rejected)
    served = frozenset((m.CREDIT, m.ACK, m.LEASE, m.ERROR))
    binds = False

    def __init__(self, workdir: Path) -> None:
        self.socket_name = "credits"
        self.service = "GeneratorService buffer client (no vLLM engine)"
        self.max_bytes = MAX_MESSAGE_BYTES
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.router_mandatory = 1
        self.router.sndtimeo = int(STALL_S * 1000)
        self.router.bind("tcp://127.0.0.1:*")
        self.tcp_port = endpoint_port(self.router.getsockopt_string(zmq.LAST_ENDPOINT))
        cfg = load_config(
            overrides=[
                f"transport.samples_port={self.tcp_port}",
                f"transport.max_message_bytes={MAX_MESSAGE_BYTES}",
                "transport.timeout_s=2.0",
                "metrics.generator_port=0",
                f'run.out_dir="{workdir / "generator"}"',
                f"algo.group_size={GROUP_SIZE}",
                "learner.mini_batch_samples=4",
                "learner.rollout_batch_prompts=4",
                "algo.max_staleness=4",
            ],
            environ={},
        )
        config = workdir / "generator.toml"
        config.write_text(config_to_toml(cfg))
        info_path = workdir / "generator-info.json"
        argv = [
            sys.executable,
            "-m",
            __spec__.name,
            "--host",
            "generator",
            "--config",
            str(config),
            "--info",
            str(info_path),
        ]
        self.proc = Proc.start("generator", argv, workdir)
        self.peer = self._await_hello()
        wait_until("the generator", info_path.is_file, self.proc)
        self.info = json.loads(info_path.read_text())
        self.metrics_url = f"http://127.0.0.1:{self.info['metrics_port']}/metrics"
        self.requests: Counter[str] = Counter()
        self.credit_request_id: int | None = None

    def _await_hello(self) -> bytes:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.router.poll(200):
                peer, data = self.router.recv_multipart()
                msg = decode(data, max_bytes=MAX_MESSAGE_BYTES)
                if msg.type == m.HELLO:
                    self.router.send_multipart([peer, encode(m.Credit(0, 0), request_id=msg.request_id)])
                    return peer
            if not self.proc.alive():
                break
        raise Crash(f"the generator never said hello:\n{tail(self.proc.log_path)}")

    def judge(self, case: Case) -> Verdict:
        got = judge_codec(case.frames, self.max_bytes)
        if isinstance(got, Verdict):
            return got
        if got.type not in self.served:
            return Verdict("rejected", "unexpected_type")
        body = got.body
        if isinstance(body, m.Credit) and body.granted > 0:
            return Verdict("skip")  # real credits: the generator would rightly hold them
        if isinstance(body, m.Lease) and body.expired:
            return Verdict("skip")  # a real expiry: the generator would rightly drop its credits
        if isinstance(body, m.Ack):
            named = {*body.accepted, *body.duplicates, *(r.group_id for r in body.rejected)}
            if self.info["pending"] in named:
                return Verdict("skip")
        return Verdict("valid")

    def send(self, frames: list[bytes]) -> None:
        try:
            self.router.send_multipart([self.peer, *frames])
        except zmq.Again:
            raise Crash(f"the generator stopped reading: a send waited {STALL_S:.0f} s") from None
        except zmq.ZMQError as exc:
            raise Crash(f"the generator is gone: {exc}") from None

    def pump(self, result: Result, block_s: float = 0.0) -> None:
        timeout = int(block_s * 1000)
        while self.router.poll(timeout):
            timeout = 0
            frames = self.router.recv_multipart()
            try:
                msg = decode(frames[-1], max_bytes=MAX_MESSAGE_BYTES)
            except CodecError:
                self.requests["undecodable"] += 1
                continue
            self.requests[msg.type] += 1
            if msg.type == m.CREDIT_REQUEST:
                self.credit_request_id = msg.request_id  # a repeat keeps its id

    def _gauges(self) -> dict[str, float]:
        s, gm = scrape(self.metrics_url), catalogue(GeneratorMetrics)
        return {
            "credits_available": metric_sum(s, sample_name(gm.credits_available)),
            "groups_acked": metric_sum(s, sample_name(gm.groups_acked)),
            "unacked_groups": metric_sum(s, sample_name(gm.unacked_groups)),
        }

    def probe(self) -> None:
        """The generator's loop is alive: /healthz answers and reports recent progress."""
        if not self.proc.alive():
            raise Crash(f"the generator exited ({self.proc.popen.returncode}):\n{tail(self.proc.log_path)}")
        import urllib.request

        url = self.metrics_url.replace("/metrics", "/livez")
        try:
            with urllib.request.urlopen(url, timeout=STALL_S) as resp:
                body = json.loads(resp.read())
        except OSError as exc:
            raise Crash(f"the generator's /livez did not answer: {exc}") from exc
        if body.get("seconds_since_progress", 1e9) > STALL_S:
            raise Crash(f"the generator's loop stalled: {body}")

    def _await_credit_request(self) -> int | None:
        """The id of the generator's credit request in flight (it repeats one every
        transport.timeout_s until answered); a credit reply counts only when it names it."""
        self.credit_request_id = None
        deadline = time.monotonic() + STALL_S
        while self.credit_request_id is None and time.monotonic() < deadline:
            self.pump(Result("credits", ""), 0.1)
        return self.credit_request_id

    def check_after(self) -> dict[str, Any]:
        """A valid credit (the reply to its credit request) and an ack for its pending group still land."""
        before = self._gauges()
        granted = 3
        self.send([encode(m.Credit(granted, 0), request_id=self._await_credit_request())])
        self.send([encode(m.Ack([self.info["pending"]]))])
        deadline = time.monotonic() + STALL_S
        after = before
        while time.monotonic() < deadline:
            self.pump(Result("credits", ""), 0.1)
            after = self._gauges()
            if after["groups_acked"] >= 1 and after["credits_available"] >= granted:
                break
        out = {
            "credits_before_check": before["credits_available"],
            "acked_before_check": before["groups_acked"],
            "credits_after_valid_credit": after["credits_available"],
            "acked_after_valid_ack": after["groups_acked"],
            "unacked_after": after["unacked_groups"],
            "generator_requests_seen": dict(self.requests),
        }
        out["ok"] = (
            before["credits_available"] == 0
            and before["groups_acked"] == 0
            and after["credits_available"] == granted
            and after["groups_acked"] == 1
            and after["unacked_groups"] == 0
        )
        return out

    def close(self) -> int | None:
        self.router.close(linger=0)
        return super().close()


# --------------------------------------------------------------------------------------------------
# The fuzzing loop
# --------------------------------------------------------------------------------------------------


def fuzz(target: Target, mutator: Mutator, n: int, workdir: Path) -> Result:
    result = Result(target.socket_name, target.service)
    before = scrape(target.metrics_url)
    rejected_before = by_reason(before, target.rejected_metric)
    groups_before = target.group_rejections(before)
    recent: deque[Case] = deque(maxlen=RECENT_CASES)
    probe_every = max(500, n // 10)
    t0 = time.perf_counter()
    try:
        while result.messages < n:
            case = mutator.next()
            if case.raw_tcp_size:
                if target.binds and result.zmtp_connections < 200:
                    send_zmtp_huge_frame("127.0.0.1", target.tcp_port, case.raw_tcp_size)
                    result.zmtp_connections += 1
                continue  # not a message the service can count: libzmq drops the connection
            verdict = target.judge(case)
            if verdict.outcome == "skip":
                result.skipped_valid += 1
                continue
            recent.append(case)
            target.send(case.frames)
            result.messages += 1
            result.mutations[case.kind] += 1
            if verdict.outcome == "rejected":
                result.expected_rejections[verdict.reason] += 1
            else:
                result.valid_sent += 1
                result.expected_groups_rejected += verdict.groups_rejected
            target.pump(result)
            _wait_for_replies(target, result, REPLY_WINDOW)
            if result.messages % probe_every == 0:
                target.probe()
                result.probes += 1
        _wait_for_replies(target, result, 0)
        result.seconds = time.perf_counter() - t0
        target.probe()
        result.probes += 1
        _read_counters(target, result, rejected_before, groups_before)
        result.after = target.check_after()
        result.after_ok = bool(result.after.get("ok"))
    except Crash as exc:
        result.seconds = result.seconds or time.perf_counter() - t0
        result.crashes = 1
        result.crash_detail = str(exc)[-4000:]
        dump = workdir / f"crash-{target.socket_name}.jsonl"
        with dump.open("w") as f:
            for c in recent:
                f.write(json.dumps({"kind": c.kind, "frames": [x.hex() for x in c.frames]}) + "\n")
        result.crash_detail += f"\n(last {len(recent)} cases in {dump})"
    return result


def _wait_for_replies(target: Target, result: Result, window: int) -> None:
    """Keep at most `window` requests unanswered; a service that stops answering has crashed."""
    deadline = time.monotonic() + STALL_S
    while target.backlog(result) > window:
        if time.monotonic() > deadline:
            if window == 0:
                return  # the last replies: some error replies may have been dropped at a full queue
            raise Crash(
                f"{target.backlog(result)} requests unanswered for {STALL_S:.0f} s:\n{tail(target.proc.log_path)}"
            )
        target.pump(result, 0.05)


def _read_counters(
    target: Target, result: Result, rejected_before: dict[str, int], groups_before: dict[str, int]
) -> None:
    """The service's own counters, polled until they reach what the oracle expects (or time out)."""
    want = {k: v for k, v in sorted(result.expected_rejections.items())}
    deadline = time.monotonic() + STALL_S
    while True:
        scraped = scrape(target.metrics_url)
        result.rejections = diff(by_reason(scraped, target.rejected_metric), rejected_before)
        result.groups_rejected = diff(target.group_rejections(scraped), groups_before)
        groups_ok = sum(result.groups_rejected.values()) == result.expected_groups_rejected
        result.rejections_match = result.rejections == want and groups_ok
        if result.rejections_match or time.monotonic() > deadline:
            return
        target.pump(result, 0.2)


# --------------------------------------------------------------------------------------------------
# Service hosts (run as child processes of this script)
# --------------------------------------------------------------------------------------------------


def host_weights(port: int, metrics_port: int, info: Path) -> int:
    """A learner's weight server with the learner's metrics, publishing a small state dict."""
    import threading

    import torch
    from prometheus_client import CollectorRegistry

    from stream_dapo.runtime.metrics import Health, LearnerMetrics, MetricsServer
    from stream_dapo.weights import WeightServer, serialize_weights

    registry = CollectorRegistry()
    metrics = LearnerMetrics(registry)
    health = Health()
    server_http = MetricsServer(registry, health, "127.0.0.1", metrics_port).start()
    torch.manual_seed(0)
    state = {
        "layer.weight": torch.randn(64, 96),
        "layer.bias": torch.randn(64),
        "norm.weight": torch.ones(96),
    }
    payload = serialize_weights(state, WEIGHTS_VERSION)
    server = WeightServer(
        zmq_bind_address("127.0.0.1", port),
        chunk_bytes=WEIGHTS_CHUNK_BYTES,
        rejected_metric=metrics.messages_rejected,
    ).start()
    server.publish(payload)
    health.ready = True
    num_chunks = -(-payload.total_bytes // WEIGHTS_CHUNK_BYTES)
    _write_info(
        info,
        {
            "version": payload.version,
            "checksum": payload.checksum,
            "num_chunks": num_chunks,
            "port": endpoint_port(server.address),
            "metrics_port": server_http.port,
        },
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        health.beat()
    server.stop()
    server_http.stop()
    return 0


class _NoEngine:
    """Stands in for the vLLM engine: nothing in flight, version 0. The fuzzed path (socket, decode,
    `BufferLink.on_message`, metrics) never reaches the engine."""

    num_in_flight = 0
    version = 0
    tokens_generated = 0
    tokens_recomputed = 0

    def start_versions(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class _NoVerifier:
    def close(self) -> None:
        pass


class _NoWeights:
    """A weight source with nothing to offer: the generator keeps the initial model."""

    first_version = 0
    startup = "look"
    latest_seen = -1

    def __call__(self, have: int) -> None:
        return None

    def join(self, engine: Any) -> None:
        pass

    def load(self, engine: Any, update: Any) -> float:
        raise AssertionError("nothing is ever published")

    def close(self) -> None:
        pass


def host_generator(config: Path, info: Path) -> int:
    """`GeneratorService` with its collaborators injected (no vLLM engine, verifier or weights), and
    the loop steps that do not need an engine."""
    import threading

    from stream_dapo.generator.buffer_link import IDLE_POLL_MS
    from stream_dapo.generator.root import build_generator

    cfg = load_config([config], environ={})
    svc = build_generator(
        cfg,
        0,
        engine=_NoEngine(),  # type: ignore[arg-type]
        verifier=_NoVerifier(),  # type: ignore[arg-type]
        prompts=iter(()),
        weights=_NoWeights(),  # type: ignore[arg-type]
    )
    svc.start()  # metrics, buffer hello, heartbeat: the service's own start-up
    pending = make_group()
    svc.link.send(m.Groups(svc.generator_id, [pending]))
    svc.link.unacked.sent(pending, time.monotonic())
    assert svc.metrics_server is not None
    _write_info(info, {"pending": pending.group_id, "metrics_port": svc.metrics_server.port})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():  # GeneratorService.serve without engine steps (no groups to start)
            svc.health.beat()
            svc.link.read(timeout_ms=IDLE_POLL_MS)
            svc.link.ask_for_credits(in_flight=0)  # the stand-in engine never has a group in flight
            svc.link.resend_unacked()
            svc.update_gauges()
    finally:
        svc.close()
    return 0


def _write_info(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def print_table(results: list[Result]) -> None:
    print()
    print(
        f"{'socket':<9} {'messages':>9} {'msg/s':>7} {'crashes':>7} {'oracle':>6} {'after':>5}  rejections by reason"
    )
    for r in results:
        j = r.to_json()
        reasons = ", ".join(f"{k} {v}" for k, v in j["rejections"].items())
        if r.groups_rejected:
            reasons += "; groups: " + ", ".join(f"{k} {v}" for k, v in r.groups_rejected.items())
        print(
            f"{r.socket:<9} {r.messages:>9} {j['messages_per_s']:>7} {r.crashes:>7} "
            f"{'match' if r.rejections_match else 'DIFF':>6} {'ok' if r.after_ok else 'FAIL':>5}  {reasons}"
        )
        print(
            f"{'':<9} valid sent {r.valid_sent}, valid stateful mutants not sent {r.skipped_valid}, "
            f"replies {sum(r.replies.values())}, probes {r.probes}, ZMTP huge-frame connections {r.zmtp_connections}"
        )
        if not r.rejections_match:
            print(
                f"{'':<9} oracle expected {dict(r.expected_rejections)}, groups {r.expected_groups_rejected}"
            )
        if r.crash_detail:
            print(f"{'':<9} CRASH: {r.crash_detail}")
    print()


def run_socket(name: str, n: int, seed: int, workdir: Path) -> Result:
    rng = random.Random(f"{seed}-{name}")
    seeds = seed_messages(np.random.default_rng(seed))
    target: Target
    if name in ("samples", "batches"):
        target = BufferTarget(name, workdir)
    elif name == "weights":
        target = WeightsTarget(workdir)
    else:
        target = CreditsTarget(workdir)
    others = [msg for key, msgs in seeds.items() if key != name for msg in msgs]
    try:
        result = fuzz(target, Mutator(rng, seeds[name], others, target.max_bytes), n, workdir)
    except BaseException:
        target.close()
        raise
    result.exit_code = target.close()
    if result.exit_code != 0 and not result.crashes:
        result.crashes = 1  # it survived the fuzzing but could not drain and persist
        result.crash_detail = f"exit code {result.exit_code} on SIGTERM:\n{tail(target.proc.log_path)}"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=100_000, help="messages per socket")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sockets", default=",".join(SOCKETS), help=f"comma-separated subset of {SOCKETS}")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--workdir", type=Path, help="state, logs and crash cases (default: a temp dir)")
    parser.add_argument("--host", choices=["weights", "generator"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--info", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.host == "weights":
        return host_weights(args.port, args.metrics_port, args.info)
    if args.host == "generator":
        return host_generator(args.config, args.info)

    sockets = [s for s in args.sockets.split(",") if s]
    unknown = set(sockets) - set(SOCKETS)
    if unknown:
        parser.error(f"unknown sockets {sorted(unknown)}; choose from {SOCKETS}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stream-dapo-fuzz-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in sockets:
        print(f"fuzzing {name}: {args.messages} messages ...", flush=True)
        results.append(run_socket(name, args.messages, args.seed, workdir))
    print_table(results)
    report = {
        "messages_per_socket": args.messages,
        "seed": args.seed,
        "workdir": str(workdir),
        "sockets": [r.to_json() for r in results],
        "ok": all(r.crashes == 0 and r.rejections_match and r.after_ok for r in results),
    }
    if args.json:
        save_json(args.json, report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

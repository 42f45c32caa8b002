"""Transport throughput: codec alone, codec over loopback TCP, raw ZeroMQ, and memcpy as the ceiling.

    .venv/bin/python -m bench.perf.transport [--repeats 5] [--messages 40] [--quick] [--json]

Payload: a `groups` message holding one group of 16 samples, with 1k and with 16k response
tokens per sample (12 bytes per token: tokens int32, logprobs float32, versions int32).
Each figure is the median over `--repeats` runs. The loopback senders run in their own processes
(as a generator would): one encodes every message, one sends the same pre-encoded frame over and
over (ZeroMQ alone, no codec); the receiver decodes and validates each codec message. Their rounds
interleave with a numpy copy of the same bytes, so "codec / raw" and "raw / memcpy" are ratios of
figures measured side by side. A raw PUSH/PULL line with 1 MiB and 16 MiB frames gives ZeroMQ's
own loopback ceiling for large frames.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[2]

from bench.report import interleave, paired_ratio, summary  # noqa: E402
from stream_dapo.transport import messages as m  # noqa: E402
from stream_dapo.transport.codec import decode, encode  # noqa: E402
from stream_dapo.transport.messages import Group, Sample, from_map, to_map  # noqa: E402
from stream_dapo.transport.sockets import open_endpoint  # noqa: E402

MAX_BYTES = 256 << 20
SAMPLES_PER_GROUP = 16
TIMEOUT_MS = 60_000

__all__ = [
    "bench_codec",
    "bench_loopback",
    "bench_memcpy",
    "bench_push_pull",
    "make_group",
    "measure_transport",
]


def make_group(response_tokens: int, seed: int = 0) -> Group:
    rng = np.random.default_rng(seed)
    samples = [
        Sample(
            tokens=rng.integers(0, 150_000, response_tokens, dtype=np.int32),
            logprobs=-rng.random(response_tokens, dtype=np.float32) * 5,
            versions=np.full(response_tokens, 7, dtype=np.int32),
            reward=1.0 if i % 2 else -1.0,
            correct=bool(i % 2),
            truncated=False,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(SAMPLES_PER_GROUP)
    ]
    return Group(
        uuid.uuid4().hex,
        "p-0",
        "gen-0",
        "42",
        rng.integers(0, 150_000, 512, dtype=np.int32),
        time.time(),
        samples,
    )


def _rates(nbytes: int, count: int, seconds: list[float]) -> dict[str, Any]:
    """GB/s and messages/s of each repeat (``count`` messages of ``nbytes`` each)."""
    return {
        "gb_per_s": summary([nbytes * count / s / 1e9 for s in seconds]),
        "msgs_per_s": summary([count / s for s in seconds]),
    }


def _seconds(fn: Callable[[], None], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def bench_codec(group: Group, count: int, repeats: int) -> dict[str, Any]:
    """Encode, decode (validated, typed), both, and from_map (the typed groups message checked and
    built from plain maps, as the buffer's journal restores groups) of ``count`` messages: GB/s and
    msg/s each."""
    body = m.Groups("gen-0", [group])
    data = encode(body)
    wire = to_map(body)

    def enc() -> None:
        for _ in range(count):
            encode(body)

    def dec() -> None:
        for _ in range(count):
            decode(data, max_bytes=MAX_BYTES)

    def both() -> None:
        for _ in range(count):
            decode(encode(body), max_bytes=MAX_BYTES)

    def from_wire() -> None:
        for _ in range(count):
            from_map(m.Groups, wire)

    ops = {"encode": enc, "decode": dec, "encode+decode": both, "from_wire": from_wire}
    return {name: _rates(len(data), count, _seconds(fn, repeats)) for name, fn in ops.items()}


def _sender(address: str, response_tokens: int, raw: bool) -> None:
    """Say hello, then send as many groups messages as each credit grants, until granted 0.

    raw=True sends one pre-encoded message over and over: ZeroMQ alone, no codec.
    """
    group = make_group(response_tokens)
    encoded = encode(m.Groups("gen-0", [group]))
    ctx = zmq.Context()
    ep = open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=MAX_BYTES, peer="receiver", hwm=64)
    ep.send(m.Hello("gen-0", 0))
    while (got := ep.recv(TIMEOUT_MS)) is not None and got[1].body.granted > 0:
        for _ in range(got[1].body.granted):
            if raw:
                ep.socket.send(encoded, copy=False)
            else:
                ep.send(m.Groups("gen-0", [group]))
    ep.close()
    ctx.term()


def _memcpy_round(nbytes: int) -> Callable[[], float]:
    """A callable that copies ``nbytes`` with numpy and returns the seconds it took."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages once

    def run() -> float:
        start = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - start

    return run


def bench_loopback(response_tokens: int, count: int, repeats: int) -> dict[str, Any]:
    """Codec and raw senders (one process each) over TCP loopback, interleaved with memcpy.

    Each round moves ``count`` messages; memcpy copies the same number of bytes.
    """
    ctx = zmq.Context()
    srv = open_endpoint(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=MAX_BYTES, peer="sender", hwm=64)
    spawn = mp.get_context("spawn")
    procs: dict[str, Any] = {}
    peers: dict[str, bytes] = {}
    nbytes = len(encode(m.Groups("gen-0", [make_group(response_tokens)])))
    try:
        for mode in ("codec", "raw"):  # one at a time, so each hello names its mode
            procs[mode] = spawn.Process(target=_sender, args=(srv.address, response_tokens, mode == "raw"))
            procs[mode].start()
            hello = srv.recv(TIMEOUT_MS)
            if hello is None or hello[0] is None:
                raise RuntimeError(f"the {mode} sender process did not connect within 60 s")
            peers[mode] = hello[0]

        def loop_round(mode: str) -> float:
            start = time.perf_counter()
            srv.send(m.Credit(count, 0), to=peers[mode])
            for _ in range(count):
                if mode == "raw":
                    if not srv.socket.poll(TIMEOUT_MS):
                        raise RuntimeError("the raw sender stopped sending")
                    srv.socket.recv_multipart(copy=False)
                elif srv.recv(TIMEOUT_MS) is None:
                    raise RuntimeError("the codec sender stopped sending")
            return time.perf_counter() - start

        memcpy = _memcpy_round(nbytes * count)
        seconds = interleave(
            {"codec": lambda: loop_round("codec"), "raw": lambda: loop_round("raw"), "memcpy": memcpy},
            repeats,
            warmup=1,  # connection buffers, allocator
        )
        for mode in peers:
            srv.send(m.Credit(0, 0), to=peers[mode])
    finally:
        for proc in procs.values():
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        srv.close()
        ctx.term()
    gbps = {mode: [nbytes * count / s / 1e9 for s in values] for mode, values in seconds.items()}
    return {
        "message_bytes": nbytes,
        "messages_per_round": count,
        "codec": _rates(nbytes, count, seconds["codec"]),
        "raw": _rates(nbytes, count, seconds["raw"]),
        "memcpy": _rates(nbytes, count, seconds["memcpy"]),
        "codec_vs_raw": paired_ratio(gbps["codec"], gbps["raw"]),
        "raw_vs_memcpy": paired_ratio(gbps["raw"], gbps["memcpy"]),
        "codec_vs_memcpy": paired_ratio(gbps["codec"], gbps["memcpy"]),
    }


def _push_sender(data_address: str, control_address: str, frame_bytes: int) -> None:
    """Send as many ``frame_bytes`` frames as each control message asks for, until asked for 0."""
    ctx = zmq.Context()
    control = ctx.socket(zmq.PULL)
    control.connect(control_address)
    data = ctx.socket(zmq.PUSH)
    data.connect(data_address)
    frame = zmq.Frame(bytes(frame_bytes))
    while control.poll(TIMEOUT_MS) and (count := int(control.recv())) > 0:
        for _ in range(count):
            data.send(frame, copy=False)
    control.close(linger=0)
    data.close(linger=1000)
    ctx.term()


def bench_push_pull(frame_bytes: int, count: int, repeats: int) -> dict[str, Any]:
    """Raw ZeroMQ PUSH/PULL of ``count`` bytes frames per round over TCP loopback (sender in its
    own process), interleaved with a numpy copy of the same bytes."""
    ctx = zmq.Context()
    data = ctx.socket(zmq.PULL)
    data.bind("tcp://127.0.0.1:*")
    control = ctx.socket(zmq.PUSH)
    control.bind("tcp://127.0.0.1:*")
    addresses = (data.getsockopt_string(zmq.LAST_ENDPOINT), control.getsockopt_string(zmq.LAST_ENDPOINT))
    proc = mp.get_context("spawn").Process(target=_push_sender, args=(*addresses, frame_bytes))
    proc.start()
    try:

        def push_round() -> float:
            start = time.perf_counter()
            control.send(str(count).encode())
            for _ in range(count):
                if not data.poll(TIMEOUT_MS):
                    raise RuntimeError("the PUSH sender stopped sending")
                data.recv(copy=False)
            return time.perf_counter() - start

        seconds = interleave(
            {"zmq": push_round, "memcpy": _memcpy_round(frame_bytes * count)}, repeats, warmup=1
        )
        control.send(b"0")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        data.close(linger=0)
        control.close(linger=0)
        ctx.term()
    gbps = {k: [frame_bytes * count / s / 1e9 for s in v] for k, v in seconds.items()}
    return {
        "frame_bytes": frame_bytes,
        "frames_per_round": count,
        "zmq": _rates(frame_bytes, count, seconds["zmq"]),
        "memcpy": _rates(frame_bytes, count, seconds["memcpy"]),
        "zmq_vs_memcpy": paired_ratio(gbps["zmq"], gbps["memcpy"]),
    }


def bench_memcpy(nbytes: int, repeats: int) -> dict[str, Any]:
    """numpy copy of ``nbytes``: the machine's memory-bandwidth ceiling (GB/s)."""
    run = _memcpy_round(nbytes)
    return {"bytes": nbytes, "gb_per_s": summary([nbytes / run() / 1e9 for _ in range(repeats)])}


def measure_transport(
    quick: bool = False, repeats: int | None = None, messages: int | None = None
) -> dict[str, Any]:
    """Every figure of this script for 1k- and 16k-token groups, plus PUSH/PULL and memcpy."""
    repeats = repeats or (2 if quick else 5)
    messages = messages or (8 if quick else 40)
    groups = []
    for tokens, count in ((1024, messages), (16 * 1024, max(1, messages // 4))):
        group = make_group(tokens)
        groups.append(
            {
                "response_tokens": tokens,
                "samples": SAMPLES_PER_GROUP,
                "message_bytes": len(encode(m.Groups("gen-0", [group]))),
                "count": count,
                "codec": bench_codec(group, count, repeats),
                "loopback": bench_loopback(tokens, count, repeats),
            }
        )
    # 256 MB per round (quick: 8 and 16 MB): 1 MiB frames and 16 MiB frames.
    frames = ((1 << 20, 8), (16 << 20, 1)) if quick else ((1 << 20, 256), (16 << 20, 16))
    push_pull = [bench_push_pull(size, count, repeats) for size, count in frames]
    return {
        "repeats": repeats,
        "groups": groups,
        "push_pull": push_pull,
        "memcpy": bench_memcpy((32 if quick else 256) << 20, repeats),
    }


def _line(label: str, rates: dict[str, Any]) -> str:
    return f"  {label:<36} {rates['gb_per_s']['median']:8.2f} GB/s" + (
        f"  {rates['msgs_per_s']['median']:10.0f} msg/s" if "msgs_per_s" in rates else ""
    )


def print_report(result: dict[str, Any]) -> None:
    for g in result["groups"]:
        print(
            f"groups message: 1 group x {g['samples']} samples x {g['response_tokens']} tokens = "
            f"{g['message_bytes'] / 1e6:.2f} MB ({g['count']} messages per repeat)"
        )
        for name, label in (
            ("encode", "encode (validated)"),
            ("decode", "decode (validated)"),
            ("encode+decode", "encode+decode"),
            ("from_wire", "from_map (validated)"),
        ):
            print(_line(label, g["codec"][name]))
        lb = g["loopback"]
        print(_line("tcp loopback, encode+send+recv+decode", lb["codec"]))
        print(_line("tcp loopback, raw bytes (no codec)", lb["raw"]))
        print(_line("numpy copy of the same bytes", lb["memcpy"]))
        print(
            f"  ratios: codec/raw {lb['codec_vs_raw']:.2f}, raw/memcpy {lb['raw_vs_memcpy']:.2f}, "
            f"codec/memcpy {lb['codec_vs_memcpy']:.2f}"
        )
    print("raw ZeroMQ PUSH/PULL over tcp loopback")
    for p in result["push_pull"]:
        print(
            _line(f"{p['frame_bytes'] >> 20} MiB frames", p["zmq"])
            + f"  ({p['zmq_vs_memcpy']:.2f} of memcpy)"
        )
    print("reference")
    mc = result["memcpy"]
    label = f"numpy copy of {mc['bytes'] >> 20} MB (ceiling)"
    print(f"  {label:<36} {mc['gb_per_s']['median']:8.2f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per figure; the median is shown (default 5)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages per repeat (16k-token case: a quarter; default 40)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = measure_transport(args.quick, args.repeats, args.messages)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)


if __name__ == "__main__":
    main()

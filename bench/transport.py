"""Transport throughput: codec alone, codec over loopback TCP, and memcpy as the ceiling.

    .venv/bin/python bench/transport.py [--repeats 5] [--messages 40]

Payload: a `groups` message holding one group of 16 samples, with 1k and with 16k response
tokens per sample (12 bytes per token: tokens int32, logprobs float32, versions int32).
Each figure is the median over `--repeats` runs. The loopback sender runs in its own process
(as a generator would), encoding every message; the receiver decodes and validates each one.
A raw-bytes loopback line (same frames, no codec) separates ZeroMQ's cost from the codec's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np
import zmq

from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import decode, encode
from stream_dapo.transport.messages import Group, Sample
from stream_dapo.transport.sockets import open_endpoint

MAX_BYTES = 256 << 20
SAMPLES_PER_GROUP = 16


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


def median_seconds(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(label: str, nbytes: int, count: int, seconds: float) -> None:
    print(f"  {label:<34} {nbytes * count / seconds / 1e9:8.2f} GB/s  {count / seconds:10.0f} msg/s")


def bench_codec(group: Group, count: int, repeats: int) -> None:
    msg_type, body = m.groups("gen-0", [group])
    data = encode(msg_type, body)

    def enc() -> None:
        for _ in range(count):
            encode(msg_type, body)

    def dec() -> None:
        for _ in range(count):
            decode(data, max_bytes=MAX_BYTES)

    def both() -> None:
        for _ in range(count):
            decode(encode(msg_type, body), max_bytes=MAX_BYTES)

    def from_wire() -> None:
        for _ in range(count):
            m.groups_from_body(body)

    report("encode (validated)", len(data), count, median_seconds(enc, repeats))
    report("decode (validated)", len(data), count, median_seconds(dec, repeats))
    report("encode+decode", len(data), count, median_seconds(both, repeats))
    report("Group.from_wire (validated)", len(data), count, median_seconds(from_wire, repeats))


def _sender(address: str, response_tokens: int, raw: bool) -> None:
    """Say hello, then send as many groups messages as each credit grants, until granted 0.

    raw=True sends one pre-encoded message over and over: ZeroMQ alone, no codec.
    """
    group = make_group(response_tokens)
    encoded = encode(*m.groups("gen-0", [group]))
    ctx = zmq.Context()
    ep = open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=MAX_BYTES, peer="receiver", hwm=64)
    ep.send(*m.hello("gen-0", 0))
    while (got := ep.recv(60_000)) is not None and got[1].body["granted"] > 0:
        for _ in range(got[1].body["granted"]):
            if raw:
                ep.socket.send(encoded, copy=False)
            else:
                ep.send(*m.groups("gen-0", [group]))
    ep.close()
    ctx.term()


def bench_loopback(response_tokens: int, count: int, repeats: int, *, raw: bool) -> None:
    ctx = zmq.Context()
    srv = open_endpoint(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=MAX_BYTES, peer="sender", hwm=64)
    proc = mp.get_context("spawn").Process(target=_sender, args=(srv.address, response_tokens, raw))
    proc.start()
    try:
        hello = srv.recv(60_000)
        if hello is None:
            raise RuntimeError("the sender process did not connect within 60 s")
        peer = hello[0]
        nbytes = len(encode(*m.groups("gen-0", [make_group(response_tokens)])))

        def one_round() -> None:
            srv.send(*m.credit(count, 0), to=peer)
            for _ in range(count):
                if raw:
                    if not srv.socket.poll(60_000):
                        raise RuntimeError("the sender stopped sending")
                    srv.socket.recv_multipart(copy=False)
                elif srv.recv(60_000) is None:
                    raise RuntimeError("the sender stopped sending")

        one_round()  # warm-up: connection buffers, allocator
        seconds = median_seconds(one_round, repeats)
        srv.send(*m.credit(0, 0), to=peer)
    finally:
        proc.join(30)
        srv.close()
        ctx.term()
    label = "tcp loopback, raw bytes (no codec)" if raw else "tcp loopback, encode+send+recv+decode"
    report(label, nbytes, count, seconds)


def bench_memcpy(repeats: int) -> None:
    src = np.ones(256 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    seconds = median_seconds(lambda: np.copyto(dst, src), repeats)
    print(f"  {'numpy copy of 256 MB (ceiling)':<34} {src.nbytes / seconds / 1e9:8.2f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repeats per figure; the median is shown"
    )
    parser.add_argument(
        "--messages", type=int, default=40, help="messages per repeat (16k-token case: a quarter)"
    )
    args = parser.parse_args()
    for tokens, count in ((1024, args.messages), (16 * 1024, max(1, args.messages // 4))):
        size = len(encode(*m.groups("gen-0", [make_group(tokens)])))
        print(
            f"groups message: 1 group x {SAMPLES_PER_GROUP} samples x {tokens} tokens = {size / 1e6:.2f} MB"
        )
        bench_codec(make_group(tokens), count, args.repeats)
        bench_loopback(tokens, count, args.repeats, raw=False)
        bench_loopback(tokens, count, args.repeats, raw=True)
    print("reference")
    bench_memcpy(args.repeats)


if __name__ == "__main__":
    main()

"""Weight fan-out (issue 38, item 3): N receivers over loopback, with and without relays passing
each version on (weights.peer_fanout), against today's path (every receiver fetches from the learner).

    .venv/bin/python -m bench.perf.weight_fanout [--quick] [--receivers 1,2,4,8] [--mb 256]
        [--versions 3] [--fanout 2] [--json PATH]

The learner's `WeightServer` runs in its own process and publishes versions of a synthetic fp32
state (`bench.perf.weight_sync.synthetic_base`: tensors of 4 MiB, each version moving 1% of the
elements). Each receiver is its own process: a real `ZmqWeightSource` (with its `ChunkRelay` when
fan-out is on) whose engine is a torch model of the same shapes that loads every version from the
shared-memory image (`load_state_dict` from the safetensors views). For each N and each mode the
same receivers take ``--versions`` versions in turn: version 1 is the full image (every receiver
joins late), the next ones are deltas against the version held. Per version: seconds from the
publish command until every receiver has loaded it, and the learner's egress (chunk bytes its
weight server sent), also as a multiple of one copy of the version.

Not shown: a real network (loopback has no bandwidth limit, so fan-out's win there is the
learner's egress, not the wall time; on a real link the learner's NIC is the bottleneck it
removes), relays that fail (the unit tests cover the path), GPU engines.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import zmq

from bench.perf.weight_sync import CHUNK, WINDOW, synthetic_base, version_of
from bench.report import bench_parser, save_json

__all__ = ["measure_fanout"]

TIMEOUT_S = 120.0
PEER_TIMEOUT_S = 10.0


def _recv(sock: zmq.Socket[Any]) -> dict[str, Any]:
    got: dict[str, Any] = sock.recv_json()  # type: ignore[assignment]
    return got


def _learner(control_address: str, total_mb: int, fanout: int) -> None:
    """The learner's end: a `WeightServer` that publishes version k when told and reports its egress."""
    from stream_dapo.weights import WeightServer, serialize_weights

    base = synthetic_base(total_mb)
    ctx = zmq.Context()
    control = ctx.socket(zmq.PAIR)
    control.connect(control_address)
    prepared = None
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK, peer_fanout=fanout) as server:
        control.send_json({"address": server.address})
        while (ask := _recv(control))["op"] != "stop":
            if ask["op"] == "prepare":
                prepared = serialize_weights(version_of(base, ask["version"]), ask["version"])
                control.send_json({"bytes": prepared.total_bytes})
            elif ask["op"] == "publish":
                assert prepared is not None
                server.publish(prepared)
                control.send_json({"sent": server.stats["bytes"]})
            else:
                control.send_json({"sent": server.stats["bytes"]})
        control.send_json({})
    control.close(linger=0)
    ctx.term()


class TorchEngine:
    """A `WeightTarget` stand-in for a vLLM engine: a torch model with the state's shapes."""

    def __init__(self, total_mb: int) -> None:
        import torch

        shapes = {name: t.shape for name, t in synthetic_base(total_mb).items()}
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(
            torch.nn.Linear(s[1], s[0], bias=False) for _, s in sorted(shapes.items(), key=_layer)
        )

    def update_weights_from_image(self, image: Any, version: int) -> float:
        import torch

        from stream_dapo.weights.safetensors_view import tensors_from_buffer

        start = time.perf_counter()
        buf = torch.frombuffer(image.view, dtype=torch.uint8)
        self.model.load_state_dict(dict(tensors_from_buffer(buf)), strict=True)
        return time.perf_counter() - start

    # The zmq source loads images only; the other ways in are not what this bench measures.
    def update_weights(self, path: Any, version: int) -> float:
        raise NotImplementedError("the fan-out bench loads shared-memory images only")

    def join_nccl(self, host: str, port: int, world_size: int, rank_base: int) -> list[int]:
        raise NotImplementedError("the fan-out bench loads shared-memory images only")

    def receive_weights_nccl(self, timeout_s: float) -> float:
        raise NotImplementedError("the fan-out bench loads shared-memory images only")


def _layer(item: tuple[str, Any]) -> int:
    return int(item[0].split(".")[1])


def _receiver(control_address: str, learner_address: str, total_mb: int, fanout: int) -> None:
    """One generator's weight path: fetch (from relays first with fan-out), load into the model."""
    from stream_dapo.weights.fanout import ChunkRelay
    from stream_dapo.weights.zmq_chunks import ZmqWeightSource

    engine = TorchEngine(total_mb)
    relay = ChunkRelay("127.0.0.1", hold_s=PEER_TIMEOUT_S) if fanout else None
    source = ZmqWeightSource(
        learner_address, TIMEOUT_S, None, window=WINDOW, relay=relay, peer_timeout_s=PEER_TIMEOUT_S
    )
    ctx = zmq.Context()
    control = ctx.socket(zmq.PAIR)
    control.connect(control_address)
    control.send_json({"ready": True})
    have = 0
    while _recv(control)["op"] == "fetch":
        update = None
        while update is None:
            update = source(have)
        source.load(engine, update)
        have = update.version
        control.send_json(
            {
                "version": have,
                "loaded_at": time.time(),
                "wire": update.wire_bytes,
                "relayed": relay.stats["bytes"] if relay is not None else 0,
            }
        )
    source.close()
    control.close(linger=0)
    ctx.term()


def _pair(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], str]:
    sock = ctx.socket(zmq.PAIR)
    sock.rcvtimeo = int(TIMEOUT_S * 1000 * 5)
    sock.bind("tcp://127.0.0.1:*")
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def run_case(receivers: int, total_mb: int, versions: int, fanout: int) -> list[dict[str, Any]]:
    """One N and one mode: per version, seconds until every receiver loaded it and learner egress."""
    spawn = mp.get_context("spawn")
    ctx: zmq.Context[Any] = zmq.Context()
    learner, address = _pair(ctx)
    procs = [spawn.Process(target=_learner, args=(address, total_mb, fanout))]
    procs[0].start()
    learner_address = _recv(learner)["address"]
    controls = []
    for _ in range(receivers):
        control, address = _pair(ctx)
        procs.append(spawn.Process(target=_receiver, args=(address, learner_address, total_mb, fanout)))
        procs[-1].start()
        controls.append(control)
    for control in controls:
        _recv(control)  # ready: model built, imports done
    rows = [_one_version(learner, controls, v) for v in range(1, versions + 1)]
    for control in [*controls, learner]:
        control.send_json({"op": "stop"})
    _recv(learner)
    for proc in procs:
        proc.join(60)
    for control in [*controls, learner]:
        control.close(linger=0)
    ctx.term()
    return rows


def _one_version(learner: zmq.Socket[Any], controls: list[zmq.Socket[Any]], version: int) -> dict[str, Any]:
    learner.send_json({"op": "prepare", "version": version})
    nbytes = _recv(learner)["bytes"]
    learner.send_json({"op": "stats"})
    sent_before = _recv(learner)["sent"]
    start = time.time()
    learner.send_json({"op": "publish"})
    _recv(learner)
    for control in controls:
        control.send_json({"op": "fetch"})
    done = [_recv(control) for control in controls]
    learner.send_json({"op": "stats"})
    egress = _recv(learner)["sent"] - sent_before
    assert all(d["version"] == version for d in done), done
    return {
        "version": version,
        "bytes": nbytes,
        "all_loaded_s": max(d["loaded_at"] for d in done) - start,
        "learner_egress_bytes": egress,
        "learner_egress_copies": egress / nbytes,
        "received_bytes": sum(d["wire"] for d in done),
    }


def measure_fanout(receivers: tuple[int, ...], total_mb: int, versions: int, fanout: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "chunk_bytes": CHUNK,
        "window": WINDOW,
        "mb": total_mb,
        "fanout": fanout,
        "cases": [],
    }
    for n in receivers:
        for mode, k in (("learner", 0), ("fanout", fanout)):  # today's path, then the relay tree
            rows = run_case(n, total_mb, versions, k)
            out["cases"].append({"receivers": n, "mode": mode, "peer_fanout": k, "versions": rows})
            for row in rows:
                print(
                    f"N={n} {mode:8s} v{row['version']}: all loaded in {row['all_loaded_s']:.3f} s, learner sent "
                    f"{row['learner_egress_bytes'] / 1e6:.1f} MB ({row['learner_egress_copies']:.2f} copies)",
                    flush=True,
                )
    out["table"] = flat_rows(out["cases"])
    return out


def flat_rows(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (receivers, mode, version): what the results page shows as a table."""
    return [
        {
            "receivers": case["receivers"],
            "mode": case["mode"],
            "version": row["version"],
            "learner_egress_copies": round(row["learner_egress_copies"], 3),
            "learner_egress_MB": round(row["learner_egress_bytes"] / 1e6, 1),
            "received_MB": round(row["received_bytes"] / 1e6, 1),
            "all_loaded_s": round(row["all_loaded_s"], 2),
        }
        for case in cases
        for row in case["versions"]
    ]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--receivers", default="1,2,4,8")
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    receivers = (1, 2) if args.quick else tuple(int(n) for n in args.receivers.split(","))
    total_mb = 20 if args.quick else args.mb
    result = measure_fanout(receivers, total_mb, 2 if args.quick else args.versions, args.fanout)
    save_json(args.json, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

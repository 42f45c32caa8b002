"""Weight sync over ZeroMQ (issue 38): today's file path vs streaming into memory vs deltas, against
raw ZeroMQ frames measured in the same run; end to end into vLLM; changed bytes on real runs.

    .venv/bin/python -m bench.perf.weight_sync [--quick] [--only transfer,vllm,changed] [--json PATH]

Three parts, each under the project's CPU lock when run from bench/results.py:

- transfer: the learner's `WeightServer` runs in its own process (as in a run) and publishes a new
  version of a synthetic fp32 state (tensors of 4 MiB; each version moves 1% of the elements of a
  fixed base by ~1e-3 relative, so two versions differ in ~2% of the elements). The receiver, this
  process, takes it by each path; repeats interleave, order rotated:
  `file` (today's: `fetch_weights_zmq`, one chunk request at a time, temp file + rename, then the file
  read back, which is what the engine did next), `stream` (`fetch_weights_stream`, a window of
  chunk requests, per-chunk digest (BLAKE3), assembled in shared memory, full image), `delta` (the same with
  the previous version held as the base), and `raw` (ZeroMQ PUSH/PULL of the same number of
  chunk-sized frames from another process: the wire's ceiling). Seconds run from the publish
  command (which includes the server's per-chunk hashing) to the bytes checked in memory. As in a
  generator, a shared-memory image the receiver is done with becomes the spare that the next
  transfer of the same size fills (`WeightImage.recycle`): the rounds measure the steady state, not
  a first transfer's page faults on fresh shared memory.
- vllm: the same with a real vLLM engine (CPU build, its worker in its own process) loading each
  version of a random Qwen2 model (~130 MB fp32): `file` loads from the file, `stream` and `delta`
  from shared memory (`update_weights_from_image`). Seconds from the publish command to the engine
  sampling from the new version.
- changed: the fraction of bytes that differ between consecutive versions of real runs, as fp32
  and cast to bf16, and the bytes a delta transfer actually sent (real `WeightServer` +
  `fetch_weights_stream` with the previous version as base): the SmolLM2-135M GSM-Symbolic run's
  versions 5, 6 and 7 (if runs/real-model is present), and a `stream-dapo run` of the tiny recipe
  recorded live by a receiver that polls the learner's weight server. At --quick sizes (the smoke
  test), three versions of the transfer part's synthetic state instead: the same code path, no run.

Not shown: more than one receiver (the learner's egress grows with N generators without fan-out:
bench/perf/weight_fanout.py measures it with and without relays), a real network (loopback has no bandwidth limit; deltas pay more on
a real link), GPU engines (NCCL is unchanged).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

import torch  # noqa: E402
import zmq  # noqa: E402

from bench.report import bench_parser, interleave, paired_ratio, save_json, summary  # noqa: E402

__all__ = ["measure_changed_bytes", "measure_transfer", "measure_vllm", "measure_weight_sync"]

CHUNK = 4 * 1024 * 1024
WINDOW = 4
TIMEOUT_MS = 60_000
PATHS = ("raw", "file", "stream", "delta")


# --------------------------------------------------------------------------------------------------
# The learner side, in its own process
# --------------------------------------------------------------------------------------------------


def synthetic_base(total_mb: int) -> dict[str, torch.Tensor]:
    count = max(1, round(total_mb * 1e6 / (4 << 20)))
    gen = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(count)}


def version_of(
    base: dict[str, torch.Tensor], version: int, fraction: float = 0.01
) -> dict[str, torch.Tensor]:
    """``base`` with ``fraction`` of each float tensor's elements moved by ~1e-3 relative (seeded by
    ``version``): an optimizer step's worth of change, roughly."""
    gen = torch.Generator().manual_seed(1000 + version)
    out = {}
    for name, t in base.items():
        if not t.is_floating_point():
            out[name] = t
            continue
        mask = torch.rand(t.shape, generator=gen) < fraction
        out[name] = torch.where(mask, t * (1 + 1e-3 * torch.randn(t.shape, generator=gen)), t)
    return out


def _recv(sock: zmq.Socket[Any]) -> dict[str, Any]:
    got: dict[str, Any] = sock.recv_json()  # type: ignore[assignment]
    return got


def _publisher(control_address: str, spec: dict[str, Any]) -> None:
    """The learner's end: a `WeightServer` that publishes version k of the state when told."""
    from safetensors.torch import load_file

    from stream_dapo.weights import WeightServer, serialize_weights

    base = load_file(spec["model_file"]) if spec.get("model_file") else synthetic_base(spec["total_mb"])
    ctx = zmq.Context()
    control = ctx.socket(zmq.PAIR)
    control.connect(control_address)
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as server:
        prepared = None
        control.send_json({"address": server.address})
        while True:
            ask = _recv(control)
            if ask["op"] == "prepare":
                prepared = serialize_weights(version_of(base, ask["version"]), ask["version"])
                control.send_json({"bytes": prepared.total_bytes})
            elif ask["op"] == "publish":
                assert prepared is not None
                start = time.perf_counter()
                server.publish(prepared)
                control.send_json({"publish_s": time.perf_counter() - start, "sent": server.stats["bytes"]})
            else:
                control.send_json({})
                break
    control.close(linger=0)
    ctx.term()


class Learner:
    """Drives `_publisher` in a spawned process; `publish(v)` returns once version v is servable."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.ctx = zmq.Context()
        self.control = self.ctx.socket(zmq.PAIR)
        self.control.bind("tcp://127.0.0.1:*")
        self.control.rcvtimeo = 600_000
        self.proc = mp.get_context("spawn").Process(
            target=_publisher, args=(self.control.getsockopt_string(zmq.LAST_ENDPOINT), spec)
        )
        self.proc.start()
        self.address = _recv(self.control)["address"]
        self.version = 0
        self.sent = 0
        self.publish_s: list[float] = []

    def prepare(self) -> int:
        self.version += 1
        self.control.send_json({"op": "prepare", "version": self.version})
        return int(_recv(self.control)["bytes"])

    def publish(self) -> int:
        self.control.send_json({"op": "publish"})
        reply = _recv(self.control)
        self.publish_s.append(reply["publish_s"])
        return self.version

    def close(self) -> None:
        self.control.send_json({"op": "stop"})
        self.control.recv_json()
        self.proc.join(60)
        self.control.close(linger=0)
        self.ctx.term()


# --------------------------------------------------------------------------------------------------
# The generator side
# --------------------------------------------------------------------------------------------------


class Receiver:
    """The paths, each `round()` publishes a fresh version and takes it; returns seconds."""

    def __init__(
        self, learner: Learner, tmp: Path, load: Callable[[str, Any, int], None] | None = None
    ) -> None:
        from stream_dapo.weights.zmq_chunks import connect_weight_server

        self.learner = learner
        self.tmp = tmp
        self.load = load  # (kind, file path or image, version) -> None: into vLLM
        self.ep = connect_weight_server(learner.address)
        self.have = 0
        self.held: Any = None
        self.wire: dict[str, list[int]] = {p: [] for p in PATHS}
        self.nbytes = 0

    def _stream(self, base: Any) -> Any:
        from stream_dapo.weights.zmq_chunks import fetch_weights_stream

        got = fetch_weights_stream(self.ep, self.have, TIMEOUT_MS / 1000, base=base, window=WINDOW, retries=0)
        assert got is not None and got.data is not None, "the learner published nothing new"
        return got

    def _held(self, got: Any) -> Any:
        from stream_dapo.weights.delta import HeldWeights

        return HeldWeights(got.version, got.data.view, got.digests, got.chunk_bytes, owner=got.data)

    def file_round(self) -> float:
        from stream_dapo.weights import fetch_weights_zmq

        self.nbytes = self.learner.prepare()
        start = time.perf_counter()
        version = self.learner.publish()
        got, path = fetch_weights_zmq(self.ep, self.have, TIMEOUT_MS / 1000, dest_dir=self.tmp, retries=0)
        assert got == version and path is not None
        if self.load is not None:
            self.load("file", path, version)
        else:
            path.read_bytes()  # what the engine did next: read the file back
        seconds = time.perf_counter() - start
        self.have = version
        self.wire["file"].append(self.nbytes)
        return seconds

    def stream_round(self) -> float:
        self.nbytes = self.learner.prepare()
        start = time.perf_counter()
        version = self.learner.publish()
        got = self._stream(None)
        if self.load is not None:
            self.load("image", got.data, version)
        seconds = time.perf_counter() - start
        self.have = version
        self.wire["stream"].append(got.wire_bytes)
        got.data.recycle()  # its pages become the spare image, as a generator's do after loading
        return seconds

    def delta_round(self) -> float:
        # Hold the current version first (untimed), as a generator that loaded it would.
        if self.held is None or self.held.version != self.have:
            self.have = -1
            if self.held is not None:
                self.held.owner.recycle()
            self.held = self._held(self._stream(None))
            self.have = self.held.version
            if self.load is not None:
                self.load("image", self.held.owner, self.have)
        self.nbytes = self.learner.prepare()
        start = time.perf_counter()
        version = self.learner.publish()
        got = self._stream(self.held)
        if self.load is not None:
            self.load("image", got.data, version)
        seconds = time.perf_counter() - start
        self.have = version
        old, self.held = self.held, self._held(got)
        old.owner.recycle()  # the base it replaced becomes the spare image, as in a generator
        self.wire["delta"].append(got.wire_bytes)
        return seconds

    def close(self) -> None:
        self.ep.close()


class RawFrames:
    """ZeroMQ PUSH/PULL of ``count`` chunk-sized frames from another process (bench/perf/transport.py's
    sender): the bytes of one version at the wire's rate, no protocol."""

    def __init__(self) -> None:
        from bench.perf.transport import _push_sender

        self.ctx = zmq.Context()
        self.data = self.ctx.socket(zmq.PULL)
        self.data.bind("tcp://127.0.0.1:*")
        self.control = self.ctx.socket(zmq.PUSH)
        self.control.bind("tcp://127.0.0.1:*")
        addresses = (
            self.data.getsockopt_string(zmq.LAST_ENDPOINT),
            self.control.getsockopt_string(zmq.LAST_ENDPOINT),
        )
        self.proc = mp.get_context("spawn").Process(
            target=_push_sender, args=(*addresses, CHUNK), daemon=True
        )
        self.proc.start()

    def round(self, nbytes: int) -> float:
        count = -(-nbytes // CHUNK)
        start = time.perf_counter()
        self.control.send(str(count).encode())
        for _ in range(count):
            if not self.data.poll(TIMEOUT_MS):
                raise RuntimeError("the PUSH sender stopped sending")
            self.data.recv(copy=False)
        return time.perf_counter() - start

    def close(self) -> None:
        self.control.send(b"0")
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
        self.data.close(linger=0)
        self.control.close(linger=0)
        self.ctx.term()


def _compare(
    spec: dict[str, Any], repeats: int, load: Callable[[str, Any, int], None] | None
) -> dict[str, Any]:
    learner = Learner(spec)
    raw = RawFrames()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
            rx = Receiver(learner, Path(tmp), load)
            try:
                rx.nbytes = learner.prepare()
                learner.publish()
                rounds = {
                    "raw": lambda: raw.round(rx.nbytes),
                    "file": rx.file_round,
                    "stream": rx.stream_round,
                    "delta": rx.delta_round,
                }
                seconds = interleave(rounds, repeats, warmup=1)
            finally:
                rx.close()
    finally:
        raw.close()
        learner.close()
    nbytes = rx.nbytes
    gbps = {p: [nbytes / s / 1e9 for s in seconds[p]] for p in PATHS}
    wire = {p: rx.wire[p][-len(seconds[p]) :] for p in PATHS if rx.wire[p]}
    return {
        "payload_bytes": nbytes,
        "seconds": {p: summary(seconds[p]) for p in PATHS},
        "gb_per_s": {p: summary(gbps[p]) for p in PATHS},
        "wire_bytes": {p: summary([float(w) for w in v]) for p, v in wire.items()},
        "publish_seconds": summary(learner.publish_s),
        "vs_raw": {p: paired_ratio(gbps[p], gbps["raw"]) for p in PATHS if p != "raw"},
        "stream_vs_file": paired_ratio(gbps["stream"], gbps["file"]),
        "delta_vs_stream": paired_ratio(gbps["delta"], gbps["stream"]),
    }


def measure_transfer(quick: bool = False) -> dict[str, Any]:
    repeats = 2 if quick else 5
    sizes = (16,) if quick else (100, 400)
    return {f"{mb}MB": _compare({"total_mb": mb}, repeats, None) for mb in sizes}


# --------------------------------------------------------------------------------------------------
# Into vLLM
# --------------------------------------------------------------------------------------------------


def _bench_model(out: Path, quick: bool = False) -> Path:
    """A random Qwen2 model of ~130 MB fp32 (tied embeddings), saved with the tiny tokenizer; ~13 MB
    at --quick sizes (the smoke test: every swap of the 130 MB model is seconds on 2 cores)."""
    from stream_dapo.model.tiny import TinyModelSpec, build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    if quick:
        spec = TinyModelSpec(
            hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768
        )
    else:
        spec = TinyModelSpec(
            hidden_size=1024, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=2560
        )
    model = build_tiny_model(tokenizer, spec, 0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def measure_vllm(quick: bool = False) -> dict[str, Any]:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from stream_dapo.config import Config
    from stream_dapo.generator.engine import RolloutEngine

    repeats = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="bench-weights-vllm-") as tmp:
        model_dir = _bench_model(Path(tmp) / "model", quick)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
        model_file = Path(tmp) / "state.safetensors"
        save_file(state, str(model_file))
        params = sum(v.numel() for v in state.values())
        del hf, state
        cfg = Config.model_validate(
            {
                "model": {"path": str(model_dir), "max_prompt_len": 64},
                "algo": {"group_size": 4, "max_response_len": 16, "overlong_cache_len": 4},
                "generator": {"kv_cache_gib": 0.25, "max_num_seqs": 8},
                "learner": {"micro_batch_tokens": 512},
                "buffer": {"capacity_groups": 512},
            }
        )
        engine = RolloutEngine.start(cfg)
        loads: dict[str, list[float]] = {"file": [], "image": []}

        def load(kind: str, what: Any, version: int) -> None:
            if kind == "file":
                loads["file"].append(engine.update_weights(what, version))
            else:
                loads["image"].append(engine.update_weights_from_image(what, version))
            assert engine.version == version

        try:
            result = _compare({"model_file": str(model_file)}, repeats, load)
        finally:
            engine.close()
    result["parameters"] = params
    result["engine_load_seconds"] = {k: summary(v) for k, v in loads.items()}
    return result


# --------------------------------------------------------------------------------------------------
# Changed bytes on real runs
# --------------------------------------------------------------------------------------------------


def _changes(images: list[tuple[int, bytes]]) -> dict[str, Any]:
    """For consecutive versions: the fraction of bytes that differ, as published (fp32) and cast to
    bf16, and the bytes a delta transfer sends (real server and receiver, the previous version held)."""
    from safetensors.torch import load

    from stream_dapo.weights import WeightServer, WeightsPayload, serialize_weights
    from stream_dapo.weights.delta import HeldWeights
    from stream_dapo.weights.zmq_chunks import connect_weight_server, fetch_weights_stream

    def as_dtype(data: bytes, dtype: torch.dtype | None, version: int) -> bytes:
        if dtype is None:
            return data
        sd = load(data)
        return serialize_weights(
            {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}, version
        ).data

    out: dict[str, Any] = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        rows = []
        for (v0, d0), (v1, d1) in zip(images, images[1:], strict=False):
            a, b = as_dtype(d0, dtype, v0), as_dtype(d1, dtype, v1)
            if len(a) != len(b):
                continue
            ta, tb = (
                torch.frombuffer(bytearray(a), dtype=torch.uint8),
                torch.frombuffer(bytearray(b), dtype=torch.uint8),
            )
            changed = int((ta != tb).sum())
            with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as server:
                server.publish(WeightsPayload(v0, a, hashlib.sha256(a).hexdigest(), 0))
                ep = connect_weight_server(server.address)
                try:
                    first = fetch_weights_stream(ep, -1, 60.0, window=WINDOW)
                    assert first is not None and first.data is not None
                    base = HeldWeights(v0, first.data.view, first.digests, CHUNK, owner=first.data)
                    server.publish(WeightsPayload(v1, b, hashlib.sha256(b).hexdigest(), 0))
                    got = fetch_weights_stream(ep, v0, 60.0, base=base, window=WINDOW)
                finally:
                    ep.close()
            assert got is not None and got.data is not None and bytes(got.data) == b
            rows.append(
                {
                    "from": v0,
                    "to": v1,
                    "bytes": len(b),
                    "changed_byte_fraction": changed / len(b),
                    "sent_bytes": got.wire_bytes,
                    "sent_fraction": got.wire_bytes / len(b),
                    "chunks": {"reused": got.reused_chunks, "delta": got.delta_chunks, "raw": got.raw_chunks},
                }
            )
        out[label] = rows
    return out


def _real_model_versions() -> list[tuple[int, bytes]]:
    run = REPO / "runs" / "real-model" / "seed-0" / "run"
    cache = run / "weights-cache" / "generator-0"
    files = sorted(cache.glob("v*.safetensors"))
    images = [(int(p.name[1:9]), p.read_bytes()) for p in files]
    last = sorted((run / "checkpoints").glob("step_*/hf/model.safetensors"))
    if last and images:
        from safetensors.torch import load, load_file

        from stream_dapo.weights import serialize_weights

        version = int(last[-1].parents[1].name.split("_")[1])
        names = set(load(images[-1][1]))
        sd = {k: v for k, v in load_file(str(last[-1])).items() if k in names}
        if set(sd) == names and version == images[-1][0] + 1:
            images.append((version, serialize_weights(sd, version).data))
    return images


def _record_tiny_run(steps: int) -> list[tuple[int, bytes]]:
    """Run the tiny recipe for ``steps`` optimizer steps and take every version its learner publishes."""
    from stream_dapo.runtime.ports import read_bound_ports
    from stream_dapo.testing.services import port_overrides
    from stream_dapo.weights.zmq_chunks import connect_weight_server, fetch_weights_stream

    images: dict[int, bytes] = {}
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="bench-weights-run-") as tmp:
        out = Path(tmp) / "run"

        def record() -> None:
            ports = None
            while ports is None and not stop.is_set():
                ports = read_bound_ports(out, "learner")
                time.sleep(0.2)
            if ports is None:
                return
            ep = connect_weight_server(f"tcp://127.0.0.1:{ports['transport.weights_port']}")
            have = -1
            try:
                while not stop.is_set():
                    try:
                        got = fetch_weights_stream(ep, have, 5.0, retries=0)
                    except Exception:  # the learner is starting or gone: look again
                        ep.close()
                        ep = connect_weight_server(f"tcp://127.0.0.1:{ports['transport.weights_port']}")
                        time.sleep(0.2)
                        continue
                    if got is not None and got.data is not None:
                        images[got.version] = bytes(got.data)
                        got.data.close()
                        have = got.version
                    time.sleep(0.05)
            finally:
                ep.close()

        thread = threading.Thread(target=record, daemon=True)
        thread.start()
        argv = [
            sys.executable,
            "-m",
            "stream_dapo.cli",
            "run",
            "--config",
            str(REPO / "configs" / "tiny-cpu.toml"),
        ]
        argv += [
            "--no-eval",
            "--quiet",
            "--set",
            f'run.out_dir="{out}"',
            "--set",
            f"learner.total_steps={steps}",
        ]
        for item in port_overrides():
            argv += ["--set", item]
        try:
            subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL, env=dict(os.environ))
        finally:
            stop.set()
            thread.join(30)
    versions = sorted(images)
    return [(v, images[v]) for v in versions]


def measure_changed_bytes(quick: bool = False) -> dict[str, Any]:
    from stream_dapo.weights import serialize_weights

    result: dict[str, Any] = {}
    # The real model's published versions, when a real-model run left them here: 538 MB each, read
    # whole (about 8 GB resident for one run's cache), so not in the quick (smoke-test) pass.
    real = [] if quick else _real_model_versions()
    if len(real) >= 2:
        result["smollm2_135m_gsm"] = {"versions": [v for v, _ in real], **_changes(real)}
    if quick:
        # The smoke-test pass: the transfer's synthetic state, three versions, through the same
        # server, receiver and byte counts; a recorded run of the tiny recipe (a whole pipeline's
        # start-up, most of this section's minute) is the full pass's.
        base = synthetic_base(8)
        versions = [(v, serialize_weights(version_of(base, v), v).data) for v in range(3)]
        result["synthetic"] = {"versions": [v for v, _ in versions], **_changes(versions)}
        return result
    tiny = _record_tiny_run(12)
    consecutive = [(a, b) for (a, _), (b, _) in zip(tiny, tiny[1:], strict=False) if b == a + 1]
    result["tiny_cpu"] = {
        "versions": [v for v, _ in tiny],
        "consecutive_pairs": len(consecutive),
        **_changes(tiny),
    }
    return result


def measure_weight_sync(
    quick: bool = False, only: tuple[str, ...] = ("transfer", "vllm", "changed")
) -> dict[str, Any]:
    out: dict[str, Any] = {"chunk_bytes": CHUNK, "window": WINDOW, "quick": quick}
    if "transfer" in only:
        out["transfer"] = measure_transfer(quick)
    if "vllm" in only:
        out["vllm"] = measure_vllm(quick)
    if "changed" in only:
        out["changed"] = measure_changed_bytes(quick)
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--only", default="transfer,vllm,changed")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = measure_weight_sync(args.quick, tuple(args.only.split(",")))
    save_json(args.json, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

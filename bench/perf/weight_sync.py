"""Weight sync: seconds per MB to publish one version and fetch it back, by path.

    .venv/bin/python -m bench.perf.weight_sync [--quick]

State dicts: the tiny model's (fp32, ~3 MB) and a synthetic one of 4 MiB fp32 tensors (~100 MB;
quick: ~17 MB). Per repeat the learner side publishes a new version, the generator side fetches it:

- serialize: `serialize_weights` (safetensors bytes + sha256), what every path starts with;
- zmq: `WeightServer.publish` + `fetch_weights_zmq` (chunked download over loopback TCP with the
  config's chunk size, sha256 check, temp file + rename); the server runs in its thread, as in the
  learner, the fetch in this process's main thread;
- shared_dir: `SharedDirPublisher.publish` (write, fsync, atomic rename, LATEST) +
  `read_shared_dir` (sha256 of the file it names).

Repeats of the two paths interleave; each figure is the median, in seconds per MB (10^6 bytes) of
safetensors payload. Loading into vLLM is not included (it needs a running engine).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

from bench.report import bench_parser, interleave, paired_ratio, summary  # noqa: E402
from bench.workload import init_model_dir, tiny_config  # noqa: E402
from stream_dapo.weights import (  # noqa: E402
    SharedDirPublisher,
    WeightServer,
    fetch_weights_zmq,
    read_shared_dir,
    serialize_weights,
)

__all__ = ["measure_weight_sync", "sync_state_dict", "synthetic_state_dict"]


def synthetic_state_dict(total_mb: int) -> dict[str, torch.Tensor]:
    """fp32 tensors of 1024 x 1024 (4 MiB each) adding up to about ``total_mb`` MB."""
    count = max(1, round(total_mb * 1e6 / (4 << 20)))
    gen = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(count)}


def sync_state_dict(state_dict: dict[str, torch.Tensor], repeats: int, chunk_bytes: int) -> dict[str, Any]:
    """Publish + fetch ``state_dict`` ``repeats`` times over each path (interleaved, one warm-up)."""
    paths = ("zmq", "shared_dir")
    phases: dict[str, dict[str, list[float]]] = {p: {"serialize": [], "transfer": []} for p in paths}
    version = 0
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        root = Path(tmp)
        server = WeightServer("tcp://127.0.0.1:*", chunk_bytes=chunk_bytes).start()
        shared = SharedDirPublisher(root / "shared")

        def sync(path: str) -> float:
            """serialize -> publish -> fetch and verify; returns the total seconds."""
            nonlocal version
            version += 1
            start = time.perf_counter()
            payload = serialize_weights(state_dict, version)
            serialized = time.perf_counter()
            if path == "zmq":
                server.publish(payload)
                got, file = fetch_weights_zmq(server.address, version - 1, dest_dir=root / "fetched")
                if got != version or file is None:
                    raise RuntimeError(f"fetched version {got} ({file}), expected {version}")
            else:
                shared.publish(payload)
                found = read_shared_dir(root / "shared", version - 1)
                if found is None or found[0] != version:
                    raise RuntimeError(f"shared dir gave {found}, expected version {version}")
            done = time.perf_counter()
            phases[path]["serialize"].append(serialized - start)
            phases[path]["transfer"].append(done - serialized)
            return done - start

        try:
            totals = interleave({p: (lambda p=p: sync(p)) for p in paths}, repeats, warmup=1)
        finally:
            server.stop()
    nbytes = serialize_weights(state_dict, 0).total_bytes
    mb = nbytes / 1e6

    def per_mb(values: list[float]) -> dict[str, Any]:
        return summary([v / mb for v in values])

    return {
        "tensors": len(state_dict),
        "payload_bytes": nbytes,
        # [1:]: the warm-up round is not in the figures.
        "serialize_s_per_mb": per_mb([s for p in paths for s in phases[p]["serialize"][1:]]),
        "transfer_s_per_mb": {p: per_mb(phases[p]["transfer"][1:]) for p in paths},
        "total_s_per_mb": {p: per_mb(totals[p]) for p in paths},
        "total_seconds": {p: summary(totals[p]) for p in paths},
        "zmq_vs_shared_dir": paired_ratio(totals["zmq"], totals["shared_dir"]),
    }


def measure_weight_sync(quick: bool = False) -> dict[str, Any]:
    from safetensors.torch import load_file

    repeats = 2 if quick else 7
    cfg = tiny_config()
    model_dir = init_model_dir(cfg)
    tiny = load_file(str(model_dir / "model.safetensors"))
    large_mb = 16 if quick else 100
    return {
        "repeats": repeats,
        "chunk_bytes": cfg.weights.chunk_bytes,
        "tiny_model": sync_state_dict(tiny, repeats, cfg.weights.chunk_bytes),
        "synthetic": sync_state_dict(synthetic_state_dict(large_mb), repeats, cfg.weights.chunk_bytes),
    }


def main() -> None:
    print(json.dumps(measure_weight_sync(bench_parser(__doc__).parse_args().quick), indent=1))


if __name__ == "__main__":
    main()

"""End-to-end samples/s of `stream-dapo run` in async and sync mode, side by side.

    python bench/async_vs_sync.py [--steps 12] [--repeats 1] [--config configs/tiny-cpu.toml]

Both modes run the same config, seed and step budget one after the other on this machine (no
evaluation, so only the training loop is timed); the figure is the median over repeats of
samples generated per second of training wall time, and the ratio async / sync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers import free_ports, tiny_overrides  # noqa: E402


def run_once(mode: str, steps: int, config: Path, model: Path, out: Path) -> dict:
    overrides = tiny_overrides(model, out, free_ports(8))
    # Keep the tiny config's batch shape; only move ports and the run directory.
    overrides = [
        o for o in overrides if o.split("=")[0].startswith(("transport.", "metrics.", "run.", "model."))
    ]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--config", str(config), "--no-eval", "--quiet"]
    argv += ["--mode", mode]
    for item in [*overrides, f"learner.total_steps={steps}"]:
        argv += ["--set", item]
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL, env=dict(os.environ))
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-cpu.toml")
    args = parser.parse_args()

    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    model = ensure_warm_model(load_config([args.config]))
    rates: dict[str, list[float]] = {"async": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in ("async", "sync"):
                s = run_once(mode, args.steps, args.config, model.resolve(), Path(tmp) / f"{mode}-{r}")
                rates[mode].append(s["samples_per_second"])
                print(
                    f"{mode:5s} repeat {r}: {s['samples_per_second']:.2f} samples/s, "
                    f"train {s['train_seconds']:.0f} s, max staleness {s['max_staleness_trained']}",
                    flush=True,
                )
    a, s = statistics.median(rates["async"]), statistics.median(rates["sync"])
    print(f"cores: {os.cpu_count()}  steps: {args.steps}  repeats: {args.repeats}")
    print(f"async {a:.2f} samples/s | sync {s:.2f} samples/s | ratio async/sync {a / s:.2f}")


if __name__ == "__main__":
    main()

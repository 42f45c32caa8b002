"""End-to-end samples/s of `stream-dapo run` in async and sync mode, side by side.

    python bench/async_vs_sync.py [--steps 12] [--repeats 1] [--config configs/tiny-cpu.toml]

Both modes run the same config, seed and step budget one after the other on this machine (no
evaluation, so only the training loop is timed); the figure is the median over repeats of
samples generated and samples trained per second of training wall time, and the ratios async / sync.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import median, paired_ratio  # noqa: E402
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


def measure_async_vs_sync(
    steps: int = 12, repeats: int = 1, config: Path = REPO / "configs" / "tiny-cpu.toml"
) -> dict:
    """Generated and trained samples/s of both modes (repeats interleaved: async, sync, async, ...)
    and the ratios async / sync (median of the per-repeat ratios)."""
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    model = ensure_warm_model(load_config([config]))
    rates: dict[str, list[float]] = {"async": [], "sync": []}
    trained: dict[str, list[float]] = {"async": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for mode in ("async", "sync"):
                s = run_once(mode, steps, config, model.resolve(), Path(tmp) / f"{mode}-{r}")
                cfg = load_config([Path(tmp) / f"{mode}-{r}" / "config.toml"], environ={})
                rates[mode].append(s["samples_per_second"])
                trained[mode].append(s["groups_trained"] * cfg.algo.group_size / s["train_seconds"])
                print(
                    f"{mode:5s} repeat {r}: generated {s['samples_per_second']:.2f} samples/s, trained "
                    f"{trained[mode][-1]:.2f} samples/s, train {s['train_seconds']:.0f} s, max staleness "
                    f"{s['max_staleness_trained']}, dropped stale {s['groups_dropped_stale']}",
                    flush=True,
                )
    return {
        "config": str(config.resolve().relative_to(REPO))
        if config.resolve().is_relative_to(REPO)
        else str(config),
        "cores": os.cpu_count(),
        "steps": steps,
        "repeats": repeats,
        "generated_samples_per_second": rates,
        "trained_samples_per_second": trained,
        "ratio_generated": paired_ratio(rates["async"], rates["sync"]),
        "ratio_trained": paired_ratio(trained["async"], trained["sync"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-cpu.toml")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    result = measure_async_vs_sync(args.steps, args.repeats, args.config)
    rates, trained = result["generated_samples_per_second"], result["trained_samples_per_second"]
    a, s = median(rates["async"]), median(rates["sync"])
    ta, ts = median(trained["async"]), median(trained["sync"])
    print(f"cores: {result['cores']}  steps: {args.steps}  repeats: {args.repeats}")
    print(
        f"generated: async {a:.2f} samples/s | sync {s:.2f} samples/s | ratio async/sync {result['ratio_generated']:.2f}"
    )
    print(
        f"trained:   async {ta:.2f} samples/s | sync {ts:.2f} samples/s | ratio async/sync {result['ratio_trained']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

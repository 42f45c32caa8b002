"""End-to-end samples/s of `stream-dapo run` in async and sync mode, side by side.

    python -m bench.perf.async_vs_sync [--steps 12] [--repeats 1] [--seeds 0] [--config configs/tiny-cpu.toml]
        [--set KEY=VALUE ...]

Both modes run the same config, seed and step budget one after the other on this machine (no
evaluation, so only the training loop is timed); the figure is the median over repeats of
samples generated and samples trained per second of training wall time, and the ratios async / sync.
With several ``--seeds`` (``generator.seed``), each repeat runs every seed in both modes, pairs
interleaved, and each (repeat, seed) pair gives one ratio.

Where the time goes, per run (from the learner's metrics rows and the generator's final metrics):
the learner's seconds waiting for a batch (idle), training (forward + backward + step), the
proximal pass and publishing weights; the generators' seconds loading weights and verifying, and
their generated tokens per second of training wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import median, paired_ratio, save_json  # noqa: E402
from stream_dapo.testing.services import tiny_overrides  # noqa: E402


def run_once(
    mode: str,
    steps: int,
    config: Path,
    model: Path,
    out: Path,
    seed: int | None = None,
    extra: Sequence[str] = (),
) -> dict:
    """One `stream-dapo run` without evaluation in ``out``; ``extra`` are more ``--set`` items."""
    overrides = tiny_overrides(model, out)
    # Keep the tiny config's batch shape; only move ports and the run directory.
    overrides = [
        o for o in overrides if o.split("=")[0].startswith(("transport.", "metrics.", "run.", "model."))
    ]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--config", str(config), "--no-eval", "--quiet"]
    argv += ["--mode", mode]
    seeded = [] if seed is None else [f"generator.seed={seed}"]
    for item in [*overrides, f"learner.total_steps={steps}", *seeded, *extra]:
        argv += ["--set", item]
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL, env=dict(os.environ))
    return json.loads((out / "summary.json").read_text())


def generator_totals(run_dir: Path) -> dict[str, float]:
    """Every generator's final metrics (``final-metrics/generator-*.json``), summed by sample name."""
    totals: dict[str, float] = {}
    for path in sorted((run_dir / "final-metrics").glob("generator-*.json")):
        for key, value in json.loads(path.read_text()).items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


def time_breakdown(run_dir: Path, summary: dict, steps_per_rollout: int) -> dict[str, float]:
    """Seconds of a finished run by where they went (see the module docstring). The learner's rows
    repeat a rollout batch's wait, packing and proximal seconds on each of its steps: they count once."""
    rows = [json.loads(line) for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "version" in r]
    firsts = [r for r in rows if (r["version"] - 1) % steps_per_rollout == 0]

    def total(key: str, of: list[dict]) -> float:
        return round(sum(r.get(key) or 0.0 for r in of), 2)

    from stream_dapo.runtime.metrics import GeneratorMetrics, catalogue, sample_name

    names = catalogue(GeneratorMetrics)
    gen = generator_totals(run_dir)
    return {
        "train_seconds": summary["train_seconds"],
        "learner_wait_seconds": total("batch_wait_seconds", firsts),
        "learner_step_seconds": total("step_seconds", rows),
        "learner_proximal_seconds": total("proximal_seconds", firsts),
        "learner_publish_seconds": total("weight_sync_seconds", rows),
        # No final metrics from a generator (it was killed before writing them): unknown, not 0.
        "generator_weight_load_seconds": round(gen[sample_name(names.weight_sync_seconds, "_sum")], 2)
        if gen
        else None,
        "generator_verify_seconds": round(gen[sample_name(names.verifier_latency, "_sum")], 2)
        if gen
        else None,
        "generator_tokens_per_second": round(gen[sample_name(names.tokens)] / summary["train_seconds"], 1)
        if gen
        else None,
    }


def measure_async_vs_sync(
    steps: int = 12,
    repeats: int = 1,
    config: Path = REPO / "configs" / "tiny-cpu.toml",
    seeds: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
) -> dict:
    """Generated and trained samples/s of both modes (repeats interleaved: async, sync, async, ...)
    and the ratios async / sync (median of the per-pair ratios); with ``seeds``, every repeat runs
    each seed in both modes."""
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    model = ensure_warm_model(load_config([config]))
    rates: dict[str, list[float]] = {"async": [], "sync": []}
    trained: dict[str, list[float]] = {"async": [], "sync": []}
    breakdown: dict[str, list[dict[str, Any]]] = {"async": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for seed in seeds if seeds else [None]:
                for mode in ("async", "sync"):
                    out = Path(tmp) / f"{mode}-{r}-{seed}"
                    s = run_once(mode, steps, config, model.resolve(), out, seed, overrides)
                    cfg = load_config([out / "config.toml"], environ={})
                    rates[mode].append(s["samples_per_second"])
                    trained[mode].append(s["groups_trained"] * cfg.algo.group_size / s["train_seconds"])
                    breakdown[mode].append(
                        {
                            "repeat": r,
                            "seed": cfg.generator.seed,
                            **time_breakdown(out, s, cfg.admission.steps_per_rollout),
                            # How each service ended (exit code, killed, final metrics written):
                            # why a generator's figures are unknown, when they are.
                            "service_stops": s.get("service_stops"),
                        }
                    )
                    b = breakdown[mode][-1]
                    print(
                        f"{mode:5s} repeat {r} seed {cfg.generator.seed}: generated {s['samples_per_second']:.2f} "
                        f"samples/s, trained {trained[mode][-1]:.2f} samples/s, train {s['train_seconds']:.0f} s "
                        f"(learner waiting {b['learner_wait_seconds']:.0f} s, stepping {b['learner_step_seconds']:.0f} s, "
                        f"proximal {b['learner_proximal_seconds']:.0f} s; generators {b['generator_tokens_per_second']} "
                        f"tokens/s), max staleness {s['max_staleness_trained']}, dropped stale "
                        f"{s['groups_dropped_stale']}",
                        flush=True,
                    )
    return {
        "config": str(config.resolve().relative_to(REPO))
        if config.resolve().is_relative_to(REPO)
        else str(config),
        "cores": os.cpu_count(),
        "steps": steps,
        "repeats": repeats,
        "seeds": list(seeds) if seeds else None,
        "overrides": list(overrides),
        "breakdown": breakdown,
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
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="generator.seed values")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="for both modes"
    )
    args = parser.parse_args()

    result = measure_async_vs_sync(args.steps, args.repeats, args.config, args.seeds, args.overrides)
    rates, trained = result["generated_samples_per_second"], result["trained_samples_per_second"]
    a, s = median(rates["async"]), median(rates["sync"])
    ta, ts = median(trained["async"]), median(trained["sync"])
    print(f"cores: {result['cores']}  steps: {args.steps}  repeats: {args.repeats}  seeds: {args.seeds}")
    print(
        f"generated: async {a:.2f} samples/s | sync {s:.2f} samples/s | ratio async/sync {result['ratio_generated']:.2f}"
    )
    print(
        f"trained:   async {ta:.2f} samples/s | sync {ts:.2f} samples/s | ratio async/sync {result['ratio_trained']:.2f}"
    )
    ratios = [a / s for a, s in zip(trained["async"], trained["sync"], strict=True)]
    print(
        f"trained ratio per pair: {', '.join(f'{x:.2f}' for x in ratios)} (min {min(ratios):.2f}, max {max(ratios):.2f})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        save_json(args.json, result)


if __name__ == "__main__":
    main()

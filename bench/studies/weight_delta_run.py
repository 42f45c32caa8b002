"""Weight deltas on or off in a real run: the real-model recipe trained for a fixed budget with
``weights.delta = true`` and with ``false``, learner and generator on this machine (loopback).

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.weight_delta_run \
        [--config configs/smollm2-words-wide-cpu.toml] [--set key=value ...] [--budget-s 720] \
        [--repeats 1] [--work runs/weight-delta-run] [--out docs/results/weight_delta_run.json]

Why: on the fp32 real model (538 MB) with deltas on, the generator spent 7.4 s per version fetching
(827 s over an hour's 112 versions) while the learner's zlib of each changed chunk ran beside
training on the same 2 cores (docs/results/real-model.md, seed 1). The microbenchmark says a full
image streams faster on loopback (docs/operations.md, "When not to use deltas"); this measures what
that does to a run, which is what `weights.delta = "auto"` rests on.

Each arm is `bench.studies.real_model.train` (``stream-dapo run --no-eval`` stopped at its first
learner step past ``--budget-s`` after launch), same config, seeds 0, arms in rotated order per
repeat. Reported per arm, from the run's files: optimizer steps by the budget and seconds per step,
the generator's weight sync (fetch + load into vLLM) per version: mean from its final metrics and
median / min / max of the launcher's per-scrape means, the bytes received per version and the delta
ratio, the learner's publish seconds, the generator's tokens/s, the learner's wait for batches.
An arm with ``result.json`` in its folder is read back; one without is run again from scratch.

What it does not show: more than `--repeats` runs per arm; another machine, or a real network link
(there deltas pay: docs/operations.md); a run's whole hour (the arms are short).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import machine_info, save_json
from bench.studies.real_model import REPO, jsonl_rows, prepare, throughput, train, weight_sync

ARMS = ("true", "false")


def _metric(metrics: dict[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return None if value is None else float(value)


def arm_figures(run_dir: Path, trained: dict, steps_per_rollout: int) -> dict[str, Any]:
    """One arm's figures from its run folder (learner rows, launcher rows, final metrics)."""
    rows = jsonl_rows(run_dir / "learner" / "metrics.jsonl")
    steps = [r for r in rows if "wall_time" in r]
    gen_file = run_dir / "final-metrics" / "generator-0.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    count = _metric(gen, "stream_dapo_generator_weight_sync_seconds_count") or 0.0
    total = _metric(gen, "stream_dapo_generator_weight_sync_seconds_sum") or 0.0
    received = _metric(gen, "stream_dapo_generator_weight_received_bytes_total")
    launch = trained["launch"]
    per_step = (steps[-1]["wall_time"] - steps[0]["wall_time"]) / (len(steps) - 1) if len(steps) > 1 else None
    summary = trained["summary"]
    return {
        "learner_steps": summary.get("learner_steps"),
        "first_step_after_launch_s": round(steps[0]["wall_time"] - launch, 1) if steps else None,
        "seconds_per_step": round(per_step, 2) if per_step else None,
        "samples_generated": summary.get("samples_generated"),
        "versions_loaded": int(count),
        "generator_sync_s_mean": round(total / count, 3) if count else None,
        "generator_sync_s_total": round(total, 1),
        "received_mb_per_version": round(received / count / 1e6, 1) if count and received else None,
        "delta_ratio_last": _metric(gen, "stream_dapo_generator_weight_delta_ratio"),
        **{f"sync_{k}": v for k, v in weight_sync(rows, jsonl_rows(run_dir / "metrics.jsonl")).items()},
        "throughput": throughput(rows, steps_per_rollout, summary.get("train_seconds")),
    }


def run_arm(
    config: Path, overrides: Sequence[str], arm: str, folder: Path, budget_s: float, steps_per_rollout: int
) -> dict[str, Any]:
    done = folder / "result.json"
    if done.is_file():
        print(f"  {folder}: kept", flush=True)
        return dict(json.loads(done.read_text()))
    if folder.exists():
        shutil.rmtree(folder)  # an unfinished arm: its clock is lost, start it again
    folder.mkdir(parents=True)
    trained = train(config, [*overrides, f"weights.delta={arm}"], folder, budget_s)
    out = {"arm": arm, **arm_figures(folder / "run", trained, steps_per_rollout)}
    save_json(done, out)
    return out


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: the runs' figures listed, and the median of each headline figure over them."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        runs = [r for r in results if r["arm"] == arm]
        if not runs:
            continue
        head = {}
        for key in ("learner_steps", "seconds_per_step", "generator_sync_s_mean", "received_mb_per_version"):
            values = [r[key] for r in runs if r.get(key) is not None]
            head[key] = round(statistics.median(values), 3) if values else None
        out[arm] = {"runs": len(runs), **head}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-words-wide-cpu.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--budget-s", type=float, default=720.0, help="seconds of training after launch, per arm"
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "weight-delta-run")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "weight_delta_run.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    overrides = [*args.overrides, "learner.seed=0", "generator.seed=0"]
    prepare(args.config, overrides)  # the import, data and warm-up, outside every arm's clock
    from stream_dapo.config import load_config

    cfg = load_config([args.config], overrides)
    results = []
    for rep in range(args.repeats):
        order = ARMS if rep % 2 == 0 else ARMS[::-1]  # rotated: neither arm always runs first
        for arm in order:
            print(f"repeat {rep}: weights.delta = {arm}, {args.budget_s:.0f} s ...", flush=True)
            results.append(
                {
                    "repeat": rep,
                    **run_arm(
                        args.config,
                        overrides,
                        arm,
                        args.work / f"{arm}-{rep}",
                        args.budget_s,
                        cfg.admission.steps_per_rollout,
                    ),
                }
            )
    report = {
        "what": "weights.delta true vs false in a real run on this machine (loopback)",
        "config": str(args.config.resolve().relative_to(REPO)),
        "overrides": overrides,
        "budget_s": args.budget_s,
        "machine": machine_info(),
        "runs": results,
        "median": summarize(results),
    }
    save_json(args.out, report)
    print("arm    steps  s/step  generator sync s/version (mean)  MB received/version")
    for r in results:
        print(
            f"{r['arm']:6s} {r['learner_steps']!s:>5}  {r['seconds_per_step']!s:>6}  "
            f"{r['generator_sync_s_mean']!s:>8}  {r['received_mb_per_version']!s:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

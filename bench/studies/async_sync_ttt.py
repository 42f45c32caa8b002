"""Time to a target eval accuracy: `stream-dapo run` in async mode vs `--mode sync`, per seed, paired.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.async_sync_ttt \\
        [--config configs/tiny-cpu.toml] [--seeds 0 1 2] [--steps 60] [--checkpoint-every 4] \\
        [--target-delta 0.10] [--set KEY=VALUE ...] [--work DIR] [--out docs/results/async_sync_ttt.json]

For each seed both modes train the same warm model for the same number of optimizer steps with
checkpoints every `--checkpoint-every` steps (the runs themselves do no evaluation). The order of the
two modes alternates from seed to seed (async first at even seeds, sync first at odd ones), so a
drift of the machine's speed over the session does not favour one mode. Afterwards one vLLM engine
evaluates the start model and every checkpoint with the project's evaluation (avg@k, as in
`stream-dapo run`), outside the timed windows: the method of bench/studies/peer_trl.py, whose functions this
reuses. A curve point is the wall time, from launching `stream-dapo run`, at which optimizer step v
finished; time to target interpolates between the checkpoints either side of the first crossing.

The ratio sync / async is taken per seed (a pair run back to back), then summarised over seeds
(mean, std, min, max), at the main target and at the targets of ``SENSITIVITY_DELTAS``. Trained
samples/s (groups trained x G / training seconds, from each run's summary) are paired the same way.

With `--work DIR` the runs are kept and the bench resumes: a mode whose run directory already holds a
finished run (`summary.json` and `launch.json`) is not run again, so an interrupted measurement loses
at most the run in progress. Evaluation runs once all runs exist.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import machine_info, save_json  # noqa: E402
from bench.studies.longcot_learning import collected_side, spread  # noqa: E402
from bench.studies.peer_trl import (  # noqa: E402
    SENSITIVITY_DELTAS,
    build_curve,
    evaluate_checkpoints,
    git_state,
    run_stream_dapo,
    side_report,
    speed_ratio,
    time_to_target,
)

DEFAULT_CONFIG = REPO / "configs" / "tiny-cpu.toml"
DEFAULT_OUT = REPO / "docs" / "results" / "async_sync_ttt.json"
MODES = ("async", "sync")


def mode_order(seed: int) -> tuple[str, str]:
    """Async first at even seeds, sync first at odd ones (interleaved repeats)."""
    return MODES if seed % 2 == 0 else (MODES[1], MODES[0])


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` (one mode of one seed) holds a finished run this bench can reuse."""
    return (run_dir / "launch.json").is_file() and (run_dir / "stream-dapo" / "summary.json").is_file()


def trained_samples_per_s(summary: Mapping[str, Any], group_size: int) -> float | None:
    """Samples that reached the loss per second of training, from a run's summary."""
    seconds = summary.get("train_seconds") or 0.0
    trained = summary.get("groups_trained")
    if not seconds or trained is None:
        return None
    return float(trained) * group_size / float(seconds)


def ratio_spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``spread`` of the ratios that exist, with the count of seeds where one side missed."""
    have = [v for v in values if v is not None]
    out: dict[str, Any] = spread(have) if have else {"n": 0}
    out["missing"] = len(values) - len(have)
    return out


def seed_figures(
    sides: Mapping[str, dict], evals: Mapping[str, dict], start: dict, target: float, group_size: int
) -> dict[str, Any]:
    """One seed's two curves, times to target at every target, and the paired ratios."""
    reports, curves = {}, {}
    for mode, side in sides.items():
        curves[mode] = build_curve(side, dict(evals), start)
        rep = side_report(side, curves[mode], target)
        rep["trained_samples_per_s"] = trained_samples_per_s(side["summary"], group_size)
        rep["summary"] = {
            k: side["summary"].get(k)
            for k in (
                "learner_steps",
                "groups_trained",
                "groups_filtered",
                "groups_dropped_stale",
                "max_staleness_trained",
                "samples_generated",
                "train_seconds",
            )
        }
        reports[mode] = rep
    sensitivity = []
    for delta in SENSITIVITY_DELTAS:
        t = start["avg_at_k"] + delta
        row: dict[str, Any] = {"delta": delta, "target": t}
        for mode, curve in curves.items():
            row[f"{mode}_s"] = time_to_target(curve, t)["interpolated_s"]
        row["ratio_sync_over_async"] = speed_ratio(row["sync_s"], row["async_s"])
        sensitivity.append(row)
    a, s = (reports[m]["time_to_target"]["interpolated_s"] for m in MODES)
    ta, ts = (reports[m]["trained_samples_per_s"] for m in MODES)
    return {
        "sides": reports,
        "ratio_sync_over_async": speed_ratio(s, a),
        "trained_samples_ratio_async_over_sync": ta / ts if ta and ts else None,
        "target_sensitivity": sensitivity,
    }


def summarise(seeds: Mapping[str, dict]) -> dict[str, Any]:
    """The paired ratios over seeds: at the main target, per sensitivity target, and samples/s."""
    per = list(seeds.values())
    return {
        "ratio_sync_over_async": ratio_spread([r["ratio_sync_over_async"] for r in per]),
        "trained_samples_ratio_async_over_sync": ratio_spread(
            [r["trained_samples_ratio_async_over_sync"] for r in per]
        ),
        "by_delta": [
            {
                "delta": delta,
                "ratio_sync_over_async": ratio_spread(
                    [r["target_sensitivity"][i]["ratio_sync_over_async"] for r in per]
                ),
                **{
                    f"{mode}_s": ratio_spread([r["target_sensitivity"][i][f"{mode}_s"] for r in per])
                    for mode in MODES
                },
            }
            for i, delta in enumerate(SENSITIVITY_DELTAS)
        ],
    }


def run_all(args: argparse.Namespace, base: Sequence[str], work: Path) -> dict[int, dict[str, dict]]:
    """Every (seed, mode) run, in the interleaved order; finished ones are read back, not rerun."""
    runs: dict[int, dict[str, dict]] = {}
    for seed in args.seeds:
        runs[seed] = {}
        for mode in mode_order(seed):
            run_dir = work / f"seed-{seed}" / mode
            if finished(run_dir):
                print(f"seed {seed} {mode}: reusing {run_dir}", flush=True)
                runs[seed][mode] = collected_side(run_dir)
                continue
            print(
                f"seed {seed} {mode}: {args.steps} steps, checkpoints every {args.checkpoint_every} ...",
                flush=True,
            )
            seeded = [*base, f"learner.seed={seed}", f"generator.seed={seed}", f'run.mode="{mode}"']
            runs[seed][mode] = run_stream_dapo(
                args.config, seeded, run_dir, args.steps, args.checkpoint_every
            )
            print(f"seed {seed} {mode}: done in {runs[seed][mode]['wall_s']:.0f} s", flush=True)
    return runs


def print_report(report: Mapping[str, Any]) -> None:
    print(f"start avg@k {report['eval_before']['avg_at_k']:.4f}; target {report['target_avg_at_k']:.4f}")
    for seed, rep in report["seeds"].items():
        for mode in MODES:
            side = rep["sides"][mode]
            last = side["curve"][-1]
            tps = side["trained_samples_per_s"]
            print(
                f"seed {seed} {mode:5s}: to target {_fmt(side['time_to_target']['interpolated_s'])} s; "
                f"{_fmt(side['seconds_per_step_after_first'], 2)} s/step; trained {_fmt(tps, 2)} samples/s; "
                f"step {last['step']} avg@k {last['avg_at_k']:.4f} at {last['t_s']:.0f} s"
            )
        print(
            f"seed {seed}: sync/async time to target {_fmt(rep['ratio_sync_over_async'], 2)}, "
            f"async/sync trained samples/s {_fmt(rep['trained_samples_ratio_async_over_sync'], 2)}"
        )
    over = report["over_seeds"]
    print(f"over seeds, sync/async time to target: {over['ratio_sync_over_async']}")
    print(f"over seeds, async/sync trained samples/s: {over['trained_samples_ratio_async_over_sync']}")
    for row in over["by_delta"]:
        print(f"  delta {row['delta']:.2f}: sync/async {row['ratio_sync_over_async']}")


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", "--eval-every", dest="checkpoint_every", type=int, default=4)
    parser.add_argument("--target-delta", type=float, default=0.10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="keep (and resume from) the runs here")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config([args.config], args.overrides)
    model = str(ensure_warm_model(cfg).resolve())
    base = [*args.overrides, f"model.path={model}"]  # run_stream_dapo keeps every checkpoint
    work_ctx = None
    if args.work is None:
        work_ctx = tempfile.TemporaryDirectory(prefix="async_sync_ttt.")
        work = Path(work_ctx.name)
    else:
        work = args.work
    try:
        runs = run_all(args, base, work)
        checkpoints = [
            d for sides in runs.values() for side in sides.values() for d in side["checkpoints"].values()
        ]
        evals = evaluate_checkpoints(args.config, base, checkpoints, work / "evals.json", seed=args.eval_seed)
    finally:
        if work_ctx:
            work_ctx.cleanup()
    start = evals["start"]
    target = start["avg_at_k"] + args.target_delta
    seeds = {
        str(seed): seed_figures(sides, evals, start, target, cfg.algo.group_size)
        for seed, sides in runs.items()
    }
    report: dict[str, Any] = {
        "what": "wall-clock time from launch to a target eval avg@k: stream-dapo async vs --mode sync, per seed",
        "machine": machine_info(),
        "cores": os.cpu_count(),
        "git": git_state(),
        "config": str(args.config.resolve().relative_to(REPO)),
        "overrides": args.overrides,
        "steps_each": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "seeds_order": {str(s): list(mode_order(s)) for s in args.seeds},
        "eval_seed": args.eval_seed,
        "eval_before": start,
        "target_delta": args.target_delta,
        "target_avg_at_k": target,
        "seeds": seeds,
        "over_seeds": summarise(seeds),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_json(args.out, report)
    print_report(report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

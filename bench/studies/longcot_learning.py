"""Does the long-CoT recipe learn within its time budget? Eval avg@k against seconds of training.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.longcot_learning \
        [--config configs/tiny-longcot-cpu.toml] [--steps 400] [--checkpoint-every 20] [--eval-every 40] \
        [--budget-s 1200] [--target-delta 0.15] [--seeds 0 1 2] [--set key=value ...] \
        [--work DIR | --evaluate-work DIR] [--no-stop] [--json docs/results/longcot_learning.json]

Issue 12's criterion for ``configs/tiny-longcot-cpu.toml``: eval avg@k up by at least 15 points within
20 minutes of training on 2 cores. For each seed this runs ``stream-dapo run --no-eval`` on the recipe
(``learner.seed`` and ``generator.seed`` set to the seed, checkpoints every ``--checkpoint-every``
steps, all kept), then one vLLM engine scores the start model and the checkpoints with the project's
evaluation (``stream-dapo eval``'s avg@k on the recipe's eval prompts and sampling settings, the same
per-request seeds for every model; bench/studies/peer_trl.py's ``evaluate``). Not every checkpoint is scored:
those at multiples of ``--eval-every``, plus the last one inside the budget and the first one past it,
so the figure at the budget is measured, not interpolated. A run is stopped (SIGTERM: the launcher
drains and writes its summary) once a complete checkpoint past the budget exists, so ``--steps`` is
only an upper bound and no step rate has to be guessed (``--no-stop`` runs them all).
``--evaluate-work DIR`` trains nothing and scores the runs an earlier ``--work DIR`` holds; each run
recorded its launch time in ``seed-N/launch.json``.

Time is counted from launching ``stream-dapo run`` (engine and learner start-up included) to the
learner's stamp of the optimizer step (``wall_time`` in ``learner/metrics.jsonl``): a little more than
the summary's ``train_seconds``, which starts once the launcher has loaded. The warm model is built
(or found in its cache) before the clock starts. The figure at the budget is the last scored point
whose step finished within ``--budget-s``; time to target interpolates between the scored points
either side of the first crossing (``peer_trl.time_to_target``).

What it does not show: another machine's speed (the same recipe ran 3.5 to 17 s per step, by machine
and by how many groups dynamic sampling drops as the policy improves), or the eval's own noise, about
+-4 points at 100 prompts x 4 samples; seeds show the spread of training, the eval seed is fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import machine_info, save_json  # noqa: E402
from bench.studies.peer_trl import (  # noqa: E402
    CurvePoint,
    build_curve,
    collect_stream_dapo,
    evaluate_checkpoints,
    git_state,
    run_stream_dapo,
    time_to_target,
)

DEFAULT_CONFIG = REPO / "configs" / "tiny-longcot-cpu.toml"
DEFAULT_OUT = REPO / "docs" / "results" / "longcot_learning.json"


def steps_to_score(
    step_time: Mapping[int, float], checkpoints: Sequence[int], launch: float, budget_s: float, every: int
) -> list[int]:
    """The checkpoint steps to evaluate: multiples of ``every``, the last one that finished within
    ``budget_s`` of ``launch`` and the first one after it (when there is one)."""
    have = sorted(s for s in checkpoints if s in step_time)
    chosen = {s for s in have if s % every == 0}
    inside = [s for s in have if step_time[s] - launch <= budget_s]
    outside = [s for s in have if step_time[s] - launch > budget_s]
    if inside:
        chosen.add(inside[-1])
    if outside:
        chosen.add(outside[0])
    return sorted(chosen)


def at_budget(curve: Sequence[CurvePoint], budget_s: float) -> dict[str, float | int]:
    """The last point of ``curve`` (which starts with the start model at 0 s) within ``budget_s``,
    with its gain over the start model in points of avg@k."""
    start = curve[0]
    point = max((p for p in curve if p.t_s <= budget_s), key=lambda p: p.t_s)
    return {
        "step": point.step,
        "t_s": round(point.t_s, 1),
        "avg_at_k": point.avg_at_k,
        "gain_points": round(100 * (point.avg_at_k - start.avg_at_k), 2),
    }


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Mean, sample std (0 for one value), min, max and count."""
    return {
        "mean": round(statistics.fmean(values), 3),
        "std": round(statistics.stdev(values), 3) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def seed_report(side: dict, evals: dict[str, dict], start: dict, budget_s: float, target: float) -> dict:
    """One seed's curve (scored checkpoints only), its figure at the budget and time to target."""
    scored = {s: d for s, d in side["checkpoints"].items() if d in evals}
    curve = build_curve({**side, "checkpoints": scored}, evals, start)
    steps = sorted(side["step_time"])
    per_step = (
        (side["step_time"][steps[-1]] - side["step_time"][steps[0]]) / (steps[-1] - steps[0])
        if len(steps) > 1
        else None
    )
    rows = {int(r["version"]): r for r in side["steps_log"]}
    return {
        "curve": [
            {
                **p.__dict__,
                **{k: evals[scored[p.step]].get(k) for k in ("truncation_rate", "mean_response_len")},
            }
            if p.step
            else p.__dict__
            for p in curve
        ],
        "at_budget": at_budget(curve, budget_s),
        "time_to_target": time_to_target(curve, target),
        "startup_s": round(side["step_time"][steps[0]] - side["launch"], 1) if steps else None,
        "seconds_per_step": round(per_step, 3) if per_step else None,
        "steps_within_budget": sum(1 for s in steps if side["step_time"][s] - side["launch"] <= budget_s),
        "entropy_first_last": [rows[steps[0]].get("entropy"), rows[steps[-1]].get("entropy")]
        if steps
        else None,
        "summary": {
            k: side["summary"].get(k)
            for k in (
                "learner_steps",
                "samples_generated",
                "groups_trained",
                "groups_filtered",
                "groups_dropped_stale",
                "learner_holds",
                "max_staleness_trained",
                "samples_per_second",
                "train_seconds",
            )
        },
    }


def print_report(report: dict[str, Any]) -> None:
    budget, target = report["budget_s"], report["target_avg_at_k"]
    print(
        f"start model avg@k {report['eval_before']['avg_at_k']:.4f}; target {target:.4f}; budget {budget:.0f} s"
    )
    for seed, rep in report["seeds"].items():
        print(f"seed {seed}: {rep['seconds_per_step']} s/step, start-up {rep['startup_s']} s")
        print("  step    t (s)  avg@k  pass@k  trunc")
        for p in rep["curve"]:
            print(
                f"  {p['step']:4d} {p['t_s']:8.1f} {p['avg_at_k']:.4f} {p.get('pass_at_k') or 0:.3f}"
                f"  {p.get('truncation_rate') if p.get('truncation_rate') is not None else '-'}"
            )
        b = rep["at_budget"]
        print(
            f"  within {budget:.0f} s: step {b['step']} at {b['t_s']} s, avg@k {b['avg_at_k']:.4f} "
            f"({b['gain_points']:+.2f} points); time to target {rep['time_to_target']['interpolated_s']}"
        )
    print(f"gain within the budget over seeds (points): {report['gain_within_budget']}")


def run_seeds(args: argparse.Namespace, base: Sequence[str], work: Path) -> dict[int, dict]:
    """One ``stream-dapo run`` per seed, each stopped once a checkpoint past the budget exists
    (unless ``--no-stop``)."""
    sides: dict[int, dict] = {}
    for seed in args.seeds:
        print(
            f"seed {seed}: up to {args.steps} steps, checkpoints every {args.checkpoint_every} ...",
            flush=True,
        )
        (work / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
        sides[seed] = run_stream_dapo(
            args.config,
            [*base, f"learner.seed={seed}", f"generator.seed={seed}"],
            work / f"seed-{seed}",
            args.steps,
            args.checkpoint_every,
            stop_after_s=None if args.no_stop else args.budget_s,
        )
        print(f"seed {seed} done in {sides[seed]['wall_s']:.0f} s", flush=True)
    return sides


def collected_side(seed_dir: Path) -> dict:
    """A seed's run from a work directory of an earlier call (``--evaluate-work``)."""
    launch_file = seed_dir / "launch.json"
    if not launch_file.is_file():
        raise SystemExit(
            f"{launch_file} is missing: --evaluate-work needs the launch time each run recorded there "
            '(write {"launch": <unix seconds>} by hand if the run came from elsewhere)'
        )
    launch = float(json.loads(launch_file.read_text())["launch"])
    out = seed_dir / "stream-dapo"
    summary = json.loads((out / "summary.json").read_text())
    return collect_stream_dapo(out, launch, launch + float(summary.get("wall_seconds", 0.0)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps of each run")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=40, help="score checkpoints at multiples of this")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="seconds of training")
    parser.add_argument("--target-delta", type=float, default=0.15, help="target = start avg@k + this")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="keep run directories here")
    parser.add_argument(
        "--no-stop", action="store_true", help="run all --steps instead of stopping past the budget"
    )
    parser.add_argument(
        "--evaluate-work",
        type=Path,
        default=None,
        metavar="DIR",
        help="train nothing: score the runs an earlier --work DIR holds (seed-N/ for each --seeds)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.eval_every % args.checkpoint_every:
        parser.error("--eval-every must be a multiple of --checkpoint-every")

    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config([args.config], args.overrides)
    model = str(ensure_warm_model(cfg).resolve())
    base = [*args.overrides, f"model.path={model}"]  # run_stream_dapo keeps every checkpoint
    work_ctx = None
    if args.evaluate_work is not None:
        work = args.evaluate_work
    elif args.work is None:
        work_ctx = tempfile.TemporaryDirectory(prefix="longcot_learning.")
        work = Path(work_ctx.name)
    else:
        work = args.work
    try:
        sides = (
            {seed: collected_side(work / f"seed-{seed}") for seed in args.seeds}
            if args.evaluate_work is not None
            else run_seeds(args, base, work)
        )
        chosen = [
            side["checkpoints"][s]
            for side in sides.values()
            for s in steps_to_score(
                side["step_time"], list(side["checkpoints"]), side["launch"], args.budget_s, args.eval_every
            )
        ]
        evals = evaluate_checkpoints(args.config, base, chosen, work / "evals.json", seed=args.eval_seed)
    finally:
        if work_ctx:
            work_ctx.cleanup()
    start = evals["start"]
    target = start["avg_at_k"] + args.target_delta
    report: dict[str, Any] = {
        "what": "eval avg@k of the long-CoT recipe against seconds of training, per training seed",
        "machine": machine_info(),
        "cores": os.cpu_count(),
        "git": git_state(),
        "config": str(args.config.resolve().relative_to(REPO)),
        "overrides": args.overrides,
        "steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "eval_every": args.eval_every,
        "budget_s": args.budget_s,
        "eval_seed": args.eval_seed,
        "stopped_past_budget": not args.no_stop,
        "evaluated_from_work": str(args.evaluate_work) if args.evaluate_work else None,
        "eval_before": start,
        "target_avg_at_k": target,
        "seeds": {
            str(s): seed_report(side, evals, start, args.budget_s, target) for s, side in sides.items()
        },
    }
    report["gain_within_budget"] = spread([r["at_budget"]["gain_points"] for r in report["seeds"].values()])
    save_json(args.json, report)
    print_report(report)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

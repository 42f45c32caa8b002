"""Time to a target eval accuracy: `stream-dapo run` in async mode vs `--mode sync`, same config and seed.

    python bench/async_sync_ttt.py [--steps 60] [--eval-every 4] [--target-delta 0.10] [--seed 0]
                                   [--out docs/results/async_sync_ttt.json]

Both modes train the same warm model for the same number of optimizer steps with checkpoints every
`--eval-every` steps (the runs themselves do no evaluation). Afterwards one vLLM engine evaluates
the start model and every checkpoint with the project's evaluation (avg@k, as in `stream-dapo run`),
outside the timed windows — the method of bench/peer_trl.py, whose functions this reuses. A curve
point is the wall time, from launching `stream-dapo run`, at which optimizer step v finished; time
to target interpolates between the checkpoints either side of the first crossing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from peer_trl import (  # noqa: E402
    SENSITIVITY_DELTAS,
    build_curve,
    evaluate_checkpoints,
    git_state,
    resolve_target,
    run_stream_dapo,
    side_report,
    speed_ratio,
    time_to_target,
)

from bench.report import save_json  # noqa: E402
from stream_dapo.config import load_config  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "tiny-cpu.toml"
DEFAULT_OUT = REPO / "docs" / "results" / "async_sync_ttt.json"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--target-delta", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config([args.config])
    model = str(ensure_warm_model(cfg).resolve())
    base = [f"model.path={model}", f"learner.seed={args.seed}", f"generator.seed={args.seed}"]
    sides = {}
    with tempfile.TemporaryDirectory(prefix="async_sync_ttt.") as tmp:
        for mode in ("async", "sync"):
            print(f"{mode}: {args.steps} steps, checkpoints every {args.eval_every} ...", flush=True)
            sides[mode] = run_stream_dapo(
                args.config, [*base, f'run.mode="{mode}"'], Path(tmp) / mode, args.steps, args.eval_every
            )
            print(f"{mode} done in {sides[mode]['wall_s']:.0f} s", flush=True)
        checkpoints = [d for side in sides.values() for d in side["checkpoints"].values()]
        evals = evaluate_checkpoints(args.config, base, checkpoints, Path(tmp) / "evals.json", seed=0)
    start = evals["start"]
    target = resolve_target(start["avg_at_k"], None, args.target_delta)
    report = {
        "what": "wall-clock time from launch to a target eval avg@k: stream-dapo async vs --mode sync",
        "cores": os.cpu_count(),
        "git": git_state(),
        "config": str(args.config.resolve().relative_to(REPO)),
        "steps_each": args.steps,
        "eval_every": args.eval_every,
        "seed": args.seed,
        "eval_before": start,
        "target_avg_at_k": target,
        "sides": {},
    }
    curves = {}
    for mode, side in sides.items():
        curves[mode] = build_curve(side, evals, start)
        rep = side_report(side, curves[mode], target)
        rep["summary"] = {
            k: side["summary"].get(k)
            for k in ("groups_trained", "groups_dropped_stale", "max_staleness_trained", "samples_generated")
        }
        report["sides"][mode] = rep
    a = report["sides"]["async"]["time_to_target"]["interpolated_s"]
    s = report["sides"]["sync"]["time_to_target"]["interpolated_s"]
    report["ratio_sync_over_async"] = speed_ratio(s, a)
    report["target_sensitivity"] = [
        {
            "delta": delta,
            "target": start["avg_at_k"] + delta,
            **{
                f"{m}_s": time_to_target(c, start["avg_at_k"] + delta)["interpolated_s"]
                for m, c in curves.items()
            },
        }
        for delta in SENSITIVITY_DELTAS
    ]
    for row in report["target_sensitivity"]:
        row["ratio_sync_over_async"] = speed_ratio(row["sync_s"], row["async_s"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_json(args.out, report)
    for mode, rep in report["sides"].items():
        last = rep["curve"][-1]
        print(
            f"{mode:5s} time to avg@k >= {target:.3f}: {rep['time_to_target']['interpolated_s']} s; "
            f"step {last['step']} avg@k {last['avg_at_k']:.3f} at {last['t_s']:.0f} s"
        )
    for row in report["target_sensitivity"]:
        print(f"target {row['target']:.3f}: async {row['async_s']} s, sync {row['sync_s']} s")
    print(f"sync / async time to target: {report['ratio_sync_over_async']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The planner against reality: `stream-dapo plan`'s prediction beside what a finished run measured.

    python bench/plan_vs_run.py RUN_DIR [RUN_DIR ...] [--json docs/results/plan_vs_run.json]

For each run directory of `stream-dapo run` (its resolved `config.toml`, `learner/metrics.jsonl`,
the launcher's `metrics.jsonl`, `summary.json` and the generators' final metrics under
`final-metrics/`), the rates the planner takes are measured from the run itself:

- generator tokens/s: response tokens generated / (training seconds - seconds spent loading
  weights), per replica. This is the run's average, not the engine-full rate the planner asks for:
  where credits or the admission line starved the engine, it understates that rate;
- learner tokens/s: tokens trained / seconds the learner had data (waits for a batch and weight
  publications excluded; the proximal pass, packing and checkpoints included), which is what
  `stream-dapo plan --from-prometheus` measures;
- mean response length (all generated responses), prompt length (trained tokens that are not loss
  tokens, per sample), the kept fraction of dynamic sampling, and the mean weight load time.

The planner's model (`stream_dapo.planner.plan`) is fed those rates and the run's recipe, and its
prediction is printed next to the measurement:

- seconds per optimizer step (steady part: from the learner's first step to its last);
- learner utilisation: 1 - (waits for a batch) / wall seconds of that span (and, for reference,
  the share spent inside optimizer steps);
- mean token staleness at the gradient step (token-weighted, from the learner's staleness counts);
- kept groups waiting in the buffer (the launcher's 5-second samples, mean over the same span).

What it does not show: variance (the planner is a fluid model of averages), or the rates under
another load (measure the run alone: under contention both sides slow down differently).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.report import save_json  # noqa: E402
from stream_dapo.config import load_config  # noqa: E402
from stream_dapo.planner import Rates, Recipe, plan  # noqa: E402

GEN = "stream_dapo_generator_"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _generator_totals(run_dir: Path) -> dict[str, float]:
    keys = (
        "tokens_total",
        "weight_sync_seconds_sum",
        "weight_sync_seconds_count",
        "response_length_tokens_sum",
        "response_length_tokens_count",
    )
    totals = dict.fromkeys(keys, 0.0)
    files = sorted((run_dir / "final-metrics").glob("generator-*.json"))
    if not files:
        raise SystemExit(f"{run_dir}: no final-metrics/generator-*.json; is it a finished `stream-dapo run`?")
    for file in files:
        values = json.loads(file.read_text())
        for key in keys:
            totals[key] += float(values.get(GEN + key, 0.0))
    totals["replicas"] = float(len(files))
    return totals


def _learner_tps(steps: list[dict[str, Any]], per_rollout: int) -> float:
    """Tokens trained per second the learner had data (as the planner's Prometheus measurement):
    wall time from the first step's end to the last's, less the waits for a batch (one per rollout
    batch, repeated on its steps) and the weight publications."""
    span = steps[-1]["elapsed_s"] - steps[0]["elapsed_s"]
    later = steps[1:]
    waiting = sum(r["batch_wait_seconds"] for r in later) / per_rollout
    publishing = sum(r.get("weight_sync_seconds") or 0.0 for r in later)
    return sum(r["tokens"] for r in later) / max(span - waiting - publishing, 1e-9)


def measure(run_dir: Path) -> dict[str, Any]:
    """Rates and outcomes of one finished run, as the module docstring defines them."""
    cfg = load_config([run_dir / "config.toml"])
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = _rows(run_dir / "learner" / "metrics.jsonl")
    launcher = _rows(run_dir / "metrics.jsonl")
    gen = _generator_totals(run_dir)
    if len(steps) < 3:
        raise SystemExit(f"{run_dir}: only {len(steps)} learner steps; the comparison needs a few")
    train_s = float(summary["train_seconds"])
    replicas = gen["replicas"]
    load_s = gen["weight_sync_seconds_sum"] / replicas
    kept = summary["groups_accepted"]
    filtered = summary["groups_filtered"]
    rates = Rates(
        gen_tps=gen["tokens_total"] / replicas / max(train_s - load_s, 1e-9),
        learn_tps=_learner_tps(steps, cfg.admission.steps_per_rollout),
        mean_response_len=gen["response_length_tokens_sum"] / gen["response_length_tokens_count"],
        prompt_len=sum(r["tokens"] - r["loss_tokens"] for r in steps) / sum(r["samples"] for r in steps),
        keep_fraction=kept / (kept + filtered) if cfg.algo.dynamic_sampling else 1.0,
        weight_sync_s=gen["weight_sync_seconds_sum"] / max(gen["weight_sync_seconds_count"], 1.0),
    )
    # Steady span: from the end of the first optimizer step to the end of the last.
    first, last = steps[0], steps[-1]
    span = last["elapsed_s"] - first["elapsed_s"]
    inside = sum(r["step_seconds"] for r in steps[1:])
    stale_tokens: dict[int, int] = {}
    for r in steps:
        for value, count in r["staleness_counts"].items():
            stale_tokens[int(value)] = stale_tokens.get(int(value), 0) + int(count)
    total_tokens = sum(stale_tokens.values())
    t0 = launcher[0]["t"]
    start_t = next((r["t"] for r in launcher if r["step"] >= 1), t0)
    queued = [r["buffer_waiting"] for r in launcher if r["t"] >= start_t and r["step"] < last["version"]]
    waiting = sum(r["batch_wait_seconds"] for r in steps[1:]) / cfg.admission.steps_per_rollout
    measured = {
        "step_s": span / (len(steps) - 1),
        "learner_busy": 1.0 - waiting / span,
        "learner_inside_steps": inside / span,
        "staleness_mean": sum(v * c for v, c in stale_tokens.items()) / max(total_tokens, 1),
        "staleness_max": max(stale_tokens) if stale_tokens else 0,
        "waiting_groups": statistics.fmean(queued) if queued else 0.0,
    }
    p = plan(Recipe.from_config(cfg), rates)
    predicted = {
        "step_s": p.step_s,
        "learner_busy": p.learner_busy,
        "staleness_mean": p.staleness.total,
        "waiting_groups": p.waiting_groups,
        "bottleneck": p.bottleneck,
        "generators_busy": p.generators_busy,
        "staleness_parts": {
            "weight_lag": p.staleness.weight_lag,
            "in_flight": p.staleness.in_flight,
            "queue": p.staleness.queue,
            "batch_position": p.staleness.batch_position,
        },
    }
    return {
        "run_dir": str(run_dir),
        "mode": summary.get("mode"),
        "learner_steps": len(steps),
        "rates": rates.__dict__,
        "measured": measured,
        "predicted": predicted,
    }


def print_report(result: dict[str, Any]) -> None:
    r, m, p = result["rates"], result["measured"], result["predicted"]
    print(f"== {result['run_dir']} ({result['mode']}, {result['learner_steps']} learner steps)")
    print(
        f"  rates: gen {r['gen_tps']:.0f} tok/s/replica, learner {r['learn_tps']:.0f} tok/s, response "
        f"{r['mean_response_len']:.0f} tok, prompt {r['prompt_len']:.0f} tok, kept {r['keep_fraction']:.2f}, "
        f"weight load {r['weight_sync_s']:.3f} s"
    )
    print(f"  {'':22s} {'predicted':>10s} {'measured':>10s} {'off by':>8s}")
    for key, label in (
        ("step_s", "s per optimizer step"),
        ("learner_busy", "learner utilisation"),
        ("staleness_mean", "mean staleness"),
        ("waiting_groups", "groups waiting"),
    ):
        pred, meas = p[key], m[key]
        off = f"{(pred - meas) / meas:+.0%}" if meas else "n/a"
        print(f"  {label:22s} {pred:10.3f} {meas:10.3f} {off:>8s}")
    parts = ", ".join(f"{k} {v:.2f}" for k, v in p["staleness_parts"].items())
    print(
        f"  predicted bottleneck: {p['bottleneck']}; staleness parts: {parts}; measured max {m['staleness_max']}"
    )
    print(f"  measured: share of wall time inside optimizer steps {m['learner_inside_steps']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    for run_dir in args.run_dirs:
        result = measure(run_dir)
        print_report(result)
        results.append(result)
    if args.json:
        save_json(args.json, {"runs": results})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

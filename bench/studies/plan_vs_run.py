"""The planner against reality: `stream-dapo plan`'s prediction beside what a finished run measured.

    python -m bench.studies.plan_vs_run RUN_DIR [RUN_DIR ...] [--gen-scaling A[@TPS] ...] [--gen-tps X]
        [--json docs/results/plan_vs_run.json]

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
  tokens, per sample), the kept fraction of dynamic sampling, the mean weight load time, and the
  token age (a token's wait for its group's longest response, from the generators' counters; 0.5,
  the planner's default, for runs from before they existed).

The planner's model (`stream_dapo.tools.plan.plan`) is fed those rates and the run's recipe, once per
--gen-scaling (the engine-scaling exponent a of `stream-dapo plan`: a number, gpu or cpu;
repeatable; default gpu, a = 1, the planner's default), and each prediction is printed next to the
measurement. The planner asks for a full engine's tokens/s, and the run's average is lower where
the engine held fewer groups or idled: `A@TPS` feeds TPS (e.g. from bench/perf/engine_scaling.py at
generator.max_groups_in_flight groups) for that prediction, and --gen-tps feeds it to all that do
not name one.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from stream_dapo.config import load_config  # noqa: E402
from stream_dapo.tools.plan import ENGINE_SCALING, Rates, Recipe, plan, token_age_from_counts  # noqa: E402

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
        "group_tail_tokens_total",
        "group_longest_tokens_sum",
        "group_longest_tokens_count",
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


def _variant(text: str) -> tuple[float, float | None]:
    """--gen-scaling A[@TPS]: the exponent (a number or a name of ENGINE_SCALING), and the
    full-engine tokens/s to feed with it (None: --gen-tps, else the run's average)."""
    scaling, _, tps = text.partition("@")
    try:
        a = ENGINE_SCALING[scaling] if scaling in ENGINE_SCALING else float(scaling)
        return a, float(tps) if tps else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write A or A@TPS, A a number in [0, 1] or one of {', '.join(ENGINE_SCALING)}"
        ) from None


def predict(recipe: Recipe, rates: Rates) -> dict[str, Any]:
    """The planner's figures for the run's recipe and rates."""
    p = plan(recipe, rates)
    return {
        "gen_scaling": rates.gen_scaling,
        "gen_tps": rates.gen_tps,
        "step_s": p.step_s,
        "learner_busy": p.learner_busy,
        "staleness_mean": p.staleness.total,
        "waiting_groups": p.waiting_groups,
        "bottleneck": p.bottleneck,
        "generators_busy": p.generators_busy,
        "engine_groups": p.engine_groups,
        "in_flight_groups": p.in_flight_groups,
        "group_s": p.group_s,
        "learner_s": p.learner_s,
        "line_s": p.line_s,
        "staleness_parts": {
            "weight_lag": p.staleness.weight_lag,
            "in_flight": p.staleness.in_flight,
            "queue": p.staleness.queue,
            "batch_position": p.staleness.batch_position,
        },
    }


def measure(
    run_dir: Path,
    variants: tuple[tuple[float, float | None], ...] = ((1.0, None),),
    token_age: float | None = None,
) -> dict[str, Any]:
    """Rates and outcomes of one finished run, as the module docstring defines them, and the
    planner's prediction for each (engine scaling, full-engine tokens/s or None for the run's
    average) of `variants`; `token_age` replaces the run's measured one."""
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
        # Runs from before the generators counted it take the planner's default (equal lengths).
        token_age=token_age_from_counts(
            gen["group_tail_tokens_total"],
            gen["response_length_tokens_sum"],
            gen["group_longest_tokens_sum"],
            gen["group_longest_tokens_count"],
        )
        if gen["group_longest_tokens_count"]
        else Rates.token_age,
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
    if token_age is not None:
        rates = replace(rates, token_age=token_age)
    recipe = Recipe.from_config(cfg)
    predicted = [
        predict(recipe, replace(rates, gen_scaling=a, gen_tps=rates.gen_tps if tps is None else tps))
        for a, tps in variants
    ]
    return {
        "run_dir": str(run_dir),
        "mode": summary.get("mode"),
        "learner_steps": len(steps),
        "rates": rates.__dict__,
        "measured": measured,
        "predicted": predicted,
    }


def print_report(result: dict[str, Any]) -> None:
    r, m, preds = result["rates"], result["measured"], result["predicted"]
    print(f"== {result['run_dir']} ({result['mode']}, {result['learner_steps']} learner steps)")
    print(
        f"  rates: gen {r['gen_tps']:.0f} tok/s/replica (run average), learner {r['learn_tps']:.0f} tok/s, "
        f"response {r['mean_response_len']:.0f} tok, prompt {r['prompt_len']:.0f} tok, kept "
        f"{r['keep_fraction']:.2f}, weight load {r['weight_sync_s']:.3f} s, token age {r['token_age']:.3f}"
    )
    heads = "".join(
        f"{'a ' + format(p['gen_scaling'], 'g') + ' @ ' + format(p['gen_tps'], '.0f'):>20s}" for p in preds
    )
    print(f"  {'':22s} {'measured':>10s}{heads}")
    for key, label in (
        ("step_s", "s per optimizer step"),
        ("learner_busy", "learner utilisation"),
        ("staleness_mean", "mean staleness"),
        ("waiting_groups", "groups waiting"),
    ):
        meas = m[key]
        cells = "".join(
            f"{p[key]:10.3f} ({(p[key] - meas) / meas:+5.0%})" if meas else f"{p[key]:10.3f}   n/a  "
            for p in preds
        )
        print(f"  {label:22s} {meas:10.3f}  {cells}")
    for p in preds:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p["staleness_parts"].items())
        print(
            f"  a {p['gen_scaling']:g} @ {p['gen_tps']:.0f} tok/s: bottleneck {p['bottleneck']}; {p['engine_groups']:.1f} groups per "
            f"engine, D {p['group_s']:.2f} s, {p['in_flight_groups']:.1f} in flight; t_L {p['learner_s']:.2f} s, "
            f"t_line {p['line_s']:.2f} s; staleness parts: {parts}"
        )
    print(
        f"  measured: max staleness {m['staleness_max']}; share of wall time inside optimizer steps "
        f"{m['learner_inside_steps']:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument(
        "--gen-scaling",
        type=_variant,
        action="append",
        metavar="A[@TPS]",
        help="engine-scaling exponent (a number, gpu or cpu) to predict with, and optionally the "
        "full-engine tokens/s to feed with it (repeatable; default gpu = 1 at the run's average rate)",
    )
    parser.add_argument(
        "--gen-tps",
        type=float,
        default=None,
        help="full-engine tokens/s to feed instead of the run's average",
    )
    parser.add_argument(
        "--token-age",
        type=float,
        default=None,
        help="token age rho to feed instead of the run's measured one (0.5: the planner's assumption "
        "before the generators counted it)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    variants = tuple(
        (a, args.gen_tps if tps is None else tps)
        for a, tps in args.gen_scaling or [(ENGINE_SCALING["gpu"], None)]
    )
    results = []
    for run_dir in args.run_dirs:
        result = measure(run_dir, variants, token_age=args.token_age)
        print_report(result)
        results.append(result)
    if args.json:
        command = "python -m bench.studies.plan_vs_run " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        save_json(args.json, {"command": command, "runs": results})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

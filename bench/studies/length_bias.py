"""Does the staleness bound bias training toward short responses? Two finished runs side by side.

    python -m bench.studies.length_bias RUN_DIR [RUN_DIR ...] [--json FILE]

Each RUN_DIR is a finished `stream-dapo run` (or one `stream-dapo ablate` cell): its summary.json,
config.toml and learner/metrics.jsonl, and eval_after.json when there is one. The runs to compare
are the same recipe, seed and step budget with `buffer.in_flight_hold_s` off and on, made with

    stream-dapo ablate --config configs/tiny-longcot-cpu.toml --presets naive-grpo --seeds 1 \\
        --budget 120 --out OUT [--set buffer.in_flight_hold_s=0]

Per run it prints: the hold setting; groups dropped stale at the dequeue gate and batch requests
the buffer held; the truncation rate and mean response length of what the learner trained (per
step, weighted by samples) against what the generators produced (per rollout window, weighted by
groups) — the gap between the two is the length bias; the share of training wall time the learner
waited for a rollout batch; trained samples per second; and the final eval avg@k.

What it does not show: variation over seeds (pass one run per seed and compare the spread), or
whether the trained policy's lengths differ because of the bias rather than the sampling noise
between two runs.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import bench_parser, fmt, markdown_table, save_json  # noqa: E402


def weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Sum of value x weight over the sum of weights (None when the weights sum to 0)."""
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def run_figures(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run (see the module docstring)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    config = tomllib.loads((run_dir / "config.toml").read_text())
    learner = config.get("learner", {})
    group_size = config.get("algo", {}).get("group_size", 8)
    steps_per_rollout = max(
        1, learner.get("rollout_batch_prompts", 16) * group_size // learner.get("mini_batch_samples", 64)
    )
    lines = (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()
    rows = [row for row in map(json.loads, lines) if "samples" in row and "version" in row]  # steps only
    if not rows:
        raise SystemExit(f"{run_dir}/learner/metrics.jsonl has no step rows: the run trained nothing")
    # The steps of one rollout batch repeat its window's figures: take each batch's first step.
    windows = [r for r in rows if (r["version"] - 1) % steps_per_rollout == 0]
    train_s = float(summary.get("train_seconds") or 0.0)
    wait_s = sum(float(r.get("batch_wait_seconds") or 0.0) for r in windows)
    eval_path = run_dir / "eval_after.json"
    after = json.loads(eval_path.read_text()) if eval_path.is_file() else {}
    return {
        "run": str(run_dir),
        "in_flight_hold_s": config.get("buffer", {}).get("in_flight_hold_s", 0.0),
        "learner_steps": summary.get("learner_steps"),
        "groups_accepted": summary.get("groups_accepted"),
        "groups_dropped_stale": summary.get("groups_dropped_stale"),
        "learner_holds": summary.get("learner_holds", 0),
        "trained_truncation": weighted_mean([(r["truncation_rate"], r["samples"]) for r in rows]),
        "generated_truncation": weighted_mean(
            [(r["gen_truncation_rate"], r["gen_groups"]) for r in windows if r.get("gen_groups")]
        ),
        "trained_len": weighted_mean([(r["response_len_mean"], r["samples"]) for r in rows]),
        "generated_len": weighted_mean(
            [(r["gen_response_len_mean"], r["gen_groups"]) for r in windows if r.get("gen_groups")]
        ),
        "learner_wait_share": wait_s / train_s if train_s else None,
        "train_seconds": train_s,
        "trained_samples_per_s": sum(r["samples"] for r in rows) / train_s if train_s else None,
        "eval_avg_at_k": after.get("avg_at_k", after.get("avg@k")),
    }


def table(figures: Sequence[Mapping[str, Any]]) -> str:
    headers = [
        "run",
        "hold s",
        "dropped stale / accepted",
        "holds",
        "truncated: trained / generated",
        "mean length: trained / generated",
        "learner waiting",
        "trained samples/s",
        "eval avg@k",
    ]
    rows = [
        [
            f["run"],
            fmt(f["in_flight_hold_s"], 0),
            f"{f['groups_dropped_stale']} / {f['groups_accepted']}",
            f["learner_holds"],
            f"{fmt(100 * f['trained_truncation'], 2)}% / {fmt(100 * f['generated_truncation'], 2)}%",
            f"{fmt(f['trained_len'], 0)} / {fmt(f['generated_len'], 0)}",
            f"{fmt(100 * f['learner_wait_share'], 1)}%",
            fmt(f["trained_samples_per_s"], 2),
            fmt(f["eval_avg_at_k"], 4),
        ]
        for f in figures
    ]
    return markdown_table(headers, rows)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run (or ablate cell) directories")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    missing = [str(r) for r in args.runs if not (r / "summary.json").is_file()]
    if missing:
        raise SystemExit(f"no summary.json in {', '.join(missing)}: pass finished run directories")
    figures = [run_figures(r) for r in args.runs]
    print(table(figures))
    save_json(args.json, {"runs": figures})


if __name__ == "__main__":
    main()

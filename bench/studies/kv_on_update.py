"""What a weight update does to the samples in flight: ``generator.kv_on_update`` measured end to end.

    python -m bench.studies.kv_on_update [--config configs/tiny-longcot-cpu.toml] [--steps 24] [--seeds 0]
        [--repeats 1] [--eval] [--json FILE]

Runs `stream-dapo run` (async, no evaluation during the run) once per mode, seed and repeat, the
modes' order rotated per repeat, on the same config and step budget:

- ``recompute``: swap at once, running samples recompute their KV with the new weights;
- ``keep``: swap at once, running samples keep the KV the old weights made;
- ``between-groups``: no new group while an update waits; swap once the in-flight groups finished.

Per run it prints: generated tokens per second of training wall time; the context tokens the KV
resets made the engine prefill again, as a share of the generated tokens; the seconds updates
waited for in-flight groups (between-groups); per-token staleness at the gradient step (mean, p50,
p95, max, from the learner's metrics rows); the share of generated samples whose tokens more than one
weight version sampled; training wall time; and with ``--eval`` the final policy's eval
avg@k (`stream-dapo eval`, the config's eval settings), so the modes compare after equal steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from bench.perf.async_vs_sync import generator_totals, run_once  # noqa: E402
from bench.report import bench_parser, machine_info, markdown_table, median, save_json  # noqa: E402

MODES = ("recompute", "keep", "between-groups")


def quantile(counts: Mapping[int, int], q: float) -> int:
    """The smallest value v with at least a fraction q of the counted items at or below it."""
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no items counted")
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return value
    return max(counts)


def token_staleness(run_dir: Path) -> dict[int, int]:
    """Response tokens trained, by staleness (learner version minus the version that sampled them),
    summed over the learner's metrics rows; the rows' -1 entry (no version) is left out."""
    counts: dict[int, int] = {}
    for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, n in (row.get("staleness_counts") or {}).items():
            if int(key) >= 0:
                counts[int(key)] = counts.get(int(key), 0) + int(n)
    return counts


def evaluate(run_dir: Path) -> dict:
    argv = [sys.executable, "-m", "stream_dapo.cli", "eval", "--config", str(run_dir / "config.toml")]
    argv += ["--model", str(run_dir / "final")]
    proc = subprocess.run(argv, check=True, cwd=REPO, capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figures(run_dir: Path, summary: dict) -> dict:
    from stream_dapo.runtime.metrics import GeneratorMetrics, catalogue, sample_name

    names = catalogue(GeneratorMetrics)
    gen = generator_totals(run_dir)
    tokens = gen.get(sample_name(names.tokens), 0.0)
    samples = gen.get(sample_name(names.samples), 0.0)
    stale = token_staleness(run_dir)
    return {
        "train_seconds": summary["train_seconds"],
        "learner_steps": summary["learner_steps"],
        "generator_tokens_per_second": round(tokens / summary["train_seconds"], 1),
        "generated_samples_per_second": summary["samples_per_second"],
        "recompute_tokens": gen.get(sample_name(names.tokens_recomputed), 0.0),
        "recompute_share_of_generated": round(gen.get(sample_name(names.tokens_recomputed), 0.0) / tokens, 4)
        if tokens
        else None,
        "weight_hold_seconds": round(gen.get(sample_name(names.weight_hold_seconds), 0.0), 1),
        "multi_version_share": round(gen.get(sample_name(names.multi_version_samples), 0.0) / samples, 4)
        if samples
        else None,
        "staleness_mean": round(sum(v * n for v, n in stale.items()) / sum(stale.values()), 3),
        "staleness_p50": quantile(stale, 0.5),
        "staleness_p95": quantile(stale, 0.95),
        "staleness_max": max(stale),
        "weight_updates": summary["generator_weight_updates"],
        "groups_dropped_stale": summary["groups_dropped_stale"],
    }


def measure(config: Path, steps: int, seeds: Sequence[int], repeats: int, with_eval: bool) -> dict:
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    model = ensure_warm_model(load_config([config])).resolve()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for seed in seeds:
                shift = (r + seed) % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    out = Path(tmp) / f"{mode}-{r}-{seed}"
                    s = run_once(
                        "async", steps, config, model, out, seed, [f'generator.kv_on_update="{mode}"']
                    )
                    row = {"mode": mode, "repeat": r, "seed": seed, **figures(out, s)}
                    if with_eval:
                        e = evaluate(out)
                        row["eval_avg_at_k"], row["eval_k"] = e["avg_at_k"], e["k"]
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    return {"config": str(config), "steps": steps, "seeds": list(seeds), "repeats": repeats, "runs": runs}


def table(result: dict) -> str:
    keys = [
        ("generator_tokens_per_second", "gen tok/s"),
        ("recompute_share_of_generated", "recompute / generated"),
        ("weight_hold_seconds", "hold s"),
        ("staleness_mean", "stale mean"),
        ("staleness_p50", "stale p50"),
        ("staleness_p95", "stale p95"),
        ("staleness_max", "stale max"),
        ("multi_version_share", "multi-version samples"),
        ("train_seconds", "train s"),
        ("eval_avg_at_k", "eval avg@k"),
    ]
    rows = []
    for mode in MODES:
        mine = [r for r in result["runs"] if r["mode"] == mode]
        cells: list[object] = [mode, len(mine)]
        for key, _ in keys:
            values = [r[key] for r in mine if r.get(key) is not None]
            if not values:
                cells.append("-")
            elif len(values) == 1:
                cells.append(values[0])
            else:
                cells.append(f"{median(values):g} [{min(values):g}, {max(values):g}]")
        rows.append(cells)
    return markdown_table(
        ["mode", "runs", *[name for _, name in keys]], rows, align="l" + "r" * (len(keys) + 1)
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-longcot-cpu.toml")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="generator.seed values")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--eval", action="store_true", help="evaluate each run's final policy")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds, args.repeats, args.eval = 2, [0], 1, False
    result = measure(args.config, args.steps, args.seeds, args.repeats, args.eval)
    result["machine"] = machine_info()
    print(table(result))
    print("cells: one run's figure, or the median [min, max] over runs")
    save_json(args.json, result)


if __name__ == "__main__":
    main()

"""Off-policy corrections where staleness is real (issue 40, item 3): token TIS, the geometric sequence
mask, IcePop and GSPO on the long-CoT recipe, 3 seeds each, one command, resumable.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.offpolicy --dry-run
    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.offpolicy \
        [--arms token-tis,geo-mask,icepop,gspo] [--seeds 3] [--budget 60] [--bf16 | --bf16-only] \
        [--bf16-seeds N] [--out runs/offpolicy] [--json docs/results/offpolicy.json] [--md docs/results/offpolicy.md] \
        [--report-only] [--set key=value ...]

The cells are `stream-dapo ablate` cells (`stream_dapo.tools.ablate`): the arms are the off-policy
preset family (`stream_dapo.core.presets.OFFPOLICY_PRESETS`), every (arm, seed) is one
`stream-dapo run` in ``OUT/<dtype>/<arm>/seed-N`` with the same optimizer-step budget, its final policy
evaluated with the ablation's eval (avg@k and pass@k on the recipe's eval prompts), and a cell whose
record matches its fingerprint (resolved config + starting model) is reused, so the same command
continues an interrupted study. ``--dry-run`` prints every cell's command, which are done, and the
estimated CPU time, and runs nothing. ``--report-only`` trains nothing and writes the pages from the
cells already done.

Settings, on ``configs/tiny-longcot-cpu.toml`` (``STALENESS_OVERRIDES``), and why. On the 2-core
machine this recipe is generator-bound: the learner waited for data 31-59% of the time in the long-CoT
ablation (docs/results/length_bias.md), so the buffer's admission line rarely fills and a larger
``algo.max_staleness`` alone would not make groups older; staleness there sat at 2-3 versions under a
bound of 4. What makes it bind here is how often the generators get new weights:

- ``learner.sync_every = 4``: weights are published every 4 optimizer steps, so a generator samples
  with weights 0-3 versions behind the learner before a token even waits (the weight lag of every
  fleet whose sync is expensive);
- ``algo.max_staleness = 8``: with 2 optimizer steps per rollout batch (S) and the lag (e - 1 = 3),
  the admission line is (8 - 2 - 3 + 1) x 4 = 16 groups (`stream_dapo.core.admission`), one full
  engine (``generator.max_groups_in_flight`` = 16): the generator may run a whole engine ahead of
  the learner, and a token's staleness is its lag (0-3) + the versions its group spends in the
  engine (2-4 measured on this recipe) + its mini-batch's place in the rollout batch (0-1), so the
  longest groups reach the bound of 8;
- the buffer's in-flight hold (``buffer.in_flight_hold_s``, default 300 s) stays on: the learner
  waits for a long group rather than letting it go past the bound and dropping it.

The staleness distribution per cell is in the report (share of tokens per staleness, mean, p95, the
share at the bound); check it before reading the arms' differences. The budget (``--budget``, default
60 optimizer steps = 30 rollout batches) is where the recipe learns: it gained +10 eval points within 24
steps (docs/operations.md, async vs sync) and 0.535 -> 0.835 in 20 minutes (bench/studies/longcot_learning.py).

Arms (each sets every key any arm changes): token-tis (today's default, min(pi_prox/mu, 2) per token),
geo-mask (SkyRL's geometric sequence mask [0.99, 1.01]: ``is_level = geometric``, ``is_mode = mask``,
``is_cap = 1.01``, whose band [1/C, C] is [0.9901, 1.01]), icepop (tokens outside [0.5, 5] masked) and
gspo (``ratio_level = sequence``, ``agg_mode = seq-mean-token-mean``, clip 3e-4 / 4e-4).

bf16 (``--bf16`` adds every arm again in bfloat16, ``--bf16-only`` runs only those): the learner runs
``model.dtype = bfloat16`` on the CPU (DeepSpeed's CPU accelerator, gloo) at ``learner.zero_stage >= 1``
(ZeRO-1 keeps fp32 master weights and accumulates gradients in fp32); at stage 0 it refuses to start
(``BF16_FINDING``). The bf16 cells therefore also set ``learner.zero_stage = 1``, and their generators
and evaluation run vLLM in bf16 too: mu and pi then differ by numerics as well as staleness
(docs/results/logprob_precision.md: mean |log pi_prox - log mu| 4e-3 to 6e-3 at equal weights).

Per arm x seed the report gives: eval avg@k and pass@k after training (and the warm model's), entropy
(first and last quarter of the steps), the masked token share and the behaviour weight's mean and max
(``masked_frac``, ``is_weight_mean``, ``is_weight_max``), the sequence-ratio spread, clip fractions,
k3 KL(behaviour -> current), learner seconds per step and training wall seconds per step, the staleness
distribution, and groups dropped stale / learner holds. Per arm: mean +- sample std over seeds of each,
and avg@k paired by seed against token-tis. Outputs: ``--json`` and ``--md`` (rendered from the
JSON), ablate's own ``OUT/<dtype>/ablation.{md,json}`` and ``OUT/<dtype>/plots/`` (ablate's curves and
this study's: entropy, masked share, weight mean, staleness, seconds per step).

What it does not show: GPU numerics (bf16 here is the CPU's kernels), a model with a large vocabulary,
a trained (peakier) policy, another machine's speed (steps took 3.5 to 17 s on this recipe by machine),
or the eval's own noise (about +-4 points at 100 prompts x 4 samples).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import fmt, machine_info, markdown_table, save_json  # noqa: E402
from stream_dapo.core.presets import OFFPOLICY_PRESETS  # noqa: E402
from stream_dapo.tools.ablate import (  # noqa: E402
    CELL_RECORD,
    Plan,
    PlannedCell,
    Spread,
    curve_window_means,
    mean_curve,
    planned_cells,
    spread,
    to_json,
)

DEFAULT_CONFIG = REPO / "configs" / "tiny-longcot-cpu.toml"
DEFAULT_OUT = REPO / "runs" / "offpolicy"
DEFAULT_JSON = REPO / "docs" / "results" / "offpolicy.json"
DEFAULT_MD = REPO / "docs" / "results" / "offpolicy.md"
BASELINE = "token-tis"
STALENESS_OVERRIDES = ("algo.max_staleness=8", "learner.sync_every=4")
"""Added to the recipe for every cell; the module docstring says why."""
PRECISIONS: dict[str, tuple[str, ...]] = {
    "float32": (),
    "bfloat16": ('model.dtype="bfloat16"', "learner.zero_stage=1"),
}
"""dtype -> the overrides its cells add (bf16 needs ZeRO-1 for fp32 gradient accumulation)."""
BF16_FINDING = (
    "The learner trains model.dtype = bfloat16 on the CPU (DeepSpeed CPU accelerator, gloo) at "
    "learner.zero_stage = 1: one process, the tiny Qwen2 model, 2 steps took ~10 s with finite loss "
    "and grad norm (DeepSpeed's BF16_Optimizer, fp32 master weights); the RMSNorm weights (1.0) did not "
    "move in the bf16 copy after 2 steps of lr 1e-3 x warm-up 1/3, below bf16's resolution at 1.0, while "
    "the fp32 master weights take the update. At zero_stage = 0 `stream-dapo run` refuses before "
    "starting anything (exit 2), as the learner would: 'model.dtype=bfloat16 at learner.zero_stage=0 "
    "would accumulate gradients in bf16 across micro-batches; set learner.zero_stage=1 (or higher) for "
    "fp32 accumulation and master weights, or model.dtype=float32' (the config itself loads: evaluate "
    "and the generators serve bf16 at any stage)."
)
STUDY_CURVES: dict[str, str] = {
    "entropy": "policy entropy (nats/token)",
    "masked_frac": "masked token share (behaviour weight 0)",
    "is_weight_mean": "behaviour weight mean",
    "staleness_mean": "mean token staleness (versions)",
    "step_seconds": "learner seconds per optimizer step",
}
"""Per-step curves this study plots (learner/metrics.jsonl keys; staleness_mean from staleness_counts)."""

# Seconds for --dry-run's estimate where no finished cell of this plan says better: the long-CoT
# recipe's start-up before step 1 (55-108 s), a step (3.5-17 s by machine; 6.9 s on the recipe's
# reference run), one evaluation of 100 prompts x 4 samples, and the warm-up of the start model.
ESTIMATE_SECONDS = {"startup": 90.0, "step": 8.0, "eval": 120.0}
WARMUP_MINUTES = (22, 50)

_MEAN_KEYS = ("masked_frac", "is_weight_mean", "approx_kl_behaviour", "step_seconds", "entropy")


# --------------------------------------------------------------------------------------------------
# One cell's figures (pure: files in, numbers out)
# --------------------------------------------------------------------------------------------------


def step_rows(metrics_jsonl: Path) -> list[dict[str, Any]]:
    """The learner's step rows, one per optimizer step in step order; the last row of a step wins
    (a resumed learner rewrites its tail); event rows (checkpoints) are left out."""
    rows: dict[int, dict[str, Any]] = {}
    for line in metrics_jsonl.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if "version" in row and "samples" in row:
            rows[int(row["version"])] = row
    return [rows[v] for v in sorted(rows)]


def staleness_stats(counts: Mapping[int, int], bound: int) -> dict[str, Any]:
    """A token histogram {staleness: tokens} as shares per value, mean, p50, p95 (the smallest value
    with at least that share of tokens at or below it), max and the share at the bound or above."""
    total = sum(counts.values())
    if not total:
        return {
            "tokens": 0,
            "shares": {},
            "mean": None,
            "p50": None,
            "p95": None,
            "max": None,
            "at_bound": None,
        }

    from stream_dapo.runtime.tracking import staleness_quantiles

    q = staleness_quantiles(counts)
    return {
        "tokens": total,
        "shares": {str(v): counts[v] / total for v in sorted(counts)},
        "mean": sum(v * c for v, c in counts.items()) / total,
        "p50": int(q["staleness_p50"]),
        "p95": int(q["staleness_p95"]),
        "max": max(counts),
        "at_bound": sum(c for v, c in counts.items() if v >= bound) / total,
    }


def cell_figures(cell_dir: Path, max_staleness: int) -> dict[str, Any]:
    """One finished cell's figures (the module docstring lists them) from its summary.json,
    eval_after.json and learner/metrics.jsonl; per-step means weigh every step alike."""
    rows = step_rows(cell_dir / "learner" / "metrics.jsonl")
    summary = json.loads((cell_dir / "summary.json").read_text())
    after = json.loads((cell_dir / "eval_after.json").read_text())
    counts: Counter[int] = Counter()
    for row in rows:
        counts.update({int(k): int(v) for k, v in (row.get("staleness_counts") or {}).items()})

    def values(key: str) -> list[float]:
        return [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]

    def mean(key: str) -> float | None:
        return statistics.fmean(values(key)) if values(key) else None

    steps = summary.get("learner_steps") or len(rows)
    train_s = summary.get("train_seconds")
    clip = [float(r["clip_frac_low"]) + float(r["clip_frac_high"]) for r in rows if "clip_frac_low" in r]
    return {
        "avg_at_k": after.get("avg_at_k"),
        "pass_at_k": after.get("pass_at_k"),
        "eval_truncation_rate": after.get("truncation_rate"),
        "steps": len(rows),
        "entropy_first_last": curve_window_means({int(r["version"]): float(r["entropy"]) for r in rows}),
        **{key: mean(key) for key in _MEAN_KEYS},
        "masked_frac_max": max(values("masked_frac"), default=None),
        "is_weight_max": max(values("is_weight_max"), default=None),
        "seq_ratio_min": min(values("seq_ratio_min"), default=None),
        "seq_ratio_max": max(values("seq_ratio_max"), default=None),
        "clip_frac": statistics.fmean(clip) if clip else None,
        "train_seconds_per_step": train_s / steps if train_s and steps else None,
        "staleness": staleness_stats(counts, max_staleness),
        "groups_dropped_stale": summary.get("groups_dropped_stale"),
        "learner_holds": summary.get("learner_holds"),
        "samples_generated": summary.get("samples_generated"),
    }


def cell_curves(cell_dir: Path) -> dict[str, dict[int, float]]:
    """STUDY_CURVES per optimizer step of one cell."""
    curves: dict[str, dict[int, float]] = {k: {} for k in STUDY_CURVES}
    for row in step_rows(cell_dir / "learner" / "metrics.jsonl"):
        step = int(row["version"])
        counts = {int(k): int(v) for k, v in (row.get("staleness_counts") or {}).items()}
        if counts:
            curves["staleness_mean"][step] = sum(k * v for k, v in counts.items()) / sum(counts.values())
        for key in STUDY_CURVES:
            if isinstance(row.get(key), int | float):
                curves[key][step] = float(row[key])
    return curves


# --------------------------------------------------------------------------------------------------
# Over seeds
# --------------------------------------------------------------------------------------------------

_SPREAD_FIGURES = (
    "avg_at_k",
    "pass_at_k",
    "eval_truncation_rate",
    *_MEAN_KEYS,
    "masked_frac_max",
    "is_weight_max",
    "seq_ratio_min",
    "seq_ratio_max",
    "clip_frac",
    "train_seconds_per_step",
    "groups_dropped_stale",
    "learner_holds",
    "samples_generated",
)


@dataclass
class StudyCell:
    """One finished (dtype, arm, seed) cell: its figures and per-step curves."""

    dtype: str
    arm: str
    seed: int
    figures: dict[str, Any]
    curves: dict[str, dict[int, float]]


def arm_summary(cells: Sequence[StudyCell], baseline: Sequence[StudyCell] | None) -> dict[str, Any]:
    """One arm's row: mean +- std over seeds of every figure, the entropy and staleness summaries,
    avg@k paired by seed against the baseline arm's cells (None for the baseline itself), and the
    mean curves."""
    figs = [c.figures for c in cells]
    row: dict[str, Any] = {"seeds": sorted(c.seed for c in cells)}
    row.update({key: spread([f[key] for f in figs if f.get(key) is not None]) for key in _SPREAD_FIGURES})
    for part in ("first", "last"):
        row[f"entropy_{part}"] = spread(
            [f["entropy_first_last"][part] for f in figs if f["entropy_first_last"]]
        )
    for key in ("mean", "p95", "max", "at_bound"):
        row[f"staleness_{key}"] = spread(
            [f["staleness"][key] for f in figs if f["staleness"][key] is not None]
        )
    # Each seed's token share per staleness value, averaged over seeds (every seed weighs alike).
    pooled: dict[str, float] = {}
    for f in figs:
        for value, share in f["staleness"]["shares"].items():
            pooled[value] = pooled.get(value, 0.0) + share / len(figs)
    row["staleness_shares"] = dict(sorted(pooled.items(), key=lambda kv: int(kv[0])))
    if baseline is None:
        row["delta_avg_at_k_vs_baseline"] = None
    else:
        mine = {c.seed: c.figures["avg_at_k"] for c in cells}
        base = {c.seed: c.figures["avg_at_k"] for c in baseline}
        row["delta_avg_at_k_vs_baseline"] = spread([mine[s] - base[s] for s in sorted(set(mine) & set(base))])
    row["curves"] = {m: mean_curve([c.curves.get(m, {}) for c in cells]) for m in STUDY_CURVES}
    return row


def summarise(cells: Sequence[StudyCell], arms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """dtype -> arm -> `arm_summary`, arms in the given order; Δ avg@k against the baseline arm."""
    out: dict[str, dict[str, Any]] = {}
    for dtype in dict.fromkeys(c.dtype for c in cells):
        by_arm = {a: [c for c in cells if c.dtype == dtype and c.arm == a] for a in arms}
        baseline = by_arm.get(BASELINE, [])
        out[dtype] = {
            a: arm_summary(mine, None if a == BASELINE else baseline) for a, mine in by_arm.items() if mine
        }
    return out


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------


def _s(value: Spread | Mapping[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    """mean ± std (std only with two seeds or more), scaled, `digits` significant digits."""
    if value is None:
        return "—"
    s = value if isinstance(value, Spread) else Spread(**value)
    text = fmt(scale * s.mean, digits)
    return text + (f" ± {fmt(scale * s.std, 2)}" if s.std is not None else "")


def _seeds_text(settings: Mapping[str, Any]) -> str:
    """The seeds, per dtype where the dtypes ran different seeds (``--bf16-seeds``)."""
    by_dtype = settings.get("seeds_by_dtype") or {}
    if len({tuple(v) for v in by_dtype.values()}) > 1:
        return ", ".join(f"{v} in {d}" for d, v in by_dtype.items())
    return str(settings["seeds"])


def render(report: Mapping[str, Any]) -> str:
    """docs/results/offpolicy.md from the report (offpolicy.json)."""
    s = report["settings"]
    lines = [
        "# Off-policy corrections where staleness is real (issue 40)",
        "",
        f"Arms {', '.join(s['arms'])} on `{s['config']}` with `{' '.join(s['overrides'])}`; seeds "
        f"{_seeds_text(s)}; {s['budget']} optimizer steps per cell; dtypes {', '.join(s['dtypes'])}. Admission line "
        f"{s['admission']['capacity']} groups (S = {s['admission']['steps_per_rollout']} steps per rollout batch, "
        f"weight lag {s['admission']['weight_lag']}, bound {s['admission']['max_staleness']}). Made with:",
        "",
        f"    {report['command']}",
        "",
    ]
    if not report["cells"]:
        lines += [
            "**Not run yet.** This page is rendered from the study's JSON; the command above fills it. "
            "`--dry-run` lists the cells and the estimated CPU time first.",
            "",
        ]
    for dtype, arms in report["arms"].items():
        lines += _dtype_section(dtype, arms, report["eval_before"].get(dtype) or {})
    if report["cells"]:
        lines += _seed_section(report["cells"])
    lines += [
        "",
        "## bf16 on the CPU",
        "",
        report["bf16_finding"],
        "",
        "## How to read it",
        "",
        "- Masked share: the share of response tokens whose behaviour weight is 0 (masked by geo-mask's or "
        "IcePop's band; 0 for truncation), mean over steps. Weight mean and max: the behaviour weight w "
        "over trained tokens (mean of the per-step means, max of the per-step maxima).",
        "- Staleness: learner version at the gradient step minus the token's behaviour version, over every "
        "trained token; 'at bound' is the share at algo.max_staleness. If it is near 0, staleness did not "
        "bind and the arms differ by their clipping only.",
        "- s/step (learner) is the learner's own step; s/step (wall) is training wall time over steps, "
        "waiting for data included. Δ avg@k is paired by seed against token-tis; ± is the sample std over "
        "seeds; the eval's own noise is about ±4 points at 100 prompts × 4 samples.",
    ]
    return "\n".join(lines) + "\n"


def _dtype_section(dtype: str, arms: Mapping[str, Any], before: Mapping[str, Any]) -> list[str]:
    start = (
        f" Warm model before RL: avg@k {fmt(100 * before['avg_at_k'])}%, pass@k {fmt(100 * before['pass_at_k'])}%."
        if "avg_at_k" in before
        else ""
    )
    headers = [
        "arm",
        "avg@k (%)",
        "Δ avg@k vs token-tis (pts)",
        "pass@k (%)",
        "entropy first → last",
        "masked share (%)",
        "weight mean / max",
        "clip frac (%)",
        "s/step learner / wall",
        "staleness mean / p95 / at bound (%)",
        "dropped stale",
        "seeds",
    ]
    rows = [
        [
            arm,
            _s(r["avg_at_k"], 100),
            _s(r["delta_avg_at_k_vs_baseline"], 100),
            _s(r["pass_at_k"], 100),
            f"{_s(r['entropy_first'])} → {_s(r['entropy_last'])}",
            _s(r["masked_frac"], 100),
            f"{_s(r['is_weight_mean'], digits=4)} / {_s(r['is_weight_max'])}",
            _s(r["clip_frac"], 100),
            f"{_s(r['step_seconds'])} / {_s(r['train_seconds_per_step'])}",
            f"{_s(r['staleness_mean'])} / {_s(r['staleness_p95'])} / {_s(r['staleness_at_bound'], 100)}",
            _s(r["groups_dropped_stale"]),
            len(r["seeds"]),
        ]
        for arm, r in arms.items()
    ]
    values = sorted({int(v) for r in arms.values() for v in r["staleness_shares"]})
    shares = [
        [arm, *(fmt(100 * r["staleness_shares"].get(str(v), 0.0), 2) for v in values)]
        for arm, r in arms.items()
    ]
    return [
        f"## {dtype}",
        "",
        f"Mean ± std over seeds.{start}",
        "",
        markdown_table(headers, rows),
        "",
        "Token share (%) per staleness (versions), mean over seeds:",
        "",
        markdown_table(["arm", *map(str, values)], shares) if values else "(no tokens)",
        "",
    ]


def _seed_section(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    headers = ["dtype", "arm", "seed", "avg@k (%)", "masked share (%)", "weight max", "staleness mean / max",
               "s/step wall"]  # fmt: skip
    rows = []
    for c in cells:
        f = c["figures"]
        st = f["staleness"]
        rows.append(
            [
                c["dtype"],
                c["arm"],
                c["seed"],
                fmt(100 * f["avg_at_k"]) if f.get("avg_at_k") is not None else "—",
                fmt(100 * f["masked_frac"]) if f.get("masked_frac") is not None else "—",
                fmt(f.get("is_weight_max")),
                f"{fmt(st['mean'])} / {st['max']}",
                fmt(f.get("train_seconds_per_step")),
            ]
        )
    return ["## Per seed", "", markdown_table(headers, rows, "lllrrrrr"), ""]


# --------------------------------------------------------------------------------------------------
# Plans, the estimate, running
# --------------------------------------------------------------------------------------------------


def make_plans(args: argparse.Namespace) -> dict[str, Plan]:
    """dtype -> the ablate Plan of its cells (one output folder per dtype)."""
    from stream_dapo.config import load_config

    dtypes = ["bfloat16"] if args.bf16_only else ["float32", "bfloat16"] if args.bf16 else ["float32"]
    plans = {}
    for dtype in dtypes:
        overrides = [*STALENESS_OVERRIDES, *PRECISIONS[dtype], *args.overrides]
        base = load_config([args.config], overrides)
        plans[dtype] = Plan(
            config_files=[str(args.config)],
            overrides=overrides,
            presets=list(args.arms),
            seeds=list(range(args.bf16_seeds if dtype == "bfloat16" and args.bf16_seeds else args.seeds)),
            budget=args.budget,
            out=args.out / dtype,
            group_size=base.algo.group_size,
        )
    return plans


def estimate_seconds(
    cells: Sequence[PlannedCell], budget: int, finished_wall: Sequence[float]
) -> dict[str, Any]:
    """CPU seconds the cells still to run should take: the mean wall time of this plan's finished
    cells when there are some, else start-up + budget x a step + an evaluation (ESTIMATE_SECONDS)."""
    todo = sum(not c.done for c in cells)
    if finished_wall:
        per_cell, source = statistics.fmean(finished_wall), f"mean of {len(finished_wall)} finished cells"
    else:
        e = ESTIMATE_SECONDS
        per_cell = e["startup"] + budget * e["step"] + e["eval"]
        source = f"{e['startup']:.0f} s start-up + {budget} steps x {e['step']} s + {e['eval']:.0f} s eval"
    return {
        "cells": len(cells),
        "to_run": todo,
        "per_cell_s": per_cell,
        "source": source,
        "total_s": todo * per_cell,
    }


def _finished_wall(cells: Sequence[PlannedCell]) -> list[float]:
    walls = []
    for c in cells:
        if c.done:
            wall = json.loads((c.cell_dir / CELL_RECORD).read_text()).get("wall_seconds")
            if isinstance(wall, int | float):
                walls.append(float(wall))
    return walls


def dry_run(plans: Mapping[str, Plan]) -> None:
    """Print what the study would run, and its estimated CPU time; run and write nothing."""
    from stream_dapo.config import load_config

    total = 0.0
    for dtype, plan in plans.items():
        cfg = load_config(plan.config_files, plan.overrides)
        rule = cfg.admission
        print(
            f"== {dtype}: {plan.out}; admission line {rule.capacity} groups (S {rule.steps_per_rollout}, "
            f"weight lag {rule.weight_lag}, max_staleness {rule.max_staleness}); model {cfg.model.path}"
        )
        cells = planned_cells(plan)
        for i, cell in enumerate(cells, 1):
            state = "done, reused" if cell.done else "to run"
            print(f"[{i}/{len(cells)}] {cell.preset} seed {cell.seed} ({state})\n    {shlex.join(cell.argv)}")
        est = estimate_seconds(cells, plan.budget, _finished_wall(cells))
        total += est["total_s"]
        print(
            f"{est['cells']} cells, {est['to_run']} to run, ~{est['per_cell_s'] / 60:.0f} min each "
            f"({est['source']}), + ~{ESTIMATE_SECONDS['eval'] / 60:.0f} min for the warm model's eval"
        )
        total += ESTIMATE_SECONDS["eval"]
        if not (Path(cfg.model.path) / "config.json").is_file():
            print(
                f"no model at {cfg.model.path} yet: the first step builds it (`stream-dapo warmup`, "
                f"{WARMUP_MINUTES[0]}-{WARMUP_MINUTES[1]} min of CPU, not counted below)"
            )
    print(f"estimated total: ~{total / 3600:.1f} h of CPU (the study expects the 2 cores to itself)")


def collect(plans: Mapping[str, Plan], done: Mapping[str, Sequence[tuple[str, int]]]) -> list[StudyCell]:
    """The study's view of the finished cells: figures and curves read from their folders."""
    cells = []
    for dtype, plan in plans.items():
        bound = int(next(o for o in plan.overrides if o.startswith("algo.max_staleness=")).split("=")[1])
        for arm, seed in done[dtype]:
            cell_dir = plan.cell_dir(arm, seed)
            cells.append(StudyCell(dtype, arm, seed, cell_figures(cell_dir, bound), cell_curves(cell_dir)))
    return cells


def build_report(
    args: argparse.Namespace,
    plans: Mapping[str, Plan],
    befores: Mapping[str, Any],
    cells: Sequence[StudyCell],
) -> dict[str, Any]:
    from stream_dapo.config import load_config

    first = next(iter(plans.values()))
    rule = load_config(first.config_files, first.overrides).admission
    return {
        "what": "off-policy corrections on the long-CoT recipe with a staleness bound that binds (issue 40)",
        "command": shlex.join(["python", "-m", "bench.studies.offpolicy", *sys.argv[1:]]),
        "machine": machine_info(),
        "settings": {
            "config": str(Path(args.config).resolve().relative_to(REPO)),
            "overrides": [*STALENESS_OVERRIDES, *args.overrides],
            "arms": list(args.arms),
            "arm_overrides": {a: OFFPOLICY_PRESETS[a] for a in args.arms},
            "seeds": first.seeds,
            "seeds_by_dtype": {d: p.seeds for d, p in plans.items()},
            "budget": first.budget,
            "dtypes": list(plans),
            "dtype_overrides": {d: list(PRECISIONS[d]) for d in plans},
            "admission": {
                "capacity": rule.capacity,
                "steps_per_rollout": rule.steps_per_rollout,
                "weight_lag": rule.weight_lag,
                "max_staleness": rule.max_staleness,
            },
        },
        "bf16_finding": BF16_FINDING,
        "eval_before": dict(befores),
        "arms": summarise(cells, list(args.arms)),
        "cells": [{"dtype": c.dtype, "arm": c.arm, "seed": c.seed, "figures": c.figures} for c in cells],
    }


def write_pages(args: argparse.Namespace, report: Mapping[str, Any]) -> None:
    payload = to_json(report)
    save_json(args.json, payload)
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(render(payload))


def plot(plans: Mapping[str, Plan], report: Mapping[str, Any]) -> None:
    from stream_dapo.tools.ablate import plot_curves

    for dtype, rows in report["arms"].items():
        _, why_not = plot_curves(rows, plans[dtype].out / "plots", STUDY_CURVES)
        if why_not:
            print(f"plots skipped: {why_not}")


def run_study(args: argparse.Namespace, plans: Mapping[str, Plan]) -> None:
    """Every cell to its end (finished ones reused), the pages written after each cell."""
    from stream_dapo.tools.ablate import build_report as ablation_report
    from stream_dapo.tools.ablate import evaluate_before, freeze_base_config, run_cell, write_report

    befores: dict[str, Any] = {}
    done: dict[str, list[tuple[str, int]]] = {d: [] for d in plans}
    for dtype, plan in plans.items():
        plan.out.mkdir(parents=True, exist_ok=True)
        freeze_base_config(plan)
        befores[dtype] = evaluate_before(plan)
        results = []
        for seed in plan.seeds:  # seed-major: a partial study is a table
            for arm in plan.presets:
                results.append(cell := run_cell(plan, arm, seed))
                print(f"{dtype} {arm} seed {seed}: {cell.status}", flush=True)
                if cell.status != "failed":
                    done[dtype].append((arm, seed))
                write_report(plan.out, ablation_report(plan, befores[dtype], results))
                write_pages(args, build_report(args, plans, befores, collect(plans, done)))
    report = build_report(args, plans, befores, collect(plans, done))
    plot(plans, report)
    write_pages(args, report)


def report_only(args: argparse.Namespace, plans: Mapping[str, Plan]) -> None:
    from stream_dapo.tools.ablate import done_cells

    befores, done = {}, {}
    for dtype, plan in plans.items():
        befores[dtype], finished, missing = done_cells(plan)
        done[dtype] = [(c.preset, c.seed) for c in finished]
        print(f"{dtype}: {len(finished)} cells done" + (f"; missing {missing}" if missing else ""))
    report = build_report(args, plans, befores, collect(plans, done))
    plot(plans, report)
    write_pages(args, report)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--arms", default=",".join(OFFPOLICY_PRESETS), help="comma-separated, token-tis first"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default: 3)")
    parser.add_argument("--budget", type=int, default=60, help="optimizer steps per cell (default: 60)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", help="every arm in float32 and again in bfloat16")
    precision.add_argument("--bf16-only", action="store_true", help="every arm in bfloat16 only")
    parser.add_argument(
        "--bf16-seeds",
        type=int,
        default=None,
        help="seeds 0..N-1 of the bfloat16 cells (default: --seeds)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="cells go to OUT/<dtype>/<arm>/seed-N")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--md", type=Path, default=DEFAULT_MD)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the cells and the estimate; run nothing")
    mode.add_argument(
        "--report-only", action="store_true", help="train nothing: the pages from finished cells"
    )
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in OFFPOLICY_PRESETS]
    if unknown or not args.arms or args.arms[0] != BASELINE:
        parser.error(
            f"--arms: {BASELINE} first, then any of {', '.join(OFFPOLICY_PRESETS)} (got {args.arms})"
        )
    if args.seeds < 1 or args.budget < 1 or (args.bf16_seeds is not None and args.bf16_seeds < 1):
        parser.error("--seeds, --bf16-seeds and --budget must be >= 1")
    if args.bf16_seeds is not None and not (args.bf16 or args.bf16_only):
        parser.error("--bf16-seeds needs --bf16 or --bf16-only")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plans = make_plans(args)
    if args.dry_run:
        dry_run(plans)
    elif args.report_only:
        report_only(args, plans)
    else:
        run_study(args, plans)
        print(f"wrote {args.json} and {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

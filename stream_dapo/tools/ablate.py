"""`stream-dapo ablate`: the DAPO paper's Table 1 ladder, run at this config's scale.

Every (preset, seed) cell is one `stream-dapo run` child with the same optimizer-step budget and the
same seeds; the table reports what was measured, including where the toy scale disagrees with the
paper's direction::

    stream-dapo ablate --seeds 3 --budget 40 --out runs/ablation
    stream-dapo ablate --presets naive-grpo,dapo --seeds 1 --set learner.lr=2e-4

What a cell is:

- the preset's five switches are passed as explicit ``--set`` overrides next to ``algo.preset``: a
  preset only fills keys nobody set, and a recipe file such as tiny-cpu.toml sets all five, so
  ``algo.preset`` alone would leave most rows running the file's DAPO switches;
- ``generator.seed`` and ``learner.seed`` are the cell's seed. ``data.seed`` is not: it also draws
  the synthetic task and its eval split, and every preset and seed must train on the same problems
  and be evaluated on the same eval set (the prompt order therefore is the same for every seed);
- equal budget means equal ``learner.total_steps`` (optimizer steps); dynamic sampling generates
  more samples per step, so samples generated are reported next to accuracy.

The config files and ``--set`` overrides are resolved once per call into ``OUT/base-config.toml``,
which every child reads: editing a recipe file while an ablation runs does not change its cells.
The warm model is evaluated once (``OUT/eval-before``); each cell runs without the launcher's
evaluation and its final policy is evaluated after training (``OUT/PRESET/seed-N/eval_after.json``).
A cell whose record (``ablation_cell.json``, written last) matches the resolved config and the
model is skipped, so an interrupted ablation continues where it stopped. ``--report-only`` trains
and evaluates nothing: it writes the table and plots of the cells already done (a partial ladder
stopped between sessions) and names the missing ones.

Outputs: ``OUT/ablation.md`` (the table, each step against the paper's, what a step costs in
generated samples and how many steps and seconds the training reward takes to reach a target, and
each curve's first and last quarter in numbers), ``OUT/ablation.json`` (every number) and
``OUT/plots/*.png`` (one per CURVE_METRICS key per optimizer step, mean over seeds; needs the
``bench`` extra's matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from stream_dapo.config import Config, SftConfig, config_to_toml, load_config
from stream_dapo.core.presets import PAPER_AIME, PRESETS, preset_overrides
from stream_dapo.runtime.exit_codes import ExitCode

log = logging.getLogger("stream_dapo.tools.ablate")

__all__ = [
    "CURVE_METRICS",
    "SPARSE_CURVES",
    "CellResult",
    "CurvePoint",
    "Spread",
    "add_arguments",
    "aggregate",
    "cell_is_done",
    "cell_overrides",
    "run_child",
    "config_fingerprint",
    "curve_window_means",
    "describe_changes",
    "time_to_target",
    "direction",
    "eval_fingerprint",
    "mean_curve",
    "window_means",
    "plot_curves",
    "preset_changes",
    "read_curves",
    "render_markdown",
    "run",
    "spread",
]

CURVE_METRICS: dict[str, str] = {
    "accuracy": "training-batch accuracy",
    "entropy": "policy entropy (nats/token)",
    "response_len_mean": "training-batch response length (tokens)",
    "truncation_rate": "training-batch truncation rate",
    "gen_accuracy": "generated samples' accuracy, all groups (training reward)",
    "gen_truncation_rate": "generated samples' truncation rate, all groups",
    "gen_response_len_mean": "generated samples' response length (tokens), all groups",
    "truncated_in_loss_share": "truncated samples trained with A != 0 (the overlong reward noise)",
    "clip_frac_low": "token share clipped below (A < 0, r < 1 - eps_low)",
    "clip_frac_high": "token share clipped above (A > 0, r > 1 + eps_high)",
    "clip_high_prob_mean": "mean probability of the up-clipped tokens (DAPO Fig. 3a)",
    "gen_filtered_share_all_correct": "generated groups all correct (DAPO Fig. 3b)",
    "gen_filtered_share_all_wrong": "generated groups all wrong",
}
"""learner/metrics.jsonl key -> plot title, one PNG each."""

TARGET_METRIC = "gen_accuracy"
"""The curve the steps/seconds-to-target figures read: every generated group counts, so it is the
same statistic with and without dynamic sampling (the trained batches' accuracy is not)."""
TARGET_WINDOW = 10
"""Trailing points averaged before comparing with the target (one point per rollout window)."""

CELL_RECORD = "ablation_cell.json"
# What does not change what a cell computes: where it listens and logs, and where it writes.
_UNCOMPARED_SECTIONS = ("transport", "metrics")
_NEUTRAL_SETTINGS: dict[tuple[str, str], Any] = {
    ("buffer", "in_flight_hold_s"): 0.0,
    ("warmup", "track_every"): 0,  # tracking never changes the warm weights; off, it is not even timed
    ("warmup", "track_prompts"): 32,
    ("warmup", "reference_min_greedy"): 0.0,  # no floor: one round of the reference phase, as before
    ("warmup", "reference_max_rounds"): 3,
    # The off-policy corrections of issue 40; their defaults are the loss as it was.
    ("algo", "is_level"): "token",
    ("algo", "icepop_low"): 0.5,
    ("algo", "icepop_high"): 5.0,
    ("algo", "ratio_level"): "token",
    ("algo", "surrogate"): "clip",
    # Issue 37's real-model path: off, the model and data are what they were.
    ("model", "source"): None,
    ("data", "gsm_symbolic"): None,
    **{("sft", key): value for key, value in SftConfig().model_dump(mode="json").items()},
}
"""Settings added after cells were first fingerprinted, with the value that behaves as the code did
before they existed. At that value a setting is left out of the fingerprint, so cells recorded
before it existed still match (`--set buffer.in_flight_hold_s=0` resumes them); at any other value
it counts, so cells that ran with and without it never share a table."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per preset (default: 3)")
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="STEPS",
        help="optimizer steps per run, the same for every preset (default: learner.total_steps)",
    )
    parser.add_argument(
        "--presets",
        default=",".join(PRESETS),
        help=f"comma-separated presets, in table order (default: all: {','.join(PRESETS)})",
    )
    parser.add_argument("--out", default="runs/ablation", help="output directory (default: runs/ablation)")
    parser.add_argument(
        "--target-delta",
        type=float,
        default=0.05,
        metavar="D",
        help="steps/seconds-to-target figures: the training reward (gen_accuracy) reaching the warm "
        "model's eval avg@k + D (default: 0.05)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the table and plots of the cells already done in --out",
    )


# --------------------------------------------------------------------------------------------------
# Pure parts: presets, fingerprints, aggregation, curves, the table
# --------------------------------------------------------------------------------------------------


def preset_changes(name: str) -> dict[str, tuple[object, object]]:
    """What preset ``name`` changes relative to the row above it: key -> (before, after).

    The first row (the baseline) changes nothing.
    """
    current = preset_overrides(name)  # raises for an unknown name
    names = list(PRESETS)
    index = names.index(name)
    if index == 0:
        return {}
    previous = PRESETS[names[index - 1]]
    return {k: (previous.get(k), v) for k, v in current.items() if previous.get(k) != v}


def describe_changes(name: str) -> str:
    changes = preset_changes(name)
    if not changes:
        return "baseline: " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in PRESETS[name].items())
    return ", ".join(f"{k.split('.')[-1]} {a} → {b}" for k, (a, b) in changes.items())


def _toml_value(value: object) -> str:
    # JSON scalars are TOML scalars: true/false, numbers, double-quoted strings.
    return json.dumps(value)


def cell_overrides(preset: str, seed: int, budget: int, cell_dir: Path) -> list[str]:
    """The ``--set`` overrides that make a cell: preset switches (explicitly), seeds, budget, out_dir."""
    sets = [f"algo.preset={_toml_value(preset)}"]
    sets += [f"{k}={_toml_value(v)}" for k, v in preset_overrides(preset).items()]
    sets += [
        f"generator.seed={seed}",
        f"learner.seed={seed}",
        f"learner.total_steps={budget}",
        f"run.out_dir={_toml_value(str(cell_dir))}",
        "run.eval_before_after=false",  # the ablation evaluates: once before, each cell after
    ]
    return sets


def config_fingerprint(cfg: Config, model_key: str | None) -> str:
    """Hash of what determines a cell's result: the resolved config (less ports, metrics and
    run.out_dir) and the identity of the starting model."""
    data = cfg.model_dump(mode="json")
    for section in _UNCOMPARED_SECTIONS:
        data.pop(section, None)
    data["run"].pop("out_dir", None)
    for (section, key), neutral in _NEUTRAL_SETTINGS.items():
        values = data.get(section)
        if values is not None and values.get(key, neutral) == neutral:
            values.pop(key, None)
            if not values:  # a section added later, at its neutral values throughout
                data.pop(section)
    payload = json.dumps({"config": data, "model": model_key}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cell_is_done(cell_dir: Path, fingerprint: str) -> bool:
    """True when the cell finished (summary, eval, record) with this fingerprint."""
    try:
        record = json.loads((cell_dir / CELL_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return (
        record.get("fingerprint") == fingerprint
        and (cell_dir / "summary.json").is_file()
        and (cell_dir / "eval_after.json").is_file()
    )


@dataclass(frozen=True)
class Spread:
    """Mean and spread of one figure over seeds. std is the sample std (n - 1); None for n < 2."""

    mean: float
    std: float | None
    lo: float
    hi: float
    n: int


def spread(values: Sequence[float]) -> Spread | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None
    std = statistics.stdev(vals) if len(vals) > 1 else None
    return Spread(mean=statistics.fmean(vals), std=std, lo=min(vals), hi=max(vals), n=len(vals))


@dataclass
class CellResult:
    """One (preset, seed) run as the report needs it."""

    preset: str
    seed: int
    status: str
    """done (ran now), reused (finished earlier), failed."""
    eval_after: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    """metric -> {optimizer step: value} from learner/metrics.jsonl."""
    error: str | None = None
    wall_seconds: float | None = None


def read_curves(metrics_jsonl: Path) -> dict[str, dict[int, float]]:
    """CURVE_METRICS per step, and ``wall_time`` (the row's Unix time); the last row of a step wins
    (a resumed learner rewrites its tail)."""
    curves: dict[str, dict[int, float]] = {k: {} for k in (*CURVE_METRICS, "wall_time")}
    if not metrics_jsonl.is_file():
        return curves
    for line in metrics_jsonl.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for key, points in curves.items():
            if isinstance(row.get(key), int | float):
                points[int(row["version"])] = float(row[key])
    return curves


@dataclass(frozen=True)
class CurvePoint:
    step: int
    mean: float
    lo: float
    hi: float


SPARSE_CURVES = {"truncated_in_loss_share": TARGET_WINDOW, "clip_high_prob_mean": TARGET_WINDOW}
"""Curves a step records only when it has something to measure (a truncated sample trained, a
token clipped above), so seeds seldom share a step: each seed's points are first averaged over
windows of this many steps, then over seeds."""


def window_means(curve: Mapping[int, float], width: int) -> dict[int, float]:
    """Mean of ``curve``'s points in each window of ``width`` steps, keyed by the window's last step
    (steps 1..width -> width, width+1..2 width -> 2 width, ...); windows without a point are absent."""
    bins: dict[int, list[float]] = {}
    for step, value in curve.items():
        bins.setdefault(-(-step // width) * width, []).append(value)
    return {end: statistics.fmean(values) for end, values in sorted(bins.items())}


def mean_curve(per_seed: Sequence[Mapping[int, float]], window: int | None = None) -> list[CurvePoint]:
    """Mean (and min/max band) over seeds at each step that every seed recorded; with ``window``,
    over the windows of that many steps that every seed has a point in (`window_means`)."""
    curves = [c for c in per_seed if c]
    if window:
        curves = [window_means(c, window) for c in curves]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    out = []
    for step in steps:
        values = [c[step] for c in curves]
        out.append(CurvePoint(step, statistics.fmean(values), min(values), max(values)))
    return out


def curve_window_means(curve: Mapping[int, float]) -> dict[str, float] | None:
    """Mean of one seed's curve over its first and its last quarter of recorded steps (at least one
    step each): where a trend over training shows without reading a plot. None for an empty curve."""
    steps = sorted(curve)
    if not steps:
        return None
    n = max(1, len(steps) // 4)
    return {
        "first": statistics.fmean(curve[s] for s in steps[:n]),
        "last": statistics.fmean(curve[s] for s in steps[-n:]),
    }


def time_to_target(
    curve: Mapping[int, float],
    wall_time: Mapping[int, float],
    target: float,
    train_seconds: float | None,
    window: int = TARGET_WINDOW,
) -> dict[str, float | None] | None:
    """The first optimizer step at which the mean of the last ``window`` recorded points of
    ``curve`` reaches ``target``, and the seconds from the run's start to that step's row (the run
    started ``train_seconds`` before its last row; without it, counted from the first row). None
    if the curve never gets there."""
    steps = sorted(curve)
    for i in range(window - 1, len(steps)):
        if statistics.fmean(curve[s] for s in steps[i - window + 1 : i + 1]) >= target:
            step = steps[i]
            if step not in wall_time:
                return {"step": step, "seconds": None}
            start = max(wall_time.values()) - train_seconds if train_seconds else min(wall_time.values())
            return {"step": step, "seconds": wall_time[step] - start}
    return None


def _paired_delta(cells_a: Sequence[CellResult], cells_b: Sequence[CellResult]) -> Spread | None:
    """avg@k of b minus a, paired by seed (common seeds only)."""
    a = {c.seed: c.eval_after["avg_at_k"] for c in cells_a if c.eval_after}
    b = {c.seed: c.eval_after["avg_at_k"] for c in cells_b if c.eval_after}
    return spread([b[s] - a[s] for s in sorted(set(a) & set(b))])


def _cell_figure(cell: CellResult, source: str, key: str) -> float | None:
    data = cell.eval_after if source == "eval" else cell.summary
    value = (data or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


_EVAL_FIGURES = ("avg_at_k", "pass_at_k", "mean_response_len", "truncation_rate")
_RUN_FIGURES = ("samples_generated", "groups_filtered", "groups_trained", "train_seconds", "wall_seconds")


def aggregate(
    cells: Sequence[CellResult],
    presets: Sequence[str],
    target: float | None = None,
    group_size: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Per preset: spreads over seeds of the eval and run figures, Δ avg@k vs naive-grpo and vs the
    preset above it (paired by seed), the paper's score, and the mean curves. With ``target``: the
    steps and seconds until TARGET_METRIC reaches it (``time_to_target``); with ``group_size``:
    samples generated per sample trained (what dynamic sampling costs)."""
    by_preset = {p: [c for c in cells if c.preset == p] for p in presets}
    out: dict[str, dict[str, Any]] = {}
    for i, preset in enumerate(presets):
        mine = by_preset[preset]
        ok = [c for c in mine if c.eval_after]
        entry: dict[str, Any] = {
            "adds": describe_changes(preset),
            "paper_aime_avg32": PAPER_AIME.get(preset),
            "seeds_done": sorted(c.seed for c in ok),
            "seeds_failed": sorted(c.seed for c in mine if c.status == "failed"),
        }
        for key in _EVAL_FIGURES:
            entry[key] = spread([v for c in ok if (v := _cell_figure(c, "eval", key)) is not None])
        for key in _RUN_FIGURES:
            entry[key] = spread([v for c in ok if (v := _cell_figure(c, "run", key)) is not None])
        entry["delta_vs_naive_grpo"] = (
            _paired_delta(by_preset["naive-grpo"], mine) if "naive-grpo" in by_preset else None
        )
        entry["delta_vs_previous"] = _paired_delta(by_preset[presets[i - 1]], mine) if i > 0 else None
        entry["curves"] = {
            m: mean_curve([c.curves.get(m, {}) for c in ok], SPARSE_CURVES.get(m)) for m in CURVE_METRICS
        }
        if group_size:
            entry["generated_per_trained"] = spread(
                [
                    c.summary["samples_generated"] / (c.summary["groups_trained"] * group_size)
                    for c in ok
                    if c.summary and c.summary.get("groups_trained")
                ]
            )
        if target is not None:
            hits = [
                time_to_target(
                    c.curves.get(TARGET_METRIC, {}),
                    c.curves.get("wall_time", {}),
                    target,
                    _cell_figure(c, "run", "train_seconds"),
                )
                for c in ok
            ]
            reached = [h for h in hits if h is not None]
            entry["to_target"] = {
                "target": target,
                "reached": len(reached),
                "runs": len(hits),
                "steps": spread([h["step"] for h in reached if h["step"] is not None]),
                "seconds": spread([h["seconds"] for h in reached if h["seconds"] is not None]),
            }
        entry["curve_windows"] = {
            m: {
                part: spread([w[part] for c in ok if (w := curve_window_means(c.curves.get(m, {})))])
                for part in ("first", "last")
            }
            for m in CURVE_METRICS
        }
        out[preset] = entry
    return out


def _pct(s: Spread | None, digits: int = 1) -> str:
    if s is None:
        return "—"
    text = f"{100 * s.mean:.{digits}f}"
    return text + (f" ± {100 * s.std:.{digits}f}" if s.std is not None else "")


def _count(s: Spread | None) -> str:
    if s is None:
        return "—"
    return f"{s.mean:,.0f}" + (f" ± {s.std:,.0f}" if s.std is not None else "")


def _signed_pts(s: Spread | None) -> str:
    if s is None:
        return "—"
    text = f"{100 * s.mean:+.1f}"
    return text + (f" ± {100 * s.std:.1f}" if s.std is not None else "")


def direction(measured: Spread | None, paper: float | None) -> str:
    """Does the measured step move avg@k the way the paper's step moved AIME?"""
    if measured is None or paper is None:
        return "—"
    if measured.mean == 0 or paper == 0:
        verdict = "no change"
    elif (measured.mean > 0) == (paper > 0):
        verdict = "same direction"
    else:
        verdict = "opposite direction"
    if measured.std is not None and abs(measured.mean) <= measured.std:
        verdict += " (within 1 std over seeds)"
    return verdict


def render_markdown(report: Mapping[str, Any]) -> str:
    """ablation.md from the ablation.json payload."""
    meta, rows, before = report["meta"], report["presets"], report.get("eval_before")
    k = meta.get("k", "k")
    lines = [
        "# DAPO Table 1 ablation, measured at this config's scale",
        "",
        f"`stream-dapo ablate`: presets {', '.join(rows)}; seeds {meta['seeds']}; "
        f"{meta['budget']} optimizer steps per run; config {', '.join(meta['config_files'])}"
        + (f" with {' '.join('--set ' + o for o in meta['overrides'])}" if meta["overrides"] else "")
        + ".",
        f"Eval after training: avg@{k} and pass@{k} over {meta.get('eval_prompts', '?')} eval prompts; "
        "mean ± sample std over seeds (no ± with one seed). Paper: AIME 2024 avg@32, Qwen2.5-32B.",
        "",
        f"| preset | adds | avg@{k} (%) | pass@{k} (%) | Δ avg@{k} vs naive-grpo (pts) | "
        f"paper AIME avg@32 | samples generated | eval truncation (%) | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if before:
        lines.append(
            f"| warm model (before RL) | — | {100 * before['avg_at_k']:.1f} | {100 * before['pass_at_k']:.1f} "
            f"| — | — | — | {100 * before['truncation_rate']:.2f} | — |"
        )
    for name, r in rows.items():
        failed = f", {len(r['seeds_failed'])} failed" if r["seeds_failed"] else ""
        paper = r["paper_aime_avg32"]
        lines.append(
            f"| {name} | {r['adds']} | {_pct(_spread_of(r['avg_at_k']))} | {_pct(_spread_of(r['pass_at_k']))} "
            f"| {_signed_pts(_spread_of(r['delta_vs_naive_grpo']))} | {paper if paper is not None else '—'} "
            f"| {_count(_spread_of(r['samples_generated']))} | {_pct(_spread_of(r['truncation_rate']), 2)} "
            f"| {len(r['seeds_done'])}{failed} |"
        )
    lines += _direction_section(rows, k)
    lines += _target_section(rows)
    lines += _curve_section(rows)
    lines += _notes(meta)
    return "\n".join(lines) + "\n"


def _direction_section(rows: Mapping[str, Any], k: object) -> list[str]:
    names = list(rows)
    if len(names) < 2:
        return []
    lines = [
        "",
        "## Each step against the paper's",
        "",
        f"| step | paper Δ AIME (pts) | measured Δ avg@{k} (pts, paired by seed) | direction |",
        "|---|---|---|---|",
    ]
    for prev, name in zip(names, names[1:], strict=False):
        a, b = PAPER_AIME.get(prev), PAPER_AIME.get(name)
        paper = None if a is None or b is None else b - a
        measured = _spread_of(rows[name]["delta_vs_previous"])
        lines.append(
            f"| {prev} → {name} | {f'{paper:+d}' if paper is not None else '—'} | {_signed_pts(measured)} "
            f"| {direction(measured, paper)} |"
        )
    return lines


def _target_section(rows: Mapping[str, Any]) -> list[str]:
    """Cost and speed: samples generated per sample trained, and steps/seconds to the target."""
    names = [n for n in rows if rows[n].get("to_target") or rows[n].get("generated_per_trained")]
    if not names:
        return []
    target = next((rows[n]["to_target"]["target"] for n in names if rows[n].get("to_target")), None)
    t = f"{100 * target:.1f}%" if target is not None else "—"
    lines = [
        "",
        "## What a step costs, and how fast the training reward gets there",
        "",
        f"Target: the generators' accuracy over every group they finished ({TARGET_METRIC}, mean of "
        f"the last {TARGET_WINDOW} rollout windows) reaches {t}, the warm model's eval avg@k plus "
        "--target-delta. Seconds count from the run's start (start-up included). Mean ± std over the "
        "seeds that reached it.",
        "",
        "| preset | samples generated per sample trained | steps to target | seconds to target | reached |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        r = rows[name]
        tt = r.get("to_target") or {}
        gpt = _spread_of(r.get("generated_per_trained"))
        steps, secs = _spread_of(tt.get("steps")), _spread_of(tt.get("seconds"))
        lines.append(
            f"| {name} | {_num(gpt) if gpt else '—'} | {_num(steps) if steps else '—'} "
            f"| {_num(secs) if secs else '—'} | {tt.get('reached', '—')} of {tt.get('runs', '—')} |"
        )
    return lines


def _curve_section(rows: Mapping[str, Any]) -> list[str]:
    """Each curve's mean over the first and last quarter of the steps, mean ± std over seeds."""
    names = [n for n in rows if rows[n].get("curve_windows")]
    if not names:
        return []
    lines = [
        "",
        "## The curves in numbers",
        "",
        "Each seed's mean over its first and its last quarter of optimizer steps, then mean ± std over "
        "seeds: first → last.",
        "",
        "| curve | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for metric, title in CURVE_METRICS.items():
        cells = []
        for name in names:
            w = rows[name]["curve_windows"].get(metric) or {}
            first, last = _spread_of(w.get("first")), _spread_of(w.get("last"))
            cells.append("—" if first is None or last is None else f"{_num(first)} → {_num(last)}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def _num(s: Spread) -> str:
    """Three significant digits, ± std when there is one."""
    text = f"{s.mean:.3g}"
    return text + (f" ± {s.std:.2g}" if s.std is not None else "")


def _notes(meta: Mapping[str, Any]) -> list[str]:
    notes = [
        "",
        "## How to read it",
        "",
        "- Equal budget is equal optimizer steps. With dynamic sampling (dapo) every step needs more "
        "generated groups (all-correct and all-wrong groups are dropped): compare *samples generated*. "
        "It counts every sample the generators finished before the run stopped, including groups still "
        "waiting in the buffer at the end (up to the admission capacity), which weighs most in short runs.",
        "- Seeds set generator.seed and learner.seed; data.seed is fixed because it also draws the "
        "synthetic task and its eval split, so all cells train on the same problems in the same order and "
        "are evaluated on the same prompts. Async runs are not bit-reproducible: scheduling adds its own "
        "variance on top of the seeds.",
        "- The curves (plots/*.png) are statistics of the mini-batches the learner trained on, mean over "
        "seeds with a min–max band. Under dynamic sampling those batches hold only mixed groups, so their "
        "accuracy, length and truncation are not the generator's raw figures; use the eval columns to "
        "compare presets.",
        "- The paper's column is a 32B model on AIME; only the direction of each step is comparable, not "
        "the magnitude.",
    ]
    if meta.get("plots_skipped"):
        notes.append(f"- Plots were not drawn: {meta['plots_skipped']}")
    drawn = {Path(p).stem for p in meta.get("plots") or ()}
    if drawn:
        notes += ["", "## Plots", ""]
        notes += [f"- [{title}](plots/{m}.png)" for m, title in CURVE_METRICS.items() if m in drawn]
    return notes


def _spread_of(value: Spread | Mapping[str, Any] | None) -> Spread | None:
    """Spreads come back from ablation.json as dicts."""
    if value is None or isinstance(value, Spread):
        return value
    return Spread(**value)


def to_json(obj: Any) -> Any:
    """Dataclasses (Spread, CurvePoint) to plain JSON."""
    if isinstance(obj, Spread | CurvePoint):
        return asdict(obj)
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_json(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------


def plot_curves(rows: Mapping[str, Mapping[str, Any]], out_dir: Path) -> tuple[list[Path], str | None]:
    """One PNG per CURVE_METRICS key, one line per preset. Returns (files, why none were drawn)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return [], "matplotlib is not installed (pip install -e '.[bench]')"
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for metric, title in CURVE_METRICS.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for preset, row in rows.items():
            points = [p if isinstance(p, CurvePoint) else CurvePoint(**p) for p in row["curves"][metric]]
            if not points:
                continue
            steps = [p.step for p in points]
            (line,) = ax.plot(steps, [p.mean for p in points], label=preset)
            ax.fill_between(
                steps, [p.lo for p in points], [p.hi for p in points], color=line.get_color(), alpha=0.15
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("optimizer step (policy version)")
        per = f", per {SPARSE_CURVES[metric]}-step window" if metric in SPARSE_CURVES else ""
        ax.set_title(textwrap.fill(f"{title}{per}, mean over seeds (band: min–max)", 72), fontsize=9)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        path = out_dir / f"{metric}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files, None


# --------------------------------------------------------------------------------------------------
# Running cells
# --------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    config_files: list[str]
    """The --config files as given (reported in the table)."""
    overrides: list[str]
    """The --set overrides as given; they apply to every cell."""
    presets: list[str]
    seeds: list[int]
    budget: int
    out: Path
    target_delta: float = 0.05
    """Steps/seconds-to-target target: the warm model's eval avg@k plus this (see aggregate)."""
    group_size: int | None = None
    run_files: list[str] = field(default_factory=list)
    """What children load: a snapshot of the resolved base config (see freeze_base_config)."""

    def cell_dir(self, preset: str, seed: int) -> Path:
        return self.out / preset / f"seed-{seed}"

    def child_config(self, *sets: str) -> tuple[Config, list[str]]:
        """The config a child with these extra overrides resolves, and all its overrides."""
        if self.run_files:
            return load_config(self.run_files, sets), list(sets)
        return load_config(self.config_files, [*self.overrides, *sets]), [*self.overrides, *sets]

    def cell_config(self, preset: str, seed: int) -> tuple[Config, list[str]]:
        return self.child_config(*cell_overrides(preset, seed, self.budget, self.cell_dir(preset, seed)))

    def child_argv(self, command: str, sets: Sequence[str], *extra: str) -> list[str]:
        argv = [sys.executable, "-m", "stream_dapo.cli", command, *extra]
        argv += [a for f in (self.run_files or self.config_files) for a in ("--config", f)]
        return argv + [a for s in sets for a in ("--set", s)]


def freeze_base_config(plan: Plan) -> None:
    """Resolve the config files and overrides once and give every child that snapshot, so an edit
    of a config file during a long ablation cannot change cells half-way. The snapshot is used only
    when it resolves to the same config (TOML has no null: a key set to null would not survive)."""
    base = load_config(plan.config_files, plan.overrides)
    path = plan.out / "base-config.toml"
    path.write_text(config_to_toml(base))
    if load_config([path], []) == base:
        plan.run_files = [str(path)]
    else:
        log.warning("%s does not reproduce the resolved config; children read the files as given", path)


def make_plan(args: argparse.Namespace) -> Plan:
    from stream_dapo.tools.launch import DEFAULT_CONFIG

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise SystemExit(
            f"stream-dapo ablate: unknown preset(s) {unknown} in --presets; choose from {','.join(PRESETS)}"
        )
    if args.seeds < 1:
        raise SystemExit("stream-dapo ablate: --seeds must be >= 1")
    files = list(args.config) or [str(DEFAULT_CONFIG)]
    base = load_config(files, args.overrides)
    budget = args.budget if args.budget is not None else base.learner.total_steps
    if budget < 1:
        raise SystemExit("stream-dapo ablate: --budget must be >= 1 optimizer step")
    order = list(PRESETS)
    return Plan(
        config_files=files,
        overrides=list(args.overrides),
        presets=sorted(presets, key=order.index),
        seeds=list(range(args.seeds)),
        budget=budget,
        out=Path(args.out),
        target_delta=args.target_delta,
        group_size=base.algo.group_size,
    )


def model_key(cfg: Config) -> str | None:
    """The starting model's identity: its build key and a digest of its weight files. The build key
    comes from the config alone, and the same config warmed up on another machine gave other weights
    (docs/results/longcot.md), so cells finished from one build are never mixed with another's.
    None when model.path holds no model this package built."""
    from stream_dapo.model.tiny import read_marker

    folder = Path(cfg.model.path)
    marker = read_marker(folder)
    if marker is None:
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return f"{marker.get('key')}/{digest.hexdigest()[:16]}"


def eval_fingerprint(cfg: Config, model_key: str | None) -> str:
    """Hash of what the before-training evaluation depends on: the model, the data, [eval], the
    verifier and the response budget (not the algorithm, the learner or the budget)."""
    payload = {
        "model": [cfg.model.model_dump(mode="json"), model_key],
        "data": cfg.data.model_dump(mode="json"),
        "eval": cfg.eval.model_dump(mode="json"),
        "verifier": cfg.verifier.model_dump(mode="json"),
        "max_response_len": cfg.algo.max_response_len,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def evaluate_before(plan: Plan) -> dict[str, Any]:
    """Evaluate the starting policy once (every preset starts from it); reuse a matching result."""
    from stream_dapo.tools.launch import evaluate_subprocess, prepare_model

    run_dir = plan.out / "eval-before"
    cfg, _ = plan.child_config(f"run.out_dir={_toml_value(str(run_dir))}")
    prepare_model(cfg)
    fp = eval_fingerprint(cfg, model_key(cfg))
    done = _done_before(run_dir, fp)
    if done is not None:
        return done
    record = run_dir / CELL_RECORD
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(config_to_toml(cfg))
    result = evaluate_subprocess(cfg, run_dir / "config.toml", Path(cfg.model.path), "before", run_dir)
    record.write_text(json.dumps({"fingerprint": fp}))
    return result


def _done_before(run_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The before-training evaluation in ``run_dir`` if it was made for this fingerprint."""
    record, result_path = run_dir / CELL_RECORD, run_dir / "eval_before.json"
    if (
        record.is_file()
        and result_path.is_file()
        and json.loads(record.read_text()).get("fingerprint") == fingerprint
    ):
        log.info("reusing %s", result_path)
        return dict(json.loads(result_path.read_text()))
    return None


def load_cell(preset: str, seed: int, cell_dir: Path, status: str) -> CellResult:
    summary = json.loads((cell_dir / "summary.json").read_text())
    return CellResult(
        preset=preset,
        seed=seed,
        status=status,
        eval_after=json.loads((cell_dir / "eval_after.json").read_text()),
        summary=summary,
        curves=read_curves(cell_dir / "learner" / "metrics.jsonl"),
        wall_seconds=json.loads((cell_dir / CELL_RECORD).read_text()).get("wall_seconds"),
    )


def run_child(argv: Sequence[str], log_file: IO[str]) -> tuple[int, int | None]:
    """Run one child to its end, its output to `log_file`. A SIGTERM or SIGINT that reaches this
    process meanwhile is passed on to the child, which drains and exits (a signal sent to ablate
    alone used to leave its child training). Returns the child's exit code and the first signal
    received (None if none)."""
    proc = subprocess.Popen(list(argv), stdout=log_file, stderr=subprocess.STDOUT)
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        log.warning("received %s: passing it on to %s", signal.Signals(signum).name, argv[2:4])
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, (received[0] if received else None)


def run_cell(plan: Plan, preset: str, seed: int) -> CellResult:
    """Train one cell with `stream-dapo run`, then evaluate its final policy; reuse a finished one."""
    from stream_dapo.tools.launch import evaluate_subprocess

    cfg, sets = plan.cell_config(preset, seed)
    cell_dir = plan.cell_dir(preset, seed)
    fp = config_fingerprint(cfg, model_key(cfg))
    if cell_is_done(cell_dir, fp):
        return load_cell(preset, seed, cell_dir, "reused")
    t0 = time.monotonic()
    argv = plan.child_argv("run", sets, "--quiet")
    log_path = plan.out / "logs" / f"{preset}_seed-{seed}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log_file:
        returncode, stopped_by = run_child(argv, log_file)
    if stopped_by is not None:
        raise SystemExit(
            f"stream-dapo ablate: stopped by {signal.Signals(stopped_by).name} during {preset} seed {seed}, "
            f"after its `stream-dapo run` drained; the finished cells in {plan.out} are kept: run the same "
            "command again to go on from there"
        )
    if returncode != 0 or not (cell_dir / "summary.json").is_file():
        return CellResult(
            preset, seed, "failed", error=f"stream-dapo run exited {returncode}; see {log_path}"
        )
    try:
        evaluate_subprocess(cfg, cell_dir / "config.toml", cell_dir / "final", "after", cell_dir)
    except RuntimeError as exc:
        return CellResult(preset, seed, "failed", error=str(exc))
    wall = round(time.monotonic() - t0, 1)
    (cell_dir / CELL_RECORD).write_text(
        json.dumps({"fingerprint": fp, "preset": preset, "seed": seed, "wall_seconds": wall}, indent=2)
    )
    return load_cell(preset, seed, cell_dir, "done")


def build_report(plan: Plan, before: Mapping[str, Any], cells: Sequence[CellResult]) -> dict[str, Any]:
    meta = {
        "config_files": plan.config_files,
        "overrides": plan.overrides,
        "seeds": plan.seeds,
        "budget": plan.budget,
        "k": before.get("k"),
        "eval_prompts": before.get("num_prompts"),
        "target_delta": plan.target_delta,
    }
    return {
        "meta": meta,
        "eval_before": dict(before),
        "presets": aggregate(
            cells,
            plan.presets,
            target=before["avg_at_k"] + plan.target_delta if "avg_at_k" in before else None,
            group_size=plan.group_size,
        ),
        "cells": [asdict(c) for c in cells],
    }


def write_report(out: Path, report: dict[str, Any]) -> None:
    payload = to_json(report)
    (out / "ablation.json").write_text(json.dumps(payload, indent=2))
    (out / "ablation.md").write_text(render_markdown(payload))


def _cell_line(i: int, total: int, cell: CellResult, before: Mapping[str, Any]) -> str:
    head = f"[{i}/{total}] {cell.preset} seed {cell.seed}:"
    if cell.eval_after is None or cell.summary is None:
        return f"{head} FAILED ({cell.error})"
    return (
        f"{head} avg@{cell.eval_after['k']} {cell.eval_after['avg_at_k']:.3f} (before "
        f"{before['avg_at_k']:.3f}), {cell.summary['samples_generated']} samples generated, "
        f"{cell.wall_seconds} s{' (reused)' if cell.status == 'reused' else ''}"
    )


def done_cells(plan: Plan) -> tuple[dict[str, Any], list[CellResult], list[tuple[str, int]]]:
    """For --report-only: the before-eval and the finished cells found in plan.out, and the
    (preset, seed) pairs not finished there. Nothing is trained, evaluated or built."""
    cfg, _ = plan.child_config(f"run.out_dir={_toml_value(str(plan.out / 'eval-before'))}")
    key = model_key(cfg)  # every cell starts from this model: hash its weights once
    if key is None:
        raise SystemExit(
            f"stream-dapo ablate --report-only: no built model at {cfg.model.path}, and the cells are "
            "matched to the weights they started from; put that model back there (a copy kept with "
            "the results), or build one with `stream-dapo warmup` and run the cells again without "
            "--report-only (a new build has other weights)"
        )
    before = _done_before(plan.out / "eval-before", eval_fingerprint(cfg, key))
    if before is None:
        raise SystemExit(
            f"stream-dapo ablate --report-only: {plan.out / 'eval-before'} holds no evaluation of this "
            "model and config; run without --report-only first (or pass the --config/--set of that run)"
        )
    cells, missing = [], []
    for seed in plan.seeds:
        for preset in plan.presets:
            cell_cfg, _ = plan.cell_config(preset, seed)
            cell_dir = plan.cell_dir(preset, seed)
            if cell_is_done(cell_dir, config_fingerprint(cell_cfg, key)):
                cells.append(load_cell(preset, seed, cell_dir, "reused"))
            else:
                missing.append((preset, seed))
    return before, cells, missing


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    plan.out.mkdir(parents=True, exist_ok=True)
    freeze_base_config(plan)
    cells: list[CellResult] = []
    if args.report_only:
        before, cells, missing = done_cells(plan)
        print(
            f"{len(cells)} of {len(cells) + len(missing)} cells done"
            + (f"; missing: {', '.join(f'{p} seed {s}' for p, s in missing)}" if missing else ""),
            flush=True,
        )
    else:
        before = evaluate_before(plan)
        todo = [(p, s) for s in plan.seeds for p in plan.presets]  # seed-major: a partial run is a table
        for i, (preset, seed) in enumerate(todo, 1):
            cells.append(run_cell(plan, preset, seed))
            print(_cell_line(i, len(todo), cells[-1], before), flush=True)
            write_report(plan.out, build_report(plan, before, cells))
    report = build_report(plan, before, cells)
    plots, why_not = plot_curves(report["presets"], plan.out / "plots")
    if why_not:
        log.warning("plots skipped: %s; the table is written", why_not)
        report["meta"]["plots_skipped"] = why_not
    # Relative to the output directory, like the markdown's links: the report stays valid when copied.
    report["meta"]["plots"] = [p.relative_to(plan.out).as_posix() for p in plots]
    write_report(plan.out, report)
    print(
        f"wrote {plan.out / 'ablation.md'}, {plan.out / 'ablation.json'}"
        + (f", {len(plots)} plots" if plots else "")
    )
    failed = [c for c in cells if c.status == "failed"]
    for c in failed:
        log.error("%s seed %d failed: %s", c.preset, c.seed, c.error)
    return ExitCode.FAILURE if failed else ExitCode.OK

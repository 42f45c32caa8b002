"""The ladder's statistics: mean and spread over seeds, curves averaged over seeds and windows,
time to target, paired deltas, and `aggregate` (one row per preset)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dapo.core.presets import PAPER_AIME
from stream_dapo.tools.ablate.settings import CURVE_METRICS, TARGET_METRIC, TARGET_WINDOW, describe_changes


@dataclass(frozen=True)
class Spread:
    """Mean and spread of one figure over seeds. std is the sample std (n - 1); None for n < 2."""

    mean: float
    std: float | None
    lo: float
    hi: float
    n: int


def spread(values: Sequence[float | None]) -> Spread | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None
    std = statistics.stdev(vals) if len(vals) > 1 else None
    return Spread(mean=statistics.fmean(vals), std=std, lo=min(vals), hi=max(vals), n=len(vals))


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


def curve_window_means(
    curve: Mapping[int, float], span: tuple[int, int] | None = None
) -> dict[str, float | None] | None:
    """Mean of one seed's curve over its first and its last quarter of recorded steps (at least one
    step each): where a trend over training shows without reading a plot. None for an empty curve.

    ``span`` (first, last optimizer step of the run): quarters of the run's steps instead, for a
    SPARSE_CURVES metric that records only some steps; a quarter where it recorded nothing is None
    (one point at step 2 of 40 is the first quarter's, not the last's too)."""
    steps = sorted(curve)
    if not steps:
        return None
    if span is None:
        n = max(1, len(steps) // 4)
        return {
            "first": statistics.fmean(curve[s] for s in steps[:n]),
            "last": statistics.fmean(curve[s] for s in steps[-n:]),
        }
    lo, hi = span
    n = max(1, (hi - lo + 1) // 4)
    first = [curve[s] for s in steps if s < lo + n]
    last = [curve[s] for s in steps if s > hi - n]
    return {
        "first": statistics.fmean(first) if first else None,
        "last": statistics.fmean(last) if last else None,
    }


def _steps_span(cell: CellResult) -> tuple[int, int] | None:
    """The first and last optimizer step any of the cell's curves recorded."""
    steps = [s for curve in cell.curves.values() for s in curve]
    return (min(steps), max(steps)) if steps else None


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


def training_start(cells: Sequence[CellResult], window: int = TARGET_WINDOW) -> float | None:
    """Where the training reward starts: each finished cell's mean of TARGET_METRIC over its first
    ``window`` recorded steps, averaged over the cells (every preset starts from the same model, so
    one level for all). None when no finished cell has the curve."""
    firsts = []
    for cell in cells:
        curve = cell.curves.get(TARGET_METRIC, {}) if cell.eval_after else {}
        steps = sorted(curve)[:window]
        if steps:
            firsts.append(statistics.fmean(curve[s] for s in steps))
    return statistics.fmean(firsts) if firsts else None


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
    """Per preset: spreads over seeds of the eval and run figures, Δ avg@k vs naive-grpo, vs the
    preset above it and vs the first preset (the baseline; all paired by seed), the paper's score, and the mean curves. With ``target``: the
    steps and seconds until TARGET_METRIC reaches it (``time_to_target``); with ``group_size``:
    samples generated per sample trained and per sample of a mixed group trained (what dynamic
    sampling costs, and what it costs per sample that carries gradient)."""
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
        entry["delta_vs_baseline"] = _paired_delta(by_preset[presets[0]], mine) if i > 0 else None
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
            # Only a mixed group's samples carry gradient (+-1 rewards): what one of those costs.
            entry["generated_per_mixed_trained"] = spread(
                [
                    c.summary["samples_generated"] / (c.trained_outcomes["mixed"] * group_size)
                    for c in ok
                    if c.summary and c.trained_outcomes and c.trained_outcomes.get("mixed")
                ]
            )
        entry["trained_zero_advantage_share"] = spread(
            [
                # "unknown" (a group no generator log names) is not counted as zero advantage
                (c.trained_outcomes.get("all_wrong", 0) + c.trained_outcomes.get("all_correct", 0))
                / sum(c.trained_outcomes.values())
                for c in ok
                if c.trained_outcomes and sum(c.trained_outcomes.values())
            ]
        )
        hits = [
            time_to_target(
                c.curves.get(TARGET_METRIC, {}),
                c.curves.get("wall_time", {}),
                target,
                _cell_figure(c, "run", "train_seconds"),
            )
            if target is not None
            else None
            for c in ok
        ]
        # Each seed's own figures: a spread over three seeds hides whether one arm wins on every seed.
        entry["per_seed"] = {
            c.seed: {
                "avg_at_k": _cell_figure(c, "eval", "avg_at_k"),
                "pass_at_k": _cell_figure(c, "eval", "pass_at_k"),
                "samples_generated": _cell_figure(c, "run", "samples_generated"),
                "train_seconds": _cell_figure(c, "run", "train_seconds"),
                "steps_to_target": h["step"] if h else None,
                "seconds_to_target": h["seconds"] if h else None,
            }
            for c, h in sorted(zip(ok, hits, strict=True), key=lambda pair: pair[0].seed)
        }
        if target is not None:
            reached = [h for h in hits if h is not None]
            entry["to_target"] = {
                "target": target,
                "reached": len(reached),
                "runs": len(hits),
                "steps": spread([h["step"] for h in reached if h["step"] is not None]),
                "seconds": spread([h["seconds"] for h in reached if h["seconds"] is not None]),
            }
        windows = {
            m: [
                curve_window_means(c.curves.get(m, {}), _steps_span(c) if m in SPARSE_CURVES else None)
                for c in ok
            ]
            for m in CURVE_METRICS
        }
        entry["curve_windows"] = {
            m: {part: spread([w[part] for w in ws if w]) for part in ("first", "last")}
            for m, ws in windows.items()
        }
        out[preset] = entry
    return out


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
    start_model: str | None = None
    """The model key (warm-up key/weights digest) the cell started from, as its record says."""
    machine: str | None = None
    """Where the cell trained (`stream_dapo.runtime.host.describe_machine`), as its record says."""
    code: str | None = None
    """The code its run started with (`stream_dapo.runtime.host.code_version`), as its record says."""
    trained_outcomes: dict[str, int] | None = None
    """Groups the learner trained by outcome (mixed, all_wrong, all_correct; `cells.trained_outcomes`)."""

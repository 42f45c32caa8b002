"""The ladder as markdown (ablation.md), JSON and plots."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stream_dapo.core.presets import PAPER_AIME
from stream_dapo.tools.ablate.settings import CURVE_METRICS, TARGET_METRIC, TARGET_WINDOW
from stream_dapo.tools.ablate.stats import SPARSE_CURVES, CurvePoint, Spread


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
    # Table 1's rows are compared with the paper and with naive GRPO; other presets (the off-policy
    # arms) with the first row of the table.
    table1 = any(r.get("paper_aime_avg32") is not None for r in rows.values())
    base = "naive-grpo" if "naive-grpo" in rows or not rows else next(iter(rows))
    delta_key = "delta_vs_naive_grpo" if base == "naive-grpo" else "delta_vs_baseline"
    lines = [
        "# DAPO Table 1 ablation, measured at this config's scale"
        if table1
        else f"# Ablation of {', '.join(rows)}, measured at this config's scale",
        "",
        f"`stream-dapo ablate`: presets {', '.join(rows)}; seeds {meta['seeds']}; "
        f"{meta['budget']} optimizer steps per run; config {', '.join(meta['config_files'])}"
        + (f" with {' '.join('--set ' + o for o in meta['overrides'])}" if meta["overrides"] else "")
        + ".",
        f"Eval after training: avg@{k} and pass@{k} over {meta.get('eval_prompts', '?')} eval prompts; "
        "mean ± sample std over seeds (no ± with one seed)."
        + (" Paper: AIME 2024 avg@32, Qwen2.5-32B." if table1 else ""),
        *_partial_line(meta),
        "",
        f"| preset | adds | avg@{k} (%) | pass@{k} (%) | Δ avg@{k} vs {base} (pts) | "
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
            f"| {_signed_pts(_spread_of(r.get(delta_key)))} | {paper if paper is not None else '—'} "
            f"| {_count(_spread_of(r['samples_generated']))} | {_pct(_spread_of(r['truncation_rate']), 2)} "
            f"| {len(r['seeds_done'])}{failed} |"
        )
    lines += _direction_section(rows, k) if table1 else []
    lines += _target_section(rows, meta)
    lines += _per_seed_section(rows, k)
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


def _target_section(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
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
        f"the last {TARGET_WINDOW} rollout windows) reaches {t}, {_target_origin(meta)}. Seconds "
        "count from the run's start (start-up included). Mean ± std over the "
        "seeds that reached it. A sample carries gradient only in a mixed group (some right, some "
        "wrong): without dynamic sampling the learner also trains all-wrong and all-correct groups, at "
        "zero advantage, so per sample *of a mixed group* trained is what each arm pays for its gradient.",
        "",
        "| preset | samples generated per sample trained | per sample of a mixed group trained "
        "| trained groups at zero advantage (%) | steps to target | seconds to target | reached |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        r = rows[name]
        tt = r.get("to_target") or {}
        gpt = _spread_of(r.get("generated_per_trained"))
        gpm = _spread_of(r.get("generated_per_mixed_trained"))
        zero = _spread_of(r.get("trained_zero_advantage_share"))
        steps, secs = _spread_of(tt.get("steps")), _spread_of(tt.get("seconds"))
        lines.append(
            f"| {name} | {_num(gpt) if gpt else '—'} | {_num(gpm) if gpm else '—'} | {_pct(zero)} "
            f"| {_num(steps) if steps else '—'} "
            f"| {_num(secs) if secs else '—'} | {tt.get('reached', '—')} of {tt.get('runs', '—')} |"
        )
    return lines


def _target_origin(meta: Mapping[str, Any]) -> str:
    """What the target of `_target_section` is measured from (ablate --target-from, --target-level)."""
    if meta.get("target_level") is not None:
        start = meta.get("target_start")
        level = (
            f"; the training reward's own starting level over the finished runs is {100 * start:.1f}%"
            if start is not None
            else ""
        )
        return f"a level fixed by --target-level{level}"
    if meta.get("target_from") == "train":
        start = meta.get("target_start")
        level = f" ({100 * start:.1f}%)" if start is not None else ""
        return (
            f"the training reward's own starting level{level}: the mean over the finished runs of its "
            f"first {TARGET_WINDOW} recorded steps (--target-from train), plus --target-delta"
        )
    return "the warm model's eval avg@k plus --target-delta"


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


def _partial_line(meta: Mapping[str, Any]) -> list[str]:
    """Which planned cells the tables below do not hold yet (none: no line)."""
    missing = meta.get("cells_not_done") or []
    if not missing:
        return []
    planned = meta.get("cells_planned", "?")
    done = planned - len(missing) if isinstance(planned, int) else "?"
    return [f"**Partial: {done} of {planned} planned cells done**; not done yet: {', '.join(missing)}."]


def _per_seed_section(rows: Mapping[str, Mapping[str, Any]], k: object) -> list[str]:
    """One row per finished cell: what the spreads above are made of."""
    if not any(row.get("per_seed") for row in rows.values()):
        return []
    lines = [
        "",
        "## Per seed",
        "",
        f"| preset | seed | avg@{k} (%) | pass@{k} (%) | samples generated | steps to target | "
        "seconds to target | train seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def fig(value: float | None, fmt: str) -> str:
        return "—" if value is None else format(value, fmt)

    for name, row in rows.items():
        for seed, cell in (row.get("per_seed") or {}).items():
            pct = {key: None if cell[key] is None else 100 * cell[key] for key in ("avg_at_k", "pass_at_k")}
            lines.append(
                f"| {name} | {seed} | {fig(pct['avg_at_k'], '.1f')} | {fig(pct['pass_at_k'], '.1f')} "
                f"| {fig(cell['samples_generated'], ',.0f')} | {fig(cell['steps_to_target'], '.0f')} "
                f"| {fig(cell['seconds_to_target'], ',.0f')} | {fig(cell['train_seconds'], ',.0f')} |"
            )
    return lines


def _num(s: Spread) -> str:
    """Three significant digits, ± std when there is one; from 1,000 up, whole numbers with thousands
    separators (seconds to target read 1,270 ± 310, not 1.27e+03 ± 3.1e+02)."""
    if abs(s.mean) >= 1000:
        return f"{s.mean:,.0f}" + (f" ± {s.std:,.0f}" if s.std is not None else "")
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
    notes += _mixed_provenance(meta)
    if meta.get("plots_skipped"):
        notes.append(f"- Plots were not drawn: {meta['plots_skipped']}")
    drawn = {Path(p).stem for p in meta.get("plots") or ()}
    if drawn:
        notes += ["", "## Plots", ""]
        notes += [f"- [{title}](plots/{m}.png)" for m, title in CURVE_METRICS.items() if m in drawn]
    return notes


_MIXED_PROVENANCE = (
    (
        "start_models",
        ", ",
        "- The cells started from {n} builds of the start model ({values}: the same warm-up settings, "
        "weights that differ in rounding, as a warm-up repeated on another machine gives); resumed with "
        "--rebuilt-start. Each cell's build is in ablation.json.",
    ),
    (
        "machines",
        "; ",
        "- The cells trained on {n} machines ({values}): their wall-clock columns (training seconds, "
        "seconds to target) compare only between cells of one machine; steps, samples and eval figures "
        "do not depend on it. Each cell's machine is in ablation.json.",
    ),
    (
        "code_versions",
        "; ",
        "- The cells ran {n} versions of the code ({values}): a change between them to what a run "
        "computes would read as a difference between cells (`git log` between the commits says what "
        "changed). Each cell's version is in ablation.json.",
    ),
)
"""meta key, separator, the note printed when a report's cells differ in it (cells resumed across
sessions: another warm-up build, another machine, another commit)."""


def _mixed_provenance(meta: Mapping[str, Any]) -> list[str]:
    notes = []
    for key, separator, sentence in _MIXED_PROVENANCE:
        values = meta.get(key) or []
        if len(values) > 1:
            notes.append(sentence.format(n=len(values), values=separator.join(values)))
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


def plot_curves(
    rows: Mapping[str, Mapping[str, Any]], out_dir: Path, metrics: Mapping[str, str] = CURVE_METRICS
) -> tuple[list[Path], str | None]:
    """One PNG per ``metrics`` key (each row's ``curves[key]``: CurvePoints), one line per preset.
    Returns (files, why none were drawn)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return [], "matplotlib is not installed (pip install -e '.[bench]')"
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for metric, title in metrics.items():
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

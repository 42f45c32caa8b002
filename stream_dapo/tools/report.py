"""`stream-dapo report RUN_DIR [RUN_DIR ...]`: a run's curves as PNG plots and one `report.md`.

Reads what a run directory already holds, nothing else:

- ``learner/metrics.jsonl``: one row per optimizer step (the learner's tracking, `stream_dapo.runtime.tracking`),
  the x axis of every curve: reward, accuracy, entropy, length, truncation, staleness, clip
  fractions, importance weights, learner tokens/s, weight publish seconds;
- ``metrics.jsonl``: the launcher's scrape of every service every few seconds, for what only the
  generators know: groups dropped by dynamic sampling, generator tokens/s, weight-load seconds
  (each taken at the last scrape of a learner step);
- ``summary.json`` (or ``eval_before.json`` / ``eval_after.json``): the evaluation before and after.

Several run directories are drawn on the same axes, one colour per run: that is how recipes are
compared. `stream-dapo run` writes the report of its own run at the end (`write_run_report`); with
matplotlib missing the report keeps its tables and says the plots were skipped.
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dapo.errors import ConfigError
from stream_dapo.runtime.tracking import staleness_quantiles

log = logging.getLogger("stream_dapo.tools.report")

REPORT_NAME = "report.md"
PLOTS_DIR = "report"
MATPLOTLIB_HINT = "pip install -e '.[report]'"


# --------------------------------------------------------------------------------------------------
# Reading a run directory
# --------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file; a torn last line (a run killed mid-write) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _setting(run: RunData, section: str, key: str) -> float | None:
    value = run.config.get(section, {}).get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class RunData:
    """What the report needs of one run directory."""

    path: Path
    label: str
    steps: list[dict[str, Any]]
    """learner/metrics.jsonl, one row per version (the last row of a version wins)."""
    live: list[dict[str, Any]]
    """metrics.jsonl of the launcher, in time order."""
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    """The run's config.toml (empty when missing)."""
    eval_before: dict[str, Any] = field(default_factory=dict)
    eval_after: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, label: str) -> RunData:
        if not path.is_dir():
            raise ConfigError(f"{path} is not a directory; pass run directories (run.out_dir of a run)")
        by_version = {
            int(r["version"]): r for r in _read_jsonl(path / "learner" / "metrics.jsonl") if "version" in r
        }
        steps = [by_version[v] for v in sorted(by_version)]
        live = _read_jsonl(path / "metrics.jsonl")
        summary = _read_json(path / "summary.json")
        if not steps and not live and not summary:
            raise ConfigError(
                f"{path} holds no run: none of learner/metrics.jsonl, metrics.jsonl, summary.json; pass the "
                "run.out_dir of a run"
            )
        return cls(
            path=path,
            label=label,
            steps=steps,
            live=live,
            summary=summary,
            config=_read_toml(path / "config.toml"),
            eval_before=summary.get("eval_before") or _read_json(path / "eval_before.json"),
            eval_after=summary.get("eval_after") or _read_json(path / "eval_after.json"),
        )

    # ---------------------------------------------------------------- series (x = learner version)

    def learner(self, key: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for row in self.steps:
            value = row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                xs.append(float(row["version"]))
                ys.append(float(value) * scale)
        return xs, ys

    def staleness(self, stat: str) -> tuple[list[float], list[float]]:
        """A staleness quantile over the tokens of consecutive windows of `smoothing_window` steps
        (x: the window's last version). Per step it would zig-zag: the steps of one rollout batch
        train the same groups one version apart."""
        window = smoothing_window(len(self.steps))
        xs, ys = [], []
        for start in range(0, len(self.steps), window):
            chunk = self.steps[start : start + window]
            counts: Counter[int] = Counter()
            for row in chunk:
                counts.update({int(k): int(v) for k, v in (row.get("staleness_counts") or {}).items()})
            q = staleness_quantiles(counts)
            if stat in q:
                xs.append(float(chunk[-1]["version"]))
                ys.append(q[stat])
        return xs, ys

    def per_step_live(self) -> list[dict[str, Any]]:
        """The launcher's last scrape at each learner step, steps >= 1."""
        last: dict[int, dict[str, Any]] = {}
        for row in self.live:
            if int(row.get("step", 0)) >= 1:
                last[int(row["step"])] = row
        return [last[s] for s in sorted(last)]

    def live_value(self, key: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for row in self.per_step_live():
            value = row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                xs.append(float(row["step"]))
                ys.append(float(value) * scale)
        return xs, ys

    def per_step_ratio(self, num: str, den: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
        """d(num) / d(den) between the last scrapes of consecutive learner steps, from cumulative
        launcher fields (den "t": a rate per second); steps where den did not move are left out."""
        xs, ys = [], []
        prev: dict[str, Any] | None = None
        for row in self.per_step_live():
            if num not in row or den not in row:
                return [], []
            if prev is not None and float(row[den]) > float(prev[den]):
                xs.append(float(row["step"]))
                ys.append(scale * (float(row[num]) - float(prev[num])) / (float(row[den]) - float(prev[den])))
            prev = row
        return xs, ys

    def source_names(self) -> list[str]:
        """The data sources the launcher's rows report (runs with [[data.sources]])."""
        names: dict[str, None] = {}
        for row in self.live:
            for name in row.get("sources") or {}:
                names[name] = None
        return list(names)

    def source_ratio(
        self, source: str, num: str, den: str, scale: float = 1.0
    ) -> tuple[list[float], list[float]]:
        """d(num) / d(den) of one source's cumulative counts between consecutive learner steps."""
        xs, ys = [], []
        prev: dict[str, Any] | None = None
        for row in self.per_step_live():
            figures = (row.get("sources") or {}).get(source)
            if figures is None:
                continue
            if prev is not None and float(figures[den]) > float(prev[den]):
                xs.append(float(row["step"]))
                ys.append(
                    scale
                    * (float(figures[num]) - float(prev[num]))
                    / (float(figures[den]) - float(prev[den]))
                )
            prev = figures
        return xs, ys

    def filtered_share(self, reason: str) -> tuple[list[float], list[float]]:
        """% of the groups finished since the previous learner step that dynamic sampling dropped for
        `reason` (all_wrong / all_correct); needs the by-reason counts of newer runs' metrics.jsonl."""
        xs, ys = [], []
        prev = {"groups_kept": 0, "groups_all_wrong": 0, "groups_all_correct": 0}
        for row in self.per_step_live():
            if f"groups_{reason}" not in row:
                return [], []
            delta = {k: int(row[k]) - prev[k] for k in prev}
            finished = sum(delta.values())
            if finished > 0:
                xs.append(float(row["step"]))
                ys.append(100.0 * delta[f"groups_{reason}"] / finished)
            prev = {k: int(row[k]) for k in prev}
        return xs, ys


Series = Callable[[RunData], tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Line:
    name: str
    series: Series
    style: str = "-"
    smooth: bool = True
    """Draw a rolling mean over the raw points (off for integer and cumulative series)."""


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    lines: tuple[Line, ...]
    limit: tuple[str, Callable[[RunData], float | None]] | None = None
    """A horizontal reference line per run: (legend name, value from the run's config)."""


@dataclass(frozen=True)
class Figure:
    """One PNG: a title, one or two panels side by side, and what the report says about it."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    about: str


def _learner(key: str, scale: float = 1.0) -> Series:
    return lambda run: run.learner(key, scale)


def _live(key: str, scale: float = 1.0) -> Series:
    return lambda run: run.live_value(key, scale)


FIGURES: tuple[Figure, ...] = (
    Figure(
        "reward_accuracy",
        "Reward and accuracy of the trained samples",
        (
            Panel(
                "Mean reward",
                "reward per sample (+1 / -1, overlong shaping)",
                (Line("reward", _learner("reward_mean")),),
            ),
            Panel(
                "Accuracy",
                "% of samples correct",
                (
                    Line("trained samples", _learner("accuracy", 100)),
                    Line("generators, all groups", _learner("gen_accuracy", 100), "--"),
                ),
            ),
        ),
        "Over the samples of each optimizer step (groups kept by dynamic sampling, so accuracy is "
        "never 0 % or 100 % for a whole group); dashed: every group the generators finished since "
        "the previous rollout batch, the filtered ones included (newer runs).",
    ),
    Figure(
        "entropy",
        "Policy entropy",
        (Panel("Mean token entropy", "nats per response token", (Line("entropy", _learner("entropy")),)),),
        "Token-weighted over the step's response tokens. A collapse towards 0 means the policy "
        "stopped exploring; Clip-Higher is meant to prevent it.",
    ),
    Figure(
        "length_truncation",
        "Response length and truncation",
        (
            Panel(
                "Mean response length",
                "tokens",
                (
                    Line("trained samples", _learner("response_len_mean")),
                    Line("generators, all samples", _learner("gen_response_len_mean"), "--"),
                ),
            ),
            Panel(
                "Truncated responses",
                "% of samples at algo.max_response_len",
                (
                    Line("trained samples", _learner("truncation_rate", 100)),
                    Line("generators, all samples", _learner("gen_truncation_rate", 100), "--"),
                ),
            ),
        ),
        "Over the samples of each step; dashed: every sample the generators finished since the "
        "previous rollout batch (newer runs).",
    ),
    Figure(
        "filtered_groups",
        "Groups dropped by dynamic sampling",
        (
            Panel(
                "Filtered-group share",
                "% of the groups finished in the window",
                (
                    Line("all wrong", lambda run: _filtered(run, "all_wrong")),
                    Line("all correct", lambda run: _filtered(run, "all_correct"), "--"),
                    Line(
                        "all reasons, cumulative from the start (older runs)",
                        lambda run: _older_filtered(run),
                        ":",
                        smooth=False,
                    ),
                ),
            ),
        ),
        "Groups whose samples were all wrong or all correct carry no gradient and are not sent. "
        "Window: the groups the generators finished since the previous rollout batch (the learner's "
        "tracking); for runs without it, since the previous learner step (launcher scrapes).",
    ),
    Figure(
        "staleness",
        "Token staleness at the gradient step",
        (
            Panel(
                "Staleness (learner version - behaviour version)",
                "versions",
                (
                    Line("p50", lambda run: run.staleness("staleness_p50"), smooth=False),
                    Line("p95", lambda run: run.staleness("staleness_p95"), "--", smooth=False),
                    Line("max", lambda run: run.staleness("staleness_max"), ":", smooth=False),
                ),
                limit=("algo.max_staleness", lambda run: _setting(run, "algo", "max_staleness")),
            ),
        ),
        "Token-weighted quantiles over the trained tokens of windows of ~5 % of the run's steps; "
        "admission keeps the max at or below algo.max_staleness.",
    ),
    Figure(
        "clip_fractions",
        "PPO clip fractions",
        (
            Panel(
                "Clipped tokens",
                "% of response tokens",
                (
                    Line("low (ratio < 1 - eps_low)", _learner("clip_frac_low", 100)),
                    Line("high (ratio > 1 + eps_high)", _learner("clip_frac_high", 100), "--"),
                    Line("dual clip", _learner("clip_frac_dual", 100), ":"),
                ),
            ),
        ),
        "Fractions of the step's response tokens whose ratio was clipped.",
    ),
    Figure(
        "importance_weights",
        "Behaviour importance weights",
        (
            Panel(
                "Weight pi_prox / mu",
                "weight (1 = on-policy)",
                (Line("mean", _learner("is_weight_mean")), Line("max", _learner("is_weight_max"), "--")),
                limit=("algo.is_cap", lambda run: _setting(run, "algo", "is_cap")),
            ),
            Panel(
                "Approx. KL(mu || pi_prox)",
                "nats per token",
                (Line("KL", _learner("approx_kl_behaviour")),),
            ),
            Panel(
                "Masked tokens (is_mode = mask or icepop)",
                "% of response tokens",
                (Line("masked", _learner("masked_frac", 100)),),
            ),
            Panel(
                "Sequence ratio (length-normalised)",
                "exp(mean log pi/pi_old) per sample",
                (Line("min", _learner("seq_ratio_min")), Line("max", _learner("seq_ratio_max"), "--")),
            ),
        ),
        "The importance weight between the learner's proximal policy and the generators' behaviour "
        "policy (decoupled loss), per token or per sample (algo.is_level); masked tokens only in "
        "algo.is_mode = mask or icepop. The sequence ratio's spread is what GSPO (algo.ratio_level = "
        "sequence) clips.",
    ),
    Figure(
        "throughput",
        "Throughput",
        (
            Panel(
                "Learner",
                "trained tokens/s (prompt + response)",
                (Line("learner", _learner("tokens_per_second")),),
            ),
            Panel(
                "Generators",
                "response tokens/s, all generators",
                (Line("generators", lambda run: _generator_tokens_per_second(run)),),
            ),
        ),
        "Learner: per optimizer step. Generators: response tokens over the window between two rollout "
        "batches (the learner's tracking), or between the launcher's last scrapes of two learner "
        "steps for runs without it.",
    ),
    Figure(
        "weight_sync",
        "Weight synchronisation",
        (
            Panel(
                "Learner: serialize + publish",
                "seconds per published version",
                (Line("publish", _learner("weight_sync_seconds")),),
            ),
            Panel(
                "Generators: load a version",
                "seconds per load (mean over each learner step)",
                (
                    Line(
                        "load",
                        lambda run: run.per_step_ratio(
                            "generator_weight_load_seconds_total", "generator_weight_loads"
                        ),
                    ),
                ),
            ),
        ),
        "Publish time on the learner (every learner.sync_every steps) and the generators' time to "
        "fetch and swap in a new version (launcher scrapes: loads between the last scrapes of two "
        "learner steps).",
    ),
)


def _generator_tokens_per_second(run: RunData) -> tuple[list[float], list[float]]:
    """The learner's window (tracked), else the launcher's scrapes between learner steps."""
    tracked = run.learner("gen_tokens_per_second")
    return tracked if tracked[0] else run.per_step_ratio("generator_tokens", "t")


def _filtered(run: RunData, reason: str) -> tuple[list[float], list[float]]:
    """The learner's window (tracked), else the launcher's scrapes between learner steps."""
    tracked = run.learner(f"gen_filtered_share_{reason}", 100)
    return tracked if tracked[0] else run.filtered_share(reason)


def _older_filtered(run: RunData) -> tuple[list[float], list[float]]:
    """Runs from before the by-reason counts: the launcher's cumulative filtered fraction."""
    if any("groups_all_wrong" in row for row in run.live):
        return [], []
    return run.live_value("filtered_frac", 100)


# --------------------------------------------------------------------------------------------------
# Plotting
# --------------------------------------------------------------------------------------------------


def _smooth(ys: Sequence[float], window: int) -> list[float]:
    """Trailing rolling mean (the first points average what there is)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(n: int) -> int:
    """About 5 % of a run's points: 1 (none) up to 20 steps."""
    return max(1, n // 20)


def source_figures(runs: Sequence[RunData]) -> list[Figure]:
    """One figure per data source of runs with [[data.sources]]: its accuracy and mean score, and the
    share of its groups dynamic sampling dropped, per learner step."""
    names: dict[str, None] = {}
    for run in runs:
        names.update(dict.fromkeys(run.source_names()))
    figures = []
    for name in names:

        def ratio(num: str, den: str, scale: float = 1.0, source: str = name) -> Series:
            return lambda run: run.source_ratio(source, num, den, scale)

        def dropped(run: RunData, source: str = name) -> tuple[list[float], list[float]]:
            xs, kept = run.source_ratio(source, "groups_kept", "groups", 100.0)
            return xs, [100.0 - k for k in kept]

        figures.append(
            Figure(
                f"source_{name}",
                f"Source {name}",
                (
                    Panel(
                        "Accuracy and mean score",
                        "% correct; mean score x 100",
                        (
                            Line("% correct", ratio("correct", "samples", 100.0)),
                            Line("mean score x 100", ratio("score_sum", "samples", 100.0), "--"),
                        ),
                    ),
                    Panel("Filtered groups", "% of its groups dropped", (Line("dropped", dropped),)),
                ),
                f"Every response of source {name} the generators scored between consecutive learner steps "
                "(the filtered groups included): the share its reward counts correct, its mean score (the "
                "reward's own scale, before overlong shaping), and the share of its groups that dynamic "
                "sampling dropped (equal scores).",
            )
        )
    return figures


def _plot_figure(fig_spec: Figure, runs: Sequence[RunData], path: Path) -> list[str]:
    """Draw one PNG; returns the labels of the runs that had no data for it (empty: all had)."""
    import matplotlib.pyplot as plt

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 6.4 if len(fig_spec.panels) < 3 else 5.6
    fig, axes = plt.subplots(
        1, len(fig_spec.panels), figsize=(width * len(fig_spec.panels), 4.4), squeeze=False
    )
    with_data: set[str] = set()
    smoothed = False
    for ax, panel in zip(axes[0], fig_spec.panels, strict=True):
        limits: set[float] = set()
        for i, run in enumerate(runs):
            for j, line in enumerate(panel.lines):
                # One run: a colour per line. Several: a colour per run, a line style per line.
                colour = colours[(j if len(runs) == 1 else i) % len(colours)]
                xs, ys = line.series(run)
                if not xs:
                    continue
                with_data.add(run.label)
                label = line.name if len(runs) == 1 else f"{run.label} · {line.name}"
                window = smoothing_window(len(ys)) if line.smooth else 1
                if not line.smooth:
                    ax.plot(
                        xs, ys, line.style, color=colour, linewidth=1.4, label=label, drawstyle="steps-post"
                    )
                elif window > 1:
                    smoothed = True
                    ax.plot(xs, ys, line.style, color=colour, alpha=0.25, linewidth=0.8)
                    ax.plot(xs, _smooth(ys, window), line.style, color=colour, linewidth=1.8, label=label)
                else:
                    ax.plot(xs, ys, line.style, color=colour, linewidth=1.6, marker=".", label=label)
            if panel.limit is not None and run.label in with_data:
                name, value_of = panel.limit
                value = value_of(run)
                if value is not None and value not in limits:  # one line per distinct setting
                    limits.add(value)
                    ax.axhline(value, color="grey", linestyle="-.", linewidth=1, label=f"{name} = {value:g}")
        ys_all = [y for ln in ax.lines for y in ln.get_ydata()]
        if ys_all and min(ys_all) >= 0:
            ax.set_ylim(bottom=0, top=None if max(ys_all) > 0 else 1)
        ax.set_title(panel.title)
        ax.set_xlabel("learner version (optimizer step)")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="grey")
    title = fig_spec.title
    if smoothed:
        title += "\n(faint: per step; bold: rolling mean over ~5 % of the run)"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [run.label for run in runs if run.label not in with_data]


def _plot_eval(runs: Sequence[RunData], path: Path) -> bool:
    """Grouped bars: avg@k and pass@k, before (light) and after (dark) training, per run."""
    import matplotlib.pyplot as plt

    have = [r for r in runs if r.eval_before or r.eval_after]
    if not have:
        return False
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(max(6.4, 2.2 * len(have) + 3), 4.4))
    metrics = ("avg_at_k", "pass_at_k")
    width = 0.8 / (2 * len(have))
    for i, run in enumerate(have):
        colour = colours[runs.index(run) % len(colours)]
        for j, (when, result) in enumerate((("before", run.eval_before), ("after", run.eval_after))):
            if not result:
                continue
            offset = (2 * i + j - len(have) + 0.5) * width
            values = [100 * float(result.get(m, float("nan"))) for m in metrics]
            xs = [k + offset for k in range(len(metrics))]
            label = when if len(have) == 1 else f"{run.label} · {when}"
            bars = ax.bar(
                xs, values, width, color=colour, alpha=0.45 if when == "before" else 1.0, label=label
            )
            ax.bar_label(bars, fmt="%.1f", fontsize="small")
    k = next((r.get("k") for r in (have[0].eval_before, have[0].eval_after) if r.get("k")), "k")
    prompts = next((r.get("num_prompts") for r in (have[0].eval_before, have[0].eval_after) if r), "?")
    ax.set_xticks(range(len(metrics)), [f"avg@{k}", f"pass@{k}"])
    ax.set_ylabel("% of eval prompts")
    ax.set_title(f"Evaluation before and after training ({prompts} prompts, k = {k})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def matplotlib_problem() -> str | None:
    try:
        import matplotlib
    except ImportError:
        return f"matplotlib is not installed ({MATPLOTLIB_HINT}): the report has its tables, no plots"
    matplotlib.use("Agg")  # files only: never a window, works without a display
    return None


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


def _pct(value: Any) -> str:
    return f"{100 * value:.1f} %" if isinstance(value, int | float) else "–"


def _num(value: Any, fmt: str = "{:g}") -> str:
    return fmt.format(value) if isinstance(value, int | float) else "–"


def _summary_table(runs: Sequence[RunData]) -> list[str]:
    lines = [
        "| run | mode | steps | train time | samples/s | groups trained | filtered (wrong / correct) "
        "| max staleness | avg@k before → after | pass@k before → after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run.summary
        steps = s.get("learner_steps", run.steps[-1]["version"] if run.steps else None)
        filtered = (
            f"{s['groups_filtered']} ({s.get('groups_filtered_all_wrong', '–')} / "
            f"{s.get('groups_filtered_all_correct', '–')})"
            if "groups_filtered" in s
            else "–"
        )
        lines.append(
            f"| {run.label} | {s.get('mode', '–')} | {_num(steps)} | {_num(s.get('train_seconds'), '{:.0f} s')} "
            f"| {_num(s.get('samples_per_second'), '{:.2f}')} | {_num(s.get('groups_trained'))} | {filtered} "
            f"| {_num(s.get('max_staleness_trained'))} "
            f"| {_pct(run.eval_before.get('avg_at_k'))} → {_pct(run.eval_after.get('avg_at_k'))} "
            f"| {_pct(run.eval_before.get('pass_at_k'))} → {_pct(run.eval_after.get('pass_at_k'))} |"
        )
    return lines


def _labels(paths: Sequence[Path]) -> list[str]:
    """Run directory names; the full path where two runs share a name."""
    names = [p.resolve().name for p in paths]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names, strict=True)]


def write_report(run_dirs: Sequence[Path], out_dir: Path) -> Path:
    """Write `out_dir/report.md` and its plots under `out_dir/report/`; returns the report's path."""
    runs = [RunData.load(p, label) for p, label in zip(run_dirs, _labels(run_dirs), strict=True)]
    out_dir.mkdir(parents=True, exist_ok=True)
    problem = matplotlib_problem()
    lines = [
        "# Run report",
        "",
        "Generated by `stream-dapo report " + " ".join(str(p) for p in run_dirs) + "`.",
        "",
    ]
    lines += [f"- **{run.label}**: `{run.path}`" for run in runs] + [""]
    lines += _summary_table(runs) + [""]
    if problem is not None:
        log.warning("%s", problem)
        lines += [f"> {problem}.", ""]
        path = out_dir / REPORT_NAME
        path.write_text("\n".join(lines) + "\n")
        return path
    plots = out_dir / PLOTS_DIR
    plots.mkdir(exist_ok=True)
    lines += ["## Evaluation before and after", ""]
    if _plot_eval(runs, plots / "eval.png"):
        lines += [f"![evaluation]({PLOTS_DIR}/eval.png)", ""]
    else:
        lines += ["No evaluation in these runs (run.eval_before_after = false or --no-eval).", ""]
    for spec in [*FIGURES, *source_figures(runs)]:
        png = plots / f"{spec.name}.png"
        missing = _plot_figure(spec, runs, png)
        lines += [f"## {spec.title}", "", spec.about, ""]
        if len(missing) == len(runs):
            png.unlink(missing_ok=True)
            lines += ["Not recorded in these runs.", ""]
            continue
        lines += [f"![{spec.title}]({PLOTS_DIR}/{spec.name}.png)", ""]
        if missing:
            lines += [f"Not recorded in: {', '.join(missing)}.", ""]
    path = out_dir / REPORT_NAME
    path.write_text("\n".join(lines) + "\n")
    return path


def write_run_report(run_dir: Path) -> Path | None:
    """The end of `stream-dapo run`: write the run's report, never fail the run over it."""
    try:
        path = write_report([run_dir], run_dir)
    except Exception as exc:  # noqa: BLE001 (the run is done; its files are intact)
        log.warning(
            "could not write the run report (%s: %s); try `stream-dapo report %s`",
            type(exc).__name__,
            exc,
            run_dir,
        )
        return None
    log.info("run report: %s", path)
    return path


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

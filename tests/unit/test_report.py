"""`stream-dapo report`: series read from a run directory, the report's tables, plots and errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from stream_dapo.cli.report import run as report_cli
from stream_dapo.errors import ConfigError
from stream_dapo.tools.report import RunData, smoothing_window, write_report, write_run_report


def step_row(v: int, **extra) -> dict:
    return {
        "version": v,
        "loss": 0.01 * v,
        "entropy": 0.5 - 0.01 * v,
        "reward_mean": -0.5 + 0.1 * v,
        "accuracy": 0.25 + 0.05 * v,
        "response_len_mean": 40.0 + v,
        "truncation_rate": 0.0,
        "clip_frac_low": 0.01,
        "clip_frac_high": 0.02,
        "clip_frac_dual": 0.0,
        "is_weight_mean": 1.0,
        "is_weight_max": 1.5,
        "masked_frac": 0.0,
        "approx_kl_behaviour": 1e-3,
        "tokens_per_second": 1000.0 + v,
        "weight_sync_seconds": 0.05,
        "staleness_counts": {"0": 10, "1": 30} if v % 2 else {"1": 20, "2": 20},
        **extra,
    }


def make_run(root: Path, name: str, steps: int = 4, eval_after: float = 0.5) -> Path:
    run = root / name
    (run / "learner").mkdir(parents=True)
    (run / "learner" / "metrics.jsonl").write_text(
        "".join(json.dumps(step_row(v)) + "\n" for v in range(1, steps + 1))
    )
    # The launcher's scrapes: cumulative group counts at the last scrape of each learner step.
    live = [
        {"t": 5.0, "step": 0, "groups_kept": 0, "groups_all_wrong": 0, "groups_all_correct": 0},
        {"t": 10.0, "step": 1, "groups_kept": 4, "groups_all_wrong": 4, "groups_all_correct": 0},
        {"t": 15.0, "step": 1, "groups_kept": 6, "groups_all_wrong": 6, "groups_all_correct": 0},
        {"t": 20.0, "step": 2, "groups_kept": 9, "groups_all_wrong": 7, "groups_all_correct": 0},
        {"t": 25.0, "step": 3, "groups_kept": 9, "groups_all_wrong": 7, "groups_all_correct": 0},
        {"t": 30.0, "step": 4, "groups_kept": 12, "groups_all_wrong": 8, "groups_all_correct": 1},
    ]
    for i, row in enumerate(live):  # 100 response tokens/s; one 0.02 s weight load per scrape
        row.update(
            generator_tokens=500 * i, generator_weight_loads=i, generator_weight_load_seconds_total=0.02 * i
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live))
    evals = {"k": 4, "num_prompts": 50}
    (run / "summary.json").write_text(
        json.dumps(
            {
                "mode": "async",
                "learner_steps": steps,
                "train_seconds": 30.0,
                "samples_per_second": 2.5,
                "groups_trained": 16,
                "groups_filtered": 9,
                "groups_filtered_all_wrong": 8,
                "groups_filtered_all_correct": 1,
                "max_staleness_trained": 2,
                "eval_before": {**evals, "avg_at_k": 0.25, "pass_at_k": 0.5},
                "eval_after": {**evals, "avg_at_k": eval_after, "pass_at_k": 0.75},
            }
        )
    )
    (run / "config.toml").write_text("[algo]\nmax_staleness = 4\nis_cap = 2.0\n")
    return run


def test_filtered_share_is_over_the_groups_finished_since_the_previous_step(tmp_path: Path) -> None:
    run = RunData.load(make_run(tmp_path, "a"), "a")
    # Steps 1..4 last scrapes: (kept, wrong, correct) = (6,6,0), (9,7,0), (9,7,0), (12,8,1).
    # Deltas: 12 finished / 6 wrong; 4 / 1; none (step 3 is left out); 5 / 1 wrong, 1 correct.
    assert run.filtered_share("all_wrong") == ([1.0, 2.0, 4.0], [50.0, 25.0, 20.0])
    assert run.filtered_share("all_correct") == ([1.0, 2.0, 4.0], [0.0, 0.0, 20.0])


def test_generator_rates_are_over_each_learner_step_from_the_cumulative_counters(tmp_path: Path) -> None:
    run = RunData.load(make_run(tmp_path, "a"), "a")
    # Last scrapes of steps 1..4 at t = 15, 20, 25, 30 s with 1000, 1500, 2000, 2500 tokens.
    assert run.per_step_ratio("generator_tokens", "t") == ([2.0, 3.0, 4.0], [100.0, 100.0, 100.0])
    xs, ys = run.per_step_ratio("generator_weight_load_seconds_total", "generator_weight_loads")
    assert xs == [2.0, 3.0, 4.0] and ys == pytest.approx([0.02] * 3)


def test_staleness_quantiles_pool_the_tokens_of_each_window(tmp_path: Path) -> None:
    run = RunData.load(make_run(tmp_path, "a", steps=40), "a")
    assert smoothing_window(40) == 2
    # Each window of 2 steps: 10 tokens at 0, 50 at 1, 20 at 2 -> p50 1, p95 2, max 2.
    xs, p50 = run.staleness("staleness_p50")
    assert xs[:3] == [2.0, 4.0, 6.0] and len(xs) == 20
    assert set(p50) == {1.0}
    assert set(run.staleness("staleness_p95")[1]) == {2.0}
    assert run.learner("accuracy", 100)[1][:2] == pytest.approx([30.0, 35.0])


def test_two_runs_overlay_in_one_report_with_a_row_each(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    a, b = make_run(tmp_path, "dapo"), make_run(tmp_path, "grpo", eval_after=0.3)
    path = write_report([a, b], tmp_path / "compare")
    text = path.read_text()
    assert (
        "| dapo | async | 4 | 30 s | 2.50 | 16 | 9 (8 / 1) | 2 | 25.0 % → 50.0 % | 50.0 % → 75.0 % |" in text
    )
    assert (
        "| grpo | async | 4 | 30 s | 2.50 | 16 | 9 (8 / 1) | 2 | 25.0 % → 30.0 % | 50.0 % → 75.0 % |" in text
    )
    pngs = sorted(p.name for p in (tmp_path / "compare" / "report").glob("*.png"))
    assert pngs == sorted(
        [
            "eval.png",
            "reward_accuracy.png",
            "entropy.png",
            "length_truncation.png",
            "filtered_groups.png",
            "staleness.png",
            "clip_fractions.png",
            "importance_weights.png",
            "throughput.png",
            "weight_sync.png",
        ]
    )
    assert all(f"(report/{name})" in text for name in pngs)
    assert "Not recorded" not in text


def test_without_matplotlib_the_report_keeps_its_table_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    run = make_run(tmp_path, "a")
    path = write_run_report(run)
    assert path == run / "report.md"
    text = path.read_text()
    assert "matplotlib is not installed (pip install -e '.[report]')" in text
    assert "| a | async | 4 |" in text
    assert not (run / "report").exists()


def test_a_report_that_cannot_be_written_does_not_fail_the_run(tmp_path: Path) -> None:
    assert write_run_report(tmp_path / "no-such-run") is None


def test_command_line_errors_name_the_fix(tmp_path: Path) -> None:
    a, b = make_run(tmp_path, "a"), make_run(tmp_path, "b")
    with pytest.raises(ConfigError, match="--out DIR"):
        report_cli(argparse.Namespace(run_dirs=[a, b], out=None))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no run"):
        report_cli(argparse.Namespace(run_dirs=[tmp_path / "empty"], out=tmp_path / "out"))
    with pytest.raises(ConfigError, match="is not a directory"):
        report_cli(argparse.Namespace(run_dirs=[tmp_path / "missing"], out=tmp_path / "out"))


def test_each_source_gets_its_figure_from_the_cumulative_counts(tmp_path: Path) -> None:
    """metrics.jsonl's `sources` (the launcher's per-source totals) give per-step ratios: step 1 -> 2
    adds 8 samples of "words" with 6 correct and a score sum moving from -2 to 2 (mean +0.5), and
    2 groups of which 1 kept (50% dropped)."""
    from stream_dapo.tools.launch import source_totals
    from stream_dapo.tools.report import source_figures

    snap = {
        "generator-0": {
            'stream_dapo_generator_source_samples_total{source="words"}': 8.0,
            'stream_dapo_generator_source_correct_total{source="words"}': 5.0,
            'stream_dapo_generator_source_score_sum{source="words"}': 2.0,
            'stream_dapo_generator_source_groups_total{outcome="mixed",source="words"}': 1.0,
            'stream_dapo_generator_source_groups_total{outcome="all_wrong",source="words"}': 1.0,
            'stream_dapo_generator_reward_failures_total{reason="timeout",source="words"}': 1.0,
            'stream_dapo_generator_source_samples_total{source="mine"}': 4.0,
        },
        "generator-1": {'stream_dapo_generator_source_samples_total{source="words"}': 8.0},
    }
    totals = source_totals(snap, ["words", "mine", "absent"])
    assert totals["words"]["samples"] == 16.0 and totals["words"]["groups"] == 2.0
    assert totals["words"]["groups_kept"] == 1.0 and totals["words"]["reward_failures"] == 1.0
    assert totals["mine"]["samples"] == 4.0 and totals["absent"]["samples"] == 0.0

    run_dir = make_run(tmp_path, "a")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    counts = [
        (0, 0, 0.0, 0, 0),
        (8, 2, -2.0, 2, 1),
        (16, 8, 2.0, 4, 2),
        (16, 8, 2.0, 4, 2),
        (24, 10, 2.0, 6, 4),
    ]
    for row, (n, c, s, g, k) in zip(rows[1:], counts, strict=True):
        row["sources"] = {
            "words": {"samples": n, "correct": c, "score_sum": s, "groups": g, "groups_kept": k}
        }
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = RunData.load(run_dir, "a")
    assert run.source_names() == ["words"]
    assert run.source_ratio("words", "correct", "samples", 100.0) == ([2.0, 4.0], [75.0, 25.0])
    assert run.source_ratio("words", "score_sum", "samples") == ([2.0, 4.0], [0.5, 0.0])
    (figure,) = source_figures([run])
    assert figure.name == "source_words"
    assert figure.panels[1].lines[0].series(run) == ([2.0, 4.0], [50.0, 0.0])

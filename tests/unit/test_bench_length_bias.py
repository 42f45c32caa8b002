"""The figures bench/studies/length_bias.py derives from a run's files, against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.studies.length_bias import run_figures, weighted_mean


def test_weighted_mean_weighs_and_refuses_nothing_to_weigh() -> None:
    assert weighted_mean([(0.1, 1.0), (0.4, 3.0)]) == pytest.approx(0.325)  # (0.1 + 1.2) / 4
    assert weighted_mean([(0.5, 0.0)]) is None


def test_trained_and_generated_figures_of_a_run(tmp_path: Path) -> None:
    # 2 steps per rollout batch (8 prompts x 4 samples / 16); each batch's steps repeat its window.
    (tmp_path / "config.toml").write_text(
        "[algo]\ngroup_size = 4\n[learner]\nrollout_batch_prompts = 8\nmini_batch_samples = 16\n"
        "[buffer]\nin_flight_hold_s = 300.0\n"
    )
    summary = {"learner_steps": 4, "groups_accepted": 20, "groups_dropped_stale": 3, "learner_holds": 7}
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "train_seconds": 40.0}))
    window_a = {"gen_truncation_rate": 0.1, "gen_groups": 10, "gen_response_len_mean": 300.0}
    window_b = {"gen_truncation_rate": 0.4, "gen_groups": 30, "gen_response_len_mean": 500.0}
    rows = [
        {"version": 1, "samples": 16, "truncation_rate": 0.0, "response_len_mean": 200.0,
         "batch_wait_seconds": 6.0, **window_a},
        {"version": 2, "samples": 16, "truncation_rate": 0.25, "response_len_mean": 400.0,
         "batch_wait_seconds": 6.0, **window_a},
        {"event": "checkpoint"},
        {"version": 3, "samples": 16, "truncation_rate": 0.5, "response_len_mean": 600.0,
         "batch_wait_seconds": 4.0, **window_b},
        {"version": 4, "samples": 16, "truncation_rate": 0.25, "response_len_mean": 400.0,
         "batch_wait_seconds": 4.0, **window_b},
    ]  # fmt: skip
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval_after.json").write_text(json.dumps({"avg_at_k": 0.25}))
    f = run_figures(tmp_path)
    assert f["in_flight_hold_s"] == 300.0 and f["learner_holds"] == 7 and f["groups_dropped_stale"] == 3
    assert f["trained_truncation"] == pytest.approx(0.25)  # (0 + .25 + .5 + .25) / 4, equal weights
    assert f["generated_truncation"] == pytest.approx(0.325)  # (0.1 x 10 + 0.4 x 30) / 40
    assert f["trained_len"] == pytest.approx(400.0)
    assert f["generated_len"] == pytest.approx(450.0)  # (300 x 10 + 500 x 30) / 40
    assert f["learner_wait_share"] == pytest.approx(0.25)  # (6 + 4) / 40, once per rollout batch
    assert f["trained_samples_per_s"] == pytest.approx(1.6)  # 64 / 40
    assert f["eval_avg_at_k"] == 0.25

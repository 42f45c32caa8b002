"""bench/perf/async_vs_sync.py's time breakdown from hand-made run files (no run)."""

from __future__ import annotations

import json

from bench.perf.async_vs_sync import time_breakdown


def _run_dir(tmp_path, generator: dict | None):
    (tmp_path / "learner").mkdir()
    rows = [  # two rollout batches of 2 steps: a batch's wait and proximal seconds repeat on its steps
        {
            "version": 1,
            "batch_wait_seconds": 30.0,
            "step_seconds": 10.0,
            "proximal_seconds": 2.0,
            "weight_sync_seconds": 1.0,
        },
        {
            "version": 2,
            "batch_wait_seconds": 30.0,
            "step_seconds": 10.0,
            "proximal_seconds": 2.0,
            "weight_sync_seconds": 1.0,
        },
        {
            "version": 3,
            "batch_wait_seconds": 5.0,
            "step_seconds": 12.0,
            "proximal_seconds": 3.0,
            "weight_sync_seconds": 1.5,
        },
        {
            "version": 4,
            "batch_wait_seconds": 5.0,
            "step_seconds": 12.0,
            "proximal_seconds": 3.0,
            "weight_sync_seconds": 1.5,
        },
    ]
    (tmp_path / "learner" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if generator is not None:
        (tmp_path / "final-metrics").mkdir()
        (tmp_path / "final-metrics" / "generator-0.json").write_text(json.dumps(generator))
    return tmp_path


def test_a_rollout_batchs_wait_counts_once_and_generator_figures_come_from_its_final_metrics(tmp_path):
    gen = {
        "stream_dapo_generator_tokens_total": 5000.0,
        "stream_dapo_generator_weight_sync_seconds_sum": 7.5,
        "stream_dapo_generator_verifier_latency_seconds_sum": 0.5,
    }
    b = time_breakdown(_run_dir(tmp_path, gen), {"train_seconds": 100.0}, steps_per_rollout=2)
    assert b["learner_wait_seconds"] == 35.0 and b["learner_proximal_seconds"] == 5.0
    assert b["learner_step_seconds"] == 44.0 and b["learner_publish_seconds"] == 5.0
    assert b["generator_tokens_per_second"] == 50.0


def test_a_generator_without_final_metrics_is_unknown_not_zero(tmp_path):
    b = time_breakdown(_run_dir(tmp_path, None), {"train_seconds": 100.0}, steps_per_rollout=2)
    assert b["generator_tokens_per_second"] is None
    assert b["generator_weight_load_seconds"] is None and b["generator_verify_seconds"] is None

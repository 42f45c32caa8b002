"""bench/studies/weight_delta_run.py's figures from a hand-made run folder (no run)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.studies.weight_delta_run import arm_figures, summarize


def _run_folder(root: Path, sync_sum: float, versions: int, received: float) -> Path:
    run = root / "run"
    (run / "learner").mkdir(parents=True)
    (run / "final-metrics").mkdir()
    rows = [
        {"version": 1, "wall_time": 160.0, "weight_sync_seconds": 0.8, "tokens": 100, "step_seconds": 10.0},
        {"version": 2, "wall_time": 190.0, "weight_sync_seconds": 1.0, "tokens": 100, "step_seconds": 10.0},
        {"version": 3, "wall_time": 220.0, "weight_sync_seconds": 0.9, "tokens": 100, "step_seconds": 10.0},
    ]
    (run / "learner" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"generator_weight_sync_seconds": s}) + "\n" for s in (7.0, 8.0, 6.0))
    )
    (run / "final-metrics" / "generator-0.json").write_text(
        json.dumps(
            {
                "stream_dapo_generator_weight_sync_seconds_count": float(versions),
                "stream_dapo_generator_weight_sync_seconds_sum": sync_sum,
                "stream_dapo_generator_weight_received_bytes_total": received,
                "stream_dapo_generator_weight_delta_ratio": 0.5,
            }
        )
    )
    return run


def test_an_arms_figures_come_from_its_final_metrics_and_learner_rows(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, sync_sum=22.2, versions=3, received=807e6)
    trained = {
        "launch": 100.0,
        "summary": {"learner_steps": 3, "samples_generated": 96, "train_seconds": 120.0},
    }
    got = arm_figures(run, trained, steps_per_rollout=1)
    assert got["learner_steps"] == 3 and got["samples_generated"] == 96
    assert got["first_step_after_launch_s"] == 60.0  # 160 - 100
    assert got["seconds_per_step"] == 30.0  # (220 - 160) / 2
    assert got["versions_loaded"] == 3 and got["generator_sync_s_mean"] == 7.4  # 22.2 / 3
    assert got["received_mb_per_version"] == 269.0  # 807 MB / 3
    assert got["sync_generator_load_s"] == {"median": 7.0, "min": 6.0, "max": 8.0}
    assert got["sync_learner_publish_s"]["median"] == 0.9
    assert got["throughput"]["learner_tokens_per_s_stepping"] == 10.0  # 300 tokens / 30 s


def test_the_summary_is_the_median_per_arm_over_repeats() -> None:
    runs = [
        {
            "arm": "true",
            "learner_steps": 20,
            "seconds_per_step": 31.0,
            "generator_sync_s_mean": 7.0,
            "received_mb_per_version": 300.0,
        },
        {
            "arm": "true",
            "learner_steps": 22,
            "seconds_per_step": 30.0,
            "generator_sync_s_mean": 8.0,
            "received_mb_per_version": 310.0,
        },
        {
            "arm": "false",
            "learner_steps": 25,
            "seconds_per_step": 27.0,
            "generator_sync_s_mean": 1.5,
            "received_mb_per_version": None,
        },
    ]
    got = summarize(runs)
    assert got["true"] == {
        "runs": 2,
        "learner_steps": 21.0,
        "seconds_per_step": 30.5,
        "generator_sync_s_mean": 7.5,
        "received_mb_per_version": 305.0,
    }
    assert got["false"]["runs"] == 1 and got["false"]["received_mb_per_version"] is None

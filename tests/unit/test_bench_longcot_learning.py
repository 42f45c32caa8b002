"""bench/studies/longcot_learning.py's choice of checkpoints and its figure at the time budget, by hand."""

from __future__ import annotations

import json

import pytest

import bench.studies.longcot_learning as bench
import bench.studies.peer_trl as peer


def test_scores_the_multiples_and_the_checkpoints_either_side_of_the_budget():
    step_time = {20: 1100.0, 40: 1200.0, 60: 1300.0, 80: 1400.0, 100: 1500.0}  # launched at 1000
    chosen = bench.steps_to_score(step_time, [20, 40, 60, 80, 100], launch=1000.0, budget_s=250.0, every=80)
    # 80 is the multiple; 40 finished at 200 s (the last inside 250 s), 60 at 300 s (the first past it).
    assert chosen == [40, 60, 80]


def test_a_budget_past_every_checkpoint_adds_only_the_last_one():
    step_time = {20: 10.0, 40: 20.0, 60: 30.0}
    assert bench.steps_to_score(step_time, [20, 40, 60, 61], launch=0.0, budget_s=99.0, every=40) == [40, 60]


def test_the_figure_at_the_budget_is_the_last_point_inside_it():
    P = peer.CurvePoint
    curve = [P(0, 0.0, 0.5575), P(280, 1150.0, 0.68), P(300, 1210.0, 0.72)]
    assert bench.at_budget(curve, 1200.0) == {
        "step": 280,
        "t_s": 1150.0,
        "avg_at_k": 0.68,
        "gain_points": 12.25,
    }
    assert bench.at_budget(curve, 10.0)["gain_points"] == 0.0  # only the start model is inside


def test_a_seed_report_keeps_only_the_scored_checkpoints():
    side = {
        "launch": 0.0,
        "step_time": {1: 20.0, 2: 24.0, 3: 28.0, 4: 32.0},
        "checkpoints": {2: "ck2", 4: "ck4"},
        "steps_log": [{"version": v, "entropy": 0.03 - v * 0.001} for v in (1, 2, 3, 4)],
        "summary": {"learner_steps": 4, "train_seconds": 31.0},
    }
    evals = {"ck4": {"avg_at_k": 0.70, "pass_at_k": 0.9, "truncation_rate": 0.01, "mean_response_len": 300.0}}
    start = {"avg_at_k": 0.50, "pass_at_k": 0.8}
    rep = bench.seed_report(side, evals, start, budget_s=30.0, target=0.60)
    assert [p["step"] for p in rep["curve"]] == [0, 4]  # ck2 was not scored
    assert rep["at_budget"]["step"] == 0  # step 4 finished at 32 s, past the 30 s budget
    assert rep["time_to_target"]["interpolated_s"] == pytest.approx(16.0)  # half-way from 0.5 to 0.7
    assert rep["seconds_per_step"] == pytest.approx(4.0)
    assert rep["steps_within_budget"] == 3
    assert rep["startup_s"] == 20.0
    assert rep["entropy_first_last"] == pytest.approx([0.029, 0.026])
    assert bench.spread([10.0, 14.0])["std"] == pytest.approx(2.828, abs=1e-3)


def _run_dir(tmp_path, times: dict[int, float], checkpoints: list[int]):
    out = tmp_path / "seed-0" / "stream-dapo"
    (out / "learner").mkdir(parents=True)
    rows = [json.dumps({"version": v, "wall_time": t}) for v, t in times.items()]
    (out / "learner" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    for step in checkpoints:
        hf = out / "checkpoints" / f"step_{step:06d}" / "hf"
        hf.mkdir(parents=True)
        (hf / "model.safetensors").write_bytes(b"")
    (out / "summary.json").write_text(json.dumps({"learner_steps": max(times), "wall_seconds": 50.0}))
    return out


def test_a_run_is_past_its_budget_once_a_complete_checkpoint_finished_after_it(tmp_path):
    out = _run_dir(tmp_path, {20: 1030.0, 40: 1060.0}, [20])
    assert not peer._past_budget(out, launch=1000.0, budget_s=45.0)  # step 40 has no checkpoint yet
    (out / "checkpoints" / "step_000040" / "hf").mkdir(parents=True)
    assert not peer._past_budget(out, launch=1000.0, budget_s=45.0)  # its weights are not written
    (out / "checkpoints" / "step_000040" / "hf" / "model.safetensors").write_bytes(b"")
    assert peer._past_budget(out, launch=1000.0, budget_s=45.0)
    assert not peer._past_budget(out, launch=1000.0, budget_s=60.0)


def test_evaluating_a_work_directory_needs_the_launch_time_and_uses_it(tmp_path):
    _run_dir(tmp_path, {20: 1030.0, 40: 1060.0}, [20, 40])
    with pytest.raises(SystemExit, match="launch.json is missing"):
        bench.collected_side(tmp_path / "seed-0")
    (tmp_path / "seed-0" / "launch.json").write_text(json.dumps({"launch": 1000.0}))
    side = bench.collected_side(tmp_path / "seed-0")
    assert side["launch"] == 1000.0 and side["wall_s"] == 50.0
    assert sorted(side["checkpoints"]) == [20, 40] and side["step_time"] == {20: 1030.0, 40: 1060.0}

"""`stream-dapo ablate`: its pure parts, against hand-computed numbers."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.cli import ablate as ablate_cli
from stream_dapo.config import load_config
from stream_dapo.tools import ablate as ablation
from stream_dapo.tools.ablate import (
    CURVE_METRICS,
    SPARSE_CURVES,
    CellResult,
    CurvePoint,
    Spread,
    aggregate,
    cell_is_done,
    cell_overrides,
    config_fingerprint,
    curve_window_means,
    direction,
    mean_curve,
    plot_curves,
    preset_changes,
    read_curves,
    render_markdown,
    spread,
    time_to_target,
    to_json,
    window_means,
)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.toml"


# ------------------------------------------------------------------------------------ mean ± spread


def test_spread_is_mean_and_sample_std() -> None:
    s = spread([0.2, 0.3, 0.4])
    assert s is not None
    # deviations 0.1, 0, 0.1: sum of squares 0.02 over n - 1 = 2 -> variance 0.01, std 0.1
    assert s.mean == pytest.approx(0.3) and s.std == pytest.approx(0.1)
    assert (s.lo, s.hi, s.n) == (0.2, 0.4, 3)


def test_spread_of_one_seed_has_no_std_and_of_none_is_none() -> None:
    assert spread([0.5]) == Spread(mean=0.5, std=None, lo=0.5, hi=0.5, n=1)
    assert spread([]) is None
    assert spread([float("nan"), 1.0]) == Spread(mean=1.0, std=None, lo=1.0, hi=1.0, n=1)


# ------------------------------------------------------------------------------------ presets, cells


def test_each_preset_changes_one_switch_of_the_row_above() -> None:
    assert preset_changes("naive-grpo") == {}
    assert preset_changes("+clip-higher") == {"algo.eps_high": (0.2, 0.28)}
    assert preset_changes("dapo") == {"algo.dynamic_sampling": (False, True)}
    with pytest.raises(ValueError, match="unknown preset"):
        preset_changes("ppo")


def test_cell_overrides_beat_a_recipe_file_that_sets_the_switches(tmp_path: Path) -> None:
    # tiny-cpu.toml sets DAPO's switches; algo.preset alone fills only unset keys.
    alone = load_config([TINY], ["algo.preset=naive-grpo"], environ={})
    assert alone.algo.dynamic_sampling is True and alone.algo.eps_high == 0.28
    sets = cell_overrides("naive-grpo", seed=2, budget=5, cell_dir=tmp_path / "naive-grpo" / "seed-2")
    cfg = load_config([TINY], sets, environ={})
    assert cfg.algo.preset == "naive-grpo"
    assert (cfg.algo.eps_high, cfg.algo.agg_mode) == (0.2, "seq-mean-token-mean")
    assert (cfg.algo.dynamic_sampling, cfg.algo.soft_overlong, cfg.algo.overlong_filter) == (False,) * 3
    assert (cfg.generator.seed, cfg.learner.seed, cfg.data.seed) == (2, 2, 0)
    assert cfg.learner.total_steps == 5 and cfg.run.eval_before_after is False
    assert cfg.run.out_dir == str(tmp_path / "naive-grpo" / "seed-2")


def test_fingerprint_ignores_ports_and_out_dir_but_not_training_or_model() -> None:
    def fp(*sets: str, model: str | None = "m1") -> str:
        return config_fingerprint(load_config([TINY], list(sets), environ={}), model)

    base = fp()
    assert fp("transport.samples_port=6001", "metrics.learner_port=9999", 'run.out_dir="/x"') == base
    assert fp("learner.lr=3e-5") != base
    assert fp("learner.total_steps=3") != base
    assert fp(model="m2") != base


def test_the_before_eval_is_keyed_on_what_it_depends_on_only() -> None:
    def fp(*sets: str, model: str | None = "m1") -> str:
        return ablation.eval_fingerprint(load_config([TINY], list(sets), environ={}), model)

    base = fp()
    assert fp("learner.lr=2e-4", 'algo.preset="naive-grpo"', "learner.total_steps=3") == base
    assert fp("eval.k=8") != base
    assert fp("algo.max_response_len=64") != base
    assert fp(model="m2") != base


def plan_args(out: Path, **changes: Any) -> argparse.Namespace:
    """`stream-dapo ablate`'s arguments: one dapo cell of 3 steps on the tiny recipe, plus `changes`."""
    values: dict[str, Any] = {
        "config": [str(TINY)],
        "overrides": [],
        "presets": "dapo",
        "seeds": 1,
        "budget": 3,
        "out": str(out),
        "target_delta": 0.05,
    }
    return argparse.Namespace(**{**values, **changes})


def test_children_read_a_snapshot_of_the_resolved_base_config(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(TINY.read_text())
    plan = ablate_cli.make_plan(plan_args(tmp_path, config=[str(recipe)], overrides=["learner.lr=3e-4"]))
    before, _ = plan.cell_config("dapo", 0)
    ablation.freeze_base_config(plan)
    assert plan.run_files == [str(tmp_path / "base-config.toml")]
    recipe.write_text("[learner]\nlr = 5e-5\n")  # someone edits the recipe mid-ablation
    cfg, sets = plan.cell_config("dapo", 0)
    assert cfg == before and cfg.learner.lr == 3e-4 and cfg.learner.total_steps == 3
    argv = plan.child_argv("run", sets, "--quiet")
    assert argv[argv.index("--config") + 1] == str(tmp_path / "base-config.toml")
    assert "learner.lr=3e-4" not in argv  # already in the snapshot


def _finish_cell(cell: Path, fingerprint: str) -> None:
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"samples_generated": 64}))
    (cell / "eval_after.json").write_text(json.dumps({"avg_at_k": 0.5, "k": 4}))
    (cell / "ablation_cell.json").write_text(json.dumps({"fingerprint": fingerprint, "wall_seconds": 9.0}))


def test_a_cell_is_done_only_with_summary_eval_and_a_matching_record(tmp_path: Path) -> None:
    cell = tmp_path / "cell"
    assert not cell_is_done(cell, "abc")
    _finish_cell(cell, "abc")
    assert cell_is_done(cell, "abc")
    assert not cell_is_done(cell, "other")
    (cell / "eval_after.json").unlink()
    assert not cell_is_done(cell, "abc")


def test_the_model_key_names_the_build_and_its_weights(tmp_path: Path) -> None:
    from stream_dapo.model.tiny import write_marker

    folder = tmp_path / "warm"
    cfg = load_config([TINY], [f"model.path={json.dumps(str(folder))}"], environ={})
    assert ablation.model_key(cfg) is None  # nothing built there
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights of one build")
    write_marker(folder, {"kind": "warm", "key": "k1"})
    first = ablation.model_key(cfg)
    assert first is not None and first.startswith("k1/")
    assert ablation.model_key(cfg) == first  # the same files, the same key
    # The same build key with other weights (the same config warmed up on another machine): a
    # different model, so a finished cell's fingerprint no longer matches.
    (folder / "model.safetensors").write_bytes(b"weights of another build")
    second = ablation.model_key(cfg)
    assert second is not None and second.startswith("k1/") and second != first
    assert config_fingerprint(cfg, first) != config_fingerprint(cfg, second)


def test_a_finished_cell_is_reused_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = ablate_cli.make_plan(plan_args(tmp_path))
    monkeypatch.setattr(ablation.cells, "model_key", lambda cfg: "m1")
    cfg, _ = plan.cell_config("dapo", 0)
    _finish_cell(plan.cell_dir("dapo", 0), config_fingerprint(cfg, "m1"))

    def no_child(*a: object, **k: object) -> None:
        raise AssertionError("a finished cell must not be run again")

    monkeypatch.setattr(ablation.cells.subprocess, "run", no_child)
    cell = ablation.run_cell(plan, "dapo", 0)
    assert cell.status == "reused" and cell.eval_after == {"avg_at_k": 0.5, "k": 4}
    assert cell.wall_seconds == 9.0


def test_plan_orders_presets_as_the_table_and_rejects_unknown_ones(tmp_path: Path) -> None:
    args = plan_args(tmp_path, presets="dapo,naive-grpo", seeds=2, budget=None)
    plan = ablate_cli.make_plan(args)
    assert plan.presets == ["naive-grpo", "dapo"] and plan.seeds == [0, 1]
    assert plan.budget == load_config([TINY], environ={}).learner.total_steps
    with pytest.raises(SystemExit, match="unknown preset"):
        ablate_cli.make_plan(argparse.Namespace(**{**vars(args), "presets": "dapo,grpo"}))


# ------------------------------------------------------------------------------------ curves


def test_read_curves_keeps_the_last_row_of_a_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"version": 1, "accuracy": 0.1, "entropy": 0.5},
        {"version": 2, "accuracy": 0.2, "entropy": 0.4},
        {"version": 2, "accuracy": 0.25, "entropy": 0.45},  # rewritten after a resume
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curves = read_curves(path)
    assert curves["accuracy"] == {1: 0.1, 2: 0.25}
    assert curves["entropy"] == {1: 0.5, 2: 0.45}
    assert curves["truncation_rate"] == {}  # an older learner did not log it


def test_mean_curve_averages_steps_every_seed_has() -> None:
    got = mean_curve([{1: 0.2, 2: 0.4, 3: 0.9}, {1: 0.4, 2: 0.6}, {}])
    assert [p.step for p in got] == [1, 2]
    assert got[0].mean == pytest.approx(0.3) and (got[0].lo, got[0].hi) == (0.2, 0.4)
    assert got[1].mean == pytest.approx(0.5) and (got[1].lo, got[1].hi) == (0.4, 0.6)
    assert mean_curve([]) == []


def test_a_sparse_curve_is_averaged_per_window_before_over_seeds() -> None:
    # Seeds that record at different steps share no step, but they share windows of 10 steps.
    a = {3: 0.2, 7: 0.4, 15: 1.0}
    b = {4: 0.6, 12: 0.5, 18: 0.7, 25: 0.9}
    assert window_means(a, 10) == {10: pytest.approx(0.3), 20: 1.0}
    assert window_means(b, 10) == {10: 0.6, 20: pytest.approx(0.6), 30: 0.9}
    assert mean_curve([a, b]) == []  # step by step, nothing in common
    got = mean_curve([a, b], 10)
    assert [p.step for p in got] == [10, 20]  # window 30: only seed b
    assert got[0].mean == pytest.approx(0.45) and (got[0].lo, got[0].hi) == pytest.approx((0.3, 0.6))
    assert got[1].mean == pytest.approx(0.8) and (got[1].lo, got[1].hi) == pytest.approx((0.6, 1.0))
    assert set(SPARSE_CURVES) <= set(CURVE_METRICS)


# ------------------------------------------------------------------------------------ table


def _cell(preset: str, seed: int, acc: float, samples: int, trunc: float = 0.0) -> CellResult:
    return CellResult(
        preset=preset,
        seed=seed,
        status="done",
        eval_after={"avg_at_k": acc, "pass_at_k": acc + 0.3, "k": 4, "truncation_rate": trunc},
        summary={"samples_generated": samples},
        curves={"accuracy": {1: acc, 2: acc + 0.1}},
    )


CELLS = [
    _cell("naive-grpo", 0, 0.20, 1000, 0.01),
    _cell("naive-grpo", 1, 0.30, 1200, 0.03),
    _cell("dapo", 0, 0.35, 2000),
    _cell("dapo", 1, 0.40, 2400),
    CellResult("dapo", 2, "failed", error="boom"),
]


def test_aggregate_pairs_deltas_by_seed_and_counts_failures() -> None:
    rows = aggregate(CELLS, ["naive-grpo", "dapo"])
    naive, dapo = rows["naive-grpo"], rows["dapo"]
    assert naive["avg_at_k"].mean == pytest.approx(0.25)
    assert naive["avg_at_k"].std == pytest.approx(math.sqrt(0.005))  # (0.05² + 0.05²) / 1
    assert naive["truncation_rate"].mean == pytest.approx(0.02)
    assert naive["delta_vs_naive_grpo"].mean == 0.0
    # per-seed differences 0.15 and 0.10: mean 0.125, std sqrt(2 * 0.025² / 1)
    assert dapo["delta_vs_naive_grpo"].mean == pytest.approx(0.125)
    assert dapo["delta_vs_naive_grpo"].std == pytest.approx(math.sqrt(2 * 0.025**2))
    assert dapo["delta_vs_previous"] == dapo["delta_vs_naive_grpo"]
    assert dapo["samples_generated"].mean == 2200
    assert (dapo["seeds_done"], dapo["seeds_failed"]) == ([0, 1], [2])
    assert dapo["paper_aime_avg32"] == 50
    expected = [CurvePoint(1, 0.375, 0.35, 0.40), CurvePoint(2, 0.475, 0.45, 0.5)]
    got = dapo["curves"]["accuracy"]
    assert [p.step for p in got] == [1, 2]
    for p, e in zip(got, expected, strict=True):
        assert (p.mean, p.lo, p.hi) == pytest.approx((e.mean, e.lo, e.hi))


def test_markdown_table_holds_mean_std_delta_paper_and_samples() -> None:
    report = {
        "meta": {
            "config_files": ["tiny.toml"],
            "overrides": [],
            "seeds": [0, 1, 2],
            "budget": 4,
            "k": 4,
            "eval_prompts": 200,
        },
        "eval_before": {"avg_at_k": 0.244, "pass_at_k": 0.63, "truncation_rate": 0.00625},
        "presets": aggregate(CELLS, ["naive-grpo", "dapo"]),
    }
    md = render_markdown(to_json(report))  # as read back from ablation.json
    lines = md.splitlines()
    row = next(line for line in lines if line.startswith("| dapo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "dynamic_sampling False → True"
    assert cells[2] == "37.5 ± 3.5"  # 0.375 ± 0.0354
    assert cells[3] == "67.5 ± 3.5"
    assert cells[4] == "+12.5 ± 3.5"
    assert cells[5] == "50"
    assert cells[6] == "2,200 ± 283"  # std of 2000, 2400
    assert cells[7] == "0.00 ± 0.00"
    assert cells[8] == "2, 1 failed"
    assert "| warm model (before RL) | — | 24.4 | 63.0 |" in md
    step = next(line for line in lines if line.startswith("| naive-grpo → dapo |"))
    assert "| +20 |" in step and "same direction" in step


def test_curve_windows_average_each_seeds_first_and_last_quarter() -> None:
    # 8 steps: quarters are steps 1-2 and 7-8.
    assert curve_window_means({s: float(s) for s in range(1, 9)}) == {"first": 1.5, "last": 7.5}
    assert curve_window_means({3: 0.4}) == {"first": 0.4, "last": 0.4}  # one step is both quarters
    assert curve_window_means({}) is None
    # A sparse curve (recorded on some steps only) is cut by the run's steps: 40 steps, quarters of 10.
    assert curve_window_means({2: 0.14}, span=(1, 40)) == {"first": 0.14, "last": None}
    assert curve_window_means({2: 0.2, 10: 0.4, 11: 9.0, 31: 0.6, 40: 0.8}, span=(1, 40)) == {
        "first": pytest.approx(0.3),
        "last": pytest.approx(0.7),
    }
    sparse = CellResult(
        "dapo",
        0,
        "done",
        eval_after={"avg_at_k": 0.3},
        curves={"entropy": {s: 0.3 for s in range(1, 41)}, "clip_high_prob_mean": {2: 0.14}},
    )
    clip = aggregate([sparse], ["dapo"])["dapo"]["curve_windows"]["clip_high_prob_mean"]
    assert clip["first"].mean == pytest.approx(0.14) and clip["last"] is None  # not "0.14 -> 0.14"
    rows = aggregate(CELLS, ["naive-grpo", "dapo"])
    # dapo's accuracy curves are {1: 0.35, 2: 0.45} and {1: 0.40, 2: 0.50}: quarter = 1 step each
    windows = rows["dapo"]["curve_windows"]["accuracy"]
    assert windows["first"].mean == pytest.approx(0.375) and windows["last"].mean == pytest.approx(0.475)
    assert windows["first"].std == pytest.approx(math.sqrt(2 * 0.025**2))
    assert rows["dapo"]["curve_windows"]["entropy"] == {"first": None, "last": None}
    md = render_markdown(
        to_json(
            {
                "meta": {"config_files": ["t.toml"], "overrides": [], "seeds": [0, 1], "budget": 2},
                "presets": rows,
            }
        )
    )
    line = next(x for x in md.splitlines() if x.startswith("| training-batch accuracy |"))
    assert line == "| training-batch accuracy | 0.25 ± 0.071 → 0.35 ± 0.071 | 0.375 ± 0.035 → 0.475 ± 0.035 |"
    assert "| policy entropy (nats/token) | — | — |" in md


def test_time_to_target_takes_the_first_trailing_window_at_target() -> None:
    curve = {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.8}
    wall = {1: 100.0, 2: 110.0, 3: 120.0, 4: 130.0}
    # windows of 2: 0.55 (step 2), 0.65 (step 3) -> step 3; the run started 130 - 50 = 80
    assert time_to_target(curve, wall, 0.64, train_seconds=50.0, window=2) == {"step": 3, "seconds": 40.0}
    assert time_to_target(curve, wall, 0.64, train_seconds=None, window=2) == {"step": 3, "seconds": 20.0}
    assert time_to_target(curve, {}, 0.64, train_seconds=50.0, window=2) == {"step": 3, "seconds": None}
    assert time_to_target(curve, wall, 0.9, train_seconds=50.0, window=2) is None
    assert time_to_target({1: 0.9}, wall, 0.5, train_seconds=None, window=2) is None  # too few points


def test_aggregate_reports_cost_and_time_to_target() -> None:
    def cell(seed: int, start: float, trained: int) -> CellResult:
        curve = {s: start + 0.01 * s for s in range(1, 31)}
        return CellResult(
            "dapo",
            seed,
            "done",
            eval_after={"avg_at_k": 0.5, "pass_at_k": 0.8, "k": 4, "truncation_rate": 0.0},
            summary={"samples_generated": 1600, "groups_trained": trained, "train_seconds": 300.0},
            curves={"gen_accuracy": curve, "wall_time": {s: 1000.0 + 10 * s for s in range(1, 31)}},
        )

    # seed 0: window means over 10 points reach 0.60 when start + 0.01 * (step - 4.5) >= 0.60
    cells = [cell(0, 0.50, 100), cell(1, 0.40, 50), cell(2, 0.0, 100)]
    row = aggregate(cells, ["dapo"], target=0.60, group_size=8)["dapo"]
    # seed 0: mean of steps s-9..s is 0.5 + 0.01 (s - 4.5) >= 0.6 at s = 14.5 -> step 15
    # seed 1: 0.4 + 0.01 (s - 4.5) >= 0.6 at s = 24.5 -> step 25; seed 2 never gets there
    # started 1000 + 300 - 300 = 1000: seconds 150 and 250
    tt = row["to_target"]
    assert (tt["reached"], tt["runs"]) == (2, 3)
    assert tt["steps"].mean == pytest.approx(20.0) and (tt["steps"].lo, tt["steps"].hi) == (15, 25)
    assert tt["seconds"].mean == pytest.approx(200.0)
    # 1600 generated / (100 x 8) = 2.0, / (50 x 8) = 4.0: mean 2.67
    assert row["generated_per_trained"].mean == pytest.approx(8 / 3)
    md = render_markdown(
        to_json(
            {
                "meta": {"config_files": ["t.toml"], "overrides": [], "seeds": [0, 1, 2], "budget": 30},
                "presets": {"dapo": row},
            }
        )
    )
    line = next(x for x in md.splitlines() if x.startswith("| dapo | 2.67"))
    assert line == "| dapo | 2.67 ± 1.2 | — | — | 20 ± 7.1 | 200 ± 71 | 2 of 3 |"  # no trained-group logs
    assert "reaches 60.0%" in md
    # What the spread is made of: each seed's own steps and seconds (seed 2 never reached it).
    assert row["per_seed"][1] == {
        "avg_at_k": 0.5,
        "pass_at_k": 0.8,
        "samples_generated": 1600.0,
        "train_seconds": 300.0,
        "steps_to_target": 25,
        "seconds_to_target": 250.0,
    }
    assert "| dapo | 0 | 50.0 | 80.0 | 1,600 | 15 | 150 | 300 |" in md.splitlines()
    assert "| dapo | 2 | 50.0 | 80.0 | 1,600 | — | — | 300 |" in md.splitlines()


def test_samples_that_carry_gradient_are_counted_from_the_trained_groups_outcomes(tmp_path: Path) -> None:
    """Without dynamic sampling the learner trains all-wrong and all-correct groups at zero advantage;
    "samples generated per sample trained" counted them as trained (no-dynamic-sampling looked 2x
    cheaper than it is per sample that carries gradient)."""
    from stream_dapo.tools.ablate.cells import trained_outcomes

    run = tmp_path / "cell"
    (run / "generators").mkdir(parents=True)
    (run / "learner").mkdir()
    assert trained_outcomes(run) is None  # no learner log
    outcomes = {"a": "mixed", "b": "all_wrong", "c": "all_correct", "d": "mixed"}
    (run / "generators" / "generator-0.groups.jsonl").write_text(
        "\n".join(json.dumps({"group_id": g, "outcome": o}) for g, o in outcomes.items()) + "\n{torn"
    )
    (run / "learner" / "trained_groups.jsonl").write_text(
        json.dumps({"version": 1, "group_ids": ["a", "b"]})
        + "\n"
        + json.dumps({"version": 2, "group_ids": ["d", "e"]})
        + '\n{"version": 3, "group_ids": ["c"'  # the torn tail of a killed learner
    )
    assert trained_outcomes(run) == {"mixed": 2, "all_wrong": 1, "unknown": 1}

    def cell(seed: int, mixed: int, wrong: int) -> CellResult:
        return CellResult(
            "no-dynamic-sampling",
            seed,
            "done",
            eval_after={"avg_at_k": 0.5, "pass_at_k": 0.8, "k": 4, "truncation_rate": 0.0},
            summary={"samples_generated": 160, "groups_trained": mixed + wrong},
            trained_outcomes={"mixed": mixed, "all_wrong": wrong},
        )

    row = aggregate([cell(0, 10, 10), cell(1, 5, 15)], ["no-dynamic-sampling"], group_size=8)[
        "no-dynamic-sampling"
    ]
    # 160 / (20 x 8) = 1.0 per sample trained either way; per mixed sample 160 / 80 = 2, 160 / 40 = 4
    assert row["generated_per_trained"].mean == pytest.approx(1.0)
    assert row["generated_per_mixed_trained"].mean == pytest.approx(3.0)
    # zero-advantage share of trained groups: 10/20 and 15/20
    assert row["trained_zero_advantage_share"].mean == pytest.approx(0.625)
    md = render_markdown(
        to_json(
            {
                "meta": {"config_files": ["t.toml"], "overrides": [], "seeds": [0, 1], "budget": 3},
                "presets": {"no-dynamic-sampling": row},
            }
        )
    )
    assert "| no-dynamic-sampling | 1 ± 0 | 3 ± 1.4 | 62.5 ± 17.7 | — | — | — of — |" in md


def test_target_from_train_starts_at_the_training_rewards_first_window(tmp_path: Path) -> None:
    def cell(preset: str, seed: int, first: float, done: bool = True) -> CellResult:
        # first 10 steps at `first`, then 0.9: the start level reads only the first window
        curve = {s: (first if s <= 10 else 0.9) for s in range(1, 21)}
        return CellResult(
            preset,
            seed,
            "done" if done else "failed",
            eval_after={"avg_at_k": 0.5, "pass_at_k": 0.8, "k": 4, "truncation_rate": 0.0} if done else None,
            summary={"samples_generated": 160, "groups_trained": 20, "train_seconds": 100.0},
            curves={"gen_accuracy": curve},
        )

    cells = [
        cell("dapo-all", 0, 0.20),
        cell("no-clip-higher", 0, 0.30),
        cell("no-clip-higher", 1, 0.0, done=False),
    ]
    assert ablation.training_start(cells) == pytest.approx(0.25)  # the failed cell is not counted
    assert ablation.training_start([cell("dapo-all", 0, 0.2, done=False)]) is None
    plan = ablation.Plan([], [], ["dapo-all", "no-clip-higher"], [0], 20, tmp_path, target_delta=0.05)
    before = {"avg_at_k": 0.10, "pass_at_k": 0.3, "k": 4, "truncation_rate": 0.0, "num_prompts": 8}
    by_eval = ablation.build_report(plan, before, cells)
    assert by_eval["presets"]["dapo-all"]["to_target"]["target"] == pytest.approx(0.15)
    assert by_eval["presets"]["dapo-all"]["to_target"]["steps"].mean == 10  # 0.2 >= 0.15 at once
    plan.target_from = "train"
    report = ablation.build_report(plan, before, cells)
    assert report["meta"]["target_start"] == pytest.approx(0.25)
    tt = report["presets"]["dapo-all"]["to_target"]
    # target 0.30: dapo-all's trailing 10-step mean is 0.2 + 0.07 (s - 10) >= 0.30 from step 12 on
    assert tt["target"] == pytest.approx(0.30) and tt["steps"].mean == 12
    md = render_markdown(to_json(report))
    assert "reaches 30.0%, the training reward's own starting level (25.0%)" in md
    assert "reaches 15.0%, the warm model's eval avg@k plus --target-delta" in render_markdown(
        to_json(by_eval)
    )
    # A fixed level: a cell added with another start (here 0.40) moves start + delta, not the target
    plan.target_level = 0.30
    more = [*cells, cell("no-clip-higher", 1, 0.40)]
    assert ablation.training_start(more) == pytest.approx(0.30)
    fixed = ablation.build_report(plan, before, more)
    assert fixed["meta"]["target_level"] == 0.30 and fixed["meta"]["target_start"] == pytest.approx(0.30)
    tt = fixed["presets"]["dapo-all"]["to_target"]
    assert tt["target"] == pytest.approx(0.30) and tt["steps"].mean == 12  # as before the cell came
    assert (
        "reaches 30.0%, a level fixed by --target-level; the training reward's own starting level over "
        "the finished runs is 30.0%" in render_markdown(to_json(fixed))
    )


@pytest.mark.parametrize("level", [0.0, -0.1, 1.5, 28.4])
def test_target_level_outside_zero_one_names_the_fix(tmp_path: Path, level: float) -> None:
    args = plan_args(tmp_path, target_level=level)
    with pytest.raises(SystemExit, match=r"--target-level .* give a fraction in \(0, 1\], e.g. 0.284"):
        ablate_cli.make_plan(args)
    plan = ablate_cli.make_plan(argparse.Namespace(**{**vars(args), "target_level": 0.284}))
    assert plan.target_level == 0.284


def test_direction_reports_opposite_steps_and_noise() -> None:
    assert direction(Spread(-0.02, None, -0.02, -0.02, 1), 6) == "opposite direction"
    assert direction(Spread(0.01, 0.03, -0.02, 0.04, 3), 2) == "same direction (within 1 std over seeds)"
    assert direction(None, 6) == "—"


# ------------------------------------------------------------------------------------ plots


def test_plots_skip_with_a_message_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    files, why = plot_curves(aggregate(CELLS, ["naive-grpo", "dapo"]), tmp_path)
    assert files == [] and why is not None and "matplotlib" in why
    assert not any(tmp_path.iterdir())


def test_plots_one_png_per_metric(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files, why = plot_curves(to_json(aggregate(CELLS, ["naive-grpo", "dapo"])), tmp_path)
    assert why is None
    assert sorted(p.name for p in files) == [
        "accuracy.png",
        "clip_frac_high.png",
        "clip_frac_low.png",
        "clip_high_prob_mean.png",
        "entropy.png",
        "gen_accuracy.png",
        "gen_filtered_share_all_correct.png",
        "gen_filtered_share_all_wrong.png",
        "gen_response_len_mean.png",
        "gen_truncation_rate.png",
        "response_len_mean.png",
        "truncated_in_loss_share.png",
        "truncation_rate.png",
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files)


def test_a_setting_added_later_is_left_out_of_the_fingerprint_at_its_neutral_value() -> None:
    """The committed long-CoT cell ran before buffer.in_flight_hold_s existed (no hold). With the
    setting at 0 (what the code did then) its recorded fingerprint still matches, so the ladder
    resumes with `--set buffer.in_flight_hold_s=0`; with the default hold it does not, and a cell
    trained with the hold is never put in one table with it."""
    root = REPO / "docs" / "results" / "ablation-longcot"
    cell = root / "cells" / "naive-grpo" / "seed-0"
    recorded = json.loads((cell / "ablation_cell.json").read_text())["fingerprint"]
    start = load_config([cell / "config.toml"], [f"model.path='{root / 'start-model'}'"], environ={})
    key = ablation.model_key(start)
    no_hold = load_config([cell / "config.toml"], ["buffer.in_flight_hold_s=0"], environ={})
    assert config_fingerprint(no_hold, key) == recorded
    assert config_fingerprint(load_config([cell / "config.toml"], [], environ={}), key) != recorded


@pytest.mark.process
def test_a_stop_signal_to_ablate_is_passed_on_to_its_running_child(tmp_path: Path) -> None:
    """Regression: SIGTERM to `stream-dapo ablate` alone left its `stream-dapo run` child training.
    The child here exits 7 on SIGTERM; ablate's handler forwards the signal it receives, then the
    previous handler is back."""
    import os
    import signal
    import threading

    child = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    log_path = tmp_path / "child.log"
    ready = threading.Event()

    def signal_once_ready() -> None:
        while "ready" not in log_path.read_text():  # the child's own word that its handler is set
            ready.wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with log_path.open("w") as log_file:
        waiter = threading.Thread(target=signal_once_ready)
        waiter.start()
        code, stopped_by = ablation.run_child([sys.executable, "-c", child], log_file)
        waiter.join()
    assert (code, stopped_by) == (7, signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.process
def test_a_training_cell_reports_progress_while_its_child_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ablate used to print nothing for the 40+ minutes a real-model cell trains. The child here
    exits only once the progress callback has run (it waits for the file the callback writes), so
    the line is logged whatever the machine's speed."""
    import logging

    go = tmp_path / "go"
    child = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n"
    calls: list[int] = []

    def progress() -> str:
        calls.append(1)
        go.touch()
        return "dapo seed 0: step 3/40"

    with (
        caplog.at_level(logging.INFO, logger="stream_dapo.tools.ablate"),
        (tmp_path / "c.log").open("w") as log_file,
    ):
        code, stopped_by = ablation.run_child([sys.executable, "-c", child], log_file, progress, every_s=0.01)
    assert (code, stopped_by) == (0, None) and calls
    assert "dapo seed 0: step 3/40" in caplog.messages


def test_cell_progress_reads_the_last_complete_metrics_row(tmp_path: Path) -> None:
    from stream_dapo.tools.ablate.cells import cell_progress

    metrics = tmp_path / "metrics.jsonl"
    assert cell_progress(metrics, 160) is None  # no file before the learner's first step
    rows = [
        {"version": 11, "accuracy": 0.25, "gen_accuracy": 0.2, "entropy": 0.4},
        {"version": 12, "accuracy": 0.5, "gen_accuracy": 0.25, "entropy": 0.3},
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"version": 13, "acc')
    assert (
        cell_progress(metrics, 160)
        == "step 12/160, batch accuracy 0.500, training reward 0.250, entropy 0.300"
    )


def test_a_finished_cells_checkpoints_are_pruned_and_its_final_export_kept(tmp_path: Path) -> None:
    from stream_dapo.tools.ablate.cells import prune_checkpoints

    cell = tmp_path / "dapo" / "seed-0"
    (cell / "checkpoints" / "step_000010").mkdir(parents=True)
    (cell / "checkpoints" / "step_000010" / "optim.pt").write_bytes(b"x" * 300)
    (cell / "checkpoints" / "step_000010" / "model.pt").write_bytes(b"x" * 200)
    (cell / "checkpoints" / "latest").symlink_to("step_000010")
    (cell / "final").mkdir()
    (cell / "final" / "model.safetensors").write_bytes(b"w" * 100)
    assert prune_checkpoints(cell) == 500
    assert not (cell / "checkpoints").exists()
    assert (cell / "final" / "model.safetensors").read_bytes() == b"w" * 100
    assert prune_checkpoints(cell) == 0  # nothing left to prune


def test_a_model_kept_as_its_checksum_has_the_key_of_its_weights(tmp_path: Path) -> None:
    """docs/results keeps no model weights: a start model is kept as weights.sha256, and its key (which
    the cells' fingerprints hold) is the one its weight files had."""
    import hashlib

    from stream_dapo.tools.ablate.cells import WEIGHTS_DIGEST

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "stream_dapo_model.json").write_text(json.dumps({"key": "k1", "kind": "warm"}))
    (folder / "a.safetensors").write_bytes(b"first")
    (folder / "b.safetensors").write_bytes(b"second")
    cfg = load_config(overrides=[f"model.path='{folder}'"], environ={})
    with_weights = ablation.cells.model_key(cfg)
    assert with_weights == "k1/" + hashlib.sha256(b"firstsecond").hexdigest()[:16]
    for p in folder.glob("*.safetensors"):
        p.unlink()
    (folder / WEIGHTS_DIGEST).write_text(hashlib.sha256(b"firstsecond").hexdigest() + "\n")
    assert ablation.cells.model_key(cfg) == with_weights
    (folder / WEIGHTS_DIGEST).unlink()
    assert ablation.cells.model_key(cfg) == "k1/" + hashlib.sha256(b"").hexdigest()[:16]


def test_the_off_policy_arms_run_through_ablate_in_table_order_and_dry_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        config=[str(TINY)],
        overrides=[],
        presets="gspo,token-tis",
        seeds=1,
        budget=2,
        out=str(tmp_path / "out"),
        target_delta=0.05,
        report_only=False,
        dry_run=True,
    )
    plan = ablate_cli.make_plan(args)
    assert plan.presets == ["token-tis", "gspo"]
    assert ablate_cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "[2/2] gspo seed 0 (to run; fingerprint" in printed and "2 cells, 2 to run, 0 done" in printed
    assert "algo.ratio_level=" in printed and "algo.preset" not in printed
    assert not (tmp_path / "out").exists()


def test_a_warm_up_or_import_folder_has_a_model_key_of_its_build_and_weights(tmp_path: Path) -> None:
    """[sft]'s output (sft.json) and an imported model (import.json) are builds too: before, their
    key was None, so a cell matched any weights at model.path."""
    sft, imported = tmp_path / "sft", tmp_path / "imported"
    for folder in (sft, imported):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
    (sft / "sft.json").write_text(json.dumps({"key": "6d876a9172e9e8fc", "final_loss": 0.17}))
    (imported / "import.json").write_text(json.dumps({"source_sha256": "b179c9523d0e6a0f98a3"}))
    keys = {
        f.name: ablation.cells.model_key(load_config(overrides=[f"model.path='{f}'"], environ={}))
        for f in (sft, imported)
    }
    digest = __import__("hashlib").sha256(b"w").hexdigest()[:16]
    assert keys == {"sft": f"sft-6d876a9172e9e8fc/{digest}", "imported": f"import-b179c9523d0e6a0f/{digest}"}


def test_rebuilt_start_reuses_cells_of_another_build_of_the_same_warm_up_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(
        config=[str(TINY)],
        overrides=[],
        presets="dapo",
        seeds=1,
        budget=3,
        out=str(tmp_path),
        target_delta=0.05,
    )
    plan = ablate_cli.make_plan(args)
    cfg, _ = plan.cell_config("dapo", 0)
    cell = plan.cell_dir("dapo", 0)
    _finish_cell(cell, config_fingerprint(cfg, "sft-k1/aaaa"))
    record = json.loads((cell / "ablation_cell.json").read_text())
    (cell / "ablation_cell.json").write_text(json.dumps({**record, "start_model": "sft-k1/aaaa"}))
    finished = ablation.cells.finished_cell
    assert finished(cell, cfg, "sft-k1/aaaa")  # the same build
    assert not finished(cell, cfg, "sft-k1/bbbb")  # a rebuild: not without the flag
    assert finished(cell, cfg, "sft-k1/bbbb", rebuilt_start=True)
    assert not finished(cell, cfg, "sft-k2/aaaa", rebuilt_start=True)  # another warm-up
    other_cfg, _ = plan.cell_config("naive-grpo", 0)
    assert not finished(cell, other_cfg, "sft-k1/bbbb", rebuilt_start=True)  # another config

    plan.rebuilt_start = True
    monkeypatch.setattr(ablation.cells, "model_key", lambda cfg: "sft-k1/bbbb")
    reused = ablation.run_cell(plan, "dapo", 0)
    assert reused.status == "reused" and reused.start_model == "sft-k1/aaaa"
    report = ablation.cells.build_report(plan, {"avg_at_k": 0.2, "k": 4}, [reused])
    assert report["meta"]["start_models"] == ["sft-k1/aaaa"]


def test_the_report_names_the_builds_a_table_mixes() -> None:
    from stream_dapo.tools.ablate.render import render_markdown

    meta = {"seeds": [0, 1], "budget": 3, "config_files": ["c.toml"], "overrides": [], "k": 4}
    one = render_markdown({"meta": {**meta, "start_models": ["sft-k1/aaaa"]}, "presets": {}})
    two = render_markdown({"meta": {**meta, "start_models": ["sft-k1/aaaa", "sft-k1/bbbb"]}, "presets": {}})
    assert "builds of the start model" not in one
    assert "started from 2 builds of the start model (sft-k1/aaaa, sft-k1/bbbb" in two


def test_cells_record_their_machine_and_a_report_over_several_says_seconds_do_not_compare(
    tmp_path: Path,
) -> None:
    from stream_dapo.runtime.host import describe_machine
    from stream_dapo.tools.ablate.render import render_markdown

    old, new = tmp_path / "old", tmp_path / "new"
    _finish_cell(old, "f1")  # a record from before machines were recorded
    _finish_cell(new, "f2")
    record = json.loads((new / "ablation_cell.json").read_text())
    (new / "ablation_cell.json").write_text(json.dumps({**record, "machine": describe_machine(cores=2)}))
    a = ablation.cells.load_cell("dapo-all", 0, old, "reused")
    b = ablation.cells.load_cell("dapo-all", 1, new, "reused")
    assert a.machine is None and b.machine == describe_machine(cores=2)
    assert b.machine.endswith(", 2 usable cores")
    plan = ablation.Plan([], [], ["dapo-all"], [0, 1], 3, tmp_path, target_delta=0.05)
    before = {"avg_at_k": 0.2, "pass_at_k": 0.4, "k": 4, "truncation_rate": 0.0, "num_prompts": 8}
    one = ablation.build_report(plan, before, [b])
    assert one["meta"]["machines"] == [b.machine]
    assert "wall-clock columns" not in render_markdown(to_json(one))
    both = ablation.build_report(plan, before, [a, b])
    assert both["meta"]["machines"] == sorted(["not recorded", b.machine])
    md = render_markdown(to_json(both))
    assert f"trained on 2 machines ({'; '.join(both['meta']['machines'])}): their wall-clock columns" in md
    # a failed cell trained nothing to time: it names no machine
    failed = CellResult("dapo-all", 2, "failed", error="exited 1")
    assert ablation.build_report(plan, before, [b, failed])["meta"]["machines"] == [b.machine]


def test_cells_record_their_code_version_and_a_report_over_several_names_them(tmp_path: Path) -> None:
    from stream_dapo.tools.ablate.render import render_markdown

    cells = []
    for seed, code in enumerate([None, "0d3d33f", "1a2b3c4 (with uncommitted changes)", "0d3d33f"]):
        cell = tmp_path / f"seed-{seed}"
        _finish_cell(cell, f"f{seed}")
        record = json.loads((cell / "ablation_cell.json").read_text())
        if code is not None:  # seed 0: a record from before code versions were recorded
            (cell / "ablation_cell.json").write_text(json.dumps({**record, "code": code}))
        cells.append(ablation.cells.load_cell("dapo-all", seed, cell, "reused"))
    assert [c.code for c in cells] == [None, "0d3d33f", "1a2b3c4 (with uncommitted changes)", "0d3d33f"]
    plan = ablation.Plan([], [], ["dapo-all"], [0, 1, 2, 3], 3, tmp_path, target_delta=0.05)
    before = {"avg_at_k": 0.2, "pass_at_k": 0.4, "k": 4, "truncation_rate": 0.0, "num_prompts": 8}
    same = ablation.build_report(plan, before, [cells[1], cells[3]])
    assert same["meta"]["code_versions"] == ["0d3d33f"]
    assert "versions of the code" not in render_markdown(to_json(same))
    mixed = ablation.build_report(plan, before, cells)
    assert mixed["meta"]["code_versions"] == ["0d3d33f", "1a2b3c4 (with uncommitted changes)", "not recorded"]
    assert (
        "- The cells ran 3 versions of the code (0d3d33f; 1a2b3c4 (with uncommitted changes); not recorded)"
        in render_markdown(to_json(mixed))
    )


def test_a_partial_report_names_the_planned_cells_not_done(tmp_path: Path) -> None:
    from stream_dapo.tools.ablate.render import render_markdown

    plan = ablation.Plan([], [], ["dapo-all", "no-clip-higher"], [0, 1], 3, tmp_path, target_delta=0.05)
    before = {"avg_at_k": 0.2, "pass_at_k": 0.4, "k": 4, "truncation_rate": 0.0, "num_prompts": 8}

    def done(preset: str, seed: int) -> CellResult:
        return CellResult(preset, seed, "done", eval_after={**before, "avg_at_k": 0.3}, summary={})

    failed = CellResult("no-clip-higher", 0, "failed", error="exited 1")
    partial = ablation.build_report(plan, before, [done("dapo-all", 0), failed, done("dapo-all", 1)])
    assert partial["meta"]["cells_planned"] == 4
    assert partial["meta"]["cells_not_done"] == ["no-clip-higher seed 0", "no-clip-higher seed 1"]
    md = render_markdown(to_json(partial)).splitlines()
    assert (
        "**Partial: 2 of 4 planned cells done**; not done yet: no-clip-higher seed 0, no-clip-higher seed 1."
        in md
    )
    cells = [done(p, s) for s in (0, 1) for p in ("dapo-all", "no-clip-higher")]
    whole = ablation.build_report(plan, before, cells)
    assert whole["meta"]["cells_not_done"] == []
    assert not any(line.startswith("**Partial") for line in render_markdown(to_json(whole)).splitlines())


def test_figures_from_a_thousand_up_are_whole_numbers_with_separators() -> None:
    from stream_dapo.tools.ablate.render import _num

    assert _num(Spread(1270.4, 310.2, 1050.0, 1490.0, 2)) == "1,270 ± 310"
    assert _num(Spread(2326.2, None, 2326.2, 2326.2, 1)) == "2,326"
    assert _num(Spread(22.5, 3.54, 20.0, 25.0, 2)) == "22.5 ± 3.5"  # below 1,000: three significant digits


def test_max_cells_trains_that_many_reuses_finished_ones_and_names_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        config=[str(TINY)],
        overrides=[],
        presets="dapo",
        seeds=4,
        budget=3,
        out=str(tmp_path / "out"),
        target_delta=0.05,
        report_only=False,
        max_cells=1,
    )
    plan = ablate_cli.make_plan(args)
    monkeypatch.setattr(ablation.cells, "model_key", lambda cfg: "m1")
    before = {"avg_at_k": 0.2, "pass_at_k": 0.4, "k": 4, "truncation_rate": 0.0, "num_prompts": 8}
    monkeypatch.setattr(ablate_cli, "evaluate_before", lambda plan: before)
    trained: list[int] = []

    def train(plan: ablation.Plan, preset: str, seed: int) -> CellResult:  # stands in for the child run
        if ablation.cells.plan_cell_finished(plan, preset, seed):
            return ablation.cells.load_cell(preset, seed, plan.cell_dir(preset, seed), "reused")
        trained.append(seed)
        cfg, _ = plan.cell_config(preset, seed)
        _finish_cell(plan.cell_dir(preset, seed), config_fingerprint(cfg, "m1"))
        return ablation.cells.load_cell(preset, seed, plan.cell_dir(preset, seed), "done")

    monkeypatch.setattr(ablate_cli, "run_cell", train)
    cfg, _ = plan.cell_config("dapo", 2)
    _finish_cell(plan.cell_dir("dapo", 2), config_fingerprint(cfg, "m1"))  # finished in an earlier call

    assert ablate_cli.run(args) == 0
    assert trained == [0]  # one cell trained; seed 2, finished already, reused past the cap
    report = json.loads((tmp_path / "out" / "ablation.json").read_text())
    assert report["presets"]["dapo"]["seeds_done"] == [0, 2]
    assert report["meta"]["cells_not_done"] == ["dapo seed 1", "dapo seed 3"]
    assert "trained 1 cell(s) in this call; not started: dapo seed 1, dapo seed 3" in capsys.readouterr().out

    assert ablate_cli.run(args) == 0  # the same command goes on
    assert trained == [0, 1]
    assert "not started: dapo seed 3." in capsys.readouterr().out
    assert ablate_cli.run(argparse.Namespace(**{**vars(args), "max_cells": 5})) == 0
    assert trained == [0, 1, 3]
    assert "not started" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--max-cells must be >= 1"):
        ablate_cli.make_plan(argparse.Namespace(**{**vars(args), "max_cells": 0}))

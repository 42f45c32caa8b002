"""bench/studies/offpolicy.py: its arms resolve to the intended configs, its cells are told apart and
resumed by fingerprint, and its figures from hand-made metric rows are the hand-computed ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.studies import offpolicy
from bench.studies.offpolicy import (
    StudyCell,
    cell_figures,
    estimate_seconds,
    make_plans,
    parse_args,
    render,
    staleness_stats,
    summarise,
)
from stream_dapo.core.presets import OFFPOLICY_PRESETS, PRESETS
from stream_dapo.tools import ablate as ablation
from stream_dapo.tools.ablate import (
    CELL_RECORD,
    cell_overrides,
    config_fingerprint,
    describe_changes,
    planned_cells,
)


def _plans(tmp_path: Path, *extra: str) -> dict[str, Any]:
    return make_plans(parse_args(["--out", str(tmp_path), *extra]))


# ------------------------------------------------------------------------------------ arms and cells


def test_each_arm_resolves_to_a_valid_config_with_its_correction_and_the_binding_bound(
    tmp_path: Path,
) -> None:
    plan = _plans(tmp_path)["float32"]
    params = {arm: plan.cell_config(arm, 0)[0] for arm in OFFPOLICY_PRESETS}
    for cfg in params.values():
        assert cfg.algo.max_staleness == 8 and cfg.learner.sync_every == 4 and cfg.learner.total_steps == 60
        assert cfg.algo.dynamic_sampling and cfg.model.dtype == "float32"  # the long-CoT DAPO recipe
        assert cfg.admission.capacity == 16  # (8 - 2 steps per rollout - 3 lag + 1) x 4 groups per step
    tis, geo, ice, gspo = (params[a].algo.loss_params for a in ("token-tis", "geo-mask", "icepop", "gspo"))
    assert (tis.is_level, tis.is_mode, tis.is_cap, tis.ratio_level, tis.agg_mode) == (
        "token", "truncate", 2.0, "token", "token-mean"
    )  # fmt: skip
    assert (geo.is_level, geo.is_mode, geo.is_cap) == ("geometric", "mask", 1.01)
    assert 1 / geo.is_cap == pytest.approx(0.99, abs=1e-4)  # SkyRL's band [0.99, 1.01]
    assert (ice.is_level, ice.is_mode, ice.icepop_low, ice.icepop_high) == ("token", "icepop", 0.5, 5.0)
    assert (gspo.ratio_level, gspo.agg_mode, gspo.eps_low, gspo.eps_high) == (
        "sequence", "seq-mean-token-mean", 3e-4, 4e-4
    )  # fmt: skip
    assert (gspo.is_level, gspo.is_mode, gspo.is_cap) == ("token", "truncate", 2.0)  # token TIS kept


def test_bf16_cells_run_bfloat16_at_zero_stage_1(tmp_path: Path) -> None:
    plans = _plans(tmp_path, "--bf16")
    assert list(plans) == ["float32", "bfloat16"]
    cfg = plans["bfloat16"].cell_config("icepop", 1)[0]
    assert cfg.model.dtype == "bfloat16" and cfg.learner.zero_stage == 1 and cfg.algo.is_mode == "icepop"
    assert plans["bfloat16"].cell_dir("icepop", 1) == tmp_path / "bfloat16" / "icepop" / "seed-1"
    assert list(_plans(tmp_path, "--bf16-only")) == ["bfloat16"]


def test_arms_set_no_table1_preset_and_are_read_against_token_tis(tmp_path: Path) -> None:
    sets = cell_overrides("geo-mask", 0, 5, tmp_path)
    assert not any(s.startswith("algo.preset=") for s in sets)
    assert any(s.startswith("algo.preset=") for s in cell_overrides("dapo", 0, 5, tmp_path))
    assert (
        describe_changes("geo-mask")
        == "is_level token → geometric, is_mode truncate → mask, is_cap 2.0 → 1.01"
    )
    assert describe_changes("token-tis").startswith("baseline: ")
    assert not set(OFFPOLICY_PRESETS) & set(PRESETS)
    # Every arm sets the same keys, so no recipe value leaks into one arm and not another.
    assert len({frozenset(o) for o in OFFPOLICY_PRESETS.values()}) == 1


def test_fingerprints_differ_between_arms_and_repeat_across_reruns(tmp_path: Path) -> None:
    def fingerprints() -> dict[tuple[str, int], str]:
        plan = _plans(tmp_path)["float32"]
        return {
            (a, s): config_fingerprint(plan.cell_config(a, s)[0], "m1")
            for a in plan.presets
            for s in plan.seeds
        }

    first, again = fingerprints(), fingerprints()
    assert first == again
    assert len({first[(a, 0)] for a in OFFPOLICY_PRESETS}) == len(OFFPOLICY_PRESETS)
    bf16 = _plans(tmp_path, "--bf16-only")["bfloat16"]
    assert config_fingerprint(bf16.cell_config("token-tis", 0)[0], "m1") != first[("token-tis", 0)]


def test_a_finished_cell_is_planned_as_done_and_left_out_of_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ablation.cells, "model_key", lambda cfg: "m1")
    plan = _plans(tmp_path, "--seeds", "1", "--arms", "token-tis,gspo")["float32"]
    cfg, _ = plan.cell_config("gspo", 0)
    cell = plan.cell_dir("gspo", 0)
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text("{}")
    (cell / "eval_after.json").write_text("{}")
    (cell / CELL_RECORD).write_text(
        json.dumps({"fingerprint": config_fingerprint(cfg, "m1"), "wall_seconds": 600})
    )
    planned = planned_cells(plan)
    assert [(c.preset, c.done) for c in planned] == [("token-tis", False), ("gspo", True)]
    assert 'algo.ratio_level="sequence"' in " ".join(planned[1].argv)
    est = estimate_seconds(planned, plan.budget, offpolicy._finished_wall(planned))
    assert (est["to_run"], est["per_cell_s"], est["total_s"]) == (1, 600.0, 600.0)
    fresh = estimate_seconds(planned, 60, [])
    assert fresh["per_cell_s"] == 90 + 60 * 8.0 + 120  # ESTIMATE_SECONDS


def test_arms_must_start_with_token_tis_and_be_known() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--arms", "gspo,token-tis"])
    with pytest.raises(SystemExit):
        parse_args(["--arms", "token-tis,cispo"])


# ------------------------------------------------------------------------------------ figures


def _write_cell(cell: Path, rows: list[dict[str, Any]], avg: float, train_s: float = 40.0) -> Path:
    (cell / "learner").mkdir(parents=True)
    (cell / "learner" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"learner_steps": 4, "train_seconds": train_s, "groups_dropped_stale": 1, "learner_holds": 3}
    (cell / "summary.json").write_text(json.dumps({**summary, "samples_generated": 500}))
    (cell / "eval_after.json").write_text(
        json.dumps({"avg_at_k": avg, "pass_at_k": 0.8, "truncation_rate": 0.05})
    )
    return cell


def _row(
    version: int, masked: float, w_mean: float, w_max: float, stale: dict[str, int], **kw: float
) -> dict:
    return {
        "version": version, "samples": 32, "masked_frac": masked, "is_weight_mean": w_mean,
        "is_weight_max": w_max, "staleness_counts": stale, "entropy": kw.get("entropy", 0.04),
        "step_seconds": kw.get("step", 4.0), "clip_frac_low": 0.01, "clip_frac_high": 0.03,
        "approx_kl_behaviour": 1e-4, "seq_ratio_min": kw.get("lo", 0.9), "seq_ratio_max": kw.get("hi", 1.1),
    }  # fmt: skip


ROWS = [
    _row(1, 0.0, 1.0, 1.0, {"0": 100}, entropy=0.08, step=3.0),
    _row(2, 0.1, 0.9, 1.5, {"1": 50, "2": 50}, entropy=0.06, lo=0.8),
    {"event": "checkpoint", "version": 2},
    _row(3, 0.2, 0.95, 2.0, {"7": 60, "8": 40}, entropy=0.04, hi=1.3),
    _row(3, 0.3, 0.8, 1.8, {"7": 50, "8": 50}, entropy=0.02, step=5.0),  # a resumed step: this one wins
    _row(4, 0.1, 0.85, 1.2, {"8": 100}, entropy=0.02, step=5.0),
]


def test_staleness_stats_of_a_histogram() -> None:
    s = staleness_stats({0: 10, 2: 30, 8: 60}, 8)
    assert s["shares"] == {"0": 0.1, "2": 0.3, "8": 0.6} and s["tokens"] == 100
    assert s["mean"] == pytest.approx(0.6 + 4.8)  # (2 x 30 + 8 x 60) / 100
    assert (s["p50"], s["p95"], s["max"], s["at_bound"]) == (8, 8, 8, 0.6)
    assert staleness_stats({1: 96, 3: 4}, 8)["p95"] == 1 and staleness_stats({}, 8)["mean"] is None


def test_cell_figures_from_hand_made_rows(tmp_path: Path) -> None:
    f = cell_figures(_write_cell(tmp_path / "c", ROWS, 0.6), 8)
    assert f["steps"] == 4 and f["avg_at_k"] == 0.6 and f["pass_at_k"] == 0.8
    assert f["masked_frac"] == pytest.approx((0 + 0.1 + 0.3 + 0.1) / 4)  # 0.125, every step alike
    assert f["masked_frac_max"] == 0.3
    assert f["is_weight_mean"] == pytest.approx((1 + 0.9 + 0.8 + 0.85) / 4)
    assert f["is_weight_max"] == 1.8  # the rewritten step 3's 2.0 is gone
    assert (f["seq_ratio_min"], f["seq_ratio_max"]) == (0.8, 1.1)
    assert f["clip_frac"] == pytest.approx(0.04)
    assert f["step_seconds"] == pytest.approx((3 + 4 + 5 + 5) / 4)
    assert f["train_seconds_per_step"] == 10.0  # 40 s / 4 steps
    assert f["entropy_first_last"] == {"first": 0.08, "last": 0.02}  # one step per quarter
    st = f["staleness"]  # tokens: 0:100, 1:50, 2:50, 7:50, 8:150 of 400
    assert st["tokens"] == 400 and st["at_bound"] == pytest.approx(150 / 400)
    assert st["mean"] == pytest.approx((50 + 100 + 350 + 1200) / 400)
    assert (st["p50"], st["p95"], st["max"]) == (2, 8, 8)


def test_arms_over_seeds_spread_pair_and_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offpolicy, "machine_info", lambda: {"cpu": "test"})  # no git subprocess

    def cell(arm: str, seed: int, avg: float, masked: float, at8: int) -> StudyCell:
        rows = [_row(v, masked, 1.0, 1.5, {"8": at8, "4": 100 - at8}) for v in (1, 2, 3, 4)]
        path = _write_cell(tmp_path / f"{arm}-{seed}", rows, avg)
        return StudyCell("float32", arm, seed, cell_figures(path, 8), offpolicy.cell_curves(path))

    cells = [
        cell("token-tis", 0, 0.50, 0.0, 20),
        cell("token-tis", 1, 0.60, 0.0, 40),
        cell("geo-mask", 0, 0.55, 0.10, 20),
        cell("geo-mask", 1, 0.75, 0.30, 60),
    ]
    arms = summarise(cells, ["token-tis", "geo-mask"])["float32"]
    geo = arms["geo-mask"]
    assert geo["avg_at_k"].mean == pytest.approx(0.65) and geo["avg_at_k"].std == pytest.approx(
        0.1414, abs=1e-4
    )
    assert geo["masked_frac"].mean == pytest.approx(0.2) and geo["masked_frac"].n == 2
    assert geo["delta_avg_at_k_vs_baseline"].mean == pytest.approx(0.10)  # +0.05 and +0.15, paired by seed
    assert geo["delta_avg_at_k_vs_baseline"].std == pytest.approx(0.0707, abs=1e-4)
    assert arms["token-tis"]["delta_avg_at_k_vs_baseline"] is None
    assert geo["staleness_at_bound"].mean == pytest.approx(0.4)
    assert geo["staleness_shares"] == {"4": pytest.approx(0.6), "8": pytest.approx(0.4)}
    assert [p.mean for p in geo["curves"]["masked_frac"]] == pytest.approx([0.2] * 4)
    args = parse_args(["--out", str(tmp_path), "--seeds", "2", "--arms", "token-tis,geo-mask"])
    report = offpolicy.build_report(
        args, make_plans(args), {"float32": {"avg_at_k": 0.4, "pass_at_k": 0.7}}, cells
    )
    page = render(ablation.to_json(report))
    assert "| geo-mask | 65.0 ± 14 | 10.0 ± 7.1 |" in page  # avg@k, Δ vs token-tis (pts)
    assert "Warm model before RL: avg@k 40.0%" in page and "admission line" in page.lower()
    assert "| token-tis | 70 | 30 |" in page  # token share per staleness 4 / 8, mean over seeds
    empty = render(ablation.to_json(offpolicy.build_report(args, make_plans(args), {}, [])))
    assert "Not run yet" in empty and "zero_stage" in empty


def test_bf16_seeds_plan_fewer_bf16_cells_and_the_page_says_which_seeds_ran_where(tmp_path: Path) -> None:
    plans = _plans(tmp_path, "--bf16", "--bf16-seeds", "1")
    assert plans["float32"].seeds == [0, 1, 2] and plans["bfloat16"].seeds == [0]
    assert (
        offpolicy._seeds_text({"seeds": [0, 1, 2], "seeds_by_dtype": {"float32": [0, 1, 2]}}) == "[0, 1, 2]"
    )
    both = {"seeds": [0, 1, 2], "seeds_by_dtype": {"float32": [0, 1, 2], "bfloat16": [0]}}
    assert offpolicy._seeds_text(both) == "[0, 1, 2] in float32, [0] in bfloat16"
    assert offpolicy._seeds_text({"seeds": [0]}) == "[0]"  # pages written before the per-dtype seeds
    with pytest.raises(SystemExit):
        parse_args(["--bf16-seeds", "1"])  # without --bf16 it would change nothing
    with pytest.raises(SystemExit):
        parse_args(["--bf16", "--bf16-seeds", "0"])

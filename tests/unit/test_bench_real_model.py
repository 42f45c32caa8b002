"""bench/studies/real_model.py's report and page from hand-made eval figures (no model, no run)."""

from __future__ import annotations

from bench.studies.real_model import _cached_evals, render_page, report


def _eval(avg: float, groups: dict[str, float] | None = None) -> dict:
    out = {
        "avg_at_k": avg,
        "pass_at_k": avg,
        "mean_response_len": 40.0,
        "truncation_rate": 0.0,
        "answered_rate": 1.0,
        "accuracy_when_answered": avg,
        "num_prompts": 4,
        "k": 4,
    }
    if groups is not None:
        out["by_group"] = {g: {"prompts": 2, "avg_at_k": v} for g, v in groups.items()}
    return out


def _rep(start: dict, final: dict) -> dict:
    rows = [
        {"wall_time": 110.0, "entropy": 0.5, "reward_mean": -0.5},
        {"wall_time": 130.0, "entropy": 0.4, "reward_mean": 0.0},
    ]
    trained = {"launch": 100.0, "stopped_at_budget": True, "summary": {"learner_steps": 2}}
    rep = report(["heldout"], start, final, trained, rows, [], 60.0)
    return {
        **rep,
        "seed": 0,
        "config": "configs/x.toml",
        "cores": 2,
        "machine": {"cpu_model": "cpu"},
        "overrides": ["learner.lr=2e-5", "learner.seed=0", "generator.seed=0"],
        "warm_start": None,
    }


def test_per_template_gains_reach_the_report_and_the_page():
    start = {"heldout_sampled": _eval(0.25, {"add": 0.5, "share": 0.0}), "heldout_greedy": _eval(0.25)}
    final = {"heldout_sampled": _eval(0.5, {"add": 0.75, "share": 0.25}), "heldout_greedy": _eval(0.5)}
    rep = _rep(start, final)
    e = rep["eval"]["heldout_sampled"]
    assert e["gain_points"] == 25.0
    assert e["by_template"] == {
        "add": {"prompts": 2, "before": 0.5, "after": 0.75},
        "share": {"prompts": 2, "before": 0.0, "after": 0.25},
    }
    assert "by_template" not in rep["eval"]["heldout_greedy"]
    page = render_page([rep])
    assert "--set learner.lr=2e-5" in page and "learner.seed=0" not in page
    assert "| add | 2 | 0.500 | 0.750 | +25.0 |" in page
    assert "| share | 2 | 0.000 | 0.250 | +25.0 |" in page


def test_a_kept_eval_set_is_measured_again_only_when_refreshed(tmp_path):
    path = tmp_path / "evals.json"
    asked: list[list[str]] = []

    def build(sets: dict) -> dict:
        asked.append(sorted(sets))
        return {f"{name}_sampled": {"run": len(asked)} for name in sets}

    data = {"heldout": "h.jsonl", "train": "t.jsonl"}
    _cached_evals(path, data, build)
    _cached_evals(path, data, build)
    kept = _cached_evals(path, data, build, refresh=["heldout"])
    assert asked == [["heldout", "train"], ["heldout"]]
    assert kept["heldout_sampled"] == {"run": 2} and kept["train_sampled"] == {"run": 1}

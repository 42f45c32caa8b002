"""bench/studies/real_model.py's report and page from hand-made eval figures (no model, no run)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.studies.real_model import _cached_evals, eval_keys, render_page, report


def _eval(avg: float, groups: dict[str, float] | None = None) -> dict:
    out: dict[str, object] = {
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


def _rep(start: dict, final: dict, names: list[str] | None = None) -> dict:
    rows = [
        {"wall_time": 110.0, "entropy": 0.5, "reward_mean": -0.5},
        {"wall_time": 130.0, "entropy": 0.4, "reward_mean": 0.0},
    ]
    trained = {"launch": 100.0, "stopped_at_budget": True, "summary": {"learner_steps": 2}}
    rep = report(names or ["heldout"], start, final, trained, rows, [], 60.0)
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
    assert "<details><summary>Per-template figures</summary>" in page


def test_the_spread_line_says_what_the_set_moved_without_its_largest_template():
    from bench.studies.real_model import spread_line

    groups = {
        "price": {"prompts": 20, "before": 0.2, "after": 0.5},  # +30: the largest
        "give": {"prompts": 20, "before": 0.1, "after": 0.175},  # +7.5
        "teams": {"prompts": 10, "before": 0.3, "after": 0.3},
        "change": {"prompts": 10, "before": 0.2, "after": 0.1},  # -10
    }
    # without price: (7.5 * 20 + 0 * 10 - 10 * 10) / 40 = +1.25 points
    assert spread_line(groups) == (
        "2 up, 1 unchanged, 1 down; without its largest gain (price, +30.0) the set moved +1.2 points."
    )
    assert spread_line({"only": {"prompts": 5, "before": 0.0, "after": 0.2}}) == "1 up, 0 unchanged, 0 down."


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


def test_a_kept_eval_set_is_measured_again_when_what_it_measured_changed(tmp_path, capsys):
    heldout, train = tmp_path / "h.jsonl", tmp_path / "t.jsonl"
    heldout.write_text('{"prompt": "a"}\n')
    train.write_text('{"prompt": "b"}\n')
    data = {"heldout": str(heldout), "train": str(train)}
    path = tmp_path / "evals.json"
    asked: list[list[str]] = []

    def build(sets: dict) -> dict:
        asked.append(sorted(sets))
        return {f"{name}_sampled": {"run": len(asked)} for name in sets}

    settings = {"weights": "w0", "seed": 0}
    _cached_evals(path, data, build, keys=eval_keys(data, settings))
    _cached_evals(path, data, build, keys=eval_keys(data, settings))
    assert asked == [["heldout", "train"]]
    train.write_text('{"prompt": "c"}\n')  # another train file: only that set again
    _cached_evals(path, data, build, keys=eval_keys(data, settings))
    assert asked[-1] == ["train"]
    _cached_evals(path, data, build, keys=eval_keys(data, {**settings, "weights": "w1"}))
    assert asked[-1] == ["heldout", "train"] and len(asked) == 3
    kept = json.loads(path.read_text())
    assert kept["keys"] == eval_keys(data, {**settings, "weights": "w1"})


def test_an_eval_file_older_than_the_keys_is_reused_and_said_so(tmp_path, capsys):
    heldout = tmp_path / "h.jsonl"
    heldout.write_text('{"prompt": "a"}\n')
    data = {"heldout": str(heldout)}
    path = tmp_path / "evals.json"
    path.write_text(json.dumps({"heldout_sampled": {"run": 0}}))

    def build(sets: dict) -> dict:
        raise AssertionError(f"measured again: {sets}")

    kept = _cached_evals(path, data, build, keys=eval_keys(data, {"seed": 0}))
    assert kept["heldout_sampled"] == {"run": 0}
    assert "kept without a key, not checked: heldout" in capsys.readouterr().out


def test_throughput_counts_a_rollout_batchs_wait_once_and_reaches_the_page():
    from bench.studies.real_model import throughput

    # Two rollout batches of 2 steps each: the rows repeat a batch's wait and generator rate.
    rows = [
        {
            "version": 1,
            "batch_wait_seconds": 30.0,
            "step_seconds": 10.0,
            "tokens": 1000,
            "gen_tokens_per_second": 90.0,
            "peak_rss_gib": 6.5,
        },
        {
            "version": 2,
            "batch_wait_seconds": 30.0,
            "step_seconds": 10.0,
            "tokens": 1000,
            "gen_tokens_per_second": 90.0,
            "peak_rss_gib": 7.0,
        },
        {
            "version": 3,
            "batch_wait_seconds": 10.0,
            "step_seconds": 15.0,
            "tokens": 500,
            "gen_tokens_per_second": 110.0,
            "peak_rss_gib": 7.25,
        },
        {
            "version": 4,
            "batch_wait_seconds": 10.0,
            "step_seconds": 15.0,
            "tokens": 500,
            "gen_tokens_per_second": 110.0,
            "peak_rss_gib": 7.25,
        },
    ]
    tp = throughput(rows, 2, train_seconds=200.0)
    assert tp == {
        "learner_wait_s": 40.0,  # 30 + 10, not 80
        "learner_wait_share": 0.2,
        "learner_tokens_per_s_stepping": 60.0,  # 3000 tokens / 50 s
        "generator_tokens_per_s": 100.0,
        "learner_peak_rss_gib": 7.25,
    }
    rep = _rep(
        {"heldout_sampled": _eval(0.25), "heldout_greedy": _eval(0.25)},
        {"heldout_sampled": _eval(0.5), "heldout_greedy": _eval(0.5)},
    )
    rep["training"]["throughput"] = tp
    page = render_page([rep])
    assert "waited for batches 40.0 s (20% of training), trained 60.0 tokens/s" in page
    assert "peak resident memory 7.25 GiB." in page
    old = {**tp, "learner_peak_rss_gib": None}
    assert "not recorded." in render_page([{**rep, "training": {**rep["training"], "throughput": old}}])
    planned = {**tp, "learner_planned_gib": 4.92}
    page = render_page([{**rep, "training": {**rep["training"], "throughput": planned}}])
    assert "peak resident memory 7.25 GiB (`stream-dapo plan --memory` without its reserve: 4.92 GiB;" in page


def test_the_planned_learner_memory_is_the_planners_total_without_its_reserve(tmp_path: Path) -> None:
    from bench.studies.real_model import planned_learner_gib
    from stream_dapo.config import load_config
    from stream_dapo.tools.memory_plan import DEFAULT_RESERVE_GIB, Settings, estimate, shape_for

    # A Llama-shaped config.json is all the planner reads.
    shape = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(shape))
    cfg = load_config(overrides=[f'model.path="{tmp_path}"'], environ={})
    got = planned_learner_gib(cfg)
    full = estimate(shape_for(str(tmp_path))[0], Settings.from_config(cfg), 1).total / 2**30
    assert got is not None and got == round(full - DEFAULT_RESERVE_GIB, 2) and got > 0
    assert (
        planned_learner_gib(load_config(overrides=[f'model.path="{tmp_path / "none"}"'], environ={})) is None
    )


def test_a_set_another_run_measured_under_the_same_key_is_copied_not_measured(tmp_path, capsys):
    heldout, train = tmp_path / "h.jsonl", tmp_path / "t.jsonl"
    heldout.write_text('{"prompt": "a"}\n')
    train.write_text('{"prompt": "b"}\n')
    data = {"heldout": str(heldout), "train": str(train)}
    same = eval_keys(data, {"weights": "w0", "seed": 0})
    other = eval_keys(data, {"weights": "w9", "seed": 0})
    donor = tmp_path / "seed-0" / "evals-start.json"
    donor.parent.mkdir()
    donor.write_text(
        json.dumps(
            {
                "heldout_sampled": {"avg": 0.0646},
                "heldout_greedy": {"avg": 0.075},
                "train_sampled": {"avg": 0.5},
                "train_greedy": {"avg": 0.5},
                "keys": {"heldout": same["heldout"], "train": other["train"]},  # train: other weights
            }
        )
    )
    asked: list[list[str]] = []

    def build(sets: dict) -> dict:
        asked.append(sorted(sets))
        return {f"{name}_{mode}": {"avg": 0.1} for name in sets for mode in ("sampled", "greedy")}

    path = tmp_path / "seed-1" / "evals-start.json"
    path.parent.mkdir()
    kept = _cached_evals(path, data, build, keys=same, donors=[donor, path, tmp_path / "absent.json"])
    assert asked == [["train"]]  # heldout copied; train's donor key differs, so it was measured
    assert kept["heldout_sampled"] == {"avg": 0.0646} and kept["heldout_greedy"] == {"avg": 0.075}
    assert kept["train_sampled"] == {"avg": 0.1}
    assert kept["keys"] == same
    assert "heldout copied from" in capsys.readouterr().out
    # a refreshed set is measured even when a donor holds it under the same key
    fresh = tmp_path / "seed-2" / "evals-start.json"
    fresh.parent.mkdir()
    _cached_evals(fresh, {"heldout": str(heldout)}, build, refresh=["heldout"], keys=same, donors=[donor])
    assert asked[-1] == ["heldout"]


def test_the_summary_gives_each_run_and_each_recipes_mean_over_its_seeds():
    from bench.studies.real_model import summary_table

    def run(seed: int, after: float, lr: str = "2e-5", probe: float | None = None) -> dict:
        start = {"heldout_sampled": _eval(0.25), "heldout_greedy": _eval(0.25)}
        final = {"heldout_sampled": _eval(after), "heldout_greedy": _eval(after + 0.25)}
        if probe is not None:  # the probe set, measured on some runs only
            start |= {"probe_sampled": _eval(0.1), "probe_greedy": _eval(0.2)}
            final |= {"probe_sampled": _eval(0.1 + probe), "probe_greedy": _eval(0.2 + 2 * probe)}
        rep = _rep(start, final, names=list(dict.fromkeys(k.rsplit("_", 1)[0] for k in start)))
        return {**rep, "seed": seed, "overrides": [f"learner.lr={lr}", f"learner.seed={seed}"]}

    lines = summary_table([run(0, 0.5, probe=0.05), run(1, 0.3, probe=0.15), run(0, 0.25, lr="1e-5")])
    text = "\n".join(lines)
    assert (
        "| configs/x.toml --set learner.lr=2e-5 | 0 | cpu | 2 | 25.0% | +25.0 | +50.0 | +5.0 | +10.0 |  |"
        in text
    )
    assert (
        "| configs/x.toml --set learner.lr=2e-5 | 1 | cpu | 2 | 25.0% | +5.0 | +30.0 | +15.0 | +30.0 |  |"
        in text
    )
    assert "| configs/x.toml --set learner.lr=1e-5 | 0 | cpu | 2 | 25.0% | +0.0 | +25.0 |  |  |  |" in text
    # the two seeds of lr 2e-5: mean (25 + 5) / 2 = 15, greedy (50 + 30) / 2 = 40, probe (5 + 15) / 2 = 10
    # and (10 + 30) / 2 = 20; lr 1e-5 has one seed, so no mean row
    assert (
        "| configs/x.toml --set learner.lr=2e-5 | 0, 1 | +15.0 (+5.0 .. +25.0) | +40.0 (+30.0 .. +50.0) "
        "| +10.0 (+5.0 .. +15.0) | +20.0 (+10.0 .. +30.0) |" in text
    )
    assert text.count("learner.lr=1e-5") == 1


def test_the_steps_line_splits_a_word_problem_set_into_one_and_two_step_templates():
    from bench.studies.real_model import steps_line

    groups = {
        "garden_rows": {"prompts": 5, "before": 0.1, "after": 0.5},  # one step
        "two_halves": {"prompts": 5, "before": 0.0, "after": 0.2},  # one step
        "fence": {"prompts": 10, "before": 0.05, "after": 0.05},  # two steps
    }
    # one step: (0.1 * 5 + 0.0 * 5) / 10 = 5% -> (0.5 * 5 + 0.2 * 5) / 10 = 35%
    assert steps_line(groups) == (
        " By steps: 1-step templates (2) 5.0% -> 35.0% (+30.0), 2-step templates (1) 5.0% -> 5.0% (+0.0)."
    )
    assert steps_line({"not_a_template": {"prompts": 1, "before": 0.0, "after": 1.0}}) == ""


def test_group_outcomes_join_the_group_log_to_the_rows_steps(tmp_path: Path) -> None:
    from bench.studies.real_model import group_outcomes, group_outcomes_line
    from stream_dapo.data.dataset import prompt_id_of
    from stream_dapo.generator.group_log import GroupLog, GroupRecord

    def row(text: str, steps: int) -> dict:
        return {"prompt": [{"role": "user", "content": text}], "extra_info": {"steps": steps}}

    rows = [row("one a", 1), row("one b", 1), row("two a", 2)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pid = [prompt_id_of(r["prompt"]) for r in rows]
    # (prompt, correct of 8): one-step 3/8 kept, 8/8 all correct, 5/8 kept; two-step 0/8 twice, 1/8 kept
    judged = [(0, 3), (1, 8), (0, 5), (2, 0), (2, 0), (2, 1)]
    log = GroupLog(tmp_path / "run" / "generators" / "generator-0.groups.jsonl")
    for i, (p, c) in enumerate(judged):
        outcome = "all_wrong" if c == 0 else "all_correct" if c == 8 else "mixed"
        log.write(GroupRecord(f"g{i}", pid[p], i, 8, c, 0, outcome, outcome == "mixed"))
    log.close()
    go = group_outcomes(tmp_path / "run", train)
    assert go == {
        "key": "steps",
        "by_value": {
            "1": {
                "groups": 3,
                "kept": 2,
                "all_wrong": 0,
                "all_correct": 1,
                "samples": 24,
                "correct": 16,
                "sample_accuracy": 0.6667,
            },
            "2": {
                "groups": 3,
                "kept": 1,
                "all_wrong": 2,
                "all_correct": 0,
                "samples": 24,
                "correct": 1,
                "sample_accuracy": 0.0417,
            },
        },
    }
    (line,) = group_outcomes_line(go)
    assert "steps = 2: 3 groups, 1 trained (33%), 2 all wrong, 0 all correct, samples correct 4.2%" in line
    assert group_outcomes(tmp_path / "elsewhere", train) is None  # no group log: nothing to say


def test_start_only_measures_the_start_model_and_does_not_train(tmp_path: Path, monkeypatch) -> None:
    import bench.studies.real_model as study

    model = tmp_path / "model"
    model.mkdir()
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text('{"prompt": []}\n')
    config = tmp_path / "c.toml"
    config.write_text(f'[model]\npath = "{model}"\n[run]\nout_dir = "{tmp_path / "out"}"\n')
    measured: list[tuple[str, list[str]]] = []

    def evaluate(config, overrides, model_dir, sets, seed):
        measured.append((model_dir, sorted(sets)))
        return {f"{n}_{mode}": _eval(0.25) for n in sets for mode in ("sampled", "greedy")}

    def train(*args, **kwargs):
        raise AssertionError("--start-only trained")

    monkeypatch.setattr(study, "prepare", lambda config, overrides: {"heldout": str(prompts)})
    monkeypatch.setattr(study, "evaluate_model", evaluate)
    monkeypatch.setattr(study, "train", train)
    work = tmp_path / "work"
    assert study.main(["--config", str(config), "--start-only", "--seed", "1", "--work", str(work)]) == 0
    assert measured == [(str(model), ["heldout"])]
    kept = json.loads((tmp_path / "work-c" / "seed-1" / "evals-start.json").read_text())
    assert kept["heldout_sampled"]["avg_at_k"] == 0.25 and "heldout" in kept["keys"]
    assert not (tmp_path / "work-c" / "seed-1" / "trained.json").exists()

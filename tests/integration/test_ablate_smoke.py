"""`stream-dapo ablate` for real: one preset, one seed, two optimizer steps, on the tiny model.

The full ladder is the lead's measurement, not a test; this proves the command evaluates the start
model, trains a cell with `stream-dapo run`, evaluates its final policy, writes a table, plots and a
JSON with finite numbers, that a second call reuses what is done, and that `--report-only` names the
cells still missing (a second preset and a second seed) without training them. One real cell is
enough for that: the table of several presets, the paired steps and the preset switches are unit
tests (tests/unit/test_ablation.py) on hand-made cells.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dapo.testing.services import tiny_overrides

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(1200)  # a hang guard: a cold cache adds the warm-up to this test

PRESETS = ["dapo"]
LADDER = ["naive-grpo", "dapo"]  # what --report-only is asked for: naive-grpo is never trained


def ablate(out: Path, warm: Path, presets: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    overrides = tiny_overrides(warm, out / "unused") + ["eval.max_prompts=16", "eval.k=2"]
    argv = [sys.executable, "-m", "stream_dapo.cli", "ablate", "--seeds", "1", "--budget", "2", *extra]
    argv += ["--presets", ",".join(presets), "--out", str(out)]
    # A private copy of the recipe: an edit of configs/ between the two calls would (rightly) rerun cells.
    recipe = out.parent / "tiny-cpu.toml"
    if not recipe.exists():
        shutil.copy(REPO / "configs" / "tiny-cpu.toml", recipe)
    argv += ["--config", str(recipe)]
    for item in overrides:
        argv += ["--set", item]
    return subprocess.run(argv, capture_output=True, text=True)


def failure(proc: subprocess.CompletedProcess[str], out: Path) -> str:
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted(out.rglob("*.log")))
    return f"ablate exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}"


def test_one_cell_gives_a_table_and_a_resumable_run(tmp_path: Path, warm_model: Path) -> None:
    out = tmp_path / "ablation"
    proc = ablate(out, warm_model, PRESETS)
    assert proc.returncode == 0, failure(proc, out)

    report = json.loads((out / "ablation.json").read_text())
    assert list(report["presets"]) == PRESETS
    for name in PRESETS:
        row = report["presets"][name]
        assert row["seeds_done"] == [0] and row["seeds_failed"] == []
        for key in ("avg_at_k", "pass_at_k", "truncation_rate", "samples_generated"):
            assert math.isfinite(row[key]["mean"]), (name, key, row[key])
        assert row["samples_generated"]["mean"] > 0
        assert [p["step"] for p in row["curves"]["entropy"]] == [1, 2]
        cell = out / name / "seed-0"
        cfg = (cell / "config.toml").read_text()
        assert "total_steps = 2" in cfg
        assert "dynamic_sampling = true" in cfg and "eps_high = 0.28\n" in cfg
        assert json.loads((cell / "summary.json").read_text())["learner_steps"] == 2
        after = json.loads((cell / "eval_after.json").read_text())
        assert 0.0 <= after["avg_at_k"] <= after["pass_at_k"] <= 1.0, after
    assert math.isfinite(report["eval_before"]["avg_at_k"])
    assert (out / "base-config.toml").is_file()

    md = (out / "ablation.md").read_text()
    for name in PRESETS:
        assert f"| {name} |" in md
    if not report["meta"].get("plots_skipped"):
        assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
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

        assert "- [policy entropy (nats/token)](plots/entropy.png)" in md
        # The JSON names its plots relative to the output directory, so a copied report stays valid.
        assert "plots/entropy.png" in report["meta"]["plots"]
        assert all((out / p).is_file() for p in report["meta"]["plots"])
        assert "## The curves in numbers" in md and "## What a step costs" in md

    # A second call finds both cells and the before-eval done: nothing is trained or evaluated again
    # (no cell's log, result or evaluation is written anew).
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".log", ".json", ".jsonl")}
    written = {p: t for p, t in written.items() if p.name not in ("ablation.json",)}
    again = ablate(out, warm_model, PRESETS)
    assert again.returncode == 0, failure(again, out)
    assert again.stdout.count("(reused)") == 1, again.stdout
    assert "reusing" in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in written} == written

    # --report-only with a second preset and a second seed asked for: the table of what is done, the
    # missing cells named, nothing trained (no new cell directory appears).
    partial = ablate(out, warm_model, LADDER, "--report-only", "--seeds", "2")
    assert partial.returncode == 0, failure(partial, out)
    missing = "missing: naive-grpo seed 0, naive-grpo seed 1, dapo seed 1"
    assert f"1 of 4 cells done; {missing}" in partial.stdout, partial.stdout
    assert not (out / "naive-grpo").exists() and not (out / "dapo" / "seed-1").exists()
    report = json.loads((out / "ablation.json").read_text())
    assert [report["presets"][name]["seeds_done"] for name in LADDER] == [[], [0]]
    assert report["meta"]["seeds"] == [0, 1]

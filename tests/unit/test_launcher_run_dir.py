"""The launcher's run directory: an earlier run is moved aside, the warm-up's data is not."""

from __future__ import annotations

from pathlib import Path

from stream_dapo.config import load_config
from stream_dapo.tools.launch import prepare_run_dir


def cfg_for(out: Path):
    return load_config(overrides=[f"run.out_dir={out}"], environ={})


def test_a_directory_holding_only_the_synthetic_data_is_used_in_place(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    (out / "data" / "train.jsonl").write_text("{}\n")
    assert prepare_run_dir(cfg_for(out), resume=False) == out
    assert (out / "data" / "train.jsonl").read_text() == "{}\n"
    assert (out / "config.toml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "nothing moved aside"


def test_an_earlier_run_is_moved_aside_whole(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "summary.json").write_text('{"learner_steps": 3}')
    (out / "config.toml").write_text("old")
    prepare_run_dir(cfg_for(out), resume=False)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
    assert len(aside) == 1
    assert (aside[0] / "summary.json").read_text() == '{"learner_steps": 3}'
    assert not (out / "summary.json").exists() and (out / "config.toml").read_text() != "old"


def test_resume_keeps_the_earlier_run_in_place(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.toml").write_text("old")
    prepare_run_dir(cfg_for(out), resume=True)
    assert (out / "checkpoints").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]

"""bench/keep_ablation.py: what it keeps of an ablation folder, and the re-keying of cells recorded
before the model key covered [sft] warm-ups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.keep_ablation import keep
from stream_dapo.config import config_to_toml, load_config
from stream_dapo.tools.ablate.cells import config_fingerprint, eval_fingerprint, finished_cell, model_key

REPO = Path(__file__).resolve().parents[2]


def _ablation(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "warm"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"the weights")
    (model / "sft.json").write_text(json.dumps({"key": "abcdef0123456789"}))
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_bytes(b"x" * ((1 << 20) + 1))  # too large to keep
    out = tmp_path / "out"
    cfg = load_config([REPO / "configs" / "tiny-cpu.toml"], [f"model.path='{model}'"], environ={})
    for run_dir, result, fp in (
        (out / "dapo" / "seed-0", "eval_after.json", config_fingerprint(cfg, None)),
        (out / "eval-before", "eval_before.json", eval_fingerprint(cfg, None)),
    ):
        (run_dir / "learner").mkdir(parents=True)
        (run_dir / "config.toml").write_text(config_to_toml(cfg))
        (run_dir / result).write_text(json.dumps({"avg_at_k": 0.25}))
        (run_dir / "ablation_cell.json").write_text(json.dumps({"fingerprint": fp}))
    cell = out / "dapo" / "seed-0"
    (cell / "summary.json").write_text("{}")
    (cell / "learner" / "metrics.jsonl").write_text('{"version": 1}\n')
    (cell / "learner" / "trained_groups.jsonl").write_text('{"version": 1, "group_ids": ["g"]}\n')
    (cell / "generators").mkdir()
    (cell / "generators" / "generator-0.groups.jsonl").write_text('{"kept": true}\n')
    (cell / "checkpoints" / "step_000010").mkdir(parents=True)
    (cell / "checkpoints" / "step_000010" / "model.safetensors").write_bytes(b"big")
    (out / "ablation.md").write_text("# table\n")
    return out, model


def test_keep_copies_records_and_the_start_model_as_its_checksum_and_rekeys(tmp_path: Path) -> None:
    out, model = _ablation(tmp_path)
    dest = tmp_path / "kept"
    kept = keep(out, dest, do_rekey=True)
    key = kept["start_model"]
    assert isinstance(key, str) and key.startswith("sft-abcdef0123456789/")
    assert kept["cells"] == ["dapo/seed-0"] and kept["rekeyed"] == ["dapo/seed-0", "eval-before"]
    cell = dest / "cells" / "dapo" / "seed-0"
    assert (cell / "generators" / "generator-0.groups.jsonl").read_text() == '{"kept": true}\n'
    assert (cell / "learner" / "trained_groups.jsonl").read_text() == '{"version": 1, "group_ids": ["g"]}\n'
    assert not (cell / "checkpoints").exists() and (dest / "ablation.md").is_file()
    assert not (dest / "start-model" / "model.safetensors").exists()
    assert not (dest / "start-model" / "tokenizer.json").exists()
    assert (dest / "start-model" / "config.json").is_file()
    # The kept checksum gives the key the weights gave, and the re-keyed record matches it.
    kept_cfg = load_config([cell / "config.toml"], [f"model.path='{dest / 'start-model'}'"], environ={})
    assert model_key(kept_cfg) == key
    record = json.loads((cell / "ablation_cell.json").read_text())
    assert record["start_model"] == key
    assert finished_cell(cell, load_config([cell / "config.toml"], [], environ={}), key)
    assert json.loads((out / "dapo" / "seed-0" / "ablation_cell.json").read_text()) == record
    again = keep(out, tmp_path / "kept2", do_rekey=True)
    assert again["rekeyed"] == []  # a keyed record is left alone


def test_rekey_refuses_a_record_made_with_another_config(tmp_path: Path) -> None:
    out, _ = _ablation(tmp_path)
    record = out / "dapo" / "seed-0" / "ablation_cell.json"
    record.write_text(json.dumps({"fingerprint": "0000000000000000"}))
    with pytest.raises(SystemExit, match="was not fingerprinted with no model"):
        keep(out, tmp_path / "kept", do_rekey=True)

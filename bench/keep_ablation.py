"""Keep a `stream-dapo ablate` folder in the repository: the report (ablation.md, ablation.json,
plots/) and what a later run or ``--report-only`` reads of each finished cell (its records, its
curves and its generators' group log), without checkpoints, logs or the buffer; and the start model
as its checksum (``start-model/``: config, build markers, small tokenizer files and ``weights.sha256``), so the
cells' fingerprints can be checked against the weights they started from.

    python -m bench.keep_ablation runs/findings-warm docs/results/ablation-smollm2-warm

To go on in a fresh checkout: copy ``DEST/cells/`` back to the ``--out`` folder and run the same
`stream-dapo ablate` command; add ``--rebuilt-start`` when the warm-up there is rebuilt (another
machine rounds differently, so its weights have another digest).

``--rekey``: cells recorded before the model key covered [sft] warm-ups and imported models carry
a fingerprint made with no model and no ``start_model``. When such a record's fingerprint is exactly
what its config gives with no model, it is rewritten with the key of the model at model.path, which
must be the model those cells started from (say so only when it is: the same session, the same
folder).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from stream_dapo.config import load_config
from stream_dapo.tools.ablate.cells import (
    WEIGHTS_DIGEST,
    config_fingerprint,
    eval_fingerprint,
    model_key,
    weights_digest,
)
from stream_dapo.tools.ablate.settings import CELL_RECORD

CELL_FILES: tuple[str, ...] = (
    "config.toml",
    "summary.json",
    "eval_after.json",
    CELL_RECORD,
    "learner/metrics.jsonl",
)
CELL_OPTIONAL = ("learner/trained_groups.jsonl",)
"""Kept where present: the learner's trained-group log (which groups each step trained; the report
joins it with the group logs; a cell recorded without it still counts)."""
BEFORE_FILES: tuple[str, ...] = ("config.toml", "eval_before.json", CELL_RECORD)
REPORT_FILES = ("ablation.md", "ablation.json")
MODEL_SKIP = (".safetensors", ".bin", ".pt")
MODEL_FILE_MAX_BYTES = 1 << 20
"""Larger files of the start model are not kept (a 49k-token tokenizer.json is 3.4 MB; the import
that wrote it is deterministic and recorded in the build marker)."""


def finished_cells(out: Path) -> list[Path]:
    """Cell folders under ``out`` (PRESET/seed-N) that hold every record a finished cell has."""
    return sorted(
        record.parent
        for record in out.glob(f"*/seed-*/{CELL_RECORD}")
        if all((record.parent / name).is_file() for name in CELL_FILES)
    )


def keep_start_model(model: Path, dest: Path) -> str:
    """Copy the model folder less its weights, plus weights.sha256; returns the digest."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(model.iterdir()):
        if (
            path.is_file()
            and not path.name.endswith(MODEL_SKIP)
            and path.stat().st_size <= MODEL_FILE_MAX_BYTES
        ):
            shutil.copy2(path, dest / path.name)
    digest = weights_digest(model)
    (dest / WEIGHTS_DIGEST).write_text(digest + "\n")
    return digest


def rekey(run_dir: Path, key: str, files: tuple[str, ...]) -> bool:
    """Give an unkeyed record (see the module's --rekey) the start model ``key``; False if it has one."""
    record_path = run_dir / CELL_RECORD
    record = json.loads(record_path.read_text())
    if record.get("start_model"):
        return False
    cfg = load_config([run_dir / "config.toml"], [], environ={})
    fingerprint = eval_fingerprint if "eval_before.json" in files else config_fingerprint
    if record.get("fingerprint") != fingerprint(cfg, None):
        raise SystemExit(
            f"keep_ablation --rekey: {record_path} was not fingerprinted with no model; it is left as it is "
            "(drop --rekey, or rerun that cell)"
        )
    record.update(fingerprint=fingerprint(cfg, key), start_model=key)
    record_path.write_text(json.dumps(record, indent=2))
    return True


def keep(out: Path, dest: Path, do_rekey: bool = False) -> dict[str, object]:
    cells = finished_cells(out)
    before = out / "eval-before"
    if not cells and not (before / "eval_before.json").is_file():
        raise SystemExit(f"keep_ablation: {out} holds no finished cell and no before-training eval")
    base = load_config([(cells[0] if cells else before) / "config.toml"], [], environ={})
    model = Path(base.model.path)
    if not model.is_dir():
        raise SystemExit(f"keep_ablation: the start model {model} is not there; it is kept as its checksum")
    key = model_key(base)
    if key is None:
        raise SystemExit(f"keep_ablation: {model} holds no model this package built (no build marker)")
    rekeyed: list[str] = []
    targets = [(c, CELL_FILES) for c in cells]
    if (before / "eval_before.json").is_file():
        targets.append((before, BEFORE_FILES))
    for run_dir, files in targets:
        if do_rekey and rekey(run_dir, key, files):
            rekeyed.append(run_dir.relative_to(out).as_posix())
        for name in (*files, *(n for n in CELL_OPTIONAL if (run_dir / n).is_file())):
            target = dest / "cells" / run_dir.relative_to(out) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / name, target)
        for log in sorted((run_dir / "generators").glob("*.groups.jsonl")):
            target = dest / "cells" / run_dir.relative_to(out) / "generators" / log.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(log, target)
    if (out / "base-config.toml").is_file():
        shutil.copy2(out / "base-config.toml", dest / "cells" / "base-config.toml")
    for name in REPORT_FILES:
        if (out / name).is_file():
            shutil.copy2(out / name, dest / name)
    if (out / "plots").is_dir():
        shutil.copytree(out / "plots", dest / "plots", dirs_exist_ok=True)
    digest = keep_start_model(model, dest / "start-model")
    return {
        "cells": [c.relative_to(out).as_posix() for c in cells],
        "start_model": key,
        "weights_sha256": digest,
        "rekeyed": rekeyed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the ablation's --out folder")
    parser.add_argument("dest", type=Path, help="where to keep it (e.g. docs/results/NAME)")
    parser.add_argument("--rekey", action="store_true", help="key unkeyed records to the model at model.path")
    args = parser.parse_args(argv)
    kept = keep(args.out, args.dest, args.rekey)
    print(json.dumps(kept, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Running the ladder's cells: one `stream-dapo run` per (preset, seed) in its own directory,
fingerprinted so that a rerun skips what is done and never mixes settings; the report built from
the cells."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from stream_dapo.config import Config, config_to_toml, load_config
from stream_dapo.core.presets import PRESETS, preset_overrides
from stream_dapo.runtime.host import code_version, describe_machine
from stream_dapo.tools.ablate.render import render_markdown, to_json
from stream_dapo.tools.ablate.settings import (
    _NEUTRAL_SETTINGS,
    _UNCOMPARED_KEYS,
    _UNCOMPARED_SECTIONS,
    CELL_RECORD,
    CURVE_METRICS,
    UNRECORDED,
    _toml_value,
)
from stream_dapo.tools.ablate.stats import CellResult, aggregate, training_start

log = logging.getLogger("stream_dapo.tools.ablate")


# --------------------------------------------------------------------------------------------------
# Pure parts: presets, fingerprints, aggregation, curves, the table
# --------------------------------------------------------------------------------------------------


def cell_overrides(preset: str, seed: int, budget: int, cell_dir: Path) -> list[str]:
    """The ``--set`` overrides that make a cell: preset switches (explicitly), seeds, budget, out_dir.
    ``algo.preset`` is set too for Table 1's rows (the only presets that key names)."""
    sets = [f"algo.preset={_toml_value(preset)}"] if preset in PRESETS else []
    sets += [f"{k}={_toml_value(v)}" for k, v in preset_overrides(preset).items()]
    sets += [
        f"generator.seed={seed}",
        f"learner.seed={seed}",
        f"learner.total_steps={budget}",
        f"run.out_dir={_toml_value(str(cell_dir))}",
        "run.eval_before_after=false",  # the ablation evaluates: once before, each cell after
    ]
    return sets


def config_fingerprint(cfg: Config, model_key: str | None) -> str:
    """Hash of what determines a cell's result: the resolved config (less ports, metrics and
    run.out_dir) and the identity of the starting model."""
    data = cfg.model_dump(mode="json")
    for section in _UNCOMPARED_SECTIONS:
        data.pop(section, None)
    for section, key in _UNCOMPARED_KEYS:
        data.get(section, {}).pop(key, None)
    data["run"].pop("out_dir", None)
    for (section, key), neutral in _NEUTRAL_SETTINGS.items():
        values = data.get(section)
        if values is not None and values.get(key, neutral) == neutral:
            values.pop(key, None)
            if not values:  # a section added later, at its neutral values throughout
                data.pop(section)
    payload = json.dumps({"config": data, "model": model_key}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cell_is_done(cell_dir: Path, fingerprint: str) -> bool:
    """True when the cell finished (summary, eval, record) with this fingerprint."""
    try:
        record = json.loads((cell_dir / CELL_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return (
        record.get("fingerprint") == fingerprint
        and (cell_dir / "summary.json").is_file()
        and (cell_dir / "eval_after.json").is_file()
    )


def build_of(key: str | None) -> str | None:
    """The build part of a model key: the warm-up's settings, without the weights' digest."""
    return None if key is None else key.split("/", 1)[0]


def finished_cell(cell_dir: Path, cfg: Config, key: str | None, rebuilt_start: bool = False) -> bool:
    """True when ``cell_dir`` holds a finished cell of ``cfg`` started from model ``key``. With
    ``rebuilt_start``, also one started from another build of the same start model: the same
    warm-up key, other weights (the record's ``start_model``; a warm-up repeated on another machine
    rounds differently). Its config must match all the same."""
    if cell_is_done(cell_dir, config_fingerprint(cfg, key)):
        return True
    start = _recorded_start(cell_dir)
    return (
        rebuilt_start
        and key is not None
        and start is not None
        and build_of(start) == build_of(key)
        and cell_is_done(cell_dir, config_fingerprint(cfg, start))
    )


def _recorded_start(run_dir: Path) -> str | None:
    try:
        start = json.loads((run_dir / CELL_RECORD).read_text()).get("start_model")
    except (OSError, ValueError, AttributeError):
        return None
    return start if isinstance(start, str) else None


def read_curves(metrics_jsonl: Path) -> dict[str, dict[int, float]]:
    """CURVE_METRICS per step, and ``wall_time`` (the row's Unix time); the last row of a step wins
    (a resumed learner rewrites its tail)."""
    curves: dict[str, dict[int, float]] = {k: {} for k in (*CURVE_METRICS, "wall_time")}
    if not metrics_jsonl.is_file():
        return curves
    for line in metrics_jsonl.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for key, points in curves.items():
            if isinstance(row.get(key), int | float):
                points[int(row["version"])] = float(row[key])
    return curves


# --------------------------------------------------------------------------------------------------
# Running cells
# --------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    config_files: list[str]
    """The --config files as given (reported in the table)."""
    overrides: list[str]
    """The --set overrides as given; they apply to every cell."""
    presets: list[str]
    seeds: list[int]
    budget: int
    out: Path
    target_delta: float = 0.05
    """Steps/seconds-to-target target: a starting level (see target_from) plus this (see aggregate)."""
    target_from: str = "eval"
    """The target's starting level: "eval", the warm model's eval avg@k (right where the eval and the
    training prompts are alike); "train", the training reward's own first window over the cells
    (`training_start`; right where they differ, e.g. held-out eval templates)."""
    target_level: float | None = None
    """A fixed target level (ablate --target-level): replaces start + target_delta, so the target of an
    ablation run a few cells at a time does not move as cells are added (a start measured from the
    finished cells does)."""
    rebuilt_start: bool = False
    """Reuse cells (and the before-training eval) that started from another build of the same start
    model (see finished_cell); the report lists the builds."""
    group_size: int | None = None
    keep_checkpoints: bool = False
    """Keep each finished cell's resume checkpoints (by default they are removed: `prune_checkpoints`)."""
    run_files: list[str] = field(default_factory=list)
    """What children load: a snapshot of the resolved base config (see freeze_base_config)."""

    def cell_dir(self, preset: str, seed: int) -> Path:
        return self.out / preset / f"seed-{seed}"

    def child_config(self, *sets: str) -> tuple[Config, list[str]]:
        """The config a child with these extra overrides resolves, and all its overrides."""
        if self.run_files:
            return load_config(self.run_files, sets), list(sets)
        return load_config(self.config_files, [*self.overrides, *sets]), [*self.overrides, *sets]

    def cell_config(self, preset: str, seed: int) -> tuple[Config, list[str]]:
        return self.child_config(*cell_overrides(preset, seed, self.budget, self.cell_dir(preset, seed)))

    def child_argv(self, command: str, sets: Sequence[str], *extra: str) -> list[str]:
        argv = [sys.executable, "-m", "stream_dapo.cli", command, *extra]
        argv += [a for f in (self.run_files or self.config_files) for a in ("--config", f)]
        return argv + [a for s in sets for a in ("--set", s)]


def freeze_base_config(plan: Plan) -> None:
    """Resolve the config files and overrides once and give every child that snapshot, so an edit
    of a config file during a long ablation cannot change cells half-way. The snapshot is used only
    when it resolves to the same config (TOML has no null: a key set to null would not survive)."""
    base = load_config(plan.config_files, plan.overrides)
    path = plan.out / "base-config.toml"
    path.write_text(config_to_toml(base))
    if load_config([path], []) == base:
        plan.run_files = [str(path)]
    else:
        log.warning("%s does not reproduce the resolved config; children read the files as given", path)


WEIGHTS_DIGEST = "weights.sha256"
"""In a model folder kept without its weights (docs/results/*/start-model): the sha256 of its
*.safetensors files, concatenated in name order, which is what `model_key` hashes."""


def plan_cell_finished(plan: Plan, preset: str, seed: int) -> bool:
    """Whether the plan's (preset, seed) cell is finished in ``plan.out`` (`finished_cell`)."""
    cfg, _ = plan.cell_config(preset, seed)
    return finished_cell(plan.cell_dir(preset, seed), cfg, model_key(cfg), plan.rebuilt_start)


def model_key(cfg: Config) -> str | None:
    """The starting model's identity: its build key and a digest of its weight files. The build key
    comes from the config alone, and the same config warmed up on another machine gave other weights
    (docs/results/longcot.md), so cells finished from one build are never mixed with another's.
    The build key is the tiny model's warm-up key, the [sft] warm-up's key, or an imported model's
    source digest. None when model.path holds no model this package built."""
    folder = Path(cfg.model.path)
    build = _build_key(folder)
    if build is None:
        return None
    files = sorted(folder.glob("*.safetensors"))
    if not files and (folder / WEIGHTS_DIGEST).is_file():  # a recorded model kept as its checksum alone
        return f"{build}/{(folder / WEIGHTS_DIGEST).read_text().strip()[:16]}"
    return f"{build}/{weights_digest(folder)[:16]}"


def weights_digest(folder: Path) -> str:
    """sha256 of the folder's *.safetensors, concatenated in name order (what WEIGHTS_DIGEST holds)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _build_key(folder: Path) -> str | None:
    """The key of the build that wrote ``folder`` (see model_key), or None."""
    from stream_dapo.model.importer import IMPORT_MARKER
    from stream_dapo.model.sft import SFT_MARKER
    from stream_dapo.model.tiny import read_marker

    marker = read_marker(folder)
    if marker is not None:
        return str(marker.get("key"))
    for name, field_name, prefix in (
        (SFT_MARKER, "key", "sft-"),
        (IMPORT_MARKER, "source_sha256", "import-"),
    ):
        try:
            info = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get(field_name):
            return prefix + str(info[field_name])[:16]
    return None


def eval_fingerprint(cfg: Config, model_key: str | None) -> str:
    """Hash of what the before-training evaluation depends on: the model, the data, [eval], the
    verifier and the response budget (not the algorithm, the learner or the budget)."""
    payload = {
        "model": [cfg.model.model_dump(mode="json"), model_key],
        "data": cfg.data.model_dump(mode="json"),
        "eval": cfg.eval.model_dump(mode="json"),
        "verifier": cfg.verifier.model_dump(mode="json"),
        "max_response_len": cfg.algo.max_response_len,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def evaluate_before(plan: Plan) -> dict[str, Any]:
    """Evaluate the starting policy once (every preset starts from it); reuse a matching result."""
    from stream_dapo.tools.launch import evaluate_subprocess, prepare_model

    run_dir = plan.out / "eval-before"
    cfg, _ = plan.child_config(f"run.out_dir={_toml_value(str(run_dir))}")
    prepare_model(cfg)
    key = model_key(cfg)
    done = _done_before(run_dir, eval_fingerprint(cfg, key))
    start = _recorded_start(run_dir)
    if done is None and plan.rebuilt_start and start is not None and build_of(start) == build_of(key):
        done = _done_before(run_dir, eval_fingerprint(cfg, start))
    if done is not None:
        return done
    record = run_dir / CELL_RECORD
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(config_to_toml(cfg))
    result = evaluate_subprocess(cfg, run_dir / "config.toml", Path(cfg.model.path), "before", run_dir)
    record.write_text(json.dumps({"fingerprint": eval_fingerprint(cfg, key), "start_model": key}))
    return result


def _done_before(run_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The before-training evaluation in ``run_dir`` if it was made for this fingerprint."""
    record, result_path = run_dir / CELL_RECORD, run_dir / "eval_before.json"
    if (
        record.is_file()
        and result_path.is_file()
        and json.loads(record.read_text()).get("fingerprint") == fingerprint
    ):
        log.info("reusing %s", result_path)
        return dict(json.loads(result_path.read_text()))
    return None


def trained_outcomes(run_dir: Path) -> dict[str, int] | None:
    """How many of the groups the learner trained were mixed, all wrong or all correct: its
    trained-group log (learner/trained_groups.jsonl) joined with the generators' group logs by group
    id ("unknown" for an id no generator log names). Without dynamic sampling, all-wrong and
    all-correct groups are trained with zero advantage: their samples carry no gradient. None
    without the learner's log."""
    trained = run_dir / "learner" / "trained_groups.jsonl"
    if not trained.is_file():
        return None
    outcome: dict[str, str] = {}
    for log_file in sorted((run_dir / "generators").glob("*.groups.jsonl")):
        for line in log_file.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                outcome[row["group_id"]] = row["outcome"]
    counts: dict[str, int] = {}
    for line in trained.read_text().splitlines():
        try:
            groups = json.loads(line)["group_ids"]
        except (ValueError, KeyError, TypeError):  # a blank line, or a torn tail of a killed learner
            continue
        for group in groups:
            kind = outcome.get(group, "unknown")
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def load_cell(preset: str, seed: int, cell_dir: Path, status: str) -> CellResult:
    summary = json.loads((cell_dir / "summary.json").read_text())
    record = json.loads((cell_dir / CELL_RECORD).read_text())
    return CellResult(
        preset=preset,
        seed=seed,
        status=status,
        eval_after=json.loads((cell_dir / "eval_after.json").read_text()),
        summary=summary,
        curves=read_curves(cell_dir / "learner" / "metrics.jsonl"),
        wall_seconds=record.get("wall_seconds"),
        start_model=_recorded_start(cell_dir),
        machine=record.get("machine"),
        code=record.get("code"),
        trained_outcomes=trained_outcomes(cell_dir),
    )


PROGRESS_EVERY_S = 300.0
"""How often ablate logs a training cell's progress (a cell runs for minutes to hours)."""


def cell_progress(metrics_jsonl: Path, budget: int) -> str | None:
    """One line on a training cell from the last row of its learner's metrics.jsonl: the step of
    the budget, its training-batch accuracy and the generators' (the training reward), the entropy.
    None before the first step."""
    try:
        lines = metrics_jsonl.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:  # a row being written
            continue
        if not isinstance(row, dict) or "version" not in row:
            continue
        parts = [f"step {row['version']}/{budget}"]
        for key, name in (
            ("accuracy", "batch accuracy"),
            ("gen_accuracy", "training reward"),
            ("entropy", "entropy"),
        ):
            if isinstance(row.get(key), int | float):
                parts.append(f"{name} {row[key]:.3f}")
        return ", ".join(parts)
    return None


def run_child(
    argv: Sequence[str],
    log_file: IO[str],
    progress: Callable[[], str | None] | None = None,
    every_s: float = PROGRESS_EVERY_S,
) -> tuple[int, int | None]:
    """Run one child to its end, its output to `log_file`, logging ``progress()`` every ``every_s``
    seconds while it runs (when it has something to say). A SIGTERM or SIGINT that reaches this
    process meanwhile is passed on to the child, which drains and exits (a signal sent to ablate
    alone used to leave its child training). Returns the child's exit code and the first signal
    received (None if none)."""
    proc = subprocess.Popen(list(argv), stdout=log_file, stderr=subprocess.STDOUT)
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        log.warning("received %s: passing it on to %s", signal.Signals(signum).name, argv[2:4])
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait(timeout=every_s if progress is not None else None)
                break
            except subprocess.TimeoutExpired:
                line = progress() if progress is not None else None
                if line:
                    log.info("%s", line)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, (received[0] if received else None)


def prune_checkpoints(cell_dir: Path) -> int:
    """Delete a finished cell's resume checkpoints (``checkpoints/``): once its run has ended and
    its ``final/`` export is evaluated nothing reads them, and on a real model they are GBs per cell
    (keep_checkpoints of them, each with the optimizer state). Returns the bytes freed."""
    root = cell_dir / "checkpoints"
    if not root.is_dir():
        return 0
    freed = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(root)
    log.info("removed %s (%.2f GB): the cell's final/ export is kept", root, freed / 1e9)
    return freed


def run_cell(plan: Plan, preset: str, seed: int) -> CellResult:
    """Train one cell with `stream-dapo run`, then evaluate its final policy; reuse a finished one."""
    from stream_dapo.tools.launch import evaluate_subprocess

    cfg, sets = plan.cell_config(preset, seed)
    cell_dir = plan.cell_dir(preset, seed)
    key = model_key(cfg)
    if finished_cell(cell_dir, cfg, key, plan.rebuilt_start):
        return load_cell(preset, seed, cell_dir, "reused")
    t0 = time.monotonic()
    code = code_version()  # what the child imports now (this process may have imported older code)
    argv = plan.child_argv("run", sets, "--quiet")
    log_path = plan.out / "logs" / f"{preset}_seed-{seed}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info(
        "training %s seed %s (%d steps): its log %s, its learner's metrics %s",
        preset,
        seed,
        plan.budget,
        log_path,
        cell_dir / "learner" / "metrics.jsonl",
    )
    with log_path.open("w") as log_file:
        returncode, stopped_by = run_child(
            argv,
            log_file,
            progress=lambda: (
                f"{preset} seed {seed}: {line}"
                if (line := cell_progress(cell_dir / "learner" / "metrics.jsonl", plan.budget))
                else None
            ),
        )
    if stopped_by is not None:
        raise SystemExit(
            f"stream-dapo ablate: stopped by {signal.Signals(stopped_by).name} during {preset} seed {seed}, "
            f"after its `stream-dapo run` drained; the finished cells in {plan.out} are kept: run the same "
            "command again to go on from there"
        )
    if returncode != 0 or not (cell_dir / "summary.json").is_file():
        return CellResult(
            preset, seed, "failed", error=f"stream-dapo run exited {returncode}; see {log_path}"
        )
    try:
        evaluate_subprocess(cfg, cell_dir / "config.toml", cell_dir / "final", "after", cell_dir)
    except RuntimeError as exc:
        return CellResult(preset, seed, "failed", error=str(exc))
    wall = round(time.monotonic() - t0, 1)
    (cell_dir / CELL_RECORD).write_text(
        json.dumps(
            {
                "fingerprint": config_fingerprint(cfg, key),
                "preset": preset,
                "seed": seed,
                "wall_seconds": wall,
                "start_model": key,
                "machine": describe_machine(),
                "code": code,
            },
            indent=2,
        )
    )
    if not plan.keep_checkpoints:  # after the record: a cell stopped in between still counts as done
        prune_checkpoints(cell_dir)
    return load_cell(preset, seed, cell_dir, "done")


def build_report(plan: Plan, before: Mapping[str, Any], cells: Sequence[CellResult]) -> dict[str, Any]:
    meta = {
        "config_files": plan.config_files,
        "overrides": plan.overrides,
        "seeds": plan.seeds,
        "budget": plan.budget,
        "k": before.get("k"),
        "eval_prompts": before.get("num_prompts"),
        "target_delta": plan.target_delta,
        "target_from": plan.target_from,
        "start_models": sorted({c.start_model for c in cells if c.start_model}),
        # Cells of one report can run sessions apart on other hosts and commits; their seconds compare
        # only within one machine (cells recorded before these were recorded: "not recorded").
        "machines": sorted({c.machine or UNRECORDED for c in cells if c.summary is not None}),
        "code_versions": sorted({c.code or UNRECORDED for c in cells if c.summary is not None}),
        # A partial ablation (stopped between sessions) must not read as the whole one.
        "cells_planned": len(plan.seeds) * len(plan.presets),
        "cells_not_done": [
            f"{preset} seed {seed}"
            for seed in plan.seeds
            for preset in plan.presets
            if not any(c.preset == preset and c.seed == seed and c.eval_after for c in cells)
        ],
    }
    start = training_start(cells) if plan.target_from == "train" else before.get("avg_at_k")
    if plan.target_from == "train":
        meta["target_start"] = start
    if plan.target_level is not None:
        meta["target_level"] = plan.target_level
        target: float | None = plan.target_level
    else:
        target = start + plan.target_delta if start is not None else None
    return {
        "meta": meta,
        "eval_before": dict(before),
        "presets": aggregate(
            cells,
            plan.presets,
            target=target,
            group_size=plan.group_size,
        ),
        "cells": [asdict(c) for c in cells],
    }


def write_report(out: Path, report: dict[str, Any]) -> None:
    payload = to_json(report)
    (out / "ablation.json").write_text(json.dumps(payload, indent=2))
    (out / "ablation.md").write_text(render_markdown(payload))


def _cell_line(i: int, total: int, cell: CellResult, before: Mapping[str, Any]) -> str:
    head = f"[{i}/{total}] {cell.preset} seed {cell.seed}:"
    if cell.eval_after is None or cell.summary is None:
        return f"{head} FAILED ({cell.error})"
    return (
        f"{head} avg@{cell.eval_after['k']} {cell.eval_after['avg_at_k']:.3f} (before "
        f"{before['avg_at_k']:.3f}), {cell.summary['samples_generated']} samples generated, "
        f"{cell.wall_seconds} s{' (reused)' if cell.status == 'reused' else ''}"
    )


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a plan as ``--dry-run`` shows it: what would run, and whether it is done already."""

    preset: str
    seed: int
    cell_dir: Path
    fingerprint: str
    done: bool
    argv: list[str]


def planned_cells(plan: Plan) -> list[PlannedCell]:
    """Every cell of ``plan`` in run order (seed-major), with the `stream-dapo run` command it would
    start and whether a finished cell with its fingerprint is there already. Builds, trains and
    writes nothing; the starting model's weights are hashed when it exists (no model yet: no cell
    can be done)."""
    cells: list[PlannedCell] = []
    key: str | None = None
    for seed in plan.seeds:
        for preset in plan.presets:
            cfg, sets = plan.cell_config(preset, seed)
            if not cells:
                key = model_key(cfg)  # every cell starts from one model: hash it once
            fp = config_fingerprint(cfg, key)
            cell_dir = plan.cell_dir(preset, seed)
            done = key is not None and finished_cell(cell_dir, cfg, key, plan.rebuilt_start)
            argv = plan.child_argv("run", sets, "--quiet")
            cells.append(PlannedCell(preset, seed, cell_dir, fp, done, argv))
    return cells


def done_cells(plan: Plan) -> tuple[dict[str, Any], list[CellResult], list[tuple[str, int]]]:
    """For --report-only: the before-eval and the finished cells found in plan.out, and the
    (preset, seed) pairs not finished there. Nothing is trained, evaluated or built."""
    cfg, _ = plan.child_config(f"run.out_dir={_toml_value(str(plan.out / 'eval-before'))}")
    key = model_key(cfg)  # every cell starts from this model: hash its weights once
    if key is None:
        raise SystemExit(
            f"stream-dapo ablate --report-only: no built model at {cfg.model.path}, and the cells are "
            "matched to the weights they started from; put that model back there (a copy kept with "
            "the results), or build one with `stream-dapo warmup` and run the cells again without "
            "--report-only (a new build has other weights)"
        )
    before = _done_before(plan.out / "eval-before", eval_fingerprint(cfg, key))
    start = _recorded_start(plan.out / "eval-before")
    if before is None and plan.rebuilt_start and start is not None and build_of(start) == build_of(key):
        before = _done_before(plan.out / "eval-before", eval_fingerprint(cfg, start))
    if before is None:
        raise SystemExit(
            f"stream-dapo ablate --report-only: {plan.out / 'eval-before'} holds no evaluation of this "
            "model and config; run without --report-only first (or pass the --config/--set of that run)"
        )
    cells, missing = [], []
    for seed in plan.seeds:
        for preset in plan.presets:
            cell_cfg, _ = plan.cell_config(preset, seed)
            cell_dir = plan.cell_dir(preset, seed)
            if finished_cell(cell_dir, cell_cfg, key, plan.rebuilt_start):
                cells.append(load_cell(preset, seed, cell_dir, "reused"))
            else:
                missing.append((preset, seed))
    return before, cells, missing

"""`stream-dapo ablate`: the command (the ladder itself is `stream_dapo.tools.ablate`)."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from stream_dapo.config import load_config
from stream_dapo.core.presets import PRESET_FAMILIES, PRESETS
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.tools.ablate.cells import (
    Plan,
    PlannedCell,
    _cell_line,
    build_report,
    done_cells,
    evaluate_before,
    freeze_base_config,
    plan_cell_finished,
    planned_cells,
    run_cell,
    write_report,
)
from stream_dapo.tools.ablate.render import plot_curves
from stream_dapo.tools.ablate.settings import TARGET_WINDOW
from stream_dapo.tools.ablate.stats import CellResult

log = logging.getLogger("stream_dapo.tools.ablate")

_ALL_PRESETS = [name for presets in PRESET_FAMILIES.values() for name in presets]
"""Every family's presets in table order: Table 1's rows, then the off-policy arms."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per preset (default: 3)")
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="STEPS",
        help="optimizer steps per run, the same for every preset (default: learner.total_steps)",
    )
    parser.add_argument(
        "--presets",
        default=",".join(PRESETS),
        help=f"comma-separated presets, in table order (default: Table 1's rows: {','.join(PRESETS)}; "
        f"the off-policy corrections: {','.join(PRESET_FAMILIES['offpolicy'])}; DAPO less one technique: "
        f"{','.join(PRESET_FAMILIES['leave-one-out'])})",
    )
    parser.add_argument("--out", default="runs/ablation", help="output directory (default: runs/ablation)")
    parser.add_argument(
        "--target-delta",
        type=float,
        default=0.05,
        metavar="D",
        help="steps/seconds-to-target figures: the training reward (gen_accuracy) reaching a starting "
        "level (see --target-from) + D (default: 0.05)",
    )
    parser.add_argument(
        "--target-from",
        choices=("eval", "train"),
        default="eval",
        help="the target's starting level: eval, the warm model's eval avg@k (where eval and training "
        f"prompts are alike); train, the training reward's mean over its first {TARGET_WINDOW} steps, "
        "averaged over the runs (where they differ, e.g. held-out eval templates) (default: eval)",
    )
    parser.add_argument(
        "--target-level",
        type=float,
        default=None,
        metavar="L",
        help="fix the steps/seconds-to-target target at this training-reward level (0 < L <= 1) instead "
        "of a starting level + --target-delta: a start measured from the finished cells (--target-from "
        "train) moves as cells are added, so an ablation run a few cells at a time fixes it (default: none)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the table and plots of the cells already done in --out",
    )
    parser.add_argument(
        "--rebuilt-start",
        action="store_true",
        help="reuse finished cells (and the before-training eval) that started from another build of "
        "the same start model: the same warm-up settings, other weights (a warm-up repeated on another "
        "machine rounds differently); the report lists the builds",
    )
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each finished cell's resume checkpoints (by default they are removed once its final "
        "policy is evaluated: only final/ is read afterwards, and on a real model they are GBs per cell)",
    )
    parser.add_argument(
        "--max-cells",
        type=int,
        default=None,
        metavar="N",
        help="train at most N cells in this call (finished ones are reused and do not count), then "
        "write the report of the cells done so far and exit; the same command goes on from there "
        "(for a long ablation run a few cells at a time)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run and write nothing: print every cell's `stream-dapo run` command and whether it is done",
    )


def make_plan(args: argparse.Namespace) -> Plan:
    from stream_dapo.tools.launch import DEFAULT_CONFIG

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in _ALL_PRESETS]
    if unknown or not presets:
        raise SystemExit(
            f"stream-dapo ablate: unknown preset(s) {unknown} in --presets; choose from {','.join(_ALL_PRESETS)}"
        )
    if args.seeds < 1:
        raise SystemExit("stream-dapo ablate: --seeds must be >= 1")
    if getattr(args, "max_cells", None) is not None and args.max_cells < 1:
        raise SystemExit(
            "stream-dapo ablate: --max-cells must be >= 1 (--report-only writes the report without training)"
        )
    level = getattr(args, "target_level", None)
    if level is not None and not 0.0 < level <= 1.0:
        raise SystemExit(
            f"stream-dapo ablate: --target-level {level} is not a training-reward level; give a fraction "
            "in (0, 1], e.g. 0.284 for 28.4%"
        )
    files = list(args.config) or [str(DEFAULT_CONFIG)]
    base = load_config(files, args.overrides)
    budget = args.budget if args.budget is not None else base.learner.total_steps
    if budget < 1:
        raise SystemExit("stream-dapo ablate: --budget must be >= 1 optimizer step")
    order = _ALL_PRESETS
    return Plan(
        config_files=files,
        overrides=list(args.overrides),
        presets=sorted(presets, key=order.index),
        seeds=list(range(args.seeds)),
        budget=budget,
        out=Path(args.out),
        target_delta=args.target_delta,
        target_from=getattr(args, "target_from", "eval"),
        target_level=level,
        group_size=base.algo.group_size,
        rebuilt_start=getattr(args, "rebuilt_start", False),
        keep_checkpoints=getattr(args, "keep_checkpoints", False),
    )


def print_dry_run(cells: list[PlannedCell]) -> None:
    """The cells --dry-run shows: one line each, then its command; the count to run last."""
    for i, cell in enumerate(cells, 1):
        state = "done, reused" if cell.done else "to run"
        print(f"[{i}/{len(cells)}] {cell.preset} seed {cell.seed} ({state}; fingerprint {cell.fingerprint})")
        print("    " + shlex.join(cell.argv))
    todo = sum(not c.done for c in cells)
    print(f"{len(cells)} cells, {todo} to run, {len(cells) - todo} done", flush=True)


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    if getattr(args, "dry_run", False):
        # The commands read the files as given; a real run reads their snapshot, OUT/base-config.toml.
        print_dry_run(planned_cells(plan))
        return ExitCode.OK
    plan.out.mkdir(parents=True, exist_ok=True)
    freeze_base_config(plan)
    cells: list[CellResult] = []
    if args.report_only:
        before, cells, missing = done_cells(plan)
        print(
            f"{len(cells)} of {len(cells) + len(missing)} cells done"
            + (f"; missing: {', '.join(f'{p} seed {s}' for p, s in missing)}" if missing else ""),
            flush=True,
        )
    else:
        before = evaluate_before(plan)
        todo = [(p, s) for s in plan.seeds for p in plan.presets]  # seed-major: a partial run is a table
        max_cells = getattr(args, "max_cells", None)
        trained, not_started = 0, []
        for i, (preset, seed) in enumerate(todo, 1):
            if max_cells is not None and trained >= max_cells and not plan_cell_finished(plan, preset, seed):
                not_started.append(f"{preset} seed {seed}")
                continue
            cells.append(run_cell(plan, preset, seed))
            trained += cells[-1].status != "reused"
            print(_cell_line(i, len(todo), cells[-1], before), flush=True)
            write_report(plan.out, build_report(plan, before, cells))
        if not_started:
            print(
                f"--max-cells {max_cells}: trained {trained} cell(s) in this call; not started: "
                f"{', '.join(not_started)}. Run the same command again to go on from there.",
                flush=True,
            )
    report = build_report(plan, before, cells)
    plots, why_not = plot_curves(report["presets"], plan.out / "plots")
    if why_not:
        log.warning("plots skipped: %s; the table is written", why_not)
        report["meta"]["plots_skipped"] = why_not
    # Relative to the output directory, like the markdown's links: the report stays valid when copied.
    report["meta"]["plots"] = [p.relative_to(plan.out).as_posix() for p in plots]
    write_report(plan.out, report)
    print(
        f"wrote {plan.out / 'ablation.md'}, {plan.out / 'ablation.json'}"
        + (f", {len(plots)} plots" if plots else "")
    )
    failed = [c for c in cells if c.status == "failed"]
    for c in failed:
        log.error("%s seed %d failed: %s", c.preset, c.seed, c.error)
    return ExitCode.FAILURE if failed else ExitCode.OK

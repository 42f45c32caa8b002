"""`stream-dapo ablate`: the command (the ladder itself is `stream_dapo.tools.ablate`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from stream_dapo.config import load_config
from stream_dapo.core.presets import PRESETS
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.tools.ablate.cells import (
    Plan,
    _cell_line,
    build_report,
    done_cells,
    evaluate_before,
    freeze_base_config,
    run_cell,
    write_report,
)
from stream_dapo.tools.ablate.render import plot_curves
from stream_dapo.tools.ablate.stats import CellResult

log = logging.getLogger("stream_dapo.tools.ablate")



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
        help=f"comma-separated presets, in table order (default: all: {','.join(PRESETS)})",
    )
    parser.add_argument("--out", default="runs/ablation", help="output directory (default: runs/ablation)")
    parser.add_argument(
        "--target-delta",
        type=float,
        default=0.05,
        metavar="D",
        help="steps/seconds-to-target figures: the training reward (gen_accuracy) reaching the warm "
        "model's eval avg@k + D (default: 0.05)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the table and plots of the cells already done in --out",
    )


def make_plan(args: argparse.Namespace) -> Plan:
    from stream_dapo.tools.launch import DEFAULT_CONFIG

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise SystemExit(
            f"stream-dapo ablate: unknown preset(s) {unknown} in --presets; choose from {','.join(PRESETS)}"
        )
    if args.seeds < 1:
        raise SystemExit("stream-dapo ablate: --seeds must be >= 1")
    files = list(args.config) or [str(DEFAULT_CONFIG)]
    base = load_config(files, args.overrides)
    budget = args.budget if args.budget is not None else base.learner.total_steps
    if budget < 1:
        raise SystemExit("stream-dapo ablate: --budget must be >= 1 optimizer step")
    order = list(PRESETS)
    return Plan(
        config_files=files,
        overrides=list(args.overrides),
        presets=sorted(presets, key=order.index),
        seeds=list(range(args.seeds)),
        budget=budget,
        out=Path(args.out),
        target_delta=args.target_delta,
        group_size=base.algo.group_size,
    )


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
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
        for i, (preset, seed) in enumerate(todo, 1):
            cells.append(run_cell(plan, preset, seed))
            print(_cell_line(i, len(todo), cells[-1], before), flush=True)
            write_report(plan.out, build_report(plan, before, cells))
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

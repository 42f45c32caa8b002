"""`stream-dapo report`: report.md with plots of one run, or several overlaid (`stream_dapo.tools.report`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stream_dapo.errors import ConfigError
from stream_dapo.tools.report import MATPLOTLIB_HINT, write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories (run.out_dir)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for report.md and report/*.png (default: the run directory; required for several)",
    )
    parser.epilog = (
        "Several run directories overlay on the same axes, one colour per run. Plots need matplotlib "
        f"({MATPLOTLIB_HINT})."
    )


def run(args: argparse.Namespace) -> int:
    run_dirs: list[Path] = args.run_dirs
    if args.out is None and len(run_dirs) > 1:
        raise ConfigError(f"{len(run_dirs)} run directories: say where the comparison goes with --out DIR")
    out = args.out if args.out is not None else run_dirs[0]
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        raise ConfigError(f"cannot write to {out}; pass --out DIR with a writable directory")
    path = write_report(run_dirs, out)
    print(path)
    return 0

"""`stream-dapo run`: start buffer, learner and generators on this machine and supervise them (`stream_dapo.tools.launch`)."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from stream_dapo.config import Config
from stream_dapo.errors import ConfigError
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.metrics import (
    FINAL_METRICS_DIR,
)
from stream_dapo.runtime.ports import PORTS_DIR
from stream_dapo.tools.launch import (
    DEFAULT_CONFIG,
    PortInUse,
    ServiceFailed,
    StopRequested,
    check_data,
    check_ports_free,
    evaluate_subprocess,
    prepare_model,
    prepare_run_dir,
    stop_on_signals,
    train,
)
from stream_dapo.weights.image import sweep_orphaned_images


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["async", "sync"], help="override run.mode")
    parser.add_argument("--resume", action="store_true", help="continue the run in run.out_dir")
    parser.add_argument("--no-eval", action="store_true", help="skip the before/after evaluation")
    parser.add_argument("--quiet", action="store_true", help="no live view (summary only)")


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 done (or drained after SIGTERM), 1 a service failed, 2 configuration, 130 Ctrl-C.
    `summary.json` is written in every case that got as far as starting the services."""
    cfg = resolve_config(args)
    t0 = time.monotonic()
    problem = cfg.learner_precision_problem()
    if problem is not None:  # before anything starts, not from the learner after the generators did
        raise ConfigError(problem)
    try:
        check_ports_free(cfg)
    except PortInUse as exc:
        print(f"stream-dapo run: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    sweep_orphaned_images()  # weight images of an earlier run's generators that were killed
    check_data(cfg)  # first: it writes data.gsm_symbolic's files, which [sft] trains on
    prepare_model(cfg)
    run_dir = prepare_run_dir(cfg, args.resume)
    shutil.rmtree(run_dir / FINAL_METRICS_DIR, ignore_errors=True)  # an earlier run's, on --resume
    shutil.rmtree(run_dir / PORTS_DIR, ignore_errors=True)
    config_path = run_dir / "config.toml"
    summary: dict[str, Any] = {"mode": cfg.run.mode, "config": str(config_path)}
    code = ExitCode.OK
    stop_on_signals()
    try:
        if cfg.run.eval_before_after:
            summary["eval_before"] = evaluate_subprocess(
                cfg, config_path, Path(cfg.model.path), "before", run_dir
            )
        train(cfg, config_path, run_dir, summary, quiet=args.quiet)
        if cfg.run.eval_before_after:
            summary["eval_after"] = evaluate_subprocess(cfg, config_path, run_dir / "final", "after", run_dir)
    except StopRequested as stop:
        summary["stopped_by"] = str(stop)
        code = ExitCode.OK if stop.signum == signal.SIGTERM else ExitCode.INTERRUPTED
    except ServiceFailed as exc:
        summary["error"] = str(exc)
        print(f"stream-dapo run: {exc}", file=sys.stderr)
        code = ExitCode.FAILURE
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    summary["wall_seconds"] = round(time.monotonic() - t0, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    from stream_dapo.tools.report import write_run_report

    write_run_report(run_dir)  # report.md + report/*.png; never fails the run
    return code


def resolve_config(args: argparse.Namespace) -> Config:
    cfg: Config = args.cfg
    if not args.config and DEFAULT_CONFIG.is_file():
        from stream_dapo.config import load_config

        cfg = load_config([DEFAULT_CONFIG], args.overrides)
    if args.mode:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"mode": args.mode})})
    if args.no_eval:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"eval_before_after": False})})
    return cfg

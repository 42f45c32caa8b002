"""`stream-dapo learner`: run the DeepSpeed learner service (`stream_dapo.learner.service`)."""

from __future__ import annotations

import argparse
import os

from stream_dapo.config import Config
from stream_dapo.learner.root import build_learner
from stream_dapo.learner.service import LearnerService
from stream_dapo.runtime.service_runner import run_service


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="train until version N instead of learner.total_steps",
    )
    parser.epilog = (
        "Checkpoints go to run.out_dir/checkpoints (resumed from automatically), the final HF export "
        "to run.out_dir/final. SIGTERM finishes the current step, checkpoints and exits 0. Data "
        "parallel: start it under torchrun or the deepspeed launcher."
    )


def run(args: argparse.Namespace) -> int:
    cfg: Config = args.cfg
    return run_service(
        "learner",
        cfg,
        lambda: build_learner(cfg, max_steps=getattr(args, "max_steps", None)),
        LearnerService.run,
        stop_message="finishing the current step, then checkpointing",
        log_config=int(os.environ.get("RANK", "0")) == 0,
        disk_full_hint=": it resumes from checkpoints/latest",
    )

"""`stream-dapo warmup`: the supervised warm-up of the tiny model, cached (`stream_dapo.model.warmup`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stream_dapo.config import Config
from stream_dapo.model.warmup import warmup


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: model.path)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: warmup.steps)")
    parser.add_argument(
        "--seed", type=int, default=None, help="init and training seed (default: warmup.seed)"
    )


def run(args: argparse.Namespace) -> int:
    cfg: Config = args.cfg
    updates: dict[str, Any] = {}
    if args.steps is not None:
        updates["steps"] = args.steps
    if args.seed is not None:
        updates["seed"] = args.seed
    if updates:
        # Through model_validate so the field limits apply to CLI values too.
        cfg = cfg.model_copy(
            update={"warmup": type(cfg.warmup).model_validate({**cfg.warmup.model_dump(), **updates})}
        )
    result = warmup(cfg, out=args.out)
    report: dict[str, Any] = {
        "model": str(result.path),
        "cached": result.cached,
        "train_seconds": round(result.train_seconds, 2),
        "final_loss": result.final_loss,
    }
    if result.pass_at_1 is not None:
        report.update(
            {
                "pass_at_1_t1": result.pass_at_1.sampled,
                "pass_at_1_greedy": result.pass_at_1.greedy,
                "eval_prompts": result.pass_at_1.num_prompts,
                "mean_response_len": result.pass_at_1.mean_response_len,
            }
        )
    print(json.dumps(report))
    return 0

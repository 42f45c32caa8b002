"""`stream-dapo init-model`: build the tiny Qwen2 model and tokenizer offline (`stream_dapo.model.tiny`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stream_dapo.model.tiny import default_init_dir, init_model, read_marker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: <model.path>/../init)"
    )
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default: 0)")


def run(args: argparse.Namespace) -> int:
    out = args.out if args.out is not None else default_init_dir(args.cfg.model.path)
    path = init_model(out, seed=args.seed)
    print(json.dumps({"model": str(path), **(read_marker(path) or {})}))
    return 0

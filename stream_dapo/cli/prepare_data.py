"""`stream-dapo prepare-data`: write data.gsm_symbolic's train / held-out-template eval / GSM8K files, cached (`stream_dapo.data.gsm_symbolic`)."""

from __future__ import annotations

import argparse
import json

from stream_dapo.data.gsm_symbolic import ensure_gsm_symbolic_data
from stream_dapo.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # everything comes from [data.gsm_symbolic]


def run(args: argparse.Namespace) -> int:
    source = args.cfg.data.gsm_symbolic
    if source is None:
        raise ConfigError("prepare-data writes [data.gsm_symbolic]'s files; set that section (see configs/)")
    files = ensure_gsm_symbolic_data(source)
    print(
        json.dumps(
            {"train": str(files.train), "eval": str(files.eval), "gsm8k": str(files.gsm8k), **files.info}
        )
    )
    return 0

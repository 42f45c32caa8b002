"""`stream-dapo sft`: prepare the data, import the base model if needed, and run the supervised
warm-up of `[sft]` into model.path (stream_dapo/model/sft.py; cached). Prints sft.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stream_dapo.config import Config
from stream_dapo.errors import ConfigError
from stream_dapo.model.sft import SFT_MARKER
from stream_dapo.tools.launch import check_data, prepare_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # everything comes from [model], [data] and [sft]


def run(args: argparse.Namespace) -> int:
    cfg: Config = args.cfg
    if not cfg.sft.enabled:
        raise ConfigError(
            "sft.enabled is false: nothing to warm up (set it, or use `stream-dapo warmup` for the tiny model)"
        )
    check_data(cfg)
    prepare_model(cfg)
    print(json.dumps(json.loads((Path(cfg.model.path) / SFT_MARKER).read_text())))
    return 0

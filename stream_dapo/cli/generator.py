"""`stream-dapo generator`: run one vLLM generator service (`stream_dapo.generator.service`)."""

from __future__ import annotations

import argparse
import logging

from stream_dapo.config import Config
from stream_dapo.generator.engine import WeightUpdateError
from stream_dapo.generator.root import build_generator
from stream_dapo.generator.service import GeneratorService, StartupError, StoppedBeforeStart
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.service_runner import run_service

log = logging.getLogger("stream_dapo.generator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index",
        type=int,
        default=0,
        metavar="I",
        help="this generator's index in 0..generator.num_generators-1 (prompt shard, metrics port, seed)",
    )
    parser.epilog = (
        "Needs a running `stream-dapo buffer` (transport.samples_port) and learner weights "
        "(weights.method). Metrics on metrics.generator_port + I. SIGTERM drains and exits 0."
    )


def run(args: argparse.Namespace) -> int:
    """Start-up problems are 2 (a missing buffer 69); a weight update that fails is 1."""
    cfg: Config = args.cfg

    def start_and_serve(service: GeneratorService) -> None:
        try:
            service.start()
        except StoppedBeforeStart as stopped:
            log.info("%s", stopped)
            return
        service.serve()

    return run_service(
        "generator",
        cfg,
        lambda: build_generator(cfg, getattr(args, "index", 0)),
        start_and_serve,
        startup_errors={StartupError: ExitCode.CONFIG},
        serve_errors={StartupError: ExitCode.CONFIG, WeightUpdateError: ExitCode.FAILURE},
    )

"""`stream-dapo buffer`: run the replay-buffer service (`stream_dapo.buffer.service`)."""

from __future__ import annotations

import argparse

from stream_dapo.buffer.journal import JournalError
from stream_dapo.buffer.service import BufferService, build_buffer
from stream_dapo.config import Config
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.service_runner import run_service


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The buffer takes everything from the config (`--config`, `--set buffer.*`)."""
    parser.epilog = (
        "State is kept in buffer.persist_path (default run.out_dir/buffer/state.msgpack) and its .journal; "
        "SIGTERM drains and persists."
    )


def run(args: argparse.Namespace) -> int:
    """A journal that cannot be read is a file to fix (2); one that cannot be written stops the
    buffer (1), so nothing unrecorded is acknowledged (a full disk is 1 either way)."""
    cfg: Config = args.cfg
    return run_service(
        "buffer",
        cfg,
        lambda: build_buffer(cfg),
        BufferService.serve_forever,
        startup_errors={JournalError: ExitCode.CONFIG},
        serve_errors={JournalError: ExitCode.FAILURE},
    )

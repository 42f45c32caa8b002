"""Fixtures shared by the tests: the root logger restored after each test, the warm tiny model."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def restore_root_logging():
    """`stream_dapo.cli.main` points the root logger at the stderr of the test that calls it (a
    capture closed afterwards); restore it, so that later tests do not log into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def warm_model() -> Path:
    """The embedded default's warm tiny model (built once, cached under runs/, shared with `make run`).

    STREAM_DAPO_TEST_MODEL=DIR uses an existing model directory instead (quick local iterations).
    """
    if os.environ.get("STREAM_DAPO_TEST_MODEL"):
        return Path(os.environ["STREAM_DAPO_TEST_MODEL"]).resolve()
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config(
        [REPO / "configs" / "tiny-cpu.toml"], [f"model.path={REPO / 'runs/tiny-model/warm'}"], environ={}
    )
    return ensure_warm_model(cfg)

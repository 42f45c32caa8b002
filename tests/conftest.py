"""Session fixtures shared by the integration tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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

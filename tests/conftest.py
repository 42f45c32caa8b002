"""Fixtures shared by the tests: the root logger restored after each test, the warm tiny model."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]

# Property tests assert what holds for every example, never how fast one runs: no per-example
# deadline (Hypothesis' 200 ms default failed two pure-core tests on a busy machine) and no
# health check on how fast examples are generated.
settings.register_profile("stream-dapo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stream-dapo")

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


_BUILD_ERROR: list[Exception] = []
"""The error the build before the first test raised, if it did; the fixture raises it again."""


def _build_warm_model() -> Path:
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config(
        [REPO / "configs" / "tiny-cpu.toml"], [f"model.path={REPO / 'runs/tiny-model/warm'}"], environ={}
    )
    return ensure_warm_model(cfg)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the warm model between collection and the first test, when a collected test needs it.

    Built inside the session fixture instead, the build (minutes on a fresh clone) counted against the
    first test's pytest-timeout and failed it on a slow or busy machine. An error is kept and raised by
    the fixture, so only the tests that need the model fail, each with the build's own error.
    """
    if os.environ.get("STREAM_DAPO_TEST_MODEL") or session.config.option.collectonly:
        return
    if not any("warm_model" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("building the tests' warm tiny model once (cached in runs/tiny-model/warm) ...")
    try:
        _build_warm_model()
    except Exception as exc:  # raised again by the fixture, in the tests that need the model
        _BUILD_ERROR.append(exc)


@pytest.fixture(scope="session")
def warm_model() -> Path:
    """The embedded default's warm tiny model (built once before the first test, cached under runs/,
    shared with `make run`).

    STREAM_DAPO_TEST_MODEL=DIR uses an existing model directory instead (quick local iterations).
    """
    if os.environ.get("STREAM_DAPO_TEST_MODEL"):
        return Path(os.environ["STREAM_DAPO_TEST_MODEL"]).resolve()
    if _BUILD_ERROR:
        raise _BUILD_ERROR[0]
    return _build_warm_model()  # returns at once once built (the hook built it unless it did not run)

"""Fixtures shared by the tests: the root logger restored after each test, the warm tiny model."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

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


def _build_warm_model() -> Path:
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config(
        [REPO / "configs" / "tiny-cpu.toml"], [f"model.path={REPO / 'runs/tiny-model/warm'}"], environ={}
    )
    return ensure_warm_model(cfg)


def _needs_model(item: pytest.Item) -> bool:
    return "warm_model" in getattr(item, "fixturenames", ())


class _Build:
    """The warm model's build in a process of its own, started when collection ends, so that it runs
    beside the tests that do not need the model (they go first) instead of before all of them."""

    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    error: Exception | None = None
    """The build's error, if it failed; the fixture raises it, so only the tests that need the model
    fail, each with the build's own words."""

    @classmethod
    def start(cls) -> None:
        fd, name = tempfile.mkstemp(prefix="stream-dapo-warm-build-", suffix=".log")
        cls.log = Path(name)
        with os.fdopen(fd, "wb") as log:
            cls.process = subprocess.Popen(
                [sys.executable, __file__, "--build-warm-model"], stdout=log, stderr=subprocess.STDOUT
            )

    @classmethod
    def wait(cls, reporter: Any) -> None:
        """Wait for the build once (outside any test's timeout); keep its error."""
        process = cls.process
        if process is None:
            return
        if process.poll() is None and reporter is not None:
            reporter.write_line("waiting for the warm tiny model's build (runs/tiny-model/warm) ...")
        rc = process.wait()  # an interrupt here leaves cls.process set, for stop()
        cls.process = None
        assert cls.log is not None
        if rc != 0:
            tail = cls.log.read_text(errors="replace")[-4000:]
            cls.error = RuntimeError(
                f"building the tests' warm tiny model exited {rc} (log {cls.log}):\n{tail}"
            )
        else:
            cls.log.unlink(missing_ok=True)

    @classmethod
    def stop(cls) -> None:
        """A session that ends before the build does (-x, an interrupt) stops it: the build publishes
        its directory in one rename, so nothing half-built is left."""
        if cls.process is not None and cls.process.poll() is None:
            cls.process.terminate()
            cls.process.wait()
            if cls.log is not None:
                cls.log.unlink(missing_ok=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The unit files first, then the other files that do not need the warm model, then those that do
    (each file's tests stay together and in order, so module fixtures start once): the build runs
    beside the light unit tier, and the first test that needs the model waits for less of it."""
    files = list(dict.fromkeys(item.path for item in items))
    needs = {item.path for item in items if _needs_model(item)}
    rank = {path: (path in needs, path.parent.name != "unit", n) for n, path in enumerate(files)}
    items.sort(key=lambda item: rank[item.path])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the warm model's build when a collected test needs it.

    Built inside the session fixture instead, the build (minutes on a fresh clone) counted against the
    first test's pytest-timeout and failed it on a slow or busy machine; the first test that needs it
    waits for it before its timeout starts (pytest_runtest_protocol below).
    """
    if os.environ.get("STREAM_DAPO_TEST_MODEL") or session.config.option.collectonly:
        return
    if any(_needs_model(item) for item in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                "building the tests' warm tiny model (cached in runs/tiny-model/warm) beside the first tests ..."
            )
        _Build.start()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Outside pytest-timeout's own wrapper: the wait for the build is no test's time."""
    if _needs_model(item):
        _Build.wait(item.config.pluginmanager.get_plugin("terminalreporter"))
    yield


def pytest_sessionfinish() -> None:
    _Build.stop()


@pytest.fixture(scope="session")
def warm_model() -> Path:
    """The embedded default's warm tiny model (built once before the first test, cached under runs/,
    shared with `make run`).

    STREAM_DAPO_TEST_MODEL=DIR uses an existing model directory instead (quick local iterations).
    """
    if os.environ.get("STREAM_DAPO_TEST_MODEL"):
        return Path(os.environ["STREAM_DAPO_TEST_MODEL"]).resolve()
    if _Build.error is not None:
        raise _Build.error
    return _build_warm_model()  # returns at once once built (the build ran unless no hook started it)


if __name__ == "__main__" and sys.argv[1:] == ["--build-warm-model"]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _build_warm_model()

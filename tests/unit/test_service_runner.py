"""run_service: the plumbing every service shares, and the exit code each kind of failure gets."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_dapo.buffer.journal import JournalDiskFullError, JournalError
from stream_dapo.config import Config, load_config
from stream_dapo.errors import ConfigError
from stream_dapo.runtime import service_runner
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.service_runner import ErrorCodes, exit_code_for, run_service
from stream_dapo.transport.sockets import PeerUnavailable, TransportError


class FakeService:
    def __init__(self, fail: BaseException | None = None, code: int | None = None) -> None:
        self.fail, self.code = fail, code
        self.stops = self.closes = 0

    def request_stop(self) -> None:
        self.stops += 1

    def close(self) -> None:
        self.closes += 1

    def serve(self) -> int | None:
        if self.fail is not None:
            raise self.fail
        return self.code


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    handlers: list = []
    monkeypatch.setattr(service_runner, "on_stop_signal", lambda stop, what="": handlers.append((stop, what)))
    return load_config(overrides=[f'run.out_dir="{tmp_path}"'], environ={})


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (PeerUnavailable("the buffer did not answer"), ExitCode.PEER_UNAVAILABLE),
        (ConfigError("set x"), ExitCode.CONFIG),
        (TransportError("port taken"), ExitCode.CONFIG),
        (FileNotFoundError("data.jsonl"), ExitCode.CONFIG),
        (JournalDiskFullError("no space left on /x", "/x"), ExitCode.FAILURE),
        (OSError(28, "No space left on device"), ExitCode.FAILURE),
    ],
)
def test_each_failure_while_serving_gets_its_exit_code_and_the_service_is_closed(
    cfg: Config, exc: BaseException, code: ExitCode, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService(fail=exc)
    with caplog.at_level(logging.ERROR, logger="stream_dapo"):
        assert run_service("thing", cfg, lambda: service, FakeService.serve) == code
    assert service.closes == 1
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["thing stopped"]


def test_a_service_own_errors_are_checked_after_disk_full_and_before_the_shared_table() -> None:
    own: ErrorCodes = {JournalError: ExitCode.CONFIG}
    assert exit_code_for(JournalError("unreadable journal"), own) == ExitCode.CONFIG
    assert exit_code_for(JournalDiskFullError("no space left on /x", "/x"), own) == ExitCode.FAILURE
    assert exit_code_for(RuntimeError("a bug")) is None


def test_a_start_up_failure_is_reported_as_such_and_a_bug_keeps_its_traceback(
    cfg: Config, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse() -> FakeService:
        raise ConfigError("set metrics.buffer_port to a free port")

    with caplog.at_level(logging.ERROR, logger="stream_dapo"):
        assert run_service("buffer", cfg, refuse, FakeService.serve) == ExitCode.CONFIG
    assert "cannot start the buffer: set metrics.buffer_port" in caplog.text
    service = FakeService(fail=KeyError("a bug"))
    with pytest.raises(KeyError):
        run_service("buffer", cfg, lambda: service, FakeService.serve)
    assert service.closes == 1


def test_serve_returns_the_exit_code(cfg: Config) -> None:
    assert run_service("learner", cfg, FakeService, FakeService.serve) == ExitCode.OK
    assert run_service("learner", cfg, lambda: FakeService(code=3), FakeService.serve) == 3


def test_release_runs_the_steps_in_order_and_skips_what_was_never_opened() -> None:
    from stream_dapo.runtime.service_runner import release

    done: list[str] = []
    never_opened = None
    release(
        lambda: done.append("sockets"), never_opened and never_opened.close, lambda: done.append("context")
    )
    assert done == ["sockets", "context"]
    with pytest.raises(TypeError, match="callables"):
        release([])  # a falsy resource is not silently taken for "never opened"


def test_release_runs_every_step_when_one_fails_and_raises_the_first_failure() -> None:
    """Regression: a generator's weight source that failed to close (EBADF) ended `release` there,
    so its vLLM engine and verifier pool were never closed."""
    from stream_dapo.runtime.service_runner import release

    done: list[str] = []

    def fails(what: str) -> Callable[[], None]:
        def step() -> None:
            done.append(what)
            raise OSError(9, f"{what} failed")

        return step

    with pytest.raises(OSError, match="weights failed"):
        release(
            fails("weights"), lambda: done.append("engine"), fails("verifier"), lambda: done.append("ctx")
        )
    assert done == ["weights", "engine", "verifier", "ctx"]

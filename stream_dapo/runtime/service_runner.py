"""What every long-running service does around its own work, written once.

`run_service` is the body of `stream-dapo generator|buffer|learner`: log the resolved config,
build the service, install the SIGTERM/SIGINT drain, serve, close, and turn what went wrong into
the exit code a supervisor acts on (`stream_dapo/runtime/exit_codes.py`). A service supplies a factory
and its serve call, plus the few errors that mean something only to it.

The mapping every service shares, checked in this order (first match wins):

| raised                                                | exit code                                     |
|-------------------------------------------------------|-----------------------------------------------|
| `PeerUnavailable` (a peer did not answer at start-up) | 69 PEER_UNAVAILABLE                           |
| `DiskFullError`                                       | 1 FAILURE (restart helps once space is freed) |
| the service's own errors (`startup_errors`, `serve_errors`) | what the service says                   |
| `ConfigError`, `TransportError`, `FileNotFoundError`  | 2 CONFIG (fix the setting named in the log)   |
| anything else that `is_disk_full` recognises          | 1 FAILURE                                     |

Anything else propagates with its traceback (exit 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from stream_dapo.config import Config, config_to_toml
from stream_dapo.errors import ConfigError
from stream_dapo.runtime.disk import DiskFullError, is_disk_full, no_space_left
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.signals import on_stop_signal
from stream_dapo.transport.sockets import PeerUnavailable, TransportError

__all__ = [
    "EXIT_CODES",
    "PRIORITY_EXIT_CODES",
    "ErrorCodes",
    "Service",
    "exit_code_for",
    "release",
    "run_service",
]

log = logging.getLogger("stream_dapo")

ErrorCodes = Mapping[type[BaseException], ExitCode]
"""Exception class -> exit code, checked in order (first match wins)."""

PRIORITY_EXIT_CODES: ErrorCodes = {
    PeerUnavailable: ExitCode.PEER_UNAVAILABLE,
    DiskFullError: ExitCode.FAILURE,
}
"""Whatever class carries them (a `JournalError` that is also a `DiskFullError`, a `TransportError`
that is a `PeerUnavailable`), these mean the same to a supervisor."""

EXIT_CODES: ErrorCodes = {
    ConfigError: ExitCode.CONFIG,
    TransportError: ExitCode.CONFIG,
    FileNotFoundError: ExitCode.CONFIG,
}


class Service(Protocol):
    """What `run_service` needs of a service besides its serve call."""

    def request_stop(self) -> None: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=Service)


def exit_code_for(exc: BaseException, own: ErrorCodes = {}) -> ExitCode | None:  # noqa: B006 (read-only)
    """The exit code for `exc`: `PRIORITY_EXIT_CODES`, the service's `own` mapping, then
    `EXIT_CODES`; None when none names it."""
    for table in (PRIORITY_EXIT_CODES, own, EXIT_CODES):
        for kind, code in table.items():
            if isinstance(exc, kind):
                return code
    return None


def run_service(
    name: str,
    cfg: Config,
    build: Callable[[], S],
    serve: Callable[[S], int | None],
    *,
    startup_errors: ErrorCodes = {},  # noqa: B006 (read-only)
    serve_errors: ErrorCodes = {},  # noqa: B006 (read-only)
    stop_message: str = "draining",
    log_config: bool = True,
    disk_full_hint: str = "",
) -> int:
    """Run one service process to the end and return its exit code.

    `build()` constructs the service (errors: "cannot start the <name>: ..."), `serve(service)`
    runs it until it finishes or drains after a signal (its return value is the exit code, None
    for 0); `service.close()` always runs after `serve`. `startup_errors` / `serve_errors` map the
    service's own exceptions (`exit_code_for` gives the order). A full disk found in any other error
    exits 1 with "no space left on run.out_dir", plus `disk_full_hint`.
    """
    if log_config:
        log.info("resolved configuration:\n%s", config_to_toml(cfg))
    try:
        service = build()
    except Exception as exc:
        code = exit_code_for(exc, startup_errors)
        if code is None:
            raise
        log.error("cannot start the %s: %s", name, exc)
        return code
    on_stop_signal(service.request_stop, stop_message)
    try:
        returned = serve(service)
        return ExitCode.OK if returned is None else returned
    except Exception as exc:
        code = exit_code_for(exc, serve_errors)
        if code is not None:
            log.error("%s stopped: %s", name, exc)
            return code
        if not is_disk_full(exc, cfg.run.out_dir):
            raise
        log.error(
            "%s stopped: %s (%s); free space there and restart the %s%s",
            name,
            no_space_left(cfg.run.out_dir),
            exc,
            name,
            disk_full_hint,
        )
        return ExitCode.FAILURE
    finally:
        service.close()


def release(*steps: object) -> None:
    """Run the steps of a shutdown in the order given. A step is a callable; a resource never
    opened passes None instead: ``release(self._auth and self._auth.stop, self._ctx and
    self._ctx.term)``. (Typed `object` because ``x and x.stop`` is, to mypy, x or the method.)

    Every step runs even when an earlier one raised: one resource that fails to close must not
    leave the next open (a vLLM engine's processes, a verifier pool). Each failure is logged; the
    first is raised once all steps ran."""
    for step in steps:
        if step is not None and not callable(step):
            raise TypeError(f"release() takes shutdown steps (callables) or None, got {step!r}")
    first: Exception | None = None
    for step in steps:
        if not callable(step):  # None: never opened
            continue
        try:
            step()
        except Exception as exc:  # noqa: BLE001 (re-raised below, after the other steps)
            log.error("shutdown step %s failed: %s: %s", _step_name(step), type(exc).__name__, exc)
            first = first or exc
    if first is not None:
        raise first


def _step_name(step: object) -> str:
    return getattr(step, "__qualname__", None) or repr(step)

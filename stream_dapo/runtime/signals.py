"""Signal handling shared by the services and tools.

`on_stop_signal`: the first SIGTERM/SIGINT asks a service to drain. `exit_on_sigterm`: while a tool
holds processes it must stop itself (a vLLM engine's engine-core and worker processes), SIGTERM
unwinds the tool like Ctrl-C instead of ending it on the spot and orphaning them.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("stream_dapo")

__all__ = ["exit_on_sigterm", "on_stop_signal"]


def on_stop_signal(request_stop: Callable[[], None], what: str = "draining") -> None:
    """Call `request_stop` on SIGTERM or SIGINT (systemd, Kubernetes and Ctrl-C), logging `what`."""

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: %s", signal.Signals(signum).name, what)
        request_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def exit_on_sigterm(what: str) -> Iterator[None]:
    """Inside the block, SIGTERM raises ``SystemExit(128 + SIGTERM)`` in the main thread, so the
    ``finally`` blocks and context managers around the work run, as they do for Ctrl-C.

    Python's default leaves SIGTERM to the OS, which ends this process at once: a supervisor,
    ``timeout`` or ``kill`` then orphans the processes that only this one knew to stop (vLLM's
    engine-core and worker processes stay up with ppid 1, spinning on every core they were bound
    to). `what` names them in the log line. A second SIGTERM while the block unwinds is ignored so it
    cannot cut the clean-up short (SIGKILL still ends everything). The handler that was installed
    before is restored when the block ends. Off the main thread, where Python cannot install signal
    handlers, it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("received SIGTERM: stopping %s before exiting", what)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: a handler installed outside Python, which cannot be put back; the default is.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

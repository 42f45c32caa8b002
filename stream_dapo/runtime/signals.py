"""SIGTERM/SIGINT handling shared by the services: the first signal asks the service to drain."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

log = logging.getLogger("stream_dapo")


def on_stop_signal(request_stop: Callable[[], None], what: str = "draining") -> None:
    """Call `request_stop` on SIGTERM or SIGINT (systemd, Kubernetes and Ctrl-C), logging `what`."""

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: %s", signal.Signals(signum).name, what)
        request_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)

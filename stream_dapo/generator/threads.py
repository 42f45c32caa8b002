"""The generator's helper threads share this shape: start, run until stopped, join with a bound."""

from __future__ import annotations

import threading
from typing import Self

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """A daemon thread running ``_run`` until ``stop()``; subclasses set ``name`` and ``_run``."""

    name = "background"
    stop_wait_s = 5.0
    """How long `stop` waits for the thread to end."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Ask the thread to end and wait up to `stop_wait_s`; False when it is still running (it
        is inside a call that ignores the request, and still uses whatever that call holds)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.stop_wait_s)
        return not self._thread.is_alive()

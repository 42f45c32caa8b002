"""The generator's helper threads share this shape: start, run until stopped, join with a bound."""

from __future__ import annotations

import threading
from typing import Self

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """A daemon thread running ``_run`` until ``stop()``; subclasses set ``name`` and ``_run``."""

    name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

"""The generator's weight watcher: polls its `WeightSource` on a thread, hands the newest version to
the service loop, which swaps it into the engine between steps."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stream_dapo.generator.threads import BackgroundThread
from stream_dapo.transport.sockets import TransportError
from stream_dapo.weights.base import WeightUpdate

__all__ = ["Poll", "WeightWatcher"]

log = logging.getLogger("stream_dapo.generator")

Poll = Callable[[int], "WeightUpdate | None"]
"""have -> a version other than `have`, ready to load (a `WeightSource` is one)."""


class WeightWatcher(BackgroundThread):
    """Polls for weights other than ``have`` every ``poll_s`` on a daemon thread.

    ``take()`` returns the newest version found since the last call (older undelivered ones are
    superseded). Until the taker calls ``loaded()`` the watcher fetches nothing: a version being
    loaded must stay as it is (a fetch used to prune the file being loaded), and each fetch holds a
    whole version in memory, so fetching during a load would hold one more. Poll errors (learner
    restarting, a checksum mismatch) are logged and retried at the next poll; they never stop the
    generator.
    """

    name = "weight-watcher"

    def __init__(self, poll: Poll, poll_s: float, have: int) -> None:
        self._poll = poll
        self._poll_s = poll_s
        self._have = have
        self._lock = threading.Lock()
        self._ready: WeightUpdate | None = None
        self._loading = False
        self.errors = 0
        super().__init__()

    def take(self) -> WeightUpdate | None:
        """The newest fetched update, if any; no fetch happens until ``loaded()``."""
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is not None:
                self._loading = True
            return ready

    @property
    def pending(self) -> bool:
        """A fetched update waits for ``take()``."""
        with self._lock:
            return self._ready is not None

    def loaded(self) -> None:
        """The update from ``take()`` is in the engine (or was given up on): fetch again."""
        with self._lock:
            self._loading = False

    def reset(self, have: int) -> None:
        """Forget what was fetched and not loaded (e.g. its file was pruned): poll relative to ``have``."""
        with self._lock:
            self._have, self._ready, self._loading = have, None, False

    def poll_once(self) -> WeightUpdate | None:
        with self._lock:
            if self._loading:
                return None
            have = self._have
        update = self._poll(have)
        if update is not None:
            with self._lock:
                self._have, self._ready = update.version, update
        return update

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll_once()
            except (TransportError, OSError, ValueError, RuntimeError) as exc:
                self.errors += 1
                log.warning("weight poll failed (retrying in %.1f s): %s", self._poll_s, exc)

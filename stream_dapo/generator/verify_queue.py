"""Finished groups on their way through verification, in the order they finished.

Verification runs on one thread (the checks themselves in the verifier pool's processes), so the
engine keeps stepping while a group is scored; outcomes are taken in finishing order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from stream_dapo.generator.rollout import FinishedGroup, GroupOutcome

__all__ = ["VerifyQueue"]


class VerifyQueue:
    """Example: `submit` groups a (started at version 3) and b (version 4); `start_versions()` is
    ``[3, 4]`` until `done()` yields a's outcome (b's waits behind it even when it was scored first),
    then ``[4]``. `wait()` blocks until every submitted group is scored (the drain)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self._queue: deque[tuple[int, Future[GroupOutcome]]] = deque()
        """(start version, verification) of each finished group, in the order they finished."""

    def submit(self, group: FinishedGroup, verify: Callable[[FinishedGroup], GroupOutcome]) -> None:
        self._queue.append((group.start_version, self._pool.submit(verify, group)))

    def __len__(self) -> int:
        return len(self._queue)

    def start_versions(self) -> list[int]:
        """The start version of every group submitted and not yet taken from `done()`."""
        return [v for v, _ in self._queue]

    def done(self) -> Iterator[GroupOutcome]:
        """The outcomes ready now, oldest first; each leaves the queue as it is yielded."""
        while self._queue and self._queue[0][1].done():
            yield self._queue.popleft()[1].result()

    def wait(self) -> None:
        """Wait until every submitted group is scored (a verification's exception is raised here)."""
        for _, future in self._queue:
            future.result()

    def close(self) -> None:
        """Stop the thread without waiting; verifications not started are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

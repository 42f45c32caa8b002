"""A generator's weight intake: the current version before the first prompt, then each newer one
swapped into the engine between steps.

A ``WeightWatcher`` thread (``weight_watcher.py``) polls, every ``generator.weight_poll_s``, the
``WeightSource`` that ``weights.factory`` builds for ``weights.method`` (zmq download, shared
directory, or an NCCL announcement); `WeightIntake.apply_new` has the source swap the newest version
into the engine (``RolloutEngine`` pauses, loads, relabels, resumes), so the engine never samples
from half-loaded weights.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stream_dapo.generator.weight_watcher import WeightWatcher
from stream_dapo.runtime.metrics import GeneratorMetrics, Health
from stream_dapo.transport.sockets import PeerUnavailable, TransportTimeout
from stream_dapo.weights.base import RelayMetrics, WeightsError, WeightSource, WeightUpdate

if TYPE_CHECKING:
    from stream_dapo.config import GeneratorConfig
    from stream_dapo.generator.engine import RolloutEngine

__all__ = ["WeightIntake"]

log = logging.getLogger("stream_dapo.generator")


class WeightIntake:
    """The weights one generator samples from.

    `source` is the injected `WeightSource`, or None: `load_initial` then asks `build_source` for
    the one of weights.method (with the relay counters of `metrics`). `load_initial(engine)` is the
    late-joiner rule and starts the `watcher`; the loop calls `apply_new()` between engine steps and
    starts no group while `holding` is true; `close()` stops the watcher and closes the source.
    """

    def __init__(
        self,
        source: WeightSource | None,
        build_source: Callable[[RelayMetrics], WeightSource],
        *,
        generator: GeneratorConfig,
        timeout_s: float,
        weights_address: str,
        shared_dir: Path,
        metrics: GeneratorMetrics,
        health: Health,
        stop: threading.Event,
    ) -> None:
        self.source = source
        self._build_source = build_source
        self.generator = generator
        self.timeout_s = timeout_s
        """transport.timeout_s: the start-up wait for the learner is 4 x this."""
        self.weights_address = weights_address
        self.shared_dir = shared_dir
        """weights.shared_dir as resolved, named when nothing is published there yet."""
        self.metrics = metrics
        self.health = health
        self._stop = stop
        self.watcher: WeightWatcher | None = None
        self._engine: RolloutEngine | None = None
        self._hold_since: float | None = None

    # ------------------------------------------------------------------------------ start-up

    def load_initial(self, engine: RolloutEngine) -> None:
        """The late-joiner rule: load the learner's current version into `engine` before the first
        prompt, then start the watcher."""
        self._engine = engine
        if self.source is None:
            mx = self.metrics
            self.source = self._build_source(
                RelayMetrics(mx.weight_relay_sent_bytes, mx.connections_refused, mx.weight_relays_dropped)
            )
        self.source.join(engine)
        self.watcher = WeightWatcher(self.source, self.generator.weight_poll_s, self.source.first_version)
        update = self._first_weights()
        if update is not None:
            self._load(update)
            self.watcher.loaded()
        elif self.source.startup == "look":
            log.warning(
                "nothing published in %s yet: starting from the initial model (version 0)", self.shared_dir
            )
        self.watcher.start()

    def _look_for_weights(self) -> WeightUpdate | None:
        """The newest published version (shared directory), None when nothing is published yet. A
        newest file that cannot be used (a checksum mismatch, a LATEST something else wrote) is not
        loaded: as a running generator does, wait for the learner to publish a good one, live but
        not ready, instead of exiting."""
        assert self.watcher is not None
        warned = False
        while not self._stop.is_set():
            try:
                self.watcher.poll_once()
                return self.watcher.take()
            except WeightsError as exc:
                if not warned:
                    log.warning(
                        "%s; waiting for the learner to publish a good version (not ready meanwhile)", exc
                    )
                    warned = True
                self.health.beat()  # waiting on purpose: /livez passes, /readyz fails until then
                self._stop.wait(self.generator.weight_poll_s)
        return None

    def _first_weights(self) -> WeightUpdate | None:
        """The learner's current version, if it differs from ours.

        `WeightSource.startup` says how long to wait: "look" once (nothing published yet means start
        from the initial model); "answer": up to 4 x transport.timeout_s for the weight server to
        answer; "announcement": as long for the first announced version, whose broadcast must be taken.
        """
        assert self.watcher is not None and self.source is not None
        if self.source.startup == "look":
            return self._look_for_weights()
        wait_s = 4 * self.timeout_s
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                if self.watcher.poll_once() is not None or self.source.startup == "answer":
                    return self.watcher.take()
                log.info("waiting for the learner to announce its weights at %s", self.weights_address)
            except TransportTimeout:
                log.info("waiting for the learner's weight server at %s", self.weights_address)
            time.sleep(min(1.0, self.generator.weight_poll_s))
        if self._stop.is_set():
            return None
        raise PeerUnavailable(
            f"no weights from the learner at {self.weights_address} within {wait_s:.0f} s: start "
            "`stream-dapo learner` (or fix transport.learner_host / transport.weights_port)"
        )

    # ------------------------------------------------------------------------------ between steps

    @property
    def holding(self) -> bool:
        """kv_on_update = "between-groups": an update waits for the in-flight groups to finish; no
        new group starts meanwhile (it would sample from weights already superseded)."""
        return (
            self.generator.kv_on_update == "between-groups"
            and self.watcher is not None
            and self.watcher.pending
        )

    def apply_new(self) -> None:
        """Swap the newest fetched version into the engine, if there is one and it may go in now."""
        assert self.watcher is not None, "load_initial() first"
        if self.holding:
            now = time.monotonic()
            if self._hold_since is None:
                self._hold_since = now
            if self._started_engine().num_in_flight:
                return
            self.metrics.weight_hold_seconds.inc(now - self._hold_since)
        self._hold_since = None
        update = self.watcher.take()
        if update is None:
            return
        try:
            self._load(update)
        except (FileNotFoundError, ValueError) as exc:  # refused before pausing: keep sampling
            log.warning("cannot load weights version %d (%s); polling again", update.version, exc)
            self.watcher.reset(self._started_engine().version)
        finally:
            self.watcher.loaded()

    def _started_engine(self) -> RolloutEngine:
        assert self._engine is not None, "load_initial() first"
        return self._engine

    def _load(self, update: WeightUpdate) -> None:
        engine = self._started_engine()
        assert self.source is not None
        seconds = self.source.load(engine, update)
        mx = self.metrics
        mx.weight_sync_seconds.observe(update.fetch_seconds + seconds)
        mx.weight_sync_bytes.inc(update.nbytes)
        wire = update.nbytes if update.wire_bytes is None else update.wire_bytes
        mx.weight_received_bytes.inc(wire)
        mx.weight_delta_ratio.set(wire / update.nbytes if update.nbytes else 1.0)
        if update.published_at > 0:
            mx.weight_publish_to_loaded_seconds.observe(max(0.0, time.time() - update.published_at))
        mx.policy_version.set(engine.version)
        self.health.detail["policy_version"] = engine.version
        log.info(
            "now sampling from weights version %d (fetch %.2f s, load %.2f s)",
            engine.version,
            update.fetch_seconds,
            seconds,
        )

    def update_gauges(self) -> None:
        """How many versions the engine is behind the newest the source has seen."""
        if self.source is not None and self._engine is not None and self.source.latest_seen >= 0:
            self.metrics.weights_behind.set(max(0, self.source.latest_seen - self._engine.version))

    # ------------------------------------------------------------------------------ close

    def close(self) -> None:
        """Stop the watcher, then close the source, unless the watcher is still inside a poll."""
        if self.watcher is not None and not self.watcher.stop():
            # Its poll waits up to transport.timeout_s for a learner that may be gone. Closing the
            # source now would close its socket and shared memory under that thread (libzmq sockets
            # are not thread-safe; it ended close() with EBADF); the process exit releases them.
            log.warning(
                "the weight watcher is still inside a poll of the learner: leaving its weight source "
                "open (released at exit)"
            )
            return
        if self.source is not None:
            self.source.close()

"""`stream-dapo buffer`: the replay-buffer service.

It binds two ROUTER sockets and serves both from one poll loop:

    samples  tcp://{transport.host}:{transport.samples_port}   generators
        hello{generator_id, policy_version}        -> credit{granted=0, learner_version}
        credit_request{generator_id, want}         -> credit{granted, learner_version}
        groups{generator_id, groups, filtered_total, rollouts, in_flight_versions}
                                                   -> ack{accepted, duplicates, rejected}
        heartbeat{generator_id, filtered_total, rollouts, in_flight_versions}
                                                   -> lease{credits, expired, learner_version}
    batches  tcp://{transport.host}:{transport.batches_port}   the learner
        learner_hello{learner_version, committed_through}  -> empty{reason="ready"}
        batch_request{learner_version, max_groups, max_tokens}
                                                   -> batch{groups, dropped_stale, rollouts} or empty{reason}
                                                      (reason "held_for_in_flight": see buffer.in_flight_hold_s)
        commit{learner_version, group_ids}         -> empty{reason="committed"}

Every valid request gets exactly one reply, so clients can use `transport.request`. A message
that cannot be decoded is counted and answered with `error` by the endpoint; a valid message on
the wrong socket, or one the buffer cannot act on, is counted and answered with `error` here.
Nothing is acknowledged before the journal records it is fsynced (`_reply` syncs first).

SIGTERM/SIGINT drain: the loop stops, the state is compacted into a snapshot, sockets close with
linger 0, and the process exits 0.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from stream_dapo.buffer.journal import CompactionMark, Journal, JournalError
from stream_dapo.buffer.replay import AdmissionPolicy, BufferInputError, ReplayBuffer
from stream_dapo.buffer.rollout_tally import RolloutTally
from stream_dapo.config import BufferConfig, Config, MetricsConfig, TransportConfig
from stream_dapo.errors import ConfigError
from stream_dapo.learner.resume import (
    BUFFER_SETTINGS,
    FIXED_FOR_BUFFER,
    buffer_refusal,
    config_changes,
    settings_of,
    split_changes,
)
from stream_dapo.runtime.metrics import BufferMetrics, final_metrics_path, start_metrics, write_final_metrics
from stream_dapo.runtime.ports import endpoint_port, write_bound_ports, zmq_listen
from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import Message
from stream_dapo.transport.curve import RefusedConnections, curve_server, start_authenticator
from stream_dapo.transport.messages import Body, SchemaError
from stream_dapo.transport.sockets import (
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    RateLimitedWarnings,
    TransportError,
    TransportTimeout,
    open_endpoint,
)

__all__ = ["BufferService", "BufferSettings", "build_buffer", "persist_path"]

log = logging.getLogger("stream_dapo.buffer")

MAX_MESSAGES_PER_SOCKET = 64
"""Messages handled from one socket per step, so a flood on one side cannot starve the other."""
BATCH_BYTES_HEADROOM = 4096
"""Room left under transport.max_message_bytes for the batch envelope (`wire_bytes` already
over-estimates each group)."""
STATUS_EVERY_S = 60.0
STATUS_KEYS = (
    "waiting",
    "leased",
    "live_generators",
    "credits_outstanding",
    "line_capacity",
    "accepted",
    "served",
    "dropped_stale",
    "learner_version",
)

Handler = Callable[[Any, int | None], Body]
"""(body struct, request id) -> reply; the id lets a handler recognise a retried request."""


def persist_path(cfg: Config) -> Path:
    """The snapshot file; the journal sits next to it with a `.journal` suffix."""
    if cfg.buffer.persist_path:
        return Path(cfg.buffer.persist_path)
    return Path(cfg.run.out_dir) / "buffer" / "state.msgpack"


@dataclass(frozen=True)
class BufferSettings:
    """What the buffer service reads of the configuration: three of its sections whole, and the few
    values it takes from others. `from_config` builds it; tests may build one directly."""

    buffer: BufferConfig
    transport: TransportConfig
    metrics: MetricsConfig
    out_dir: str
    """run.out_dir: bound ports and final figures go under it."""
    policy: AdmissionPolicy
    """What the state machine decides with (`Config.admission_policy`)."""
    sampling: m.Sampling
    """The generators' sampling settings every peer must share (generator.*)."""
    journaled: dict[str, Any]
    """The settings stored with the state and compared at the next start (resume.BUFFER_SETTINGS)."""

    @classmethod
    def from_config(cls, cfg: Config) -> BufferSettings:
        return cls(
            buffer=cfg.buffer,
            transport=cfg.transport,
            metrics=cfg.metrics,
            out_dir=cfg.run.out_dir,
            policy=cfg.admission_policy(),
            sampling=m.Sampling.of(cfg.generator),
            journaled=settings_of(cfg.model_dump(mode="json"), BUFFER_SETTINGS),
        )


def build_buffer(cfg: Config, *, clock: Callable[[], float] = time.monotonic) -> BufferService:
    """The buffer's composition root: its settings and journal from `cfg`, then the service (which
    restores the state, binds its sockets and its metrics server)."""
    return BufferService(BufferSettings.from_config(cfg), Journal(persist_path(cfg)), clock=clock)


class BufferService:
    """The buffer's sockets, journal, metrics and poll loop around a `ReplayBuffer`.

    Construction restores the state from disk, binds both sockets and the metrics server, and
    marks the service ready; it raises ConfigError, JournalError or TransportError with the fix
    when something is missing or taken. Run it with `serve_forever(stop_event)` (in any one
    thread) or drive it with `step(timeout_ms)`; `close()` persists and releases everything.
    """

    def __init__(
        self, settings: BufferSettings, journal: Journal, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`journal`: where the state is restored from and recorded; `clock`: what times leases,
        holds and ages (monotonic; a test injects its own). `build_buffer(cfg)` makes both."""
        self.settings = settings
        policy = settings.policy
        self.journal = journal
        self._ctx: zmq.Context[Any] | None = None
        self._endpoints: list[Endpoint] = []
        self._refused: list[RefusedConnections] = []
        """Failed Curve handshakes, per socket (only with transport.curve_dir)."""
        self._auth: Any = None
        self._stop = threading.Event()
        self.metrics_server: Any = None
        self.rollouts = RolloutTally()
        self._compactor = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="compactor")
        self._compaction: tuple[futures.Future[int], CompactionMark, float] | None = None
        """The background compaction under way: its snapshot write, its mark, when it started."""
        try:
            self.buffer = self._restore(policy, clock)
            self._bind_sockets()
            self._start_metrics()
        except BaseException:
            self.close(persist=False)
            raise
        self._routes: dict[Endpoint, dict[str, Handler]] = {
            self.samples: {
                m.HELLO: self._on_hello,
                m.CREDIT_REQUEST: self._on_credit_request,
                m.GROUPS: self._on_groups,
                m.HEARTBEAT: self._on_heartbeat,
            },
            self.batches: {
                m.LEARNER_HELLO: self._on_learner_hello,
                m.BATCH_REQUEST: self._on_batch_request,
                m.COMMIT: self._on_commit,
            },
        }
        self._poller = zmq.Poller()
        for endpoint in self._endpoints:
            self._poller.register(endpoint.socket, zmq.POLLIN)
        self._endpoint_rejected: dict[tuple[int, str], int] = {}
        self._refusals = RateLimitedWarnings(log, interval_s=10.0)
        self._hellos = RateLimitedWarnings(log, interval_s=10.0, level=logging.INFO)
        """A client repeating hello (a loop, a bug) must not flood the log: one line per id per 10 s."""
        self._exported: dict[str, Any] = {}
        self._last_compaction = time.monotonic()
        self._last_status = time.monotonic()
        self._closed = False
        self.health.detail.update(
            {"samples": self.samples.address, "batches": self.batches.address, "ports": self.bound_ports}
        )
        write_bound_ports(settings.out_dir, "buffer", self.bound_ports)
        self.health.ready = True
        log.info(
            "buffer ready: generators -> %s, learner -> %s, metrics on port %d, admission capacity %d groups",
            self.samples.address,
            self.batches.address,
            self.metrics_port,
            policy.admission_capacity,
        )

    # ---------------------------------------------------------------------------------- set-up

    def _restore(self, policy: AdmissionPolicy, clock: Callable[[], float]) -> ReplayBuffer:
        records = self.journal.load()
        try:
            buffer = ReplayBuffer.restore(policy, records, self.journal, clock)
        except BufferInputError as exc:
            raise JournalError(
                f"cannot restore the buffer from {self.journal.snapshot_path} and its journal: {exc}. Move both "
                "aside to start empty (their groups are then lost)"
            ) from exc
        self._check_config(buffer)
        report = self.journal.report
        if report.snapshot_records or report.journal_records:
            s = buffer.stats()
            log.info(
                "restored from %s: %d waiting, %d leased, %d ids seen (%d snapshot + %d journal records)",
                self.journal.snapshot_path,
                s["waiting"],
                s["leased"],
                s["seen_ids"],
                report.snapshot_records,
                report.journal_records,
            )
        return buffer

    def _check_config(self, buffer: ReplayBuffer) -> None:
        """Compare the settings stored with the state (`resume.BUFFER_SETTINGS`) with this start's:
        a change of one the stored groups depend on is refused (ConfigError: exit 2, naming key, old
        and new value and the way out), any other is applied and logged; then store this start's."""
        current = self.settings.journaled
        stored = buffer.run_config
        if stored is not None:
            applied, refused = split_changes(config_changes(stored, current), FIXED_FOR_BUFFER)
            if refused:
                state = f"{self.journal.snapshot_path} (and its .journal)"
                raise ConfigError(buffer_refusal(refused, state))
            if applied:
                log.info(
                    "configuration changed since the buffer's state was written; applied: %s",
                    "; ".join(str(c) for c in applied),
                )
        elif buffer.stored:
            log.info(
                "the buffer's state files do not say what configuration they were written with; storing this one"
            )
        buffer.record_config(current)
        self.journal.sync()

    def _bind_sockets(self) -> None:
        t = self.settings.transport
        self._ctx = zmq.Context()
        curve = self._curve_keys()
        for name, port, peer in (
            ("samples", t.samples_port, "generator"),
            ("batches", t.batches_port, "learner"),
        ):
            address, fd = zmq_listen(f"transport.{name}_port", t.host, port)
            try:
                endpoint = open_endpoint(
                    self._ctx,
                    zmq.ROUTER,
                    bind=address,
                    use_fd=fd,
                    max_bytes=t.max_message_bytes,
                    peer=peer,
                    hwm=t.hwm,
                    curve=curve,
                    curve_server=curve is not None,
                    send_timeout_ms=0,  # see _reply: one peer that stops reading must not stall the rest
                )
            except TransportError as exc:
                raise TransportError(f"{exc} (the buffer's {name} socket: transport.{name}_port)") from exc
            self._endpoints.append(endpoint)
            if curve is not None:
                self._refused.append(
                    RefusedConnections(endpoint.socket, name, self._count_refused(name), log)
                )
        self.samples, self.batches = self._endpoints

    def _curve_keys(self) -> CurveKeys | None:
        """CurveZMQ: the server keys of transport.curve_dir; only clients whose public keys are in
        `curve_dir/clients/` may connect (`transport/curve.py`)."""
        server = curve_server(self.settings.transport.curve_dir)
        if server is None:
            return None
        keys, allowed = server
        assert self._ctx is not None
        self._auth = start_authenticator(self._ctx, allowed)
        return keys

    def _start_metrics(self) -> None:
        mc = self.settings.metrics
        self.registry, self.health, self.metrics_server = start_metrics(
            mc.host, mc.buffer_port, setting="metrics.buffer_port"
        )
        self.metrics = BufferMetrics(self.registry)
        self.metrics.max_staleness.set(self.settings.policy.max_staleness)

    @property
    def metrics_port(self) -> int:
        return int(self.metrics_server.port)

    @property
    def bound_ports(self) -> dict[str, int]:
        """What this buffer bound, by the setting that chose it (0 in the config: a free port)."""
        return {
            "transport.samples_port": endpoint_port(self.samples.address),
            "transport.batches_port": endpoint_port(self.batches.address),
            "metrics.buffer_port": self.metrics_port,
        }

    # ---------------------------------------------------------------------------------- loop

    def request_stop(self) -> None:
        """Make `serve_forever` return after the current step (a signal handler calls it)."""
        self._stop.set()

    def serve_forever(self, stop_event: threading.Event | None = None, poll_ms: int = 100) -> None:
        """Serve until `stop_event` (default: `request_stop()`) is set, then drain: snapshot, close
        sockets, stop metrics."""
        stop = self._stop if stop_event is None else stop_event
        persist = True
        try:
            while not stop.is_set():
                self.step(poll_ms)
        except JournalError:
            persist = False  # the disk refused a write: a snapshot would fail the same way
            raise
        finally:
            self.close(persist=persist)

    def step(self, timeout_ms: int = 100) -> int:
        """Wait up to `timeout_ms` for messages on either socket, handle them, and do the
        periodic chores. Returns the number of messages handled."""
        ready = dict(self._poller.poll(timeout_ms))
        handled = 0
        for endpoint in self._endpoints:
            if ready.get(endpoint.socket):
                handled += self._drain(endpoint)
        self._count_endpoint_rejections()
        for refused in self._refused:
            refused.poll()
        self._expire_generators()
        self._maybe_compact()
        self._export_metrics()
        self._maybe_log_status()
        self.health.beat()
        return handled

    def _drain(self, endpoint: Endpoint) -> int:
        handled = 0
        while handled < MAX_MESSAGES_PER_SOCKET:
            got = endpoint.recv(0)
            if got is None:
                break
            peer, msg = got
            self._dispatch(endpoint, peer, msg)
            handled += 1
        return handled

    def _dispatch(self, endpoint: Endpoint, peer: bytes | None, msg: Message) -> None:
        """Handle one request and answer it, naming its request id in the reply."""
        assert peer is not None  # ROUTER endpoints always name the peer
        rid = msg.request_id
        handler = self._routes[endpoint].get(msg.type)
        if handler is None:
            expected = sorted(self._routes[endpoint])
            self._refuse(
                endpoint,
                peer,
                "unexpected_type",
                f"{msg.type!r} is not served on {endpoint.address}; it takes {expected}",
                rid,
            )
            return
        try:
            reply = handler(msg.body, rid)
        except BufferInputError as exc:
            self._refuse(endpoint, peer, exc.reason, f"{msg.type}: {exc}", rid)
            return
        except SchemaError as exc:
            self._refuse(endpoint, peer, "bad_request", f"{msg.type}: {exc}", rid)
            return
        self._reply(endpoint, peer, reply, rid)

    def _reply(self, endpoint: Endpoint, peer: bytes, reply: Body, request_id: int | None) -> None:
        # Write-ahead: whatever this reply acknowledges is on disk before the peer can know it,
        # and in /metrics too, so what a peer saw acknowledged is never missing from a scrape.
        self._count_endpoint_rejections()
        self.journal.sync()
        self._export_metrics()
        try:
            endpoint.send(reply, to=peer, request_id=request_id)
        except PeerUnreachable:
            # Gone since it asked. A generator resends unacknowledged groups (they become
            # duplicates); a learner's lost batch returns to the queue on its next learner_hello.
            self._refusals.warn(
                "peer_gone", "%s: peer %r left before its %s reply", endpoint.address, peer, reply.TYPE
            )
        except TransportTimeout as exc:
            # Its queue is full: it is not reading. Waiting would stall every other peer behind it, so
            # the reply is dropped, as on a lost connection (a generator resends, a learner asks again).
            self._refusals.warn("queue_full", "%s", exc)

    def _refuse(
        self, endpoint: Endpoint, peer: bytes, reason: str, detail: str, request_id: int | None
    ) -> None:
        self._refusals.warn(
            reason, "%s: refused a message from %r (%s): %s", endpoint.address, peer, reason, detail
        )
        self.buffer.count_rejected_message(reason)
        self._reply(endpoint, peer, m.Error(reason, detail[:4096]), request_id)

    # ---------------------------------------------------------------------------------- handlers

    def _on_hello(self, body: m.Hello, rid: int | None) -> m.Credit:
        self._check_sampling(
            f"generator {body.generator_id} ({body.holder or 'no holder named'})", body.sampling
        )
        version = self.buffer.generator_hello(body.generator_id, body.holder)
        self.rollouts.restart(body.generator_id)
        self._hellos.warn(
            body.generator_id,
            "generator %s connected (%s, policy version %d)",
            body.generator_id,
            body.holder or "no holder named",
            body.policy_version,
        )
        return m.Credit(0, version)

    def _on_credit_request(self, body: m.CreditRequest, rid: int | None) -> m.Credit:
        granted = self.buffer.grant_credits(body.generator_id, body.want, request_id=rid)
        return m.Credit(granted, self.buffer.learner_version)

    def _on_groups(self, body: m.Groups, rid: int | None) -> m.Ack:
        result = self.buffer.add_groups(
            body.generator_id, body.groups, body.filtered_total, body.holder, body.acked_below
        )
        self.buffer.report_in_flight(body.generator_id, body.in_flight_versions)
        if body.rollouts is not None:
            self.rollouts.observe(body.generator_id, body.rollouts)
        rejected = [m.Rejection(gid, reason) for gid, reason in result.rejected]
        return m.Ack(result.accepted, result.duplicates, rejected)

    def _on_heartbeat(self, body: m.Heartbeat, rid: int | None) -> m.Lease:
        credits, expired = self.buffer.heartbeat(body.generator_id, body.filtered_total)
        self.buffer.report_in_flight(body.generator_id, body.in_flight_versions)
        if body.rollouts is not None:
            self.rollouts.observe(body.generator_id, body.rollouts)
        if expired:
            log.warning(
                "generator %s is back after its lease expired: it drops the credits it held",
                body.generator_id,
            )
        return m.Lease(credits, expired, self.buffer.learner_version)

    def _check_sampling(self, who: str, theirs: m.Sampling | None) -> None:
        """Refuse a peer that samples (or computes log-probs) with other settings than this buffer's
        config, and so than the learner's, which passed the same check: its groups' behaviour
        log-probs would describe another distribution than the one the learner trains, and nothing
        but a drifting gauge would show it. An older peer that does not say (None) is let in."""
        if theirs is None:
            return
        ours = self.settings.sampling
        differ = [
            f"generator.{name} = {getattr(theirs, name)!r} there, {getattr(ours, name)!r} here"
            for name in m.Sampling.KEYS
            if getattr(theirs, name) != getattr(ours, name)
        ]
        if differ:
            raise SamplingMismatch(
                f"{who} samples with other settings than the buffer and the learner: {'; '.join(differ)}. "
                "Behaviour log-probs must describe the distribution the learner trains: give every service "
                "the same generator.temperature, top_p, top_k and min_p (one config file, or the same --set), "
                "then restart it"
            )

    def _on_learner_hello(self, body: m.LearnerHello, rid: int | None) -> m.Empty:
        self._check_sampling("the learner", body.sampling)
        n = self.buffer.learner_hello(body.learner_version, body.committed_through)
        log.info(
            "learner connected at version %d (committed through %d): %d leased groups back to the front",
            body.learner_version,
            body.committed_through,
            n,
        )
        return m.Empty("ready")

    def _on_batch_request(self, body: m.BatchRequest, rid: int | None) -> m.Batch | m.Empty:
        result = self.buffer.serve(
            body.learner_version,
            body.max_groups,
            body.max_tokens,
            max_bytes=max(1, self.settings.transport.max_message_bytes - BATCH_BYTES_HEADROOM),
            request_id=rid,
        )
        if result.retried:
            log.info(
                "batch_request %s retried: answering with the same lease (%d groups)", rid, len(result.groups)
            )
        for stale in result.staleness:
            self.metrics.staleness.observe(stale)
        if result.groups:
            return m.Batch(result.groups, len(result.dropped_stale), m.Rollouts(**self.rollouts.totals))
        if result.held:
            return m.Empty("held_for_in_flight")
        return m.Empty("all_stale" if result.dropped_stale else "no_waiting_groups")

    def _on_commit(self, body: m.Commit, rid: int | None) -> m.Empty:
        result = self.buffer.commit(body.learner_version, body.group_ids, request_id=rid)
        if result.retried:
            log.info("commit %s retried: already applied", rid)
        elif result.unknown:
            log.info(
                "commit at version %d named %d groups not held (already committed)",
                body.learner_version,
                len(result.unknown),
            )
        return m.Empty("committed")

    # ---------------------------------------------------------------------------------- chores

    def _count_refused(self, socket_name: str) -> Callable[[str], None]:
        return lambda reason: self.metrics.connections_refused.labels(socket=socket_name, reason=reason).inc()

    def _count_endpoint_rejections(self) -> None:
        """Forward the endpoints' decode failures into the buffer's persisted counters."""
        for i, endpoint in enumerate(self._endpoints):
            for reason, total in endpoint.rejected.items():
                new = total - self._endpoint_rejected.get((i, reason), 0)
                if new:
                    self._endpoint_rejected[(i, reason)] = total
                    self.buffer.count_rejected_message(reason, new)

    def _expire_generators(self) -> None:
        for gen, n in self.buffer.expire_generators():
            log.warning(
                "generator %s not heard from for %.0f s (buffer.generator_lease_s): its %d credits return to the "
                "admission line",
                gen,
                self.settings.buffer.generator_lease_s,
                n,
            )

    def _maybe_compact(self) -> None:
        """Every buffer.persist_every_s, compact without stalling the loop: the state's records are
        taken here (a shallow copy: the groups are immutable), the snapshot is encoded, written and
        fsynced on the compactor thread while this loop goes on journaling, and the journal frames
        it covers are dropped here once it is in place (`Journal.begin_compaction`). A failed
        write raises here, at the next step, as a synchronous one would have."""
        if self._compaction is not None:
            future, mark, t0 = self._compaction
            if not future.done():
                return
            self._compaction = None
            size = future.result()
            old = self.journal.finish_compaction(mark, rotate=True)
            if old is not None:  # closing it frees the old journal's blocks: not on this loop
                self._compactor.submit(old.close)
            elapsed = time.perf_counter() - t0
            self.metrics.persist_seconds.observe(elapsed)
            log.debug(
                "snapshot %s: %d bytes in %.3f s (in the background)",
                self.journal.snapshot_path,
                size,
                elapsed,
            )
            return
        due = time.monotonic() - self._last_compaction >= self.settings.buffer.persist_every_s
        if due and self.journal.records_since_compaction:
            self._last_compaction = time.monotonic()
            t0 = time.perf_counter()
            mark = self.journal.begin_compaction()
            records = list(self.buffer.snapshot_records())
            self._compaction = (self._compactor.submit(self.journal.write_snapshot, records, mark), mark, t0)

    def _wait_for_compaction(self) -> None:
        """Let a background compaction finish (or fail) before the next one or before closing."""
        if self._compaction is not None:
            futures.wait([self._compaction[0]])
            self._maybe_compact()

    def persist(self) -> None:
        """Compact the journal into a fresh snapshot now (after any background one)."""
        self._wait_for_compaction()
        t0 = time.perf_counter()
        size = self.journal.compact(self.buffer.snapshot_records())
        elapsed = time.perf_counter() - t0
        self.metrics.persist_seconds.observe(elapsed)
        self._last_compaction = time.monotonic()
        log.debug("snapshot %s: %d bytes in %.3f s", self.journal.snapshot_path, size, elapsed)

    def _maybe_log_status(self) -> None:
        if time.monotonic() - self._last_status >= STATUS_EVERY_S:
            self._last_status = time.monotonic()
            s = self.stats()
            log.info("status: %s", ", ".join(f"{key} {s[key]}" for key in STATUS_KEYS))

    def _export_metrics(self) -> None:
        """Gauges from the current state; counters by their increase since the last export (the
        first export carries the restored totals, so counters continue across restarts)."""
        s = self.stats()
        mt = self.metrics
        mt.depth.labels(state="waiting").set(s["waiting"])
        mt.depth.labels(state="leased").set(s["leased"])
        mt.credits_outstanding.set(s["credits_outstanding"])
        mt.live_generators.set(s["live_generators"])
        self.health.detail["generators"] = self.buffer.generator_leases()
        mt.credit_capacity.set(s["line_capacity"])
        mt.learner_version.set(s["learner_version"])
        mt.oldest_waiting.set(s["oldest_waiting_age_s"])
        mt.journal_bytes.set(s["journal_bytes"])
        mt.seen_ids.set(s["seen_ids"])
        mt.in_flight_reported.set(s["in_flight_reported"])
        for key, counter in (
            ("accepted", mt.groups_accepted),
            ("duplicates", mt.groups_duplicate),
            ("served", mt.groups_served),
            ("committed", mt.groups_committed),
            ("requeued", mt.groups_requeued),
            ("dropped_stale", mt.dropped_stale),
            ("credits_granted", mt.credits_granted),
            ("retried_requests", mt.retried_requests),
            ("generators_expired", mt.generators_expired),
            ("holds", mt.learner_holds),
            ("holds_expired", mt.learner_holds_expired),
        ):
            if s[key] > self._exported.get(key, 0):
                counter.inc(s[key] - self._exported.get(key, 0))
                self._exported[key] = s[key]
        for key, counter in (
            ("rejected_messages", mt.messages_rejected),
            ("rejected_groups", mt.groups_rejected),
        ):
            done = self._exported.setdefault(key, {})
            for reason, total in s[key].items():
                if total > done.get(reason, 0):
                    counter.labels(reason=reason).inc(total - done.get(reason, 0))
                    done[reason] = total

    def stats(self) -> dict[str, Any]:
        """The buffer's counters and depths plus persistence figures (for the run summary)."""
        return {
            **self.buffer.stats(),
            **self.buffer.hold_stats(),
            "oldest_waiting_age_s": round(self.buffer.oldest_waiting_age_s(), 3),
            "live_generators": self.buffer.live_generators,
            "journal_bytes": self.journal.journal_bytes,
        }

    # ---------------------------------------------------------------------------------- shutdown

    def close(self, persist: bool = True) -> None:
        """Snapshot the state (unless `persist` is False), write stats.json, close the sockets
        with linger 0 and stop the metrics server. Safe to call twice."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        persisted = False
        try:
            if persist and hasattr(self, "buffer"):
                self.persist()
                persisted = True
                self._write_stats()
                self._write_final_metrics()
        finally:
            release(
                *(refused.close for refused in self._refused),
                *(endpoint.close for endpoint in self._endpoints),
                self._auth and self._auth.stop,
                self._ctx and self._ctx.term,
                self.metrics_server
                and (lambda: self.metrics_server.stop(self.settings.metrics.final_scrape_wait_s)),
                lambda: self._compactor.shutdown(wait=True),  # a snapshot still being written
                self.journal.close,
            )
            log.info("buffer closed%s", " (state persisted)" if persisted else "")

    def _write_final_metrics(self) -> None:
        """The last /metrics values, for the run summary (a scrape can miss the last changes)."""
        if self.metrics_server is None:
            return
        self._export_metrics()
        path = final_metrics_path(self.settings.out_dir, "buffer")
        try:
            write_final_metrics(self.registry, path)
        except OSError as exc:
            log.warning("cannot write %s: %s (the run summary falls back to the last scrape)", path, exc)

    def _write_stats(self) -> None:
        """stats.json next to the state, for the run summary; best effort (the state is safe)."""
        path = self.journal.snapshot_path.with_name("stats.json")
        try:
            path.write_text(json.dumps(self.stats(), indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc.strerror)


class SamplingMismatch(BufferInputError):
    """A generator or learner whose sampling settings differ from the buffer's (`_check_sampling`)."""

    reason = "sampling_mismatch"


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

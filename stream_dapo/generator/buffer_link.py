"""A generator's link to the buffer: the hello, credits, the lease, sending groups, acks and resends.

`BufferLink` owns the DEALER to the buffer (and the heartbeat's own), the `CreditLedger` and the
`UnackedGroups` (``credits.py``); the service calls its public methods from its loop and tests call
the same ones.

- ``connect()``: say hello. While another live process holds this generator id, the buffer refuses:
  wait for its lease to run out (a restart after a crash), or exit 2 naming both once the holder has
  outlived a lease (two generators with one --index).
- Credits: a group starts only with a credit (``credit_request{want}``, `ask_for_credits`). A credit
  is redeemed at the buffer by the group it started (`send_group`), or, for a group dynamic sampling
  dropped, by the increase of ``filtered_total`` (a running total in every ``groups`` message and
  heartbeat, `report_filtered`).
- Lease: a heartbeat thread (`start_heartbeat`) every ``generator.heartbeat_s`` keeps the credits; a
  generator the buffer has not heard from for ``buffer.generator_lease_s`` loses them (`check_lease`
  drops what it held). A buffer that stops answering heartbeats makes ``/readyz`` fail.
- Acks and resends: sent groups stay in `unacked` until the buffer acknowledges them (`read`), and are
  resent after ``transport.timeout_s`` (`resend_unacked`) or as soon as the connection to the buffer
  is re-established (the buffer drops duplicates by id, so a resend is harmless).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import zmq

from stream_dapo.generator.credits import CreditLedger, Heartbeat, UnackedGroups
from stream_dapo.generator.errors import StartupError, StoppedBeforeStart
from stream_dapo.runtime.metrics import GeneratorMetrics, Health
from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import Message
from stream_dapo.transport.curve import curve_client
from stream_dapo.transport.messages import Group
from stream_dapo.transport.sockets import (
    CurveKeys,
    Endpoint,
    PeerUnavailable,
    RateLimitedWarnings,
    RemoteError,
    TransportTimeout,
    open_endpoint,
    request,
)

if TYPE_CHECKING:
    from stream_dapo.config import GeneratorConfig, TransportConfig

__all__ = ["IDLE_POLL_MS", "MAX_MESSAGES_PER_TURN", "UNACKED_FACTOR", "BufferLink"]

log = logging.getLogger("stream_dapo.generator")

IDLE_POLL_MS = 50
"""Socket wait per turn when the engine has nothing to do (no busy spinning)."""
MAX_MESSAGES_PER_TURN = 64
UNACKED_FACTOR = 4
"""Stop asking for credits while more than this many times max_groups_in_flight groups wait for an
acknowledgement: the buffer is down or far behind, and new groups would only pile up here."""


class BufferLink:
    """The buffer, as one generator sees it.

    `rollouts` and `in_flight_versions` are the service's: the running rollout tally and the start
    versions of its unsent groups, which every ``groups`` message and heartbeat carries. The link
    sets ``health.ready`` (and ``health.detail``) as the connection and the heartbeat replies go.
    Nothing is contacted before `connect()`.
    """

    def __init__(
        self,
        generator_id: str,
        holder: str,
        *,
        transport: TransportConfig,
        generator: GeneratorConfig,
        lease_s: float,
        metrics: GeneratorMetrics,
        health: Health,
        stop: threading.Event,
        rollouts: Callable[[], Mapping[str, int]],
        in_flight_versions: Callable[[], list[int]],
    ) -> None:
        self.generator_id = generator_id
        self.holder = holder
        """Who this process is, in its hello: a generator id belongs to one live process."""
        self.transport = transport
        self.generator = generator
        self.lease_s = lease_s
        """buffer.generator_lease_s: how long a restart waits for the previous holder's lease."""
        self.metrics = metrics
        self.health = health
        self._stop = stop
        self._rollouts = rollouts
        self._in_flight_versions = in_flight_versions
        self.address = transport.buffer_address("samples")
        self.credits = CreditLedger(generator.max_groups_in_flight, timeout_s=transport.timeout_s)
        self.unacked = UnackedGroups(resend_after_s=transport.timeout_s)
        self.credit_version = 0
        """The learner version of the newest grant: a credited group starts only when the admission
        rule's lag gate allows it (`AdmissionRule.may_start`)."""
        self.endpoint: Endpoint | None = None
        self.heartbeat: Heartbeat | None = None
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._monitor: zmq.Socket[Any] | None = None
        self._disconnected = False
        self._in_flight_report: tuple[int, ...] = ()
        """`in_flight_versions()` as of the main loop's last refresh, for the heartbeat thread."""
        self._filtered_sent = 0
        self._rejected_seen: Counter[str] = Counter()
        self._warnings = RateLimitedWarnings(log)

    # ------------------------------------------------------------------------------ start-up

    def connect(self) -> None:
        """Open the endpoint and say hello (see the module docstring for a refusal)."""
        self.endpoint = self._open(self._curve())
        patience_s = self.lease_s + 2 * self.generator.heartbeat_s
        refused_since: float | None = None
        while True:
            try:
                reply = self._hello()
                break
            except RemoteError as exc:
                if exc.reason == "sampling_mismatch":
                    raise StartupError(f"the buffer refused this generator: {exc.detail}") from None
                if exc.reason != "generator_id_taken":
                    raise
                now = time.monotonic()
                if refused_since is None:
                    refused_since = now
                    log.warning("%s; waiting up to %.0f s for that lease to run out", exc.detail, patience_s)
                if now - refused_since > patience_s:
                    raise StartupError(f"the buffer refused this generator: {exc.detail}") from None
                if self._stop.wait(self.generator.heartbeat_s):
                    raise StoppedBeforeStart(
                        f"stopped while waiting for {self.generator_id} to be free"
                    ) from None
        log.info("buffer at %s answered (learner version %d)", self.address, reply.body.learner_version)
        self._monitor = self.endpoint.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)

    def start_heartbeat(self) -> None:
        """Keep the credit lease on a thread of its own (`Heartbeat`), on its own connection."""
        curve = self._curve()
        health = self.health
        self.heartbeat = Heartbeat(
            lambda: self._open(curve, send_timeout_ms=0),
            self.generator_id,
            self.generator.heartbeat_s,
            filtered_total=lambda: self.credits.filtered_total,
            progressing=lambda: time.monotonic() - health.last_progress < health.stall_after_s,
            rollouts=lambda: dict(self._rollouts()),
            in_flight=lambda: list(self._in_flight_report),
        ).start()

    def _curve(self) -> CurveKeys | None:
        return curve_client(self.transport.curve_dir)

    def _open(self, curve: CurveKeys | None, send_timeout_ms: int = 5000) -> Endpoint:
        t = self.transport
        return open_endpoint(
            self._ctx,
            zmq.DEALER,
            connect=self.address,
            max_bytes=t.max_message_bytes,
            peer="buffer",
            hwm=t.hwm,
            curve=curve,
            send_timeout_ms=send_timeout_ms,
        )

    def _hello(self) -> Message:
        t = self.transport
        assert self.endpoint is not None
        try:
            return request(
                self.endpoint,
                m.Hello(self.generator_id, 0, self.holder, m.Sampling.of(self.generator)),
                timeout_ms=int(t.timeout_s * 1000),
                retries=0,
                accept=lambda msg: msg.type == m.CREDIT,
            )
        except TransportTimeout:
            raise PeerUnavailable(
                f"the buffer did not answer at {self.address} within {t.timeout_s:.0f} s: start "
                "`stream-dapo buffer` first (or fix transport.buffer_host / transport.samples_port"
                + (" / the Curve keys in transport.curve_dir" if t.curve_dir else "")
                + ")"
            ) from None

    # ------------------------------------------------------------------------------ what the buffer says

    def read(self, timeout_ms: int) -> None:
        """Take what the buffer sent (up to `MAX_MESSAGES_PER_TURN` messages, waiting up to
        `timeout_ms` for the first), after noticing a reconnect."""
        assert self.endpoint is not None, "connect() first"
        self._watch_connection()
        for i in range(MAX_MESSAGES_PER_TURN):
            got = self.endpoint.recv(timeout_ms if i == 0 else 0)
            if got is None:
                return
            self.on_message(got[1])

    def _watch_connection(self) -> None:
        """After a reconnect (the buffer restarted, or the link dropped), resend unacknowledged groups
        and ask for credits again at once instead of waiting out transport.timeout_s."""
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
                self.health.ready = False  # /readyz fails, /livez still passes: no restart needed
                self.health.detail["buffer_connected"] = False
                log.warning("lost the connection to the buffer at %s; ZeroMQ reconnects", self.address)
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected = False
                self.health.ready = True
                self.health.detail["buffer_connected"] = True
                log.info("reconnected to the buffer: resending %d unacknowledged groups", len(self.unacked))
                self.unacked.expire()
                self.credits.forget_request()

    def on_message(self, msg: Message) -> None:
        """One message from the buffer: a credit grant, an ack, an error (logged); anything else is
        counted as rejected."""
        body = msg.body
        if isinstance(body, m.Credit):
            if not self.credits.granted(body.granted, time.monotonic(), msg.request_id):
                self.metrics.stale_credit_replies.inc()
            elif body.granted:
                self.credit_version = max(self.credit_version, body.learner_version)
        elif isinstance(body, m.Ack):
            self._on_ack(body)
        elif isinstance(body, m.Error):
            log.warning("the buffer answered error %s: %s", body.reason, body.detail)
        else:
            self.metrics.messages_rejected.labels(reason="unexpected_type").inc()
            self._warnings.warn("unexpected_type", "unexpected %r message from the buffer; ignored", msg.type)

    def _on_ack(self, body: m.Ack) -> None:
        result = self.unacked.ack(body.accepted, body.duplicates, body.rejected)
        self.metrics.groups_acked.inc(result.acked)
        for gid, reason in result.rejected:
            log.warning("the buffer rejected group %s: %s", gid, reason)
            self.metrics.groups_rejected.labels(reason=reason).inc()

    def check_lease(self) -> None:
        """Drop held credits when the buffer took them back, and be unready while the buffer leaves
        heartbeats unanswered (it hangs or is gone; ZeroMQ reconnects by itself)."""
        beat = self.heartbeat
        if beat is None:
            return
        if beat.expired.is_set():
            beat.expired.clear()
            dropped = self.credits.lease_expired()
            log.warning(
                "the buffer had not heard from %s for buffer.generator_lease_s and took its credits back: "
                "dropping the %d held (groups in flight still go out)",
                self.generator_id,
                dropped,
            )
        silent_s = time.monotonic() - beat.last_answer
        responding = silent_s <= max(self.transport.timeout_s, 3 * self.generator.heartbeat_s)
        if responding != self.health.detail.get("buffer_responding", True):
            if responding:
                log.info("the buffer answers heartbeats again")
            else:
                log.warning(
                    "the buffer has not answered a heartbeat for %.0f s; not ready until it does", silent_s
                )
            self.health.detail["buffer_responding"] = responding
        self.health.ready = responding and not self._disconnected

    # ------------------------------------------------------------------------------ what the link sends

    def ask_for_credits(self, in_flight: int) -> None:
        """Ask for the free slots (`in_flight` groups are in the engine), unless a request is in
        flight or too many groups wait for an acknowledgement."""
        if len(self.unacked) > UNACKED_FACTOR * self.generator.max_groups_in_flight:
            return
        req = self.credits.request(in_flight, time.monotonic())
        if req is not None:
            self.send(m.CreditRequest(self.generator_id, req.want), request_id=req.request_id)

    def send_group(self, group: Group) -> None:
        """Send a new group (numbered, then kept until acknowledged)."""
        group = self.unacked.number(group)
        self.unacked.sent(group, time.monotonic())
        self._send_groups([group])
        self.metrics.groups_sent.inc()

    def report_filtered(self) -> None:
        """Tell the buffer about credits redeemed without a group, if any since the last message."""
        if self.credits.filtered_total != self._filtered_sent:
            self._send_groups([])

    def resend_unacked(self) -> None:
        for group in self.unacked.due(time.monotonic()):
            log.info("resending unacknowledged group %s", group.group_id)
            self._send_groups([group])
            self.metrics.groups_sent.inc()

    def _send_groups(self, groups: list[Group]) -> None:
        self.send(
            m.Groups(
                self.generator_id,
                groups,
                filtered_total=self.credits.filtered_total,
                rollouts=m.Rollouts(**self._rollouts()),
                in_flight_versions=list(self.refresh_in_flight()),
                holder=self.holder,
                acked_below=self.unacked.acked_below,
            )
        )
        self._filtered_sent = self.credits.filtered_total

    def send(self, body: m.Body, request_id: int | None = None) -> None:
        """Send one message; a full queue to the buffer is logged (unacked groups are resent later)."""
        assert self.endpoint is not None, "connect() first"
        try:
            self.endpoint.send(body, request_id=request_id)
        except TransportTimeout as exc:
            log.warning("%s", exc)

    def refresh_in_flight(self) -> tuple[int, ...]:
        """Refresh the report the heartbeat thread sends (a tuple: swapped whole, never mutated)."""
        self._in_flight_report = tuple(self._in_flight_versions())
        return self._in_flight_report

    def update_gauges(self) -> None:
        """The in-flight report, credits held, groups unacknowledged, messages the endpoint rejected."""
        mx = self.metrics
        self.refresh_in_flight()
        mx.credits_available.set(self.credits.held)
        mx.unacked_groups.set(len(self.unacked))
        assert self.endpoint is not None, "connect() first"
        for reason, n in (self.endpoint.rejected - self._rejected_seen).items():
            mx.messages_rejected.labels(reason=reason).inc(n)
        self._rejected_seen = Counter(self.endpoint.rejected)

    # ------------------------------------------------------------------------------ drain / close

    def return_credits(self, aborted: int) -> None:
        """At the drain: `aborted` groups will never be sent, and the credits held will not be used."""
        self.credits.redeem_without_group(aborted + self.credits.held)
        self.credits.held = 0

    def await_acks(self, budget_s: float) -> int:
        """Read acks and resend for up to `budget_s` until nothing is unacknowledged; returns how
        many groups still are."""
        deadline = time.monotonic() + budget_s
        while len(self.unacked) and time.monotonic() < deadline:
            self.read(timeout_ms=IDLE_POLL_MS)
            self.resend_unacked()
        return len(self.unacked)

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def close(self) -> None:
        """Close the connection monitor, the endpoint and the context, each even when the one before
        failed (stop the heartbeat first: its socket is of this context)."""
        try:
            self._close_monitor()
        finally:
            try:
                if self.endpoint is not None:
                    self.endpoint.close()
            finally:
                self._ctx.destroy(linger=0)

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            assert self.endpoint is not None
            self.endpoint.socket.disable_monitor()
            self._monitor.close(linger=0)

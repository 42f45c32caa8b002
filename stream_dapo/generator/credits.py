"""A generator's side of admission: the credits it holds and asks for (`CreditLedger`), the groups
it sent and the buffer has not acknowledged (`UnackedGroups`), and the heartbeat that keeps its
credit lease (`Heartbeat`). The ledger and the unacknowledged set are pure and unit-tested; the
buffer link (``buffer_link.py``) feeds them the buffer's replies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from stream_dapo.generator.threads import BackgroundThread
from stream_dapo.transport import messages as m
from stream_dapo.transport.messages import Group
from stream_dapo.transport.sockets import Endpoint, TransportTimeout, new_request_id

__all__ = ["CREDIT_RETRY_S", "AckOutcome", "CreditLedger", "CreditRequest", "Heartbeat", "UnackedGroups"]

CREDIT_RETRY_S = 0.25
"""Wait after the buffer granted no credit before asking again (its line is full)."""


@dataclass(frozen=True)
class CreditRequest:
    """One ``credit_request``: its request id is the same on every attempt, so the buffer answers a
    repeat (the reply was lost) with the grant it already made instead of granting again."""

    request_id: int
    want: int


@dataclass
class CreditLedger:
    """Credits held, the credit request in flight, and redemptions the buffer has not heard of.

    Example: with ``max_in_flight=4``, 1 group in flight and nothing held, ``request(1, now)`` asks
    for 3; a ``credit{granted=2}`` reply to that request makes ``held == 2``; two ``take()`` calls
    start two groups. At most one request is in flight. One unanswered for ``timeout_s``, or when
    the link to the buffer was re-established, is sent again with the same request id and want;
    only the first reply naming the request in flight counts (a second reply to a repeat carries
    the same grant and is ignored).
    """

    max_in_flight: int
    timeout_s: float
    retry_s: float = CREDIT_RETRY_S
    new_id: Callable[[], int] = new_request_id
    held: int = 0
    filtered_total: int = 0
    """Credits spent since the hello on groups the buffer will never receive (dropped by dynamic
    sampling, aborted, or unused at shutdown): a running total, sent with every ``groups`` message
    and heartbeat, so a lost or repeated report costs nothing (the buffer redeems the increase)."""
    pending: CreditRequest | None = None
    requested_at: float | None = None
    next_request_at: float = 0.0

    def want(self, in_flight: int) -> int:
        return max(0, self.max_in_flight - in_flight - self.held)

    def request(self, in_flight: int, now: float) -> CreditRequest | None:
        """The credit request to send now (a new one, or the one in flight again), or None."""
        if self.pending is not None:
            if self.requested_at is not None and now - self.requested_at < self.timeout_s:
                return None
            self.requested_at = now
            return self.pending
        if now < self.next_request_at:
            return None
        want = self.want(in_flight)
        if not want:
            return None
        self.pending, self.requested_at = CreditRequest(self.new_id(), want), now
        return self.pending

    def granted(self, n: int, now: float, request_id: int | None) -> bool:
        """Apply a ``credit`` reply. False (and nothing changes) unless it answers the request in
        flight: a late second reply to a repeated request, or a reply to a hello."""
        if n < 0:
            raise ValueError(f"granted must be >= 0, got {n}")
        if self.pending is None or request_id != self.pending.request_id:
            return False
        self.held += n
        self.pending, self.requested_at = None, None
        if n == 0:
            self.next_request_at = now + self.retry_s
        return True

    def forget_request(self) -> None:
        """The link to the buffer was re-established (its reply may be lost): send the request in
        flight again at once, or a new one if there is none."""
        self.requested_at = None
        self.next_request_at = 0.0

    def take(self) -> bool:
        """Use one credit to start a group."""
        if self.held <= 0:
            return False
        self.held -= 1
        return True

    def redeem_without_group(self, n: int = 1) -> None:
        """``n`` credits were spent (or will not be used) without a group reaching the buffer."""
        self.filtered_total += n

    def lease_expired(self) -> int:
        """The buffer took back our credits (it had not heard from us for its lease time): drop the
        ones held and ask again. Returns how many were dropped."""
        dropped, self.held = self.held, 0
        self.forget_request()
        return dropped


@dataclass
class _Pending:
    group: Group
    sent_at: float
    attempts: int = 1


@dataclass
class AckOutcome:
    """What one `ack` from the buffer settled among the groups awaiting acknowledgement."""

    acked: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    unknown: int = 0


class UnackedGroups:
    """Groups sent to the buffer and not yet acknowledged, resent after ``resend_after_s``.

    `number` gives each new group this process sends the next ``seq`` (0, 1, 2, ...), and
    `acked_below` is the lowest number still awaiting acknowledgement (the next number when none
    is): every group numbered below it was acknowledged and is never sent again. Every ``groups``
    message carries it, so the buffer forgets the ids this process can no longer resend (its memory
    stays bounded by what is unacknowledged, and its dedup stays exact)."""

    def __init__(self, resend_after_s: float) -> None:
        self.resend_after_s = resend_after_s
        self._pending: dict[str, _Pending] = {}
        self._next_seq = 0
        self.resent = 0

    def number(self, group: Group) -> Group:
        """`group` with this process's next ``seq`` (a new group, about to be sent for the first time)."""
        numbered = msgspec.structs.replace(group, seq=self._next_seq)
        self._next_seq += 1
        return numbered

    @property
    def acked_below(self) -> int:
        """Every group numbered below this was acknowledged (see the class docstring)."""
        seqs = [p.group.seq for p in self._pending.values() if p.group.seq is not None]
        return min(seqs, default=self._next_seq)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._pending

    def sent(self, group: Group, now: float) -> None:
        self._pending.setdefault(group.group_id, _Pending(group, now))

    def due(self, now: float) -> list[Group]:
        """Groups to resend now (oldest first); they count as sent again at ``now``."""
        out = []
        for p in self._pending.values():
            if now - p.sent_at >= self.resend_after_s:
                p.sent_at, p.attempts = now, p.attempts + 1
                out.append(p.group)
        self.resent += len(out)
        return out

    def expire(self) -> None:
        """Make every pending group due now (the connection to the buffer was re-established)."""
        for p in self._pending.values():
            p.sent_at = float("-inf")

    def ack(
        self, accepted: Iterable[str], duplicates: Iterable[str], rejected: Iterable[m.Rejection]
    ) -> AckOutcome:
        """Apply an ``ack``: accepted and duplicate ids are done, rejected ones are dropped (the buffer
        will never take them; resending would not help)."""
        result = AckOutcome()
        for gid in [*accepted, *duplicates]:
            if self._pending.pop(gid, None) is None:
                result.unknown += 1
            else:
                result.acked += 1
        for item in rejected:
            if self._pending.pop(item.group_id, None) is None:
                result.unknown += 1
            else:
                result.rejected.append((item.group_id, item.reason))
        return result


class Heartbeat(BackgroundThread):
    """Keeps the generator's credit lease on a thread of its own, so that a main loop that is busy
    (a long weight load, a slow engine step) does not lose its credits.

    Every ``every_s`` it sends ``heartbeat{generator_id, filtered_total, rollouts,
    in_flight_versions}`` (``rollouts``: the generator's rollout tally, for tracking;
    ``in_flight_versions``: the start versions of its unsent groups) on its own connection to the buffer and reads the
    ``lease`` replies: ``expired`` is set when one says the buffer had taken
    the credits back, and ``last_answer`` is when the buffer last replied (readiness). It stops
    renewing while ``progressing()`` is false (the main loop made no progress for its liveness
    bound), so a hung generator loses its credits like a dead one.
    """

    name = "heartbeat"

    def __init__(
        self,
        connect: Callable[[], Endpoint],
        generator_id: str,
        every_s: float,
        filtered_total: Callable[[], int],
        progressing: Callable[[], bool],
        rollouts: Callable[[], Mapping[str, int]] | None = None,
        in_flight: Callable[[], list[int]] | None = None,
    ) -> None:
        self._connect = connect
        self._in_flight = in_flight
        self.generator_id = generator_id
        self.every_s = every_s
        self._filtered_total = filtered_total
        self._progressing = progressing
        self._rollouts = rollouts
        self.expired = threading.Event()
        self.last_answer = time.monotonic()
        self.sent = 0
        super().__init__()

    def _run(self) -> None:
        endpoint = self._connect()  # a socket belongs to the thread that uses it
        try:
            while not self._stop.is_set():
                if self._progressing():
                    try:
                        tally = m.Rollouts(**self._rollouts()) if self._rollouts is not None else None
                        versions = self._in_flight() if self._in_flight is not None else None
                        endpoint.send(m.Heartbeat(self.generator_id, self._filtered_total(), tally, versions))
                        self.sent += 1
                    except TransportTimeout:  # the queue to a hung buffer is full: try again later
                        pass
                deadline = time.monotonic() + self.every_s
                while not self._stop.is_set() and (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
                    got = endpoint.recv(min(left_ms, 200))
                    if got is not None and isinstance(lease := got[1].body, m.Lease):
                        self.last_answer = time.monotonic()
                        if lease.expired:
                            self.expired.set()
        finally:
            endpoint.close()

"""The fleet as the replay buffer sees it: which process holds each generator id, the admission
credits each generator holds (leases that expire with their holder), the groups it reports in
flight (and the hold they put on the learner), and the id horizon of each sender.

One half of `ReplayBuffer`'s state machine (the other is `queue.GroupQueue`): no sockets, no
threads, no files. Every persisted change is one record handed to `log` and applied by one
`apply_*` method, live and on replay (`ReplayBuffer.restore`). Liveness (when a generator was last
heard from) and in-flight reports are soft state: not journaled, and after a restart every
generator starts with a full lease.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stream_dapo.buffer.policy import (
    AdmissionPolicy,
    BufferInputError,
    GeneratorIdTaken,
    Record,
    check_count,
    check_id,
    check_version,
)
from stream_dapo.transport.messages import MAX_FILTERED_TOTAL, Group

__all__ = ["FLEET_COUNTERS", "SENDERS_PER_GENERATOR", "Fleet", "Sender"]

SENDERS_PER_GENERATOR = 4
"""Processes (holders) per generator id whose id horizon the buffer keeps: the current one and the
three before it. Numbered groups from an older holder of the id are refused ("retired_sender"):
that process lost the id to a successor long ago, and the buffer no longer knows what it sent."""

FLEET_COUNTERS = ("uncredited", "credits_granted", "credits_released", "generators_expired")
"""The `ReplayBuffer.stats()` counters the fleet keeps."""


@dataclass
class Sender:
    """One generator process (a holder of a generator id) that numbers its groups (`Group.seq`).

    Its id horizon: every group it numbered below `below` was acknowledged to it and is never sent
    again, so a group numbered below is a duplicate without looking its id up. `ids` holds the ids
    of its accepted groups numbered at or above `below` (id -> seq): what it may still resend. Both
    are bounded by what the process has not had acknowledged, not by the length of the run."""

    below: int = 0
    ids: dict[str, int] = field(default_factory=dict)

    def knows(self, group: Group) -> bool:
        """`group` (numbered by this sender) was accepted before."""
        assert group.seq is not None
        return group.seq < self.below or group.group_id in self.ids

    def advance(self, below: int) -> None:
        if below > self.below:
            self.below = below
            self.ids = {gid: seq for gid, seq in self.ids.items() if seq >= below}


class Fleet:
    """The generators: ids and their holders, credits, leases, in-flight reports, id horizons.

    Credits are leases: a generator not heard from for generator_lease_s loses them
    (`expire_generators`), and a hello releases what the process before it held. How many credits
    may be granted is the admission line's call (`ReplayBuffer.grantable`), which also counts the
    queue; the fleet keeps who holds them. `hold` is the learner's side of the in-flight reports.
    """

    def __init__(
        self, policy: AdmissionPolicy, log: Callable[[Record], None], clock: Callable[[], float]
    ) -> None:
        self.policy = policy
        self._log = log
        self._clock = clock
        self.counters: dict[str, int] = dict.fromkeys(FLEET_COUNTERS, 0)
        self._credits: dict[str, int] = {}
        self._last_grant: dict[str, tuple[int, int]] = {}
        """Per generator, (request id, credits granted) of its last credit request that was granted
        any: a repeat of that request (the reply was lost) gets the same grant, not a second one."""
        self._filtered: dict[str, int] = {}
        """The last filtered_total each generator reported (persisted)."""
        self._holders: dict[str, str] = {}
        """Per generator id, the process that said hello with it last (persisted): while that one is
        live, no other process may use the id (`hello`)."""
        self._senders: dict[str, OrderedDict[str, Sender]] = {}
        """Per generator id, its last SENDERS_PER_GENERATOR holders (oldest first) and their id
        horizons (persisted): the ids of numbered groups (see `Sender`)."""
        # Liveness (not persisted: liveness, not state): when each generator was last heard from;
        # after a restart every generator starts with a full lease (`_started_at`).
        self._last_seen: dict[str, float] = {}
        self._expired: set[str] = set()
        self._started_at = clock()
        # In-flight reports (not persisted either: a generator reports in full with every heartbeat
        # and every groups message): per generator, the start version of each group it has started
        # and not yet sent. `hold` holds the learner back for them.
        self._in_flight: dict[str, tuple[int, ...]] = {}
        self._held_since: float | None = None
        self._held_for = -1
        """The start version of the in-flight group the current hold is for."""
        self._hold_floor = 0
        """In-flight groups started before this version no longer hold the learner: a hold for them
        ran past in_flight_hold_s."""
        self.holds = 0
        """Batch requests answered short because of in-flight groups."""
        self.holds_expired = 0
        """Holds that ran past in_flight_hold_s (the learner went on; those groups may be dropped)."""

    # ---------------------------------------------------------------------------------- generators

    def hello(self, generator_id: str, holder: str) -> None:
        """`ReplayBuffer.generator_hello`: claim the id for `holder` (or refuse), release its credits."""
        check_id(generator_id, "generator_id")
        current = self._holders.get(generator_id)
        if current and holder != current and self.is_live(generator_id):
            silent = self._clock() - self._last_seen.get(generator_id, self._started_at)
            raise GeneratorIdTaken(
                f"generator_id {generator_id!r} is held by {current} (heard from {silent:.1f} s ago), so "
                f"{holder or 'this process'} may not use it: two generators run with one id (--index). Give "
                f"each its own --index; a restarted generator gets in once its predecessor's lease of "
                f"{self.policy.generator_lease_s:g} s (buffer.generator_lease_s) has run out"
            )
        if holder and holder != current:
            self._log({"kind": "hello", "generator": generator_id, "holder": holder})
            self.apply_hello(generator_id, holder)
        self.heard_from(generator_id)
        self._expired.discard(generator_id)
        self._in_flight.pop(generator_id, None)  # a new process: its predecessor's groups are gone
        held = self._credits.get(generator_id, 0)
        if held or self._filtered.get(generator_id):
            self._log_credit(generator_id, 0, granted=0, uncredited=0, released=held, filtered_total=0)

    def heartbeat(self, generator_id: str, filtered_total: int) -> tuple[int, bool]:
        """`ReplayBuffer.heartbeat`: renew the lease, apply filtered_total, tell a past expiry once."""
        self.heard_from(generator_id)
        self.report_filtered_total(generator_id, filtered_total)
        expired = generator_id in self._expired
        self._expired.discard(generator_id)
        return self._credits.get(generator_id, 0), expired

    def expire_generators(self) -> list[tuple[str, int]]:
        """Release the credits of every generator not heard from for `generator_lease_s` (it died,
        was preempted or scaled away): the admission line gets them back. Returns (generator,
        credits released) for each."""
        now, lease_s = self._clock(), self.policy.generator_lease_s
        gone = [
            (gen, n)
            for gen, n in self._credits.items()
            if now - self._last_seen.get(gen, self._started_at) > lease_s
        ]
        for gen, n in gone:
            self._log({"kind": "expire", "generator": gen})
            self._log_credit(gen, 0, granted=0, uncredited=0, released=n)
            self.apply_expire(gen)
            self._expired.add(gen)
        return gone

    def is_live(self, generator_id: str) -> bool:
        """Heard from within generator_lease_s (after a restart, every generator gets a full lease)."""
        since = self._clock() - self._last_seen.get(generator_id, self._started_at)
        return since <= self.policy.generator_lease_s

    def heard_from(self, generator_id: str) -> None:
        check_id(generator_id, "generator_id")
        self._last_seen[generator_id] = self._clock()

    def holder_of(self, generator_id: str) -> str | None:
        """The process that holds `generator_id` (its last hello's), if any said hello with one."""
        return self._holders.get(generator_id)

    # ---------------------------------------------------------------------------------- credits

    def report_filtered_total(self, generator_id: str, filtered_total: int) -> None:
        """Redeem the credits a generator spent without a group since its last report: the increase
        of its running total (a repeated or lost report therefore changes nothing)."""
        if (
            not isinstance(filtered_total, int)
            or isinstance(filtered_total, bool)
            or not 0 <= filtered_total <= MAX_FILTERED_TOTAL
        ):
            raise BufferInputError(
                f"filtered_total must be an int in [0, {MAX_FILTERED_TOTAL}] (credits spent without a group "
                f"since the generator's hello), got {filtered_total!r}"
            )
        new = filtered_total - self._filtered.get(generator_id, 0)
        if new > 0:
            self.redeem(generator_id, new, filtered_total=filtered_total)

    def redeem(self, generator_id: str, n: int, filtered_total: int | None = None) -> None:
        """`n` of the generator's credits were spent (more than it holds: counted as uncredited)."""
        held = self._credits.get(generator_id, 0)
        self._log_credit(
            generator_id,
            max(0, held - n),
            granted=0,
            uncredited=max(0, n - held),
            released=0,
            filtered_total=filtered_total,
        )

    def repeated_grant(self, generator_id: str, request_id: int | None) -> int | None:
        """What the generator's last granted request got, when `request_id` repeats it; else None."""
        last = self._last_grant.get(generator_id)
        if request_id is not None and last is not None and last[0] == request_id:
            return last[1]
        return None

    def grant(self, generator_id: str, granted: int, request_id: int | None) -> None:
        """Add `granted` (> 0, within the admission line's room) to the generator's credits."""
        out = self._credits.get(generator_id, 0) + granted
        self._log_credit(generator_id, out, granted=granted, uncredited=0, released=0, rid=request_id)

    def _log_credit(
        self,
        gen: str,
        out: int,
        *,
        granted: int,
        uncredited: int,
        released: int,
        filtered_total: int | None = None,
        rid: int | None = None,
    ) -> None:
        record: Record = {
            "kind": "credit",
            "generator": gen,
            "outstanding": out,
            "granted": granted,
            "uncredited": uncredited,
            "released": released,
        }
        if filtered_total is not None:
            record["filtered_total"] = filtered_total
        if rid is not None:
            record["request_id"] = rid
        self._log(record)
        self.apply_credit(gen, out, granted, uncredited, released, filtered_total, rid)

    # ---------------------------------------------------------------------------------- senders

    def sender(self, gen: str, holder: str) -> Sender | None:
        """The id horizon of `holder` as a sender of `gen`'s groups (None: unknown or retired)."""
        senders = self._senders.get(gen)
        return senders.get(holder) if senders is not None and holder else None

    def advance_horizon(self, gen: str, holder: str, acked_below: int) -> None:
        """The sender had everything numbered below `acked_below` acknowledged: forget those ids."""
        check_count(acked_below, "acked_below")
        if acked_below > self._senders[gen][holder].below:
            self._log({"kind": "horizon", "generator": gen, "holder": holder, "below": acked_below})
            self.apply_horizon(gen, holder, acked_below)

    def remembers(self, group_id: str) -> bool:
        """Some sender keeps `group_id` above its horizon (it may still resend it)."""
        return any(group_id in s.ids for senders in self._senders.values() for s in senders.values())

    @property
    def sender_ids(self) -> int:
        """Ids the senders keep above their horizons."""
        return sum(len(s.ids) for senders in self._senders.values() for s in senders.values())

    # ---------------------------------------------------------------------------------- in flight

    def report_in_flight(self, generator_id: str, versions: Sequence[int] | None) -> None:
        """A generator's full report of its in-flight groups: the policy version each was started at
        (started and not yet sent: in its engine or its verifier). None: it did not report (an older
        generator), nothing changes. Soft state like liveness: not journaled."""
        if versions is None:
            return
        check_id(generator_id, "generator_id")
        for v in versions:
            check_version(v, "in_flight_versions[i]")
        if versions:
            self._in_flight[generator_id] = tuple(sorted(versions))
        else:
            self._in_flight.pop(generator_id, None)

    def hold(self, learner_version: int, pos: int, max_groups: int, waiting: int) -> tuple[int, int] | None:
        """The room `ReplayBuffer.serve` has before it would hold the learner for an in-flight group
        (`hold_room`), as the hold now stands: a hold starts when the room is short of `max_groups`
        with more than the room `waiting`, and lets go (None from then on for that group and older
        ones) once it has lasted in_flight_hold_s."""
        room = self.hold_room(learner_version, pos)
        if room is not None and room[0] < max_groups and waiting > room[0]:
            now = self._clock()
            if self._held_since is None or self._held_for != room[1]:
                self._held_since, self._held_for = now, room[1]  # a hold for another group starts
            elif now - self._held_since > self.policy.in_flight_hold_s:
                self.holds_expired += 1
                self._hold_floor = room[1] + 1
                self._held_since = None
                room = None
        else:
            self._held_since = None
        return room

    def hold_room(self, learner_version: int, pos: int) -> tuple[int, int] | None:
        """How many more groups may be served at `learner_version` (`pos` already served at it)
        before a reported in-flight group could no longer be trained when it arrives, and the start
        version of the group that sets that limit; None when nothing holds the learner.

        In-flight groups are served after what is waiting now, oldest start first (they are the
        oldest policy when they arrive). With n more groups served now, the k-th of those that can
        still be saved lands at position pos + n + k of this version's serving order, so it is
        trained at learner_version + (pos + n + k) // B_v, which must stay <= start + max_staleness:
        n <= (start + max_staleness - learner_version + 1) * B_v - 1 - pos - k. A group for which
        even n = 0 is too late (the gate will drop it) holds nothing and takes no position.
        Reports count only from generators heard from within generator_lease_s.
        """
        p = self.policy
        if p.in_flight_hold_s <= 0 or p.lockstep or not self._in_flight:
            return None
        now = self._clock()
        starts = sorted(
            v
            for gen, versions in self._in_flight.items()
            if now - self._last_seen.get(gen, self._started_at) <= p.generator_lease_s
            for v in versions
            if v >= self._hold_floor
        )
        room: tuple[int, int] | None = None
        k = 0
        for start in starts:
            limit = (start + p.max_staleness - learner_version + 1) * p.groups_per_version - 1 - pos - k
            if limit < 0:
                continue
            if room is None or limit < room[0]:
                room = (limit, start)
            k += 1
        return room

    def hold_stats(self) -> dict[str, int]:
        """The learner hold's figures (soft state, not restored)."""
        return {
            "in_flight_reported": sum(len(v) for v in self._in_flight.values()),
            "holds": self.holds,
            "holds_expired": self.holds_expired,
        }

    # ---------------------------------------------------------------------------------- views

    @property
    def credits_outstanding(self) -> int:
        return sum(self._credits.values())

    def credits_of(self, generator_id: str) -> int:
        return self._credits.get(generator_id, 0)

    @property
    def filtered_totals(self) -> dict[str, int]:
        """The last filtered_total each generator reported (0s left out)."""
        return dict(self._filtered)

    @property
    def live_generators(self) -> int:
        """Generators heard from within buffer.generator_lease_s: the fleet as the buffer sees it."""
        now, lease_s = self._clock(), self.policy.generator_lease_s
        return sum(1 for t in self._last_seen.values() if now - t <= lease_s)

    def generator_leases(self) -> dict[str, dict[str, float]]:
        """Per generator heard from (or holding credits): its credits and seconds since last heard."""
        now = self._clock()
        return {
            gen: {
                "credits": self._credits.get(gen, 0),
                "silent_s": round(now - self._last_seen.get(gen, self._started_at), 1),
            }
            for gen in sorted({*self._credits, *self._last_seen})
        }

    # ---------------------------------------------------------------------------------- apply

    def apply_sent(self, group: Group, gen: str, holder: str) -> bool:
        """Part of the "accept" record: a numbered group's id goes to its sender's horizon (unless
        already below it). False: no sender numbered it, the queue keeps its id for good."""
        sender = self.sender(gen, holder)
        if sender is None or group.seq is None:
            return False
        if group.seq >= sender.below:
            sender.ids[group.group_id] = group.seq
        return True

    def apply_hello(self, gen: str, holder: str) -> None:
        """`holder` now holds generator id `gen`: it gets an id horizon of its own; the oldest of
        the id's holders beyond SENDERS_PER_GENERATOR is retired (its ids forgotten)."""
        self._holders[gen] = holder
        senders = self._senders.setdefault(gen, OrderedDict())
        if holder in senders:
            senders.move_to_end(holder)
            return
        senders[holder] = Sender()
        while len(senders) > SENDERS_PER_GENERATOR:
            senders.popitem(last=False)

    def apply_horizon(self, gen: str, holder: str, below: int) -> None:
        self._senders[gen][holder].advance(below)

    def apply_expire(self, gen: str) -> None:
        self.counters["generators_expired"] += 1
        self._last_seen.pop(gen, None)
        self._in_flight.pop(gen, None)
        self._last_grant.pop(gen, None)  # its credits went back: a repeat of its request is granted anew

    def apply_credit(
        self,
        gen: str,
        out: int,
        granted: int,
        uncredited: int,
        released: int,
        ft: int | None = None,
        rid: int | None = None,
    ) -> None:
        if granted:
            if rid is None:
                self._last_grant.pop(gen, None)
            else:
                self._last_grant[gen] = (rid, granted)
        elif released:  # hello or expiry: the generator holds none of these any more
            self._last_grant.pop(gen, None)
        if out:
            self._credits[gen] = out
        else:
            self._credits.pop(gen, None)
        if ft is not None:
            if ft:
                self._filtered[gen] = ft
            else:
                self._filtered.pop(gen, None)
        self.counters["credits_granted"] += granted
        self.counters["uncredited"] += uncredited
        self.counters["credits_released"] += released

    # ---------------------------------------------------------------------------------- snapshot

    def snapshot_state(self) -> Record:
        """The fleet's fields of the snapshot's `state` record."""
        return {
            # Lists of pairs, not maps: there may be more generators than a map may have keys.
            "credits": [[gen, n] for gen, n in self._credits.items()],
            "filtered": [[gen, n] for gen, n in self._filtered.items()],
            "holders": [[gen, holder] for gen, holder in self._holders.items()],
            "last_grants": [[gen, rid, n] for gen, (rid, n) in self._last_grant.items()],
            # Per generator id, oldest holder first: [generator, holder, below, ids, seqs].
            "senders": [
                [gen, holder, sender.below, list(sender.ids), list(sender.ids.values())]
                for gen, senders in self._senders.items()
                for holder, sender in senders.items()
            ],
        }

    def apply_state(self, r: Record) -> None:
        """The fleet's part of a snapshot's `state` record (format 2 has no "senders")."""
        self._credits = {str(gen): int(n) for gen, n in r["credits"] if int(n) > 0}
        self._filtered = {str(gen): int(n) for gen, n in r.get("filtered", []) if int(n) > 0}
        self._holders = {str(gen): str(holder) for gen, holder in r.get("holders", [])}
        self._last_grant = {str(gen): (int(rid), int(n)) for gen, rid, n in r.get("last_grants", [])}
        self._senders = {}
        for gen, holder, below, ids, seqs in r.get("senders", []):
            if len(ids) != len(seqs):
                raise ValueError(f"sender {holder!r} of {gen!r}: {len(ids)} ids but {len(seqs)} seqs")
            sender = Sender(int(below), {str(gid): int(seq) for gid, seq in zip(ids, seqs, strict=True)})
            self._senders.setdefault(str(gen), OrderedDict())[str(holder)] = sender
        for gen, holder in self._holders.items():  # a format-2 state: holders without horizons yet
            if self.sender(gen, holder) is None:
                self._senders.setdefault(gen, OrderedDict())[holder] = Sender()

"""The replay buffer as a pure state machine: admission credits, the lifecycle of a group,
the staleness gate at dequeue, and an effect log that makes it durable.

No sockets, no threads, no files: the service feeds it decoded messages, a `Persistence` sink
receives one record per state change, and `ReplayBuffer.restore` rebuilds the exact state from
those records (a snapshot followed by the journal tail). Every mutation goes through the same
`apply_*` methods live and on replay, so "what was logged" and "what the buffer holds" cannot
drift apart.

`ReplayBuffer` is the facade the service talks to. It composes two halves, each owning its state
and the records that change it: the fleet (`fleet.Fleet`: generator ids and holders, credits and
their leases, in-flight reports and the learner hold, per-sender id horizons) and the queue
(`queue.GroupQueue`: groups waiting and leased, seen ids, the staleness gate, serve, commit,
requeue). What spans both is here: the admission line (waiting groups + credits), accepting groups
(dedup asks both halves), request retries, rejection counts, the run's settings, and the snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stream_dapo.buffer.fleet import FLEET_COUNTERS, SENDERS_PER_GENERATOR, Fleet, Sender
from stream_dapo.buffer.policy import (
    AdmissionPolicy,
    BufferInputError,
    GeneratorIdTaken,
    Record,
    check_version,
)
from stream_dapo.buffer.queue import (
    QUEUE_COUNTERS,
    SEEN_IDS_PER_RECORD,
    CommitResult,
    GroupQueue,
    GroupState,
    ServeResult,
)
from stream_dapo.transport.messages import Group, from_map, to_map

__all__ = [
    "SEEN_IDS_PER_RECORD",
    "SENDERS_PER_GENERATOR",
    "AddResult",
    "AdmissionPolicy",
    "BufferInputError",
    "CommitResult",
    "GeneratorIdTaken",
    "GroupState",
    "MemoryLog",
    "Persistence",
    "Record",
    "ReplayBuffer",
    "ServeResult",
]

SNAPSHOT_FORMAT = 3
"""Version of the `state` record (2: readable record keys, `journal.migrate_record` upgrades 1;
3: adds "senders", the id horizon of each generator process; a format-2 state has none)."""
READABLE_SNAPSHOT_FORMATS = (2, 3)

_STATE_KEYS = (
    "kind",
    "format",
    "counters",
    "rejected_messages",
    "rejected_groups",
    "credits",
    "filtered",
    "holders",
    "learner_version",
    "committed_through",
    "position",
    "max_staleness_served",
    "last_lease",
    "last_commit_request_id",
    "last_grants",
    "config",
    "senders",
)
"""The keys of the `state` record in the order the snapshot writes them (the fleet's and the
queue's fields interleave: the order predates the split, and snapshots stay byte for byte)."""

_COUNTERS = (
    "accepted",
    "duplicates",
    "uncredited",
    "served",
    "committed",
    "reused",
    "commit_unknown",
    "requeued",
    "dropped_stale",
    "credits_granted",
    "credits_released",
    "retried_requests",
    "generators_expired",
)
"""Every counter of `stats()`, in its order: the queue's, the fleet's, and the buffer's own."""
_OWN_COUNTERS = ("retried_requests",)
assert sorted(_COUNTERS) == sorted(QUEUE_COUNTERS + FLEET_COUNTERS + _OWN_COUNTERS)


# --------------------------------------------------------------------------------------------------
# Persistence sink and results
# --------------------------------------------------------------------------------------------------


class Persistence(Protocol):
    """Receives one record per state change, in order. The service makes them durable (the
    journal's `sync`) before it replies to the message that caused them."""

    def append(self, record: Record) -> None: ...


@dataclass
class MemoryLog:
    """An in-memory `Persistence`: for tests, and for a buffer that need not survive restarts."""

    records: list[Record] = field(default_factory=list)

    def append(self, record: Record) -> None:
        self.records.append(record)


@dataclass
class AddResult:
    """What to acknowledge for one `groups` message."""

    accepted: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(group_id, reason) pairs."""


# --------------------------------------------------------------------------------------------------
# The buffer
# --------------------------------------------------------------------------------------------------


class ReplayBuffer:
    """Queue of whole groups with admission credits, leases, commits and a staleness gate.

    Admission and back-pressure: a generator starts a group only with a credit, and credits are
    granted only while waiting groups + outstanding credits stay within
    `AdmissionPolicy.admission_capacity` (and waiting + leased + credits within capacity_groups). The
    queue therefore never holds more than the learner consumes within max_staleness versions, so
    generators are paced instead of their work being thrown away; the gate in `serve` is only a
    backstop. Groups are served oldest policy first (then in arrival order), so a long group that
    finishes after shorter ones credited later is not pushed past the bound by them once it is here;
    while it is still generating, its generator's in-flight report makes `serve` hold the learner
    short of the version at which it would arrive too stale (`Fleet.hold_room`, buffer.in_flight_hold_s).

    Lifecycle (see `GroupState`), for example with B_v = 2 and max_staleness = 1, where groups
    a and b were generated at version 4 and c at version 3::

        add_groups("gen-0", [a, b, c])   a, b, c WAITING (each redeems a credit of gen-0)
        serve(v=5, max_groups=2)         c (oldest policy) would be trained at version 5, 2 > 1
                                         versions after its oldest token: dropped, counted;
                                         a, b LEASED, trained at version 5 (staleness 1)
        learner_hello(v=4, through=4)    the learner restarted from its step-4 checkpoint:
                                         a, b back to WAITING
        serve(v=4, max_groups=2)         a, b LEASED again, trained at version 4
        commit(v=6, [a, b])              a, b COMMITTED (only their ids are kept)
        add_groups("gen-0", [a])         a is a duplicate: acknowledged again, stored once

    Ids kept: a generator process numbers its groups (`Group.seq`) and says in every groups message
    below which number everything was acknowledged to it (`acked_below`): ids below are forgotten (a
    resend numbered below is a duplicate by construction), so the ids kept stay near the groups not
    yet acknowledged, however long the run. Unnumbered groups (older generators) keep their ids.

    Every state change is one record handed to `persistence`; `restore` replays them. The state
    lives in two halves (`Fleet`, `GroupQueue`); this class sequences them and owns what spans both.
    """

    def __init__(
        self,
        policy: AdmissionPolicy,
        persistence: Persistence | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` times every duration (leases, holds, ages): monotonic, so that a step of the
        real-time clock (NTP, a resumed VM) expires nothing and ages nothing. `wall_clock` only
        stamps acceptance times for people (`accepted_at` in the state files)."""
        self.policy = policy
        self._sink: Persistence = persistence if persistence is not None else MemoryLog()
        self._clock = clock
        self._wall_clock = wall_clock
        self._queue = GroupQueue(policy, self._log, clock)
        self._fleet = Fleet(policy, self._log, clock)
        self._counters: dict[str, int] = dict.fromkeys(_OWN_COUNTERS, 0)
        """The buffer's own counters (the queue and the fleet keep theirs)."""
        self._rejected_messages: dict[str, int] = {}
        self._rejected_groups: dict[str, int] = {}
        self.run_config: dict[str, Any] | None = None
        """The settings the state was built under, as the service recorded them (`record_config`;
        persisted; None in state files from before it did): opaque here, compared by the service."""

    # ---------------------------------------------------------------------------------- restore

    @classmethod
    def restore(
        cls,
        policy: AdmissionPolicy,
        records: Iterable[Record],
        persistence: Persistence | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> ReplayBuffer:
        """Rebuild a buffer from a snapshot's records followed by the journal's, in order."""
        buf = cls(policy, None, clock, wall_clock)
        for i, record in enumerate(records):
            try:
                buf._replay(record)
            except (KeyError, TypeError, ValueError) as exc:
                raise BufferInputError(
                    f"persisted record #{i} (kind {record.get('kind')!r}) cannot be applied: {exc!r}; the state "
                    "files were written by another version or edited by hand"
                ) from exc
        buf._sink = persistence if persistence is not None else MemoryLog()
        return buf

    def _replay(self, r: Record) -> None:
        kind = r["kind"]
        if kind not in _REPLAY:
            raise ValueError(f"unknown record kind {kind!r}")
        _REPLAY[kind](self, r)

    def _log(self, record: Record) -> None:
        self._sink.append(record)

    # ---------------------------------------------------------------------------------- generators

    def generator_hello(self, generator_id: str, holder: str = "") -> int:
        """A generator (re)started: it holds no credits any more, so its outstanding ones are
        released back to the line, and its filtered_total starts again from 0. Returns the learner
        version to tell it.

        A generator id belongs to one live process, named by `holder` (host, pid, a token): a hello
        from another process while the holder is live (heard from within generator_lease_s) raises
        GeneratorIdTaken naming both, and changes nothing, so the holder's credits and filtered_total
        stay exact. A restarted process gets in once its predecessor's lease has run out. A hello
        without a holder (an older client) claims nothing but is refused the same way."""
        self._fleet.hello(generator_id, holder)
        return self.learner_version

    def heartbeat(self, generator_id: str, filtered_total: int) -> tuple[int, bool]:
        """The generator is alive: its lease is renewed and its filtered_total applied. Returns the
        credits the buffer counts as its, and whether they expired since it was last heard from
        (told once: the generator then drops the credits it holds)."""
        return self._fleet.heartbeat(generator_id, filtered_total)

    def expire_generators(self) -> list[tuple[str, int]]:
        """Release the credits of every generator not heard from for `generator_lease_s` (it died,
        was preempted or scaled away): the admission line gets them back. Returns (generator,
        credits released) for each."""
        return self._fleet.expire_generators()

    def report_in_flight(self, generator_id: str, versions: Sequence[int] | None) -> None:
        """A generator's full report of its in-flight groups: the policy version each was started at
        (started and not yet sent: in its engine or its verifier). None: it did not report (an older
        generator), nothing changes. Soft state like liveness: not journaled."""
        self._fleet.report_in_flight(generator_id, versions)

    def holder_of(self, generator_id: str) -> str | None:
        """The process that holds `generator_id` (its last hello's), if any said hello with one."""
        return self._fleet.holder_of(generator_id)

    def grant_credits(self, generator_id: str, want: int, request_id: int | None = None) -> int:
        """Grant up to `want` credits, as many as the admission line has room for.

        A `request_id` equal to that of the generator's last granted request is a repeat of it (its
        reply was lost: the buffer restarted after journaling the grant, or the link dropped): it
        gets the same number again and nothing more is counted against the line. Without this, a
        grant journaled but never delivered would count against the line forever while the
        generator holds nothing, and admission would stall.
        """
        self._fleet.heard_from(generator_id)
        if not isinstance(want, int) or want < 0:
            raise BufferInputError(
                f"want must be an int >= 0 (credits the generator could use now), got {want!r}"
            )
        repeated = self._fleet.repeated_grant(generator_id, request_id)
        if repeated is not None:
            self._count_retry()
            return repeated
        granted = min(want, self.grantable)
        if granted:
            self._fleet.grant(generator_id, granted, request_id)
        return granted

    def add_groups(
        self,
        generator_id: str,
        groups: Sequence[Group],
        filtered_total: int | None = None,
        holder: str = "",
        acked_below: int | None = None,
    ) -> AddResult:
        """Accept new groups, recognise resends, and redeem credits.

        Every group that is not a duplicate redeems one credit of `generator_id`, and so does each
        increase of its `filtered_total` (credits it spent without a group: dynamic sampling,
        aborts, unused at shutdown). Groups with a wrong sample count, or beyond capacity_groups,
        are rejected.

        Dedup: a group is a duplicate if it is stored (waiting or leased), or, when numbered
        (`Group.seq`) by `holder`, if that sender's id horizon knows it (`fleet.Sender`), or, when
        not numbered, if its id was ever accepted. `acked_below` (the sender's, see `Groups`)
        advances its horizon first: ids below it are forgotten. Numbered groups from a holder that
        is not one of the id's last SENDERS_PER_GENERATOR are rejected ("retired_sender").
        """
        self._fleet.heard_from(generator_id)
        if filtered_total is not None:
            self._fleet.report_filtered_total(generator_id, filtered_total)
        sender = self._fleet.sender(generator_id, holder)
        if sender is not None and acked_below is not None:
            self._fleet.advance_horizon(generator_id, holder, acked_below)
        result = AddResult()
        accepted_now: set[str] = set()
        reasons: dict[str, int] = {}
        for group in groups:
            gid = group.group_id
            numbered = group.seq is not None and bool(holder)
            if self._is_duplicate(group, numbered, sender, accepted_now):
                result.duplicates.append(gid)
            elif (reason := self._rejection_reason(group, numbered, sender)) is not None:
                result.rejected.append((gid, reason))
                reasons[reason] = reasons.get(reason, 0) + 1
            else:
                accepted_now.add(gid)
                self._accept(group, generator_id if numbered else "", holder if numbered else "")
                result.accepted.append(gid)
        self._count_refused(len(result.duplicates), reasons)
        # A retired sender's credits went back when its lease ran out: its groups redeem none (they
        # would take the credits of the id's current holder).
        redeemed = len(result.accepted) + len(result.rejected) - reasons.get("retired_sender", 0)
        if redeemed:
            self._fleet.redeem(generator_id, redeemed)
        return result

    def _is_duplicate(
        self, group: Group, numbered: bool, sender: Sender | None, accepted_now: set[str]
    ) -> bool:
        gid = group.group_id
        if gid in accepted_now or self._queue.stores(gid):
            return True
        if numbered:
            return sender is not None and sender.knows(group)
        return gid in self._queue.seen

    def _rejection_reason(self, group: Group, numbered: bool, sender: Sender | None) -> str | None:
        if numbered and sender is None:
            return "retired_sender"
        if group.num_samples != self.policy.group_size:
            return "wrong_group_size"
        if self.stored >= self.policy.capacity_groups:
            # Only reachable by groups sent without a credit: credits never exceed the cap.
            return "buffer_full"
        return None

    def _accept(self, group: Group, gen: str, holder: str) -> None:
        """Journal and apply one accepted group (`gen` and `holder` name its sender, if numbered)."""
        at = self._wall_clock()
        record: Record = {"kind": "accept", "group": to_map(group), "accepted_at": at}
        if gen:
            record["generator"], record["holder"] = gen, holder
        self._log(record)
        self._apply_accept(group, at, gen, holder)

    def _count_refused(self, duplicates: int, reasons: dict[str, int]) -> None:
        if duplicates:
            self._log({"kind": "duplicate", "count": duplicates})
            self._queue.apply_duplicates(duplicates)
        for reason, n in reasons.items():
            self._log({"kind": "reject_groups", "reason": reason, "count": n})
            self._apply_rejected(self._rejected_groups, reason, n)

    # ---------------------------------------------------------------------------------- learner

    def learner_hello(self, learner_version: int, committed_through: int) -> int:
        """The learner (re)started from its checkpoint at `learner_version`: whatever it had
        leased is lost with its process, so every LEASED group returns to the front of the
        queue, in the order it was served. Returns how many were requeued."""
        return self._queue.requeue(learner_version, committed_through)

    def serve(
        self,
        learner_version: int,
        max_groups: int,
        max_tokens: int = 0,
        max_bytes: int = 0,
        request_id: int | None = None,
    ) -> ServeResult:
        """Lease up to `max_groups` waiting groups, front first, for the learner at `learner_version`.

        With `max_tokens` > 0 the batch stops before its `Group.num_tokens` would exceed it, and
        with `max_bytes` > 0 before its estimated wire size (`wire_bytes`) would; either way it
        always holds at least one group. The i-th group served at this learner version is trained
        at v + floor(i / B_v); a group whose oldest token is more than max_staleness versions
        older than that is dropped (kept only as a seen id) and counted, never served. Reported
        in-flight groups may hold the batch short (`Fleet.hold`, `ServeResult.held`).

        A `request_id` equal to the last lease's is a retry of that request: it gets the same lease.
        """
        check_version(learner_version, "learner_version")
        repeated = self._queue.repeated_lease(request_id)
        if repeated is not None:
            self._count_retry()
            return repeated
        self._queue.check_budgets(max_groups, max_tokens, max_bytes)
        pos = self._queue.position(learner_version)
        room = self._fleet.hold(learner_version, pos, max_groups, self._queue.num_waiting)
        result = self._queue.lease(
            learner_version, None if room is None else room[0], max_groups, max_tokens, max_bytes, request_id
        )
        self._fleet.holds += result.held
        return result

    def commit(
        self, learner_version: int, group_ids: Sequence[str], request_id: int | None = None
    ) -> CommitResult:
        """The learner checkpointed these groups. Waiting ones count too: a commit resent after
        a `learner_hello` must still retire groups that the hello requeued. A `request_id` equal to
        the last commit's is a retry: already applied, nothing changes."""
        check_version(learner_version, "learner_version")
        if self._queue.repeats_commit(request_id):
            self._count_retry()
            return CommitResult([], [], [], retried=True)
        return self._queue.commit(learner_version, group_ids, request_id)

    def _count_retry(self) -> None:
        self._log({"kind": "retry"})
        self._apply_retry()

    # ---------------------------------------------------------------------------------- the books

    def count_rejected_message(self, reason: str, n: int = 1) -> None:
        """Count malformed or misdirected messages (the service forwards the endpoint's counts)."""
        if n <= 0:
            return
        self._log({"kind": "reject_message", "reason": reason, "count": n})
        self._apply_rejected(self._rejected_messages, reason, n)

    def record_config(self, settings: dict[str, Any]) -> None:
        """Store the settings this buffer runs with (the service compares them on its next start)."""
        if settings != self.run_config:
            self._log({"kind": "config", "settings": dict(settings)})
            self._apply_config(dict(settings))

    # ---------------------------------------------------------------------------------- apply

    def _apply_accept(self, group: Group, at: float, gen: str = "", holder: str = "") -> None:
        """The group waits; its id is kept by its sender (numbered) or in the queue's seen ids."""
        kept_by_sender = self._fleet.apply_sent(group, gen, holder)
        self._queue.apply_accept(group, at, keep_id=not kept_by_sender)

    def _apply_retry(self) -> None:
        self._counters["retried_requests"] += 1

    def _apply_config(self, settings: dict[str, Any]) -> None:
        self.run_config = settings

    def _apply_rejected(self, table: dict[str, int], reason: str, n: int) -> None:
        table[reason] = table.get(reason, 0) + n

    # ---------------------------------------------------------------------------------- snapshot

    def snapshot_records(self) -> Iterator[Record]:
        """The whole state as records that `restore` accepts: state, seen ids, then groups in
        queue order (waiting front to back, then leased in serve order)."""
        fields: Record = {
            "kind": "state",
            "format": SNAPSHOT_FORMAT,
            "counters": self._all_counters(),
            "rejected_messages": dict(self._rejected_messages),
            "rejected_groups": dict(self._rejected_groups),
            **self._fleet.snapshot_state(),
            **self._queue.snapshot_state(),
            "config": self.run_config,
        }
        assert fields.keys() == set(_STATE_KEYS), sorted(fields.keys() ^ set(_STATE_KEYS))
        yield {key: fields[key] for key in _STATE_KEYS}
        yield from self._queue.snapshot_records()

    def _apply_state(self, r: Record) -> None:
        if r["format"] not in READABLE_SNAPSHOT_FORMATS:
            raise ValueError(f"snapshot format {r['format']} is not one of {READABLE_SNAPSHOT_FORMATS}")
        for name, value in r["counters"].items():
            table = self._counter_table(name)
            if table is not None:
                table[name] = int(value)
        self._rejected_messages = {str(k): int(v) for k, v in r["rejected_messages"].items()}
        self._rejected_groups = {str(k): int(v) for k, v in r["rejected_groups"].items()}
        self._fleet.apply_state(r)
        self._queue.apply_state(r)
        config = r.get("config")
        self.run_config = None if config is None else dict(config)

    def _counter_table(self, name: str) -> dict[str, int] | None:
        """The half (or the buffer itself) that keeps counter `name`; None for a name none keeps."""
        for table in (self._queue.counters, self._fleet.counters, self._counters):
            if name in table:
                return table
        return None

    def _all_counters(self) -> dict[str, int]:
        counters = {**self._queue.counters, **self._fleet.counters, **self._counters}
        return {name: counters[name] for name in _COUNTERS}

    # ---------------------------------------------------------------------------------- views

    @property
    def learner_version(self) -> int:
        """The learner's version as the buffer last heard it (its requests carry it)."""
        return self._queue.learner_version

    @property
    def committed_through(self) -> int:
        """The version of the learner checkpoint it restarted from (its last `learner_hello`)."""
        return self._queue.committed_through

    @property
    def holds(self) -> int:
        """Batch requests answered short because of in-flight groups."""
        return self._fleet.holds

    @property
    def holds_expired(self) -> int:
        """Holds that ran past in_flight_hold_s (the learner went on; those groups may be dropped)."""
        return self._fleet.holds_expired

    @property
    def _filtered(self) -> dict[str, int]:
        """The last filtered_total each generator reported (a test continues the running totals)."""
        return self._fleet.filtered_totals

    @property
    def num_waiting(self) -> int:
        return self._queue.num_waiting

    @property
    def num_leased(self) -> int:
        return self._queue.num_leased

    @property
    def stored(self) -> int:
        """Groups stored: waiting + leased."""
        return self._queue.num_waiting + self._queue.num_leased

    @property
    def credits_outstanding(self) -> int:
        return self._fleet.credits_outstanding

    @property
    def live_generators(self) -> int:
        """Generators heard from within buffer.generator_lease_s: the fleet as the buffer sees it."""
        return self._fleet.live_generators

    def generator_leases(self) -> dict[str, dict[str, float]]:
        """Per generator heard from (or holding credits): its credits and seconds since last heard."""
        return self._fleet.generator_leases()

    @property
    def seen_ids(self) -> int:
        """Ids kept to drop resends: unnumbered ones (kept for good) + each sender's above its horizon."""
        return len(self._queue.seen) + self._fleet.sender_ids

    def credits_of(self, generator_id: str) -> int:
        return self._fleet.credits_of(generator_id)

    @property
    def admitted(self) -> int:
        """Groups admitted and not yet served (the admission line): waiting groups + outstanding
        credits, which may still turn into groups. `stats()` reports it as "line"."""
        return self._queue.num_waiting + self.credits_outstanding

    @property
    def admission_limit(self) -> int:
        """What `admitted` may reach now: the policy's admission capacity, less what leased groups
        take of capacity_groups. `stats()` reports it as "line_capacity"."""
        return max(
            0, min(self.policy.admission_capacity, self.policy.capacity_groups - self._queue.num_leased)
        )

    @property
    def grantable(self) -> int:
        """Credits that may be granted now (the room left under `admission_limit`)."""
        if self.policy.lockstep:
            return max(
                0,
                min(self.policy.rollout_batch_prompts, self.admission_limit)
                - self._served_this_round
                - self.admitted,
            )
        return max(0, self.admission_limit - self.admitted)

    @property
    def _served_this_round(self) -> int:
        """Lock-step: groups already leased for the rollout batch the learner at `learner_version`
        is collecting. Once it reports a newer version (its next request), a new round opens."""
        return self._queue.position(self.learner_version)

    def waiting_ids(self) -> list[str]:
        return self._queue.waiting_ids()

    def leased_ids(self) -> list[str]:
        return self._queue.leased_ids()

    def state_of(self, group_id: str) -> GroupState | None:
        state = self._queue.state_of(group_id)
        if state is None and self._fleet.remembers(group_id):
            return GroupState.COMMITTED
        return state

    def oldest_waiting_age_s(self) -> float:
        """Seconds since the group at the front of the queue was accepted (0 when empty)."""
        return self._queue.oldest_waiting_age_s()

    def stats(self) -> dict[str, Any]:
        """Counters and depths for the run summary and the metrics exporter (plain JSON types)."""
        return {
            **self._all_counters(),
            "rejected_messages": dict(self._rejected_messages),
            "rejected_groups": dict(self._rejected_groups),
            "credits_outstanding": self.credits_outstanding,
            "max_staleness_served": self._queue.max_staleness_served,
            "waiting": self._queue.num_waiting,
            "leased": self._queue.num_leased,
            "seen_ids": self.seen_ids,
            "line": self.admitted,
            "line_capacity": self.admission_limit,
            "learner_version": self.learner_version,
            "committed_through": self.committed_through,
        }

    def hold_stats(self) -> dict[str, int]:
        """The learner hold's figures (soft state, not restored, so not in `stats()`, whose state a
        restore must reproduce exactly)."""
        return self._fleet.hold_stats()


_REPLAY: dict[str, Callable[[ReplayBuffer, Record], None]] = {
    # journal records: one per state change
    "accept": lambda b, r: b._apply_accept(
        from_map(Group, r["group"]),
        float(r["accepted_at"]),
        str(r.get("generator", "")),
        str(r.get("holder", "")),
    ),
    "horizon": lambda b, r: b._fleet.apply_horizon(str(r["generator"]), str(r["holder"]), int(r["below"])),
    "duplicate": lambda b, r: b._queue.apply_duplicates(int(r["count"])),
    "reject_groups": lambda b, r: b._apply_rejected(b._rejected_groups, r["reason"], int(r["count"])),
    "reject_message": lambda b, r: b._apply_rejected(b._rejected_messages, r["reason"], int(r["count"])),
    "credit": lambda b, r: b._fleet.apply_credit(
        r["generator"],
        int(r["outstanding"]),
        int(r["granted"]),
        int(r["uncredited"]),
        int(r["released"]),
        r.get("filtered_total"),
        None if r.get("request_id") is None else int(r["request_id"]),
    ),
    "expire": lambda b, r: b._fleet.apply_expire(r["generator"]),
    "hello": lambda b, r: b._fleet.apply_hello(str(r["generator"]), str(r["holder"])),
    "lease": lambda b, r: b._queue.apply_lease(
        int(r["learner_version"]),
        list(r["group_ids"]),
        list(r["dropped"]),
        r["max_staleness_served"],
        r.get("request_id"),
    ),
    "commit": lambda b, r: b._queue.apply_commit(
        int(r["learner_version"]), list(r["done"]), list(r["reused"]), int(r["unknown"]), r.get("request_id")
    ),
    "retry": lambda b, r: b._apply_retry(),
    "config": lambda b, r: b._apply_config(dict(r["settings"])),
    "requeue": lambda b, r: b._queue.apply_requeue(int(r["learner_version"]), int(r["committed_through"])),
    "version": lambda b, r: b._queue.apply_version(int(r["learner_version"])),
    # snapshot records: the whole state
    "state": lambda b, r: b._apply_state(r),
    "seen": lambda b, r: b._queue.apply_seen(r),
    "group": lambda b, r: b._queue.apply_snapshot_group(r),
}
"""How each persisted record kind is applied on restore (live changes call the same methods): by
the fleet, the queue, or the buffer itself for what spans both."""

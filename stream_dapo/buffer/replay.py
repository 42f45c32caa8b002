"""The replay buffer as a pure state machine: admission credits, the lifecycle of a group,
the staleness gate at dequeue, and an effect log that makes it durable.

No sockets, no threads, no files: the service feeds it decoded messages, a `Persistence` sink
receives one record per state change, and `ReplayBuffer.restore` rebuilds the exact state from
those records (a snapshot followed by the journal tail). Every mutation goes through the same
`_apply_*` methods live and on replay, so "what was logged" and "what the buffer holds" cannot
drift apart.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stream_dapo.transport.codec import wire_bytes
from stream_dapo.transport.messages import MAX_FILTERED_TOTAL, Group, from_map, to_map

__all__ = [
    "AddResult",
    "AdmissionPolicy",
    "BufferInputError",
    "CommitResult",
    "GroupState",
    "MemoryLog",
    "Persistence",
    "ReplayBuffer",
    "ServeResult",
]

SNAPSHOT_FORMAT = 3
"""Version of the `state` record (2: readable record keys, `journal.migrate_record` upgrades 1;
3: adds "senders", the id horizon of each generator process; a format-2 state has none)."""
READABLE_SNAPSHOT_FORMATS = (2, 3)
SEEN_IDS_PER_RECORD = 10_000
"""Seen ids are snapshotted in chunks so that no single record grows with the length of the run."""
SENDERS_PER_GENERATOR = 4
"""Processes (holders) per generator id whose id horizon the buffer keeps: the current one and the
three before it. Numbered groups from an older holder of the id are refused ("retired_sender"):
that process lost the id to a successor long ago, and the buffer no longer knows what it sent."""

Record = dict[str, Any]


class BufferInputError(ValueError):
    """A caller passed something the buffer cannot act on; the message says what to pass."""

    reason = "bad_request"
    """The `error` reply's reason."""


class GeneratorIdTaken(BufferInputError):
    """A hello for a generator id that another live process holds (two generators with one --index)."""

    reason = "generator_id_taken"


class GroupState(enum.Enum):
    """Where a group is in its life. COMMITTED groups are forgotten except for their id."""

    WAITING = "waiting"
    """Accepted, acknowledged and durable; queued for the learner."""
    LEASED = "leased"
    """Served to the learner, not yet in one of its checkpoints."""
    COMMITTED = "committed"
    """In a learner checkpoint (or dropped as stale): only the id is kept, to drop resends, and only
    while its sender may still resend it (see `_Sender`); then the group is forgotten entirely."""


# --------------------------------------------------------------------------------------------------
# Admission policy (the rule itself lives in stream_dapo.core.admission)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionPolicy:
    """The numbers the buffer decides with, taken from the config once."""

    admission_capacity: int
    """`AdmissionRule.capacity`: waiting groups + outstanding credits never exceed it."""
    capacity_groups: int
    """buffer.capacity_groups: hard cap on waiting + leased; credits never exceed it either."""
    groups_per_version: int
    """B_v: the i-th group of a rollout is trained at learner version v + floor(i / B_v)."""
    max_staleness: int
    max_reuse: int
    group_size: int
    lockstep: bool = False
    """run.mode = "sync": credits only for the rollout batch the learner is about to take, granted
    once it has trained the previous one (generators wait for that version's weights)."""
    rollout_batch_prompts: int = 0
    """R: groups per rollout batch (learner.rollout_batch_prompts); used in lock-step mode."""
    generator_lease_s: float = 30.0
    """buffer.generator_lease_s: a generator's credits expire this long after it was last heard from."""
    in_flight_hold_s: float = 0.0
    """buffer.in_flight_hold_s: how long `serve` may hold the learner for reported in-flight groups
    (0: never)."""

    def __post_init__(self) -> None:
        for name in ("capacity_groups", "groups_per_version", "max_reuse", "group_size"):
            if getattr(self, name) < 1:
                raise BufferInputError(f"AdmissionPolicy.{name} must be >= 1, got {getattr(self, name)}")
        if self.admission_capacity < 0 or self.max_staleness < 0:
            raise BufferInputError("AdmissionPolicy.admission_capacity and max_staleness must be >= 0")
        if self.in_flight_hold_s < 0:
            raise BufferInputError(
                f"AdmissionPolicy.in_flight_hold_s must be >= 0, got {self.in_flight_hold_s}"
            )


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


@dataclass
class ServeResult:
    """One batch: the groups in training order, what the staleness gate dropped, and the
    staleness (versions) each served group will have at its gradient step."""

    groups: list[Group]
    dropped_stale: list[str]
    staleness: list[int]
    retried: bool = False
    """The request repeated the last lease's request id: `groups` is that lease again (what is
    still leased of it), and nothing was counted a second time."""
    held: bool = False
    """Fewer groups than asked (maybe none) were served although more were waiting: serving them
    would make a reported in-flight group too stale to train when it arrives (`ReplayBuffer.serve`)."""


@dataclass
class CommitResult:
    committed: list[str]
    """Groups now in a checkpoint and forgotten (except their id)."""
    reused: list[str]
    """Committed groups that went back to WAITING because buffer.max_reuse allows another use."""
    unknown: list[str]
    """Ids that were not waiting or leased (already committed, or never seen): ignored."""
    retried: bool = False
    """The request repeated the last commit's request id: nothing was applied a second time."""


@dataclass
class _Sender:
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


@dataclass
class _Entry:
    group: Group
    accepted_at: float
    """Wall-clock time of acceptance (Unix seconds, persisted): a timestamp for people, never a duration."""
    since: float
    """The buffer's monotonic clock at acceptance, or at restore for a restored group (ages count
    from there: a wall-clock step must not age a group)."""
    uses: int = 0
    """Times the group was committed (trained into a checkpoint)."""


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
    short of the version at which it would arrive too stale (`_hold_room`, buffer.in_flight_hold_s).

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

    Every state change is one record handed to `persistence`; `restore` replays them.
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
        self._waiting: OrderedDict[str, _Entry] = OrderedDict()
        self._leased: OrderedDict[str, _Entry] = OrderedDict()
        self._seen: set[str] = set()
        """Ids of accepted groups that no sender numbered (older generators, state files written
        before id horizons): kept for good, as every id used to be."""
        self._senders: dict[str, OrderedDict[str, _Sender]] = {}
        """Per generator id, its last SENDERS_PER_GENERATOR holders (oldest first) and their id
        horizons (persisted): the ids of numbered groups (see `_Sender`)."""
        self._credits: dict[str, int] = {}
        self._last_grant: dict[str, tuple[int, int]] = {}
        """Per generator, (request id, credits granted) of its last credit request that was granted
        any: a repeat of that request (the reply was lost) gets the same grant, not a second one."""
        self._counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._rejected_messages: dict[str, int] = {}
        self._rejected_groups: dict[str, int] = {}
        self._max_staleness_served: int | None = None
        self.learner_version = 0
        self.committed_through = 0
        self.run_config: dict[str, Any] | None = None
        """The settings the state was built under, as the service recorded them (`record_config`;
        persisted; None in state files from before it did): opaque here, compared by the service."""
        # Groups served so far at learner version _pos_version: a rollout batch fetched in several
        # requests keeps counting positions, so the gate knows when each group will be trained.
        self._pos_version = -1
        self._pos = 0
        # Request ids of the last lease (with what it leased) and of the last commit: a learner that
        # gave up waiting (a stalled buffer) resends the same request, which must not lease a
        # second batch, or apply a commit twice (a second use of a reusable group).
        self._last_lease: tuple[int, list[str]] | None = None
        self._last_commit_rid: int | None = None
        # Credit leases. `_filtered` (persisted): the last filtered_total each generator reported.
        # `_last_seen` (not persisted: liveness, not state): when each generator was last heard
        # from; after a restart every generator starts with a full lease (`_started_at`).
        self._filtered: dict[str, int] = {}
        self._holders: dict[str, str] = {}
        """Per generator id, the process that said hello with it last (persisted): while that one is
        live, no other process may use the id (`generator_hello`)."""
        self._last_seen: dict[str, float] = {}
        self._expired: set[str] = set()
        self._started_at = clock()
        # In-flight reports (not persisted either: a generator reports in full with every heartbeat
        # and every groups message): per generator, the start version of each group it has started
        # and not yet sent. `serve` holds the learner back for them.
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
        _check_id(generator_id, "generator_id")
        current = self._holders.get(generator_id)
        if current and holder != current and self._is_live(generator_id):
            silent = self._clock() - self._last_seen.get(generator_id, self._started_at)
            raise GeneratorIdTaken(
                f"generator_id {generator_id!r} is held by {current} (heard from {silent:.1f} s ago), so "
                f"{holder or 'this process'} may not use it: two generators run with one id (--index). Give "
                f"each its own --index; a restarted generator gets in once its predecessor's lease of "
                f"{self.policy.generator_lease_s:g} s (buffer.generator_lease_s) has run out"
            )
        if holder and holder != current:
            self._log({"kind": "hello", "generator": generator_id, "holder": holder})
            self._apply_hello(generator_id, holder)
        self._heard_from(generator_id)
        self._expired.discard(generator_id)
        self._in_flight.pop(generator_id, None)  # a new process: its predecessor's groups are gone
        held = self._credits.get(generator_id, 0)
        if held or self._filtered.get(generator_id):
            self._log_credit(generator_id, 0, granted=0, uncredited=0, released=held, filtered_total=0)
        return self.learner_version

    def heartbeat(self, generator_id: str, filtered_total: int) -> tuple[int, bool]:
        """The generator is alive: its lease is renewed and its filtered_total applied. Returns the
        credits the buffer counts as its, and whether they expired since it was last heard from
        (told once: the generator then drops the credits it holds)."""
        self._heard_from(generator_id)
        self._apply_filtered_total(generator_id, filtered_total)
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
            self._apply_expire(gen)
            self._expired.add(gen)
        return gone

    def report_in_flight(self, generator_id: str, versions: Sequence[int] | None) -> None:
        """A generator's full report of its in-flight groups: the policy version each was started at
        (started and not yet sent: in its engine or its verifier). None: it did not report (an older
        generator), nothing changes. Soft state like liveness: not journaled."""
        if versions is None:
            return
        _check_id(generator_id, "generator_id")
        for v in versions:
            _check_version(v, "in_flight_versions[i]")
        if versions:
            self._in_flight[generator_id] = tuple(sorted(versions))
        else:
            self._in_flight.pop(generator_id, None)

    def _hold_room(self, learner_version: int, pos: int) -> tuple[int, int] | None:
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

    def _is_live(self, generator_id: str) -> bool:
        """Heard from within generator_lease_s (after a restart, every generator gets a full lease)."""
        since = self._clock() - self._last_seen.get(generator_id, self._started_at)
        return since <= self.policy.generator_lease_s

    def holder_of(self, generator_id: str) -> str | None:
        """The process that holds `generator_id` (its last hello's), if any said hello with one."""
        return self._holders.get(generator_id)

    def _heard_from(self, generator_id: str) -> None:
        _check_id(generator_id, "generator_id")
        self._last_seen[generator_id] = self._clock()

    def _apply_filtered_total(self, generator_id: str, filtered_total: int) -> None:
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
            self._redeem(generator_id, new, filtered_total=filtered_total)

    def _redeem(self, generator_id: str, n: int, filtered_total: int | None = None) -> None:
        held = self._credits.get(generator_id, 0)
        self._log_credit(
            generator_id,
            max(0, held - n),
            granted=0,
            uncredited=max(0, n - held),
            released=0,
            filtered_total=filtered_total,
        )

    def grant_credits(self, generator_id: str, want: int, request_id: int | None = None) -> int:
        """Grant up to `want` credits, as many as the admission line has room for.

        A `request_id` equal to that of the generator's last granted request is a repeat of it (its
        reply was lost: the buffer restarted after journaling the grant, or the link dropped): it
        gets the same number again and nothing more is counted against the line. Without this, a
        grant journaled but never delivered would count against the line forever while the
        generator holds nothing, and admission would stall.
        """
        self._heard_from(generator_id)
        if not isinstance(want, int) or want < 0:
            raise BufferInputError(
                f"want must be an int >= 0 (credits the generator could use now), got {want!r}"
            )
        last = self._last_grant.get(generator_id)
        if request_id is not None and last is not None and last[0] == request_id:
            self._count_retry()
            return last[1]
        granted = min(want, self.grantable)
        if granted:
            out = self._credits.get(generator_id, 0) + granted
            self._log_credit(generator_id, out, granted=granted, uncredited=0, released=0, rid=request_id)
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
        (`Group.seq`) by `holder`, if that sender's id horizon knows it (`_Sender`), or, when not
        numbered, if its id was ever accepted. `acked_below` (the sender's, see `Groups`) advances
        its horizon first: ids below it are forgotten. Numbered groups from a holder that is not
        one of the id's last SENDERS_PER_GENERATOR are rejected ("retired_sender").
        """
        self._heard_from(generator_id)
        if filtered_total is not None:
            self._apply_filtered_total(generator_id, filtered_total)
        sender = self._sender(generator_id, holder)
        if sender is not None and acked_below is not None:
            self._check_count(acked_below, "acked_below")
            if acked_below > sender.below:
                self._log(
                    {"kind": "horizon", "generator": generator_id, "holder": holder, "below": acked_below}
                )
                self._apply_horizon(generator_id, holder, acked_below)
        result = AddResult()
        seen_now: set[str] = set()
        reasons: dict[str, int] = {}
        for group in groups:
            gid = group.group_id
            numbered = group.seq is not None and bool(holder)
            if gid in seen_now or gid in self._waiting or gid in self._leased:
                duplicate = True
            elif numbered:
                duplicate = sender is not None and sender.knows(group)
            else:
                duplicate = gid in self._seen
            if duplicate:
                result.duplicates.append(gid)
                continue
            reason = "retired_sender" if numbered and sender is None else self._rejection_reason(group)
            if reason is not None:
                result.rejected.append((gid, reason))
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            seen_now.add(gid)
            at = self._wall_clock()
            record: Record = {"kind": "accept", "group": to_map(group), "accepted_at": at}
            if numbered:
                record["generator"], record["holder"] = generator_id, holder
            self._log(record)
            self._apply_accept(group, at, generator_id if numbered else "", holder if numbered else "")
            result.accepted.append(gid)
        if result.duplicates:
            self._log({"kind": "duplicate", "count": len(result.duplicates)})
            self._apply_duplicates(len(result.duplicates))
        for reason, n in reasons.items():
            self._log({"kind": "reject_groups", "reason": reason, "count": n})
            self._apply_rejected(self._rejected_groups, reason, n)
        # A retired sender's credits went back when its lease ran out: its groups redeem none (they
        # would take the credits of the id's current holder).
        redeemed = len(result.accepted) + len(result.rejected) - reasons.get("retired_sender", 0)
        if redeemed:
            self._redeem(generator_id, redeemed)
        return result

    @staticmethod
    def _check_count(value: Any, name: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BufferInputError(f"{name} must be an int >= 0, got {value!r}")

    def _rejection_reason(self, group: Group) -> str | None:
        if group.num_samples != self.policy.group_size:
            return "wrong_group_size"
        if self.stored >= self.policy.capacity_groups:
            # Only reachable by groups sent without a credit: credits never exceed the cap.
            return "buffer_full"
        return None

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
        self._apply_credit(gen, out, granted, uncredited, released, filtered_total, rid)

    # ---------------------------------------------------------------------------------- learner

    def learner_hello(self, learner_version: int, committed_through: int) -> int:
        """The learner (re)started from its checkpoint at `learner_version`: whatever it had
        leased is lost with its process, so every LEASED group returns to the front of the
        queue, in the order it was served. Returns how many were requeued."""
        _check_version(learner_version, "learner_version")
        _check_version(committed_through, "committed_through")
        n = len(self._leased)
        self._log(
            {"kind": "requeue", "learner_version": learner_version, "committed_through": committed_through}
        )
        self._apply_requeue(learner_version, committed_through)
        return n

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
        older than that is dropped (kept only as a seen id) and counted, never served.

        A `request_id` equal to the last lease's is a retry of that request: it gets the same lease.
        """
        _check_version(learner_version, "learner_version")
        if request_id is not None and self._last_lease is not None and self._last_lease[0] == request_id:
            self._count_retry()
            ids = [gid for gid in self._last_lease[1] if gid in self._leased]
            return ServeResult([self._leased[gid].group for gid in ids], [], [], retried=True)
        if not isinstance(max_groups, int) or max_groups < 1:
            raise BufferInputError(f"max_groups must be an int >= 1, got {max_groups!r}")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise BufferInputError(f"max_tokens must be an int >= 0 (0: no token budget), got {max_tokens!r}")
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise BufferInputError(f"max_bytes must be an int >= 0 (0: no size budget), got {max_bytes!r}")
        pos = self._pos if self._pos_version == learner_version else 0
        room = self._hold_room(learner_version, pos)
        if room is not None and room[0] < max_groups and len(self._waiting) > room[0]:
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
        held = False
        chosen: list[str] = []
        dropped: list[str] = []
        staleness: list[int] = []
        tokens = 0
        nbytes = 0
        for gid, entry in self._in_serving_order():
            if len(chosen) >= max_groups:
                break
            trained_at = learner_version + (pos + len(chosen)) // self.policy.groups_per_version
            stale = trained_at - entry.group.min_version
            if stale > self.policy.max_staleness:
                dropped.append(gid)
                continue
            if room is not None and len(chosen) >= room[0]:
                held = True
                break
            n = entry.group.num_tokens
            size = wire_bytes(entry.group)
            if chosen and (
                (max_tokens and tokens + n > max_tokens) or (max_bytes and nbytes + size > max_bytes)
            ):
                break
            chosen.append(gid)
            staleness.append(stale)
            tokens += n
            nbytes += size
        groups = [self._waiting[gid].group for gid in chosen]
        if chosen or dropped:
            smax = max(staleness) if staleness else None
            self._log(
                {
                    "kind": "lease",
                    "learner_version": learner_version,
                    "group_ids": chosen,
                    "dropped": dropped,
                    "max_staleness_served": smax,
                    "request_id": request_id,
                }
            )
            self._apply_lease(learner_version, chosen, dropped, smax, request_id)
        else:
            self._note_version(learner_version)
        self.holds += held
        return ServeResult(groups, dropped, staleness, held=held)

    def _in_serving_order(self) -> list[tuple[str, _Entry]]:
        """Waiting groups oldest policy first (by the version of their oldest token), then in
        arrival order.

        Groups finish out of order: a long group started before a burst of short ones arrives
        after them. Served in arrival order it would wait behind groups that were credited after
        it and could cross max_staleness; served by age, the line behaves as the admission bound
        assumes (a group is trained in the order it was credited), so the gate stays a backstop.
        """
        return sorted(self._waiting.items(), key=lambda item: item[1].group.min_version)

    def commit(
        self, learner_version: int, group_ids: Sequence[str], request_id: int | None = None
    ) -> CommitResult:
        """The learner checkpointed these groups. Waiting ones count too: a commit resent after
        a `learner_hello` must still retire groups that the hello requeued. A `request_id` equal to
        the last commit's is a retry: already applied, nothing changes."""
        _check_version(learner_version, "learner_version")
        if request_id is not None and request_id == self._last_commit_rid:
            self._count_retry()
            return CommitResult([], [], [], retried=True)
        done: list[str] = []
        reuse: list[str] = []
        unknown: list[str] = []
        for gid in dict.fromkeys(group_ids):  # ordered de-duplication
            entry = self._leased.get(gid) or self._waiting.get(gid)
            if entry is None:
                unknown.append(gid)
            elif entry.uses + 1 < self.policy.max_reuse:
                reuse.append(gid)
            else:
                done.append(gid)
        if done or reuse or unknown:
            record = {
                "kind": "commit",
                "learner_version": learner_version,
                "done": done,
                "reused": reuse,
                "unknown": len(unknown),
                "request_id": request_id,
            }
            self._log(record)
            self._apply_commit(learner_version, done, reuse, len(unknown), request_id)
        else:
            self._note_version(learner_version)
        return CommitResult(done, reuse, unknown)

    def _count_retry(self) -> None:
        self._log({"kind": "retry"})
        self._apply_retry()

    def _apply_expire(self, gen: str) -> None:
        self._counters["generators_expired"] += 1
        self._last_seen.pop(gen, None)
        self._in_flight.pop(gen, None)
        self._last_grant.pop(gen, None)  # its credits went back: a repeat of its request is granted anew

    def _apply_retry(self) -> None:
        self._counters["retried_requests"] += 1

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

    def _apply_config(self, settings: dict[str, Any]) -> None:
        self.run_config = settings

    def _note_version(self, v: int) -> None:
        if v != self.learner_version:
            self._log({"kind": "version", "learner_version": v})
            self._apply_version(v)

    # ---------------------------------------------------------------------------------- apply

    def _apply_accept(self, group: Group, at: float, gen: str = "", holder: str = "") -> None:
        self._waiting[group.group_id] = _Entry(group, at, self._clock())
        sender = self._sender(gen, holder)
        if sender is not None and group.seq is not None:
            if group.seq >= sender.below:
                sender.ids[group.group_id] = group.seq
        else:
            self._seen.add(group.group_id)
        self._counters["accepted"] += 1

    def _sender(self, gen: str, holder: str) -> _Sender | None:
        senders = self._senders.get(gen)
        return senders.get(holder) if senders is not None and holder else None

    def _apply_hello(self, gen: str, holder: str) -> None:
        """`holder` now holds generator id `gen`: it gets an id horizon of its own; the oldest of
        the id's holders beyond SENDERS_PER_GENERATOR is retired (its ids forgotten)."""
        self._holders[gen] = holder
        senders = self._senders.setdefault(gen, OrderedDict())
        if holder in senders:
            senders.move_to_end(holder)
            return
        senders[holder] = _Sender()
        while len(senders) > SENDERS_PER_GENERATOR:
            senders.popitem(last=False)

    def _apply_horizon(self, gen: str, holder: str, below: int) -> None:
        self._senders[gen][holder].advance(below)

    def _apply_duplicates(self, n: int) -> None:
        self._counters["duplicates"] += n

    def _apply_version(self, v: int) -> None:
        self.learner_version = v

    def _apply_rejected(self, table: dict[str, int], reason: str, n: int) -> None:
        table[reason] = table.get(reason, 0) + n

    def _apply_credit(
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
        self._counters["credits_granted"] += granted
        self._counters["uncredited"] += uncredited
        self._counters["credits_released"] += released

    def _apply_lease(
        self, v: int, ids: list[str], drop: list[str], smax: int | None, rid: int | None = None
    ) -> None:
        self.learner_version = v
        if rid is not None:
            self._last_lease = (rid, list(ids))
        if self._pos_version != v:
            self._pos_version, self._pos = v, 0
        self._pos += len(ids)
        for gid in ids:
            self._leased[gid] = self._waiting.pop(gid)
        for gid in drop:
            del self._waiting[gid]
        self._counters["served"] += len(ids)
        self._counters["dropped_stale"] += len(drop)
        if smax is not None:
            best = self._max_staleness_served
            self._max_staleness_served = smax if best is None else max(best, smax)

    def _apply_commit(
        self, v: int, done: list[str], reuse: list[str], unknown: int, rid: int | None = None
    ) -> None:
        self.learner_version = v
        if rid is not None:
            self._last_commit_rid = rid
        for gid in done:
            self._leased.pop(gid, None) or self._waiting.pop(gid)
        for gid in reuse:
            entry = self._leased.pop(gid, None) or self._waiting.pop(gid)
            entry.uses += 1
            self._waiting[gid] = entry  # to the back: a reused group is the least urgent
        self._counters["committed"] += len(done) + len(reuse)
        self._counters["reused"] += len(reuse)
        self._counters["commit_unknown"] += unknown

    def _apply_requeue(self, v: int, through: int) -> None:
        leased = list(self._leased.items())
        self._leased.clear()
        for gid, entry in reversed(leased):
            self._waiting[gid] = entry
            self._waiting.move_to_end(gid, last=False)
        self._counters["requeued"] += len(leased)
        self.learner_version = v
        self.committed_through = through
        self._pos_version, self._pos = -1, 0
        self._last_lease = None  # its groups are back in line: a retry of it leases anew

    # ---------------------------------------------------------------------------------- snapshot

    def snapshot_records(self) -> Iterator[Record]:
        """The whole state as records that `restore` accepts: state, seen ids, then groups in
        queue order (waiting front to back, then leased in serve order)."""
        yield {
            "kind": "state",
            "format": SNAPSHOT_FORMAT,
            "counters": dict(self._counters),
            "rejected_messages": dict(self._rejected_messages),
            "rejected_groups": dict(self._rejected_groups),
            # A list of pairs, not a map: there may be more generators than a map may have keys.
            "credits": [[gen, n] for gen, n in self._credits.items()],
            "filtered": [[gen, n] for gen, n in self._filtered.items()],
            "holders": [[gen, holder] for gen, holder in self._holders.items()],
            "learner_version": self.learner_version,
            "committed_through": self.committed_through,
            "position": [self._pos_version, self._pos],
            "max_staleness_served": self._max_staleness_served,
            "last_lease": None if self._last_lease is None else [self._last_lease[0], self._last_lease[1]],
            "last_commit_request_id": self._last_commit_rid,
            "last_grants": [[gen, rid, n] for gen, (rid, n) in self._last_grant.items()],
            "config": self.run_config,
            # Per generator id, oldest holder first: [generator, holder, below, ids, seqs].
            "senders": [
                [gen, holder, sender.below, list(sender.ids), list(sender.ids.values())]
                for gen, senders in self._senders.items()
                for holder, sender in senders.items()
            ],
        }
        ids = sorted(self._seen)
        for start in range(0, len(ids), SEEN_IDS_PER_RECORD):
            yield {"kind": "seen", "group_ids": ids[start : start + SEEN_IDS_PER_RECORD]}
        for state, table in ((GroupState.WAITING, self._waiting), (GroupState.LEASED, self._leased)):
            for entry in table.values():
                yield {
                    "kind": "group",
                    "state": state.value,
                    "uses": entry.uses,
                    "accepted_at": entry.accepted_at,
                    "group": to_map(entry.group),
                }

    def _apply_state(self, r: Record) -> None:
        if r["format"] not in READABLE_SNAPSHOT_FORMATS:
            raise ValueError(f"snapshot format {r['format']} is not one of {READABLE_SNAPSHOT_FORMATS}")
        for name, value in r["counters"].items():
            if name in self._counters:
                self._counters[name] = int(value)
        self._rejected_messages = {str(k): int(v) for k, v in r["rejected_messages"].items()}
        self._rejected_groups = {str(k): int(v) for k, v in r["rejected_groups"].items()}
        self._credits = {str(gen): int(n) for gen, n in r["credits"] if int(n) > 0}
        self._filtered = {str(gen): int(n) for gen, n in r.get("filtered", []) if int(n) > 0}
        self._holders = {str(gen): str(holder) for gen, holder in r.get("holders", [])}
        self.learner_version = int(r["learner_version"])
        self.committed_through = int(r["committed_through"])
        self._pos_version, self._pos = (int(x) for x in r["position"])
        smax = r["max_staleness_served"]
        self._max_staleness_served = None if smax is None else int(smax)
        lease = r.get("last_lease")
        self._last_lease = None if lease is None else (int(lease[0]), [str(g) for g in lease[1]])
        rid = r.get("last_commit_request_id")
        self._last_commit_rid = None if rid is None else int(rid)
        self._last_grant = {str(gen): (int(rid), int(n)) for gen, rid, n in r.get("last_grants", [])}
        config = r.get("config")
        self.run_config = None if config is None else dict(config)
        self._senders = {}
        for gen, holder, below, ids, seqs in r.get("senders", []):
            if len(ids) != len(seqs):
                raise ValueError(f"sender {holder!r} of {gen!r}: {len(ids)} ids but {len(seqs)} seqs")
            sender = _Sender(int(below), {str(gid): int(seq) for gid, seq in zip(ids, seqs, strict=True)})
            self._senders.setdefault(str(gen), OrderedDict())[str(holder)] = sender
        for gen, holder in self._holders.items():  # a format-2 state: holders without horizons yet
            if self._sender(gen, holder) is None:
                self._senders.setdefault(gen, OrderedDict())[holder] = _Sender()

    def _apply_snapshot_group(self, r: Record) -> None:
        group = from_map(Group, r["group"])
        entry = _Entry(group, float(r["accepted_at"]), self._clock(), int(r["uses"]))
        table = self._waiting if GroupState(r["state"]) is GroupState.WAITING else self._leased
        table[group.group_id] = entry  # its id is in a "seen" record, or in its sender's ids

    # ---------------------------------------------------------------------------------- views

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_leased(self) -> int:
        return len(self._leased)

    @property
    def stored(self) -> int:
        """Groups stored: waiting + leased."""
        return len(self._waiting) + len(self._leased)

    @property
    def credits_outstanding(self) -> int:
        return sum(self._credits.values())

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

    @property
    def seen_ids(self) -> int:
        """Ids kept to drop resends: unnumbered ones (kept for good) + each sender's above its horizon."""
        return len(self._seen) + sum(
            len(s.ids) for senders in self._senders.values() for s in senders.values()
        )

    def credits_of(self, generator_id: str) -> int:
        return self._credits.get(generator_id, 0)

    @property
    def admitted(self) -> int:
        """Groups admitted and not yet served (the admission line): waiting groups + outstanding
        credits, which may still turn into groups. `stats()` reports it as "line"."""
        return len(self._waiting) + self.credits_outstanding

    @property
    def admission_limit(self) -> int:
        """What `admitted` may reach now: the policy's admission capacity, less what leased groups
        take of capacity_groups. `stats()` reports it as "line_capacity"."""
        return max(0, min(self.policy.admission_capacity, self.policy.capacity_groups - len(self._leased)))

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
        return self._pos if self._pos_version == self.learner_version else 0

    def waiting_ids(self) -> list[str]:
        return list(self._waiting)

    def leased_ids(self) -> list[str]:
        return list(self._leased)

    def state_of(self, group_id: str) -> GroupState | None:
        if group_id in self._waiting:
            return GroupState.WAITING
        if group_id in self._leased:
            return GroupState.LEASED
        if group_id in self._seen or any(
            group_id in sender.ids for senders in self._senders.values() for sender in senders.values()
        ):
            return GroupState.COMMITTED
        return None

    def oldest_waiting_age_s(self) -> float:
        """Seconds since the group at the front of the queue was accepted (0 when empty)."""
        if not self._waiting:
            return 0.0
        front = next(iter(self._waiting.values()))
        return max(0.0, self._clock() - front.since)

    def stats(self) -> dict[str, Any]:
        """Counters and depths for the run summary and the metrics exporter (plain JSON types)."""
        return {
            **self._counters,
            "rejected_messages": dict(self._rejected_messages),
            "rejected_groups": dict(self._rejected_groups),
            "credits_outstanding": self.credits_outstanding,
            "max_staleness_served": self._max_staleness_served,
            "waiting": len(self._waiting),
            "leased": len(self._leased),
            "seen_ids": self.seen_ids,
            "line": self.admitted,
            "line_capacity": self.admission_limit,
            "learner_version": self.learner_version,
            "committed_through": self.committed_through,
        }

    def hold_stats(self) -> dict[str, int]:
        """The learner hold's figures (soft state, not restored, so not in `stats()`, whose state a
        restore must reproduce exactly)."""
        return {
            "in_flight_reported": sum(len(v) for v in self._in_flight.values()),
            "holds": self.holds,
            "holds_expired": self.holds_expired,
        }


_REPLAY: dict[str, Callable[[ReplayBuffer, Record], None]] = {
    # journal records: one per state change
    "accept": lambda b, r: b._apply_accept(
        from_map(Group, r["group"]),
        float(r["accepted_at"]),
        str(r.get("generator", "")),
        str(r.get("holder", "")),
    ),
    "horizon": lambda b, r: b._apply_horizon(str(r["generator"]), str(r["holder"]), int(r["below"])),
    "duplicate": lambda b, r: b._apply_duplicates(int(r["count"])),
    "reject_groups": lambda b, r: b._apply_rejected(b._rejected_groups, r["reason"], int(r["count"])),
    "reject_message": lambda b, r: b._apply_rejected(b._rejected_messages, r["reason"], int(r["count"])),
    "credit": lambda b, r: b._apply_credit(
        r["generator"],
        int(r["outstanding"]),
        int(r["granted"]),
        int(r["uncredited"]),
        int(r["released"]),
        r.get("filtered_total"),
        None if r.get("request_id") is None else int(r["request_id"]),
    ),
    "expire": lambda b, r: b._apply_expire(r["generator"]),
    "hello": lambda b, r: b._apply_hello(str(r["generator"]), str(r["holder"])),
    "lease": lambda b, r: b._apply_lease(
        int(r["learner_version"]),
        list(r["group_ids"]),
        list(r["dropped"]),
        r["max_staleness_served"],
        r.get("request_id"),
    ),
    "commit": lambda b, r: b._apply_commit(
        int(r["learner_version"]), list(r["done"]), list(r["reused"]), int(r["unknown"]), r.get("request_id")
    ),
    "retry": lambda b, r: b._apply_retry(),
    "config": lambda b, r: b._apply_config(dict(r["settings"])),
    "requeue": lambda b, r: b._apply_requeue(int(r["learner_version"]), int(r["committed_through"])),
    "version": lambda b, r: b._apply_version(int(r["learner_version"])),
    # snapshot records: the whole state
    "state": lambda b, r: b._apply_state(r),
    "seen": lambda b, r: b._seen.update(r["group_ids"]),
    "group": lambda b, r: b._apply_snapshot_group(r),
}
"""How each persisted record kind is applied on restore (live changes call the same methods)."""


def _check_id(value: Any, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise BufferInputError(f"{name} must be a non-empty string, got {value!r}")


def _check_version(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BufferInputError(f"{name} must be an int >= 0 (optimizer steps taken), got {value!r}")

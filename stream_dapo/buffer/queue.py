"""The queue of the replay buffer: whole groups waiting for the learner and leased to it, the ids
kept to drop resends, the staleness gate at dequeue, commits and the requeue on a learner restart.

One half of `ReplayBuffer`'s state machine (the other is `fleet.Fleet`): no sockets, no threads, no
files. Every change is one record handed to `log` and applied by one `apply_*` method, live and on
replay (`ReplayBuffer.restore`).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from stream_dapo.buffer.policy import AdmissionPolicy, BufferInputError, Record, check_version
from stream_dapo.transport.codec import wire_bytes
from stream_dapo.transport.messages import Group, from_map, to_map

__all__ = ["QUEUE_COUNTERS", "SEEN_IDS_PER_RECORD", "CommitResult", "GroupQueue", "GroupState", "ServeResult"]

SEEN_IDS_PER_RECORD = 10_000
"""Seen ids are snapshotted in chunks so that no single record grows with the length of the run."""

QUEUE_COUNTERS = (
    "accepted",
    "duplicates",
    "served",
    "committed",
    "reused",
    "commit_unknown",
    "requeued",
    "dropped_stale",
)
"""The `ReplayBuffer.stats()` counters the queue keeps."""


class GroupState(enum.Enum):
    """Where a group is in its life. COMMITTED groups are forgotten except for their id."""

    WAITING = "waiting"
    """Accepted, acknowledged and durable; queued for the learner."""
    LEASED = "leased"
    """Served to the learner, not yet in one of its checkpoints."""
    COMMITTED = "committed"
    """In a learner checkpoint (or dropped as stale): only the id is kept, to drop resends, and only
    while its sender may still resend it (see `fleet.Sender`); then the group is forgotten entirely."""


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
class _Entry:
    group: Group
    accepted_at: float
    """Wall-clock time of acceptance (Unix seconds, persisted): a timestamp for people, never a duration."""
    since: float
    """The buffer's monotonic clock at acceptance, or at restore for a restored group (ages count
    from there: a wall-clock step must not age a group)."""
    uses: int = 0
    """Times the group was committed (trained into a checkpoint)."""


class GroupQueue:
    """Whole groups from acceptance to commit: WAITING, LEASED, then COMMITTED (see `GroupState`),
    with the learner's version and its request ids as the queue last saw them.

    `seen` holds the ids of accepted groups that no sender numbered (older generators, state files
    written before id horizons), kept for good; numbered groups' ids live with their sender in the
    fleet (`fleet.Sender`), and `ReplayBuffer` asks both.
    """

    def __init__(
        self, policy: AdmissionPolicy, log: Callable[[Record], None], clock: Callable[[], float]
    ) -> None:
        self.policy = policy
        self._log = log
        self._clock = clock
        self.counters: dict[str, int] = dict.fromkeys(QUEUE_COUNTERS, 0)
        self._waiting: OrderedDict[str, _Entry] = OrderedDict()
        self._leased: OrderedDict[str, _Entry] = OrderedDict()
        self.seen: set[str] = set()
        self._max_staleness_served: int | None = None
        self.learner_version = 0
        self.committed_through = 0
        # Groups served so far at learner version _pos_version: a rollout batch fetched in several
        # requests keeps counting positions, so the gate knows when each group will be trained.
        self._pos_version = -1
        self._pos = 0
        # Request ids of the last lease (with what it leased) and of the last commit: a learner that
        # gave up waiting (a stalled buffer) resends the same request, which must not lease a
        # second batch, or apply a commit twice (a second use of a reusable group).
        self._last_lease: tuple[int, list[str]] | None = None
        self._last_commit_rid: int | None = None

    # ---------------------------------------------------------------------------------- learner

    def requeue(self, learner_version: int, committed_through: int) -> int:
        """`ReplayBuffer.learner_hello`: every LEASED group back to the front, in serve order."""
        check_version(learner_version, "learner_version")
        check_version(committed_through, "committed_through")
        n = len(self._leased)
        self._log(
            {"kind": "requeue", "learner_version": learner_version, "committed_through": committed_through}
        )
        self.apply_requeue(learner_version, committed_through)
        return n

    def repeated_lease(self, request_id: int | None) -> ServeResult | None:
        """The last lease again (what is still leased of it) when `request_id` repeats its request."""
        if request_id is None or self._last_lease is None or self._last_lease[0] != request_id:
            return None
        ids = [gid for gid in self._last_lease[1] if gid in self._leased]
        return ServeResult([self._leased[gid].group for gid in ids], [], [], retried=True)

    def position(self, learner_version: int) -> int:
        """Groups already served at `learner_version` (0 once the learner reports a newer one)."""
        return self._pos if self._pos_version == learner_version else 0

    @staticmethod
    def check_budgets(max_groups: int, max_tokens: int, max_bytes: int) -> None:
        if not isinstance(max_groups, int) or max_groups < 1:
            raise BufferInputError(f"max_groups must be an int >= 1, got {max_groups!r}")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise BufferInputError(f"max_tokens must be an int >= 0 (0: no token budget), got {max_tokens!r}")
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise BufferInputError(f"max_bytes must be an int >= 0 (0: no size budget), got {max_bytes!r}")

    def lease(
        self,
        learner_version: int,
        room: int | None,
        max_groups: int,
        max_tokens: int,
        max_bytes: int,
        request_id: int | None,
    ) -> ServeResult:
        """`ReplayBuffer.serve` once the budgets are checked: lease what fits, in serving order,
        stopping at `room` more groups (the in-flight hold; None: no hold), and drop what the
        staleness gate refuses."""
        chosen, dropped, staleness, held = self._choose(
            learner_version, room, max_groups, max_tokens, max_bytes
        )
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
            self.apply_lease(learner_version, chosen, dropped, smax, request_id)
        else:
            self.note_version(learner_version)
            if request_id is not None:
                # An empty answer is this request's answer too: a late copy of it (the learner
                # retried, then read the first reply) must not lease groups that arrived meanwhile,
                # which nobody would wait for. Not journaled: an empty poll changes no group.
                self._last_lease = (request_id, [])
        return ServeResult(groups, dropped, staleness, held=held)

    def _choose(
        self, learner_version: int, room: int | None, max_groups: int, max_tokens: int, max_bytes: int
    ) -> tuple[list[str], list[str], list[int], bool]:
        """(ids to lease, ids the gate drops, the staleness of each leased one, held short by `room`).
        The i-th group served at this learner version is trained at v + floor(i / B_v)."""
        pos = self.position(learner_version)
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
            if room is not None and len(chosen) >= room:
                return chosen, dropped, staleness, True
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
        return chosen, dropped, staleness, False

    def _in_serving_order(self) -> list[tuple[str, _Entry]]:
        """Waiting groups oldest policy first (by the version of their oldest token), then in
        arrival order.

        Groups finish out of order: a long group started before a burst of short ones arrives
        after them. Served in arrival order it would wait behind groups that were credited after
        it and could cross max_staleness; served by age, the line behaves as the admission bound
        assumes (a group is trained in the order it was credited), so the gate stays a backstop.
        """
        return sorted(self._waiting.items(), key=lambda item: item[1].group.min_version)

    def repeats_commit(self, request_id: int | None) -> bool:
        """`request_id` is the last commit's: a retry, already applied."""
        return request_id is not None and request_id == self._last_commit_rid

    def commit(self, learner_version: int, group_ids: Sequence[str], request_id: int | None) -> CommitResult:
        """`ReplayBuffer.commit` once the version is checked and the request is not a retry."""
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
            self.apply_commit(learner_version, done, reuse, len(unknown), request_id)
        else:
            self.note_version(learner_version)
        return CommitResult(done, reuse, unknown)

    def note_version(self, v: int) -> None:
        if v != self.learner_version:
            self._log({"kind": "version", "learner_version": v})
            self.apply_version(v)

    # ---------------------------------------------------------------------------------- views

    def stores(self, group_id: str) -> bool:
        """`group_id` is stored: waiting or leased."""
        return group_id in self._waiting or group_id in self._leased

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_leased(self) -> int:
        return len(self._leased)

    def waiting_ids(self) -> list[str]:
        return list(self._waiting)

    def leased_ids(self) -> list[str]:
        return list(self._leased)

    def state_of(self, group_id: str) -> GroupState | None:
        """WAITING, LEASED, COMMITTED for an unnumbered id kept in `seen`; None otherwise."""
        if group_id in self._waiting:
            return GroupState.WAITING
        if group_id in self._leased:
            return GroupState.LEASED
        if group_id in self.seen:
            return GroupState.COMMITTED
        return None

    def oldest_waiting_age_s(self) -> float:
        """Seconds since the group at the front of the queue was accepted (0 when empty)."""
        if not self._waiting:
            return 0.0
        front = next(iter(self._waiting.values()))
        return max(0.0, self._clock() - front.since)

    @property
    def max_staleness_served(self) -> int | None:
        return self._max_staleness_served

    # ---------------------------------------------------------------------------------- apply

    def apply_accept(self, group: Group, at: float, keep_id: bool) -> None:
        """Part of the "accept" record: the group waits; `keep_id`: no sender keeps its id."""
        self._waiting[group.group_id] = _Entry(group, at, self._clock())
        if keep_id:
            self.seen.add(group.group_id)
        self.counters["accepted"] += 1

    def apply_duplicates(self, n: int) -> None:
        self.counters["duplicates"] += n

    def apply_version(self, v: int) -> None:
        self.learner_version = v

    def apply_lease(
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
        self.counters["served"] += len(ids)
        self.counters["dropped_stale"] += len(drop)
        if smax is not None:
            best = self._max_staleness_served
            self._max_staleness_served = smax if best is None else max(best, smax)

    def apply_commit(
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
        self.counters["committed"] += len(done) + len(reuse)
        self.counters["reused"] += len(reuse)
        self.counters["commit_unknown"] += unknown

    def apply_requeue(self, v: int, through: int) -> None:
        leased = list(self._leased.items())
        self._leased.clear()
        for gid, entry in reversed(leased):
            self._waiting[gid] = entry
            self._waiting.move_to_end(gid, last=False)
        self.counters["requeued"] += len(leased)
        self.learner_version = v
        self.committed_through = through
        self._pos_version, self._pos = -1, 0
        self._last_lease = None  # its groups are back in line: a retry of it leases anew

    # ---------------------------------------------------------------------------------- snapshot

    def snapshot_state(self) -> Record:
        """The queue's fields of the snapshot's `state` record."""
        return {
            "learner_version": self.learner_version,
            "committed_through": self.committed_through,
            "position": [self._pos_version, self._pos],
            "max_staleness_served": self._max_staleness_served,
            "last_lease": None if self._last_lease is None else [self._last_lease[0], self._last_lease[1]],
            "last_commit_request_id": self._last_commit_rid,
        }

    def snapshot_records(self) -> Iterator[Record]:
        """What follows the `state` record: seen ids, then groups in queue order (waiting front to
        back, then leased in serve order)."""
        ids = sorted(self.seen)
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

    def apply_state(self, r: Record) -> None:
        """The queue's part of a snapshot's `state` record."""
        self.learner_version = int(r["learner_version"])
        self.committed_through = int(r["committed_through"])
        self._pos_version, self._pos = (int(x) for x in r["position"])
        smax = r["max_staleness_served"]
        self._max_staleness_served = None if smax is None else int(smax)
        lease = r.get("last_lease")
        self._last_lease = None if lease is None else (int(lease[0]), [str(g) for g in lease[1]])
        rid = r.get("last_commit_request_id")
        self._last_commit_rid = None if rid is None else int(rid)

    def apply_seen(self, r: Record) -> None:
        self.seen.update(r["group_ids"])

    def apply_snapshot_group(self, r: Record) -> None:
        group = from_map(Group, r["group"])
        entry = _Entry(group, float(r["accepted_at"]), self._clock(), int(r["uses"]))
        table = self._waiting if GroupState(r["state"]) is GroupState.WAITING else self._leased
        table[group.group_id] = entry  # its id is in a "seen" record, or in its sender's ids

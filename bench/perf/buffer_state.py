"""The buffer's own state over a long run: memory, snapshot size, compaction and restore time from
1e5 to 1e7 groups (issue 41 item 5).

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.perf.buffer_state \\
        [--checkpoints 100000 1000000 10000000] [--mode horizon|unnumbered] [--generators 8] \\
        [--batch 64] [--compact-every 50000] [--lost-acks 0.01] [--seed 0] [--out FILE.json]

It drives the real `ReplayBuffer` over the real `Journal` in a temporary directory, the way the
service does, with no sockets: `--generators` generator processes (each a real `UnackedGroups`,
holder "gen-i/proc", hello first) send their groups in rounds of `--batch` groups in all; a fraction
`--lost-acks` of acknowledgements is lost, so those groups are resent after the resend timeout (one
round here) and must come back as duplicates; a learner leases and commits every waiting group
each round; the journal is synced once per round (as the service syncs before it replies). Every
`--compact-every` groups it compacts in the service's order (`BufferService._maybe_compact`): the
mark, the state's records and, later, replacing the journal by its uncovered tail on the loop
("in-loop"); the snapshot's encoding, write and fsync, and closing the replaced journal (which frees
its blocks), on the compactor thread ("write"; timed here on the same thread, so "in-loop" is what
the poll loop pays, "write" what the thread takes).

`--mode unnumbered` sends groups without `Group.seq` (a generator from before id horizons): every id
is kept for good, as on main before this change; it is the contrast, not the subject.

At each checkpoint it prints: groups accepted, ids kept, resident memory (VmRSS of this process),
snapshot and journal bytes, the in-loop and write time of the compactions since the previous
checkpoint (median and max over them), and the time to restore a fresh buffer from a copy of the
files (load + replay, one try, in ms). Groups are tiny (G = 2, 3 response tokens): the bench measures the
buffer's bookkeeping, not group storage, which admission already bounds (capacity_groups).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stream_dapo.buffer.journal import Journal
from stream_dapo.buffer.replay import AdmissionPolicy, ReplayBuffer
from stream_dapo.generator.credits import UnackedGroups
from stream_dapo.transport.messages import Group, Sample

G = 2
POLICY = AdmissionPolicy(
    admission_capacity=100_000,
    capacity_groups=100_000,
    groups_per_version=1_000_000,
    max_staleness=1_000_000,
    max_reuse=1,
    group_size=G,
)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def template_sample() -> Sample:
    return Sample(
        tokens=np.arange(3, dtype=np.int32),
        logprobs=np.full(3, -0.5, dtype=np.float32),
        versions=np.zeros(3, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )


class Generator:
    def __init__(self, index: int, numbered: bool) -> None:
        self.id = f"gen-{index}"
        self.holder = f"{self.id}/proc" if numbered else ""
        self.unacked = UnackedGroups(resend_after_s=1.0)
        self.numbered = numbered
        self.made = 0

    def new_groups(self, n: int, sample: Sample, prompt: np.ndarray) -> list[Group]:
        out = []
        for _ in range(n):
            group = Group(f"{self.id}-{self.made:x}", "p", self.id, "7", prompt, 1.0, [sample] * G)
            self.made += 1
            out.append(self.unacked.number(group) if self.numbered else group)
        return out


def compact(buf: ReplayBuffer, journal: Journal) -> tuple[float, float, int]:
    """The service's compaction, step by step: (in-loop seconds, write seconds, snapshot bytes)."""
    t0 = time.perf_counter()
    mark = journal.begin_compaction()
    records = list(buf.snapshot_records())
    t1 = time.perf_counter()
    size = journal.write_snapshot(records, mark)
    t2 = time.perf_counter()
    old = journal.finish_compaction(mark, rotate=True)
    t3 = time.perf_counter()
    if old is not None:
        old.close()  # the service closes it on its compactor thread: counted as "write" here
    t4 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), (t2 - t1) + (t4 - t3), size


def restore_seconds(state_dir: Path) -> float:
    copy = Path(tempfile.mkdtemp(prefix="buffer-state-restore-"))
    try:
        for name in ("state.msgpack", "state.msgpack.journal"):
            if (state_dir / name).exists():
                shutil.copy(state_dir / name, copy / name)
        t0 = time.perf_counter()
        journal = Journal(copy / "state.msgpack")
        ReplayBuffer.restore(POLICY, journal.load(), journal)
        elapsed = time.perf_counter() - t0
        journal.close()
        return elapsed
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    numbered = args.mode == "horizon"
    work = Path(tempfile.mkdtemp(prefix="buffer-state-"))
    journal = Journal(work / "state.msgpack")
    buf = ReplayBuffer.restore(POLICY, journal.load(), journal)
    gens = [Generator(i, numbered) for i in range(args.generators)]
    for gen in gens:
        buf.generator_hello(gen.id, gen.holder)
    sample, prompt = template_sample(), np.array([1, 2], dtype=np.int32)
    per_gen = max(1, args.batch // args.generators)
    checkpoints = sorted(args.checkpoints)
    rows: list[dict[str, Any]] = []
    in_loop: list[float] = []
    writes: list[float] = []
    snapshot = 0
    next_compaction = args.compact_every
    duplicates_expected = 0
    round_no = 0
    t_start = time.perf_counter()
    try:
        while checkpoints:
            round_no += 1
            for gen in gens:
                fresh = gen.new_groups(per_gen, sample, prompt)
                for group in fresh:
                    gen.unacked.sent(group, float(round_no))
                resent = gen.unacked.due(float(round_no))
                duplicates_expected += len(resent)
                result = buf.add_groups(
                    gen.id,
                    fresh + resent,
                    holder=gen.holder,
                    acked_below=gen.unacked.acked_below if numbered else None,
                )
                if result.rejected or len(result.accepted) != len(fresh):
                    raise AssertionError(f"round {round_no}: {gen.id} got {result}")
                lost = {gid for gid in result.accepted if rng.random() < args.lost_acks}
                gen.unacked.ack([g for g in result.accepted if g not in lost], result.duplicates, [])
            journal.sync()
            served = buf.serve(buf.learner_version, max(1, buf.num_waiting))
            buf.commit(buf.learner_version + 1, [g.group_id for g in served.groups])
            accepted = buf.stats()["accepted"]
            if accepted >= next_compaction:
                loop_s, write_s, snapshot = compact(buf, journal)
                in_loop.append(loop_s)
                writes.append(write_s)
                next_compaction += args.compact_every
            if accepted >= checkpoints[0]:
                checkpoints.pop(0)
                s = buf.stats()
                if s["duplicates"] != duplicates_expected:
                    raise AssertionError(
                        f"{s['duplicates']} duplicates counted, {duplicates_expected} resent"
                    )
                row = {
                    "groups": accepted,
                    "ids_kept": s["seen_ids"],
                    "rss_mb": round(rss_bytes() / 2**20, 1),
                    "snapshot_bytes": snapshot,
                    "journal_bytes": journal.journal_bytes,
                    "compactions": len(in_loop),
                    "in_loop_ms_median": round(1e3 * statistics.median(in_loop), 2) if in_loop else None,
                    "in_loop_ms_max": round(1e3 * max(in_loop), 2) if in_loop else None,
                    "write_ms_median": round(1e3 * statistics.median(writes), 2) if writes else None,
                    "write_ms_max": round(1e3 * max(writes), 2) if writes else None,
                    "restore_ms": round(1e3 * restore_seconds(work), 2),
                    "duplicates": s["duplicates"],
                    "elapsed_s": round(time.perf_counter() - t_start, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                in_loop, writes = [], []
    finally:
        journal.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--mode", choices=["horizon", "unnumbered"], default="horizon")
    parser.add_argument("--generators", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--compact-every", type=int, default=50_000)
    parser.add_argument("--lost-acks", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}))
    rows = run(args)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()

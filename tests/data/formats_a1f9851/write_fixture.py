"""Writes `buffer/` and `expected.json` here with the buffer code of commit a1f9851 (the last before
id horizons and snapshot format 3). Run from a checkout of that commit:

    PYTHONPATH=<checkout of a1f9851> python tests/data/formats_a1f9851/write_fixture.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from stream_dapo.buffer.journal import Journal
from stream_dapo.buffer.replay import AdmissionPolicy, ReplayBuffer
from stream_dapo.transport.messages import Group, Sample

OUT = Path(sys.argv[1])
POLICY = AdmissionPolicy(
    admission_capacity=8, capacity_groups=16, groups_per_version=2, max_staleness=3, max_reuse=1, group_size=2
)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def group(gid: str, version: int) -> Group:
    s = Sample(
        tokens=np.array([5, 2, 3], dtype=np.int32),
        logprobs=np.array([-0.5, -0.25, -1.0], dtype=np.float32),
        versions=np.full(3, version, dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, f"p-{gid}", "gen-0", "7", np.array([7, 8, 4], dtype=np.int32), 2.0, [s, s])


clock = Clock()
journal = Journal(OUT / "buffer" / "state.msgpack")
buf = ReplayBuffer.restore(POLICY, journal.load(), journal, clock, lambda: 1_700_000_000.0)
buf.generator_hello("gen-0", "host-a pid 1 (aa)")
buf.grant_credits("gen-0", 6, request_id=1)
buf.add_groups("gen-0", [group(f"g{i}", 0) for i in range(4)], filtered_total=1)
buf.add_groups("gen-0", [group("g1", 0)])
buf.serve(0, 2, request_id=2)
buf.commit(1, ["g0", "g1"], request_id=3)
buf.heartbeat("gen-0", 2)
journal.compact(buf.snapshot_records())
clock.now += 100.0  # gen-0's holder went silent: its lease ran out, another process takes the id
buf.expire_generators()
buf.generator_hello("gen-0", "host-b pid 2 (bb)")
buf.grant_credits("gen-0", 4, request_id=4)
buf.add_groups("gen-0", [group("g4", 1), group("g2", 0), group("bad", 1)])
buf.serve(1, 1, request_id=5)
buf.learner_hello(1, 1)
buf.serve(3, 3, request_id=6)
buf.commit(4, ["g3", "g4"], request_id=7)
journal.close()
(OUT / "expected.json").write_text(
    json.dumps({"stats": buf.stats(), "waiting": buf.waiting_ids(), "leased": buf.leased_ids()}, indent=2)
    + "\n"
)

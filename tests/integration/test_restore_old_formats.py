"""Files written by the code before the module-boundary redesign (commit 6d41d82) still restore.

`tests/data/formats_6d41d82/` was written by that commit's code (`Journal` + `ReplayBuffer` for
the buffer, `LearnerService._checkpoint` for the learner, on the tiny Qwen2 of `stream_dapo.testing.services`
with seed 0 at version 3); `expected.json` holds the buffer's stats as that code reported them.
The buffer journal's record keys and the checkpoint layout are formats: if this test fails, a change
broke restoring a running deployment's state, not just a test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import torch

from stream_dapo.buffer.journal import FORMAT_VERSION, JOURNAL_MAGIC, SNAPSHOT_MAGIC, Journal
from stream_dapo.buffer.replay import ReplayBuffer
from stream_dapo.config import Config, load_config
from stream_dapo.testing.services import admission_policy, tiny_qwen2

DATA = Path(__file__).resolve().parents[1] / "data" / "formats_6d41d82"
DATA_289E6BD = Path(__file__).resolve().parents[1] / "data" / "formats_289e6bd"
"""Written by `Journal` + `ReplayBuffer` at 289e6bd (format 1, one-letter record keys) with the
policy below and a fixed clock: hello, grants, accepted / duplicate groups, a lease and a commit,
then a compaction (the snapshot), then a journal tail holding every record kind the buffer writes
(grants and a retried grant, accepts, a wrong-sized group, a heartbeat's filtered total, a requeue,
leases, commits and a retried commit, an expiry, rejected messages, a version, a stale drop);
`expected.json` is what that code reported afterwards."""


def config(out: Path) -> Config:
    return load_config(
        overrides=[
            f'run.out_dir="{out}"',
            "algo.group_size=2",
            "learner.mini_batch_samples=4",
            "learner.rollout_batch_prompts=2",
            "learner.micro_batch_tokens=4096",
        ],
        environ={},
    )


def test_a_buffer_journal_written_by_the_old_code_restores_the_same_state(tmp_path: Path) -> None:
    shutil.copytree(DATA / "buffer", tmp_path / "buffer")
    journal = Journal(tmp_path / "buffer" / "state.msgpack")  # a snapshot and a journal tail
    try:
        buf = ReplayBuffer.restore(config(tmp_path).admission_policy(), journal.load(), journal)
        assert buf.stats() == json.loads((DATA / "expected.json").read_text())["stats"]
        # The credit request journaled before the "crash" is answered with its grant, not a new one.
        assert buf.grant_credits("gen-0", 4, request_id=11) == 4
        assert buf.stats()["credits_granted"] == 4
    finally:
        journal.close()


def test_a_format_1_journal_with_every_record_kind_restores_and_is_rewritten_in_the_current_format(
    tmp_path: Path,
) -> None:
    shutil.copytree(DATA_289E6BD / "buffer", tmp_path / "buffer")
    expected = json.loads((DATA_289E6BD / "expected.json").read_text())
    policy = admission_policy(admission_capacity=8, capacity_groups=16, max_staleness=4, max_reuse=2)
    snapshot = tmp_path / "buffer" / "state.msgpack"
    journal = Journal(snapshot)
    try:
        records = journal.load()
        assert journal.report.migrated_from == 1 and FORMAT_VERSION == 2
        kinds = {r["kind"] for r in records}
        assert kinds == {
            "state", "seen", "group", "accept", "duplicate", "reject_groups", "reject_message", "credit",
            "expire", "lease", "commit", "retry", "requeue", "version",
        }  # fmt: skip
        buf = ReplayBuffer.restore(policy, records, journal)
        assert buf.stats() == expected["stats"]
        assert (buf.waiting_ids(), buf.leased_ids()) == (expected["waiting"], expected["leased"])
        g4 = next(g for g in buf.serve(5, 1).groups if g.group_id == "g4")  # the group itself came back
        assert (g4.prompt_tokens.tolist(), g4.samples[1].tokens.tolist()) == ([7, 8, 4], [5, 2, 3])
    finally:
        journal.close()
    # Load rewrote both files in the current format; restoring from them gives the same state.
    assert snapshot.read_bytes().startswith(SNAPSHOT_MAGIC)
    assert Path(f"{snapshot}.journal").read_bytes().startswith(JOURNAL_MAGIC)
    again = Journal(snapshot)
    try:
        records = again.load()
        assert again.report.migrated_from is None
        restored = ReplayBuffer.restore(policy, records, again)
        assert restored.stats() == {**expected["stats"], "served": 7, "leased": 3, "waiting": 0, "line": 0}
    finally:
        again.close()


DATA_A1F9851 = Path(__file__).resolve().parents[1] / "data" / "formats_a1f9851"
"""Written by `Journal` + `ReplayBuffer` at a1f9851 (snapshot state format 2, no id horizons) with
`write_fixture.py` there: two holders of one generator id, grants with request ids, filtered totals,
duplicates, a lease, a commit and a requeue, a snapshot and then a journal tail."""


def test_a_buffer_journal_of_the_last_format_2_code_restores_and_keeps_every_old_id(tmp_path: Path) -> None:
    from stream_dapo.buffer.replay import AdmissionPolicy

    shutil.copytree(DATA_A1F9851 / "buffer", tmp_path / "buffer")
    expected = json.loads((DATA_A1F9851 / "expected.json").read_text())
    policy = AdmissionPolicy(
        admission_capacity=8,
        capacity_groups=16,
        groups_per_version=2,
        max_staleness=3,
        max_reuse=1,
        group_size=2,
    )
    snapshot = tmp_path / "buffer" / "state.msgpack"
    journal = Journal(snapshot)
    try:
        buf = ReplayBuffer.restore(policy, journal.load(), journal)
        assert buf.stats() == expected["stats"]
        assert (buf.waiting_ids(), buf.leased_ids()) == (expected["waiting"], expected["leased"])
        assert buf.holder_of("gen-0") == "host-b pid 2 (bb)"
        journal.compact(buf.snapshot_records())  # rewritten in state format 3
    finally:
        journal.close()
    again = Journal(snapshot)
    try:
        buf = ReplayBuffer.restore(policy, again.load(), again)
        assert buf.stats() == expected["stats"]
        # Every id the old code accepted is still a duplicate: the old generators did not number them.
        old = ["g0", "g1", "g2", "g3", "g4", "bad"]
        template = buf.serve(4, 1).groups[0]
        resent = [msgspec.structs.replace(template, group_id=gid) for gid in old]
        assert buf.add_groups("gen-0", resent).duplicates == old
        # The process that holds the id now numbers its groups: it has an id horizon from here on.
        fresh = msgspec.structs.replace(template, group_id="n0", seq=0)
        assert buf.add_groups("gen-0", [fresh], holder="host-b pid 2 (bb)", acked_below=0).accepted == ["n0"]
        assert buf.add_groups("gen-0", [fresh], holder="host-b pid 2 (bb)", acked_below=1).duplicates == [
            "n0"
        ]
    finally:
        again.close()


def test_a_learner_checkpoint_written_by_the_old_code_resumes_with_its_weights_and_state(
    tmp_path: Path,
) -> None:
    from stream_dapo.learner.root import build_learner
    from stream_dapo.learner.trainer import Learner

    shutil.copytree(DATA / "checkpoints", tmp_path / "checkpoints")
    cfg = config(tmp_path)
    svc = build_learner(cfg)
    svc.learner = Learner(cfg, tiny_qwen2(1))  # other weights: the checkpoint must bring back seed 0's
    state = svc._resume()
    assert svc.learner.version == 3
    assert state["commit_group_ids"] == ["g0", "g1"]
    restored = svc.learner.gather_state_dict()
    expected = dict(tiny_qwen2(0).named_parameters())
    assert restored is not None and set(expected) <= set(restored)
    for name, param in expected.items():
        assert torch.equal(restored[name], param.detach()), name

"""Files written by the code before the module-boundary redesign (commit 6d41d82) still restore.

`tests/data/formats_6d41d82/` was written by that commit's code (`Journal` + `ReplayBuffer` for
the buffer, `LearnerService._checkpoint` for the learner, on the tiny Qwen2 of `tests.helpers`
with seed 0 at version 3); `expected.json` holds the buffer's stats as that code reported them.
The buffer journal's record keys and the checkpoint layout are formats: if this test fails, a change
broke restoring a running deployment's state, not just a test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from stream_dapo.buffer.journal import Journal
from stream_dapo.buffer.replay import AdmissionPolicy, ReplayBuffer
from stream_dapo.config import Config, load_config
from tests.helpers import tiny_qwen2

DATA = Path(__file__).resolve().parents[1] / "data" / "formats_6d41d82"


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
        buf = ReplayBuffer.restore(AdmissionPolicy.from_config(config(tmp_path)), journal.load(), journal)
        assert buf.stats() == json.loads((DATA / "expected.json").read_text())["stats"]
        # The credit request journaled before the "crash" is answered with its grant, not a new one.
        assert buf.grant_credits("gen-0", 4, request_id=11) == 4
        assert buf.stats()["credits_granted"] == 4
    finally:
        journal.close()


def test_a_learner_checkpoint_written_by_the_old_code_resumes_with_its_weights_and_state(
    tmp_path: Path,
) -> None:
    from stream_dapo.learner.service import LearnerService
    from stream_dapo.learner.trainer import Learner

    shutil.copytree(DATA / "checkpoints", tmp_path / "checkpoints")
    cfg = config(tmp_path)
    svc = LearnerService(cfg)
    svc.learner = Learner(cfg, tiny_qwen2(1))  # other weights: the checkpoint must bring back seed 0's
    state = svc._resume()
    assert svc.learner.version == 3
    assert state["commit_group_ids"] == ["g0", "g1"]
    restored = svc.learner.gather_state_dict()
    expected = dict(tiny_qwen2(0).named_parameters())
    assert restored is not None and set(expected) <= set(restored)
    for name, param in expected.items():
        assert torch.equal(restored[name], param.detach()), name

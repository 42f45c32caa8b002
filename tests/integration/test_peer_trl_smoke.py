"""bench/studies/peer_trl.py's TRL side for one optimizer step at tiny sizes: TRL accepts the mapped settings,
the project's reward reaches it, the policy changes and a timed checkpoint is written.

Skipped where TRL is not installed (it is in the ``bench`` extra only; CI installs ``cpu,dev``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is in the bench extra only: pip install -e '.[cpu,bench]'")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from stream_dapo.config import load_config  # noqa: E402
from tests.conftest import REPO  # noqa: E402


@pytest.mark.timeout(300)
def test_trl_side_trains_one_step_with_the_project_reward(warm_model, tmp_path):
    import bench.studies.peer_trl as peer

    cfg = load_config(
        [REPO / "configs" / "tiny-cpu.toml"],
        [
            f"model.path={warm_model}",
            f'run.out_dir="{tmp_path / "run"}"',
            "data.synthetic.num_train=300",
            "algo.group_size=4",
            "learner.rollout_batch_prompts=8",  # 32 samples: 2 mini-batches of 16 per generation
            "learner.mini_batch_samples=16",
            "algo.max_response_len=48",
            "algo.overlong_cache_len=12",
        ],
        environ={},
    )
    threads = torch.get_num_threads()
    try:
        kwargs = peer.train_trl(cfg, out=tmp_path / "trl", steps=1, save_every=1, seed=0, threads=threads)
    finally:
        torch.set_num_threads(threads)
    assert kwargs["steps_per_generation"] == 2 and kwargs["per_device_train_batch_size"] == 16

    rows = [json.loads(line) for line in (tmp_path / "trl" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    checkpoint = Path(rows[0]["checkpoint"])
    history = json.loads((tmp_path / "trl" / "log_history.json").read_text())
    logged = next(h for h in history if "reward" in h)
    assert "rewards/stream_dapo_verifier/mean" in logged
    assert -2.0 <= logged["reward"] <= 1.0  # +1/-1 plus a penalty in [-1, 0]

    before = load_file(str(Path(warm_model) / "model.safetensors"))
    after = load_file(str(checkpoint / "model.safetensors"))
    assert before.keys() == after.keys()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed, "one optimizer step on mixed groups must move the policy"

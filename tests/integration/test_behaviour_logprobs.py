"""mu from vLLM equals the learner's pi_prox at identical weights, at any sampling settings.

One real vLLM engine (CPU build, the project's `RolloutEngine`, ``logprobs_mode="processed_logprobs"``)
samples the warm tiny model at temperature 1.0 / 0.7, top-p 1.0 / 0.9 and top-k off / 20; a DeepSpeed
`Learner` with the same float32 weights and the generator's sampling policy recomputes every sampled
token's log-prob with `compute_logprobs`: pi_prox / mu must be 1 within 1e-4 on every token. The
learner at temperature 1 without truncation (what it computed before) must be far off, so the test
would catch the old behaviour.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from bench.perf.logprob_precision import gap_figures, prox_minus_mu, sample_groups  # noqa: E402
from stream_dapo.config import load_config  # noqa: E402
from stream_dapo.core.sampling import SamplingPolicy, sampling_logits  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROMPTS = 6
GROUP = 4
RATIO_TOL = 1e-4
GRID = [
    SamplingPolicy(temperature=t, top_p=p, top_k=k)
    for t, p, k in itertools.product((1.0, 0.7), (1.0, 0.9), (0, 20))
]


@pytest.fixture(scope="module")
def setup(warm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from bench.workload import task_prompts
    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.learner.trainer import Learner

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("behaviour-logprobs")
    cfg = load_config(
        [REPO / "configs" / "tiny-cpu.toml"],
        [
            f"model.path={warm_model}",
            f'run.out_dir="{out}"',
            f"algo.group_size={GROUP}",
            "learner.rollout_batch_prompts=6",
            "learner.mini_batch_samples=24",
            "generator.kv_cache_gib=0.25",
            "generator.temperature=0.7",
            "generator.top_p=0.9",
            "generator.top_k=20",
        ],
        environ={},
    )
    items = task_prompts(cfg, warm_model, split="eval")[:PROMPTS]
    engine = RolloutEngine.start(cfg)
    try:
        sampled = [sample_groups(engine, items, policy) for policy in GRID]
    finally:
        engine.close()
    learner = Learner(cfg)
    return cfg, learner, sampled


def test_the_learner_takes_its_policy_from_the_generator_settings(setup: Any) -> None:
    cfg, learner, _ = setup
    assert learner.sampling == SamplingPolicy(temperature=0.7, top_p=0.9, top_k=20)
    assert learner.sampling == cfg.generator.sampling_policy()


@pytest.mark.parametrize("index", range(len(GRID)), ids=[p.describe() for p in GRID])
def test_prox_over_mu_is_one_within_1e4_at_identical_weights(setup: Any, index: int) -> None:
    _, learner, sampled = setup
    policy, groups = GRID[index], sampled[index]
    learner.sampling = policy
    d = prox_minus_mu(learner, groups)
    figures = gap_figures(d)
    assert figures["tokens"] >= PROMPTS * GROUP * 5
    assert bool(np.isfinite(d).all()), "a sampled token fell outside the learner's truncation set"
    assert figures["max_ratio"] <= 1 + RATIO_TOL and figures["min_ratio"] >= 1 - RATIO_TOL, figures
    if policy.is_identity:
        return
    # The learner at temperature 1 without truncation (the old definition) is far from mu here.
    learner.sampling = SamplingPolicy()
    raw = gap_figures(prox_minus_mu(learner, groups))
    assert raw["max_abs"] > 100 * RATIO_TOL, raw


def test_a_train_step_reports_the_fresh_gap_of_identical_weights(setup: Any) -> None:
    _, learner, sampled = setup
    learner.sampling = GRID[-1]
    metrics = learner.train_step(sampled[-1])  # version 0 tokens, prox computed at version 0
    fresh, every = metrics.behaviour_gap["fresh"], metrics.behaviour_gap["all"]
    assert fresh == every  # every token is fresh here
    assert fresh["tokens"] == metrics.loss_tokens
    assert fresh["mean_abs"] < RATIO_TOL and fresh["outside_0.9_1.1"] == 0.0
    assert metrics.masked_frac == 0.0 and math.isfinite(metrics.entropy)


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (20, 1.0), (20, 0.9), (5, 0.5), (300, 0.95)])
def test_the_truncation_mask_is_vllms(top_k: int, top_p: float) -> None:
    """Our mask against vLLM's own top-k/top-p function on random tempered logits."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(top_k)
    logits = torch.randn(64, 327, generator=gen) * 4 / 0.7
    k = torch.full((64,), top_k if 0 < top_k < 327 else 327, dtype=torch.int32) if top_k else None
    p = torch.full((64,), top_p) if top_p < 1 else None
    theirs = torch.isinf(apply_top_k_top_p_pytorch(logits.clone(), k, p))
    ours = torch.isinf(sampling_logits(logits[None], SamplingPolicy(top_p=top_p, top_k=top_k))[0])
    assert torch.equal(ours, theirs)
    assert int((~ours).sum(dim=-1).min()) >= 1

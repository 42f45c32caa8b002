"""Pure helpers of bench/studies/peer_trl.py (no TRL needed): time to target, reward wrapping, config mapping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import bench.studies.peer_trl as peer
from stream_dapo.config import load_config
from stream_dapo.core.loss import PolicyLossParams, policy_loss
from stream_dapo.core.rewards import RewardShaping
from tests.conftest import REPO

P = peer.CurvePoint


def test_time_to_target_interpolates_between_the_points_around_the_first_crossing():
    curve = [P(0, 0.0, 0.24), P(4, 60.0, 0.30), P(8, 120.0, 0.36), P(12, 180.0, 0.33)]
    # 60 + (0.34 - 0.30) / (0.36 - 0.30) * 60 = 100
    result = peer.time_to_target(curve, 0.34)
    assert result["interpolated_s"] == pytest.approx(100.0)
    assert (result["first_point_s"], result["first_point_step"]) == (120.0, 8)


def test_time_to_target_exact_hit_is_the_point_itself():
    result = peer.time_to_target([P(0, 0.0, 0.25), P(2, 30.0, 0.35)], 0.35)
    assert result["interpolated_s"] == pytest.approx(30.0)


def test_time_to_target_counts_the_first_crossing_not_a_later_one():
    curve = [P(0, 0.0, 0.2), P(2, 10.0, 0.5), P(4, 20.0, 0.1), P(6, 30.0, 0.6)]
    # 0 + (0.3 - 0.2) / (0.5 - 0.2) * 10 = 3.333...
    assert peer.time_to_target(curve, 0.3)["interpolated_s"] == pytest.approx(10 / 3)


def test_time_to_target_sorts_by_time_and_handles_start_at_target_and_never():
    assert peer.time_to_target([P(2, 50.0, 0.5), P(0, 0.0, 0.4)], 0.4)["interpolated_s"] == 0.0
    never = peer.time_to_target([P(0, 0.0, 0.2), P(2, 10.0, 0.29)], 0.3)
    assert never == {"interpolated_s": None, "first_point_s": None, "first_point_step": None}


def test_target_and_ratio():
    assert peer.resolve_target(0.24375, None, 0.10) == pytest.approx(0.34375)
    assert peer.resolve_target(0.24375, 0.4, 0.10) == 0.4
    assert peer.speed_ratio(300.0, 100.0) == pytest.approx(3.0)
    assert peer.speed_ratio(None, 100.0) is None
    assert peer.speed_ratio(100.0, None) is None


def test_truncation_means_full_length_without_eos():
    assert peer.is_truncated([5, 6, 7], [2], 3)
    assert not peer.is_truncated([5, 6, 2], [2], 3)  # stopped on its last allowed token
    assert not peer.is_truncated([5, 2], [2], 3)


SHAPING = RewardShaping(
    soft_overlong=True, max_response_len=96, overlong_cache_len=24, overlong_factor=1.0, overlong_filter=False
)


def test_shaped_rewards_add_the_soft_overlong_penalty_to_the_verdict():
    eos = 2
    short_right = [7] * 19 + [eos]  # 20 tokens: no penalty -> +1
    long_wrong = [7] * 83 + [eos]  # 84 tokens: -1 + (72 - 84) / 24 = -1.5
    cut_right = [7] * 96  # truncated at 96: +1 + (72 - 96) / 24 = 0
    rewards = peer.shaped_rewards([True, False, True], [short_right, long_wrong, cut_right], [eos], SHAPING)
    assert rewards == pytest.approx([1.0, -1.5, 0.0])


def test_verifier_reward_reads_conversational_completions_and_passes_gold():
    seen = []

    class FakePool:
        def verify_batch(self, pairs):
            seen.extend(pairs)
            return [SimpleNamespace(correct=text.endswith(gold)) for text, gold in pairs]

    reward = peer.VerifierReward(FakePool(), [2], SHAPING)
    completions = [
        [{"role": "assistant", "content": "3+4=7\nAnswer: 7"}],
        [{"role": "assistant", "content": "x"}],
    ]
    out = reward(
        prompts=[None, None], completions=completions, completion_ids=[[5, 2], [5, 2]], gold=["7", "7"]
    )
    assert out == [1.0, -1.0]
    assert seen == [("3+4=7\nAnswer: 7", "7"), ("x", "7")]
    assert reward.__name__ == "stream_dapo_verifier"


def test_trl_kwargs_mirror_the_tiny_cpu_recipe():
    cfg = load_config([REPO / "configs" / "tiny-cpu.toml"], environ={})
    kw = peer.trl_grpo_kwargs(cfg, steps=10, seed=3, output_dir="/tmp/x")
    lc, a = cfg.learner, cfg.algo
    assert kw["num_generations"] == a.group_size == 8
    # one optimizer step = one mini-batch; one generation batch = one rollout step of 16 prompts x 8
    assert (
        kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == lc.mini_batch_samples == 64
    )
    assert kw["per_device_train_batch_size"] * kw["steps_per_generation"] == lc.rollout_batch_prompts * 8
    assert (kw["loss_type"], kw["epsilon"], kw["epsilon_high"], kw["delta"], kw["beta"]) == (
        "dapo",
        0.2,
        0.28,
        10.0,
        0.0,
    )
    assert kw["learning_rate"] == lc.lr and kw["lr_scheduler_type"] == "constant"
    assert kw["max_completion_length"] == a.max_response_len == 96
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (1.0, 1.0, 0)
    assert kw["mask_truncated_completions"] is a.overlong_filter
    assert not kw["bf16"] and not kw["gradient_checkpointing"] and not kw["use_vllm"]
    assert (kw["max_steps"], kw["seed"]) == (10, 3)


def test_trl_kwargs_refuse_what_trl_cannot_express():
    cfg = load_config([REPO / "configs" / "tiny-cpu.toml"], ["algo.agg_mode=seq-mean-token-mean"], environ={})
    with pytest.raises(ValueError, match="token-mean"):
        peer.trl_grpo_kwargs(cfg, steps=1, seed=0, output_dir="/tmp/x")
    cfg = load_config([REPO / "configs" / "tiny-cpu.toml"], ["learner.warmup_steps=5"], environ={})
    with pytest.raises(ValueError, match="warmup_steps"):
        peer.trl_grpo_kwargs(cfg, steps=1, seed=0, output_dir="/tmp/x")


def test_trl_two_sided_clip_at_delta_equals_the_dual_clip():
    """The mapping delta = dual_clip_c: TRL's per-token loss (trl/trainer/grpo_trainer.py, _compute_loss:
    coef_2 = clamp(r, 1 - eps, 1 + eps_high); coef_1 = clamp(r, max=delta); -min(coef_1 A, coef_2 A))
    equals stream-dapo's clipped surrogate with dual clip c, in value and gradient."""
    eps, eps_high, c = 0.2, 0.28, 10.0
    log_r = torch.log(torch.tensor([0.1, 0.7, 0.9, 1.0, 1.2, 1.5, 5.0, 12.0, 50.0], dtype=torch.float64))
    for adv in (-1.3, 0.8):
        a = torch.full((1,), adv, dtype=torch.float64)
        logp_ours = log_r.clone().unsqueeze(0).requires_grad_(True)
        zeros = torch.zeros_like(logp_ours)
        ours, _ = policy_loss(
            logp_ours,
            zeros,
            a,
            torch.ones_like(zeros),
            PolicyLossParams(eps_low=eps, eps_high=eps_high, dual_clip_c=c, ratio_mode="behaviour"),
            global_tokens=1.0,  # per-token sum, so the gradients compare token by token
        )
        ours.backward()
        logp_trl = log_r.clone().unsqueeze(0).requires_grad_(True)
        r = torch.exp(logp_trl)
        coef_2 = torch.clamp(r, 1 - eps, 1 + eps_high)
        coef_1 = torch.clamp(r, max=c)
        trl = (-torch.min(coef_1 * a, coef_2 * a)).sum()
        trl.backward()
        assert ours.item() == pytest.approx(trl.item())
        assert torch.allclose(logp_ours.grad, logp_trl.grad)


def test_target_sensitivity_reports_each_delta_and_the_ratio():
    curves = {
        "stream_dapo": [P(0, 0.0, 0.2), P(4, 10.0, 0.3), P(8, 20.0, 0.4)],
        "trl": [P(0, 0.0, 0.2), P(4, 10.0, 0.25), P(8, 20.0, 0.3)],
    }
    rows = peer.target_sensitivity(curves, 0.2, deltas=(0.05, 0.1, 0.15))
    assert [r["target"] for r in rows] == pytest.approx([0.25, 0.3, 0.35])
    # +0.05: stream-dapo 0 + 0.05/0.1*10 = 5 s, TRL exactly at 10 s -> ratio 2
    assert (rows[0]["stream_dapo_s"], rows[0]["trl_s"]) == pytest.approx((5.0, 10.0))
    assert rows[0]["ratio_trl_over_stream_dapo"] == pytest.approx(2.0)
    # +0.10: 10 s vs 20 s; +0.15: stream-dapo 15 s, TRL never -> no ratio
    assert rows[1]["ratio_trl_over_stream_dapo"] == pytest.approx(2.0)
    assert rows[2]["stream_dapo_s"] == pytest.approx(15.0) and rows[2]["trl_s"] is None
    assert rows[2]["ratio_trl_over_stream_dapo"] is None


def test_the_benchmarked_run_keeps_every_checkpoint_its_curve_needs(tmp_path):
    """120 steps with a checkpoint every 20: six checkpoints, all of them left after pruning (the
    learner's default keeps 3, which once left the long-CoT curve only steps 80, 100 and 120)."""
    from stream_dapo.learner.checkpoints import checkpoint_name, prune_checkpoints

    out = tmp_path / "run"
    sets = peer.stream_dapo_run_sets(["learner.keep_checkpoints=2"], out, steps=120, every=20)
    cfg = load_config([REPO / "configs" / "tiny-longcot-cpu.toml"], sets, environ={})
    assert (cfg.learner.total_steps, cfg.learner.checkpoint_every) == (120, 20)
    root = tmp_path / "checkpoints"
    for version in range(20, 121, 20):
        (root / checkpoint_name(version)).mkdir(parents=True)
        assert prune_checkpoints(root, cfg.learner.keep_checkpoints) == []
    assert sorted(p.name for p in root.iterdir()) == [checkpoint_name(v) for v in range(20, 121, 20)]


def test_the_differences_state_the_figures_of_the_config_compared():
    """tiny-cpu: 128 samples per generation batch, 64 per step; the long-CoT recipe: 64 and 32, inline engine."""
    tiny = {
        d["setting"]: d
        for d in peer.differences(load_config([REPO / "configs" / "tiny-cpu.toml"], environ={}))
    }
    long = {
        d["setting"]: d
        for d in peer.differences(load_config([REPO / "configs" / "tiny-longcot-cpu.toml"], environ={}))
    }
    assert tiny.keys() == long.keys() and len(tiny) == 10
    assert "generate 128 samples, then 2 optimizer steps" in tiny["rollout/training overlap"]["trl"]
    assert "generate 64 samples, then 2 optimizer steps" in long["rollout/training overlap"]["trl"]
    assert "32-sample mini-batch" in long["token-level loss normaliser"]["stream_dapo"]
    assert "64-sample mini-batch" in tiny["token-level loss normaliser"]["stream_dapo"]
    assert "micro_batch_tokens=16384" in long["micro-batching"]["stream_dapo"]
    assert "engine core inline" in long["generation engine"]["stream_dapo"]
    assert "sqrt(7/8) = 0.935" in long["advantage normalisation"]["trl"]


def test_a_side_stops_at_its_first_checkpoint_past_the_budget():
    launch, budget = 1000.0, 60.0
    times = {10: 1050.0, 20: 1059.0, 30: 1061.0, 31: 1070.0}
    assert not peer.past_budget(times, [10, 20], launch, budget)  # 59 s: still inside
    assert peer.past_budget(times, [10, 20, 30], launch, budget)  # step 30 finished at 61 s
    # a step past the budget without a checkpoint does not stop the side: its figure would be missing
    assert not peer.past_budget(times, [10], launch, budget)
    assert not peer.past_budget(times, [40], launch, budget)  # a checkpoint whose step time is unknown


def test_trl_kwargs_accumulate_the_real_model_recipes_mini_batch():
    """smollm2-words: 8 prompts x 8 samples per rollout, 32 per optimizer step. With 4 accumulation
    steps TRL runs padded batches of 8 and still generates once per 2 optimizer steps."""
    cfg = load_config(
        [REPO / "configs" / "smollm2-words-wide-cpu.toml"], ["learner.share_prompt=true"], environ={}
    )
    kw = peer.trl_grpo_kwargs(cfg, steps=400, seed=1, output_dir="/tmp/x", grad_accum=4)
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (8, 4)
    assert kw["steps_per_generation"] == 8  # 64 samples / batches of 8
    # optimizer steps per generation batch: 8 batches / 4 per step = 2 = rollout 64 / mini 32
    assert kw["steps_per_generation"] // kw["gradient_accumulation_steps"] == 64 // 32
    assert (kw["learning_rate"], kw["max_completion_length"]) == (5e-6, 256)
    with pytest.raises(ValueError, match="divide learner.mini_batch_samples=32"):
        peer.trl_grpo_kwargs(cfg, steps=1, seed=0, output_dir="/tmp/x", grad_accum=3)
    diffs = {d["setting"]: d for d in peer.differences(cfg, grad_accum=4)}
    assert "learner.share_prompt" in diffs["micro-batching"]["stream_dapo"]
    assert "4 padded batches of 8 rows" in diffs["micro-batching"]["trl"]


def test_a_finished_trl_side_is_read_back_and_an_unfinished_one_starts_again(tmp_path, monkeypatch):
    """--work resumes: a side with its done record is not run again (its clock is the recorded one);
    a side without one is removed and run from nothing, so one curve never mixes two launches."""
    import json

    calls: list[list[str]] = []

    def fake_run(argv, **kw):  # the trl-train child: writes what a finished side leaves
        calls.append(argv)
        out = tmp_path / "trl"
        assert not (out / "stale.txt").exists()
        out.mkdir(parents=True, exist_ok=True)
        (out / "steps.jsonl").write_text(
            json.dumps({"step": 1, "wall_time": 5.0})
            + "\n"
            + json.dumps({"step": 2, "wall_time": 9.0, "checkpoint": "c2"})
            + "\n"
        )
        (out / "log_history.json").write_text("[]")
        (out / "grpo_kwargs.json").write_text("{}")

    monkeypatch.setattr(peer.subprocess, "run", fake_run)
    monkeypatch.setattr(peer, "_ensure_data", lambda cfg: None)
    config = REPO / "configs" / "tiny-cpu.toml"
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "stale.txt").write_text("an interrupted attempt")
    first = peer.run_trl(config, [], tmp_path, steps=2, every=2, seed=0, threads=1, budget_s=60.0)
    assert (
        len(calls) == 1 and "--budget-s" in calls[0] and calls[0][calls[0].index("--budget-s") + 1] == "60.0"
    )
    assert first["checkpoints"] == {2: "c2"} and first["step_time"] == {1: 5.0, 2: 9.0}
    again = peer.run_trl(config, [], tmp_path, steps=2, every=2, seed=0, threads=1, budget_s=60.0)
    assert len(calls) == 1  # read back, not rerun
    assert (again["launch"], again["wall_s"]) == (first["launch"], first["wall_s"])

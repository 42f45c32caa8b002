"""Gradient accumulation equals one big batch: the token-level loss is normalised globally.

A DeepSpeed learner (world size 1, ZeRO stage 0, fp32) takes one step on the same mini-batch packed
into 1 and into 3 micro-batches, and into 3 with shared prompts (learner.share_prompt: a group's
samples in one forward row); each must give the gradient and the parameter update of a plain
torch reference that computes the token-mean loss over the whole mini-batch, sequence by sequence,
without padding. Normalising per micro-batch (the bug to avoid) reweights the three micro-batches
and fails the gradient comparison.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM

from stream_dapo.config import Config
from stream_dapo.core.loss import policy_loss, token_logprobs
from stream_dapo.errors import ConfigError
from stream_dapo.learner.packing import sequences_from_groups
from stream_dapo.learner.trainer import Learner, StepMetrics, deepspeed_config
from stream_dapo.testing.services import random_group, tiny_qwen2
from stream_dapo.transport.messages import Group

LR = 1e-3


tiny_model = tiny_qwen2


def make_cfg(micro_batch_tokens: int, algo: dict[str, object] | None = None, **learner: object) -> Config:
    return Config.model_validate(
        {
            "model": {"max_prompt_len": 8, "path": "unused"},
            "algo": {"group_size": 3, "max_response_len": 32, "overlong_cache_len": 4, **(algo or {})},
            "learner": {
                "mini_batch_samples": 6,
                "rollout_batch_prompts": 2,
                "micro_batch_tokens": micro_batch_tokens,
                "lr": LR,
                "zero_stage": 0,
                **learner,
            },
        }
    )


def make_groups(seed: int) -> list[Group]:
    """Two groups of three; lengths 30, 28, 25 and 20, 18, 12 make three micro-batches at budget 64.
    One sample is overlong-filtered (loss_weight 0): it must not count in T."""
    rng = np.random.default_rng(seed)
    return [
        random_group(rng, "a", 6, [24, 22, 19], [1.2, -0.6, -0.6], [1.0, 1.0, 0.0]),
        random_group(rng, "b", 4, [16, 14, 8], [-1.0, 0.5, 0.5], [1.0, 1.0, 1.0]),
    ]


def grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None  # every parameter is in the loss
    return p.grad.clone()


def reference_step(
    model: Qwen2ForCausalLM, opt: torch.optim.Optimizer, groups: list[Group], cfg: Config
) -> tuple[float, dict, float, float]:
    """Plain torch: the loss over the whole mini-batch, one unpadded sequence at a time. Returns the
    loss, the gradients, the gradient norm and the share of loss tokens the correction dropped."""
    params = cfg.algo.loss_params
    seqs = sequences_from_groups(groups)
    total_tokens = sum(len(s.response) for s in seqs if s.loss_weight > 0)
    total_seqs = sum(1 for s in seqs if s.loss_weight > 0)
    loss_sum, kept = 0.0, 0.0
    for s in seqs:
        ids = torch.from_numpy(np.concatenate([s.prompt, s.response]).astype(np.int64))[None]
        p = len(s.prompt)
        logp = token_logprobs(model(input_ids=ids).logits[:, p - 1 : -1], ids[:, p:])
        mask = torch.full_like(logp, float(s.loss_weight > 0))
        loss, m = policy_loss(
            logp,
            torch.from_numpy(s.behaviour_logprobs)[None],
            torch.tensor([s.advantage]),
            mask,
            params,
            prox_logprobs=logp.detach(),
            global_tokens=total_tokens,
            global_seqs=total_seqs,
        )
        loss.backward()
        loss_sum += float(loss.detach())
        kept += m["num_tokens"]
    grads = {n: grad_of(p) for n, p in model.named_parameters()}
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.learner.grad_clip))
    opt.step()
    opt.zero_grad()
    return loss_sum, grads, norm, 1.0 - kept / total_tokens


def learner_step(learner: Learner, groups: list[Group]) -> tuple[StepMetrics, dict, int]:
    batch = learner.prepare(groups)
    acc = learner.accumulate_gradients(batch)
    grads = {n: p.grad.clone() for n, p in learner.engine.module.named_parameters()}
    return learner.apply_update(batch, acc), grads, len(batch.micro_batches)


def params_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


# The off-policy corrections of issue 40 through the real learner: each trains every parameter, and
# accumulation over micro-batches still equals the one-big-batch reference.
CORRECTIONS = {
    "dapo": {},
    "sequence-tis": {"is_level": "sequence"},
    "geometric-mask": {"is_level": "geometric", "is_mode": "mask", "is_cap": 1.05},
    "icepop": {"is_mode": "icepop"},
    "gspo": {"ratio_level": "sequence", "agg_mode": "seq-mean-token-mean"},
    "cispo": {"surrogate": "cispo", "eps_low": 1.0},
}


@pytest.mark.process
@pytest.mark.parametrize("algo", CORRECTIONS.values(), ids=CORRECTIONS.keys())
def test_one_vs_three_micro_batches_match_one_big_batch_reference(algo: dict[str, object]) -> None:
    big, small = make_cfg(4096, algo), make_cfg(64, algo)
    # Shared prompts at 64 tokens: group a's row (5 + 25 + 23 + 20) does not fit and splits into
    # rows of 53 and 25 tokens, group b's is 44: three micro-batches of one or two rows.
    shared = make_cfg(64, algo, share_prompt=True)
    learners = {
        (1, "per-sample"): Learner(big, tiny_model(), source_dir="."),
        (3, "per-sample"): Learner(small, tiny_model(), source_dir="."),
        (3, "shared"): Learner(shared, tiny_model(), source_dir="."),
    }
    reference = tiny_model()
    opt = torch.optim.AdamW(
        reference.parameters(),
        lr=LR,
        betas=big.learner.betas,
        eps=1e-8,
        weight_decay=big.learner.weight_decay,
    )
    start = params_of(reference)

    for step, seed in enumerate((1, 2)):
        groups = make_groups(seed)
        ref_loss, ref_grads, ref_norm, ref_masked = reference_step(reference, opt, groups, big)
        for (expected_micro, _), learner in learners.items():
            metrics, grads, n_micro = learner_step(learner, groups)
            assert n_micro == expected_micro
            assert metrics.version == step + 1
            assert metrics.loss_tokens == 24 + 22 + 16 + 14 + 8  # the filtered sample (19) is not in T
            assert metrics.loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
            assert metrics.grad_norm == pytest.approx(ref_norm, rel=1e-5)
            assert metrics.masked_frac == pytest.approx(ref_masked, abs=1e-9)
            assert metrics.masked_frac < 1.0
            # The proximal policy is the current one (fresh weights), so every sequence ratio is 1.
            assert (metrics.seq_ratio_min, metrics.seq_ratio_max) == pytest.approx((1.0, 1.0))
            for name, g in ref_grads.items():
                torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=f"grad of {name}")
            # Adam's update g / (|g| + eps) amplifies float noise in gradients near eps (1e-8): its
            # slope is LR * eps / (|g| + eps)^2. On a Zen 3 without AVX-512 one element of up_proj had
            # g = -1.78e-8 in the reference and -1.77e-8 here (8e-11 apart, inside the 1e-7 gradient
            # tolerance), and its update moved by 1.05e-6. So updates agree to 2e-6 absolute: two
            # thousandths of a step of size LR (a wrong accumulation moves them by ~LR).
            ref_now = params_of(reference)
            for name, value in params_of(learner.engine.module).items():
                update, ref_update = value - start[name], ref_now[name] - start[name]
                assert ref_update.abs().max() > LR / 2, name
                torch.testing.assert_close(update, ref_update, rtol=1e-5, atol=2e-6, msg=f"update of {name}")
    assert metrics.lr == pytest.approx(LR)


def test_deepspeed_config_follows_the_learner_section() -> None:
    cfg = make_cfg(4096, zero_stage=2, grad_clip=0.5, warmup_steps=3)
    ds = deepspeed_config(cfg, world_size=4, on_gpu=False)
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["gradient_clipping"] == 0.5
    assert ds["train_batch_size"] == 4 and ds["gradient_accumulation_steps"] == 1
    assert ds["managed_gradient_accumulation"] is False
    assert ds["optimizer"]["params"]["torch_adam"] is True
    assert "scheduler" not in ds and not ds["bf16"]["enabled"]

    bf16 = make_cfg(4096, zero_stage=1)
    bf16.model.dtype = "bfloat16"
    ds = deepspeed_config(bf16, world_size=1, on_gpu=False)
    assert ds["bf16"]["enabled"] and ds["data_types"]["grad_accum_dtype"] == "fp32"

    bf16.learner.zero_stage = 0
    with pytest.raises(ConfigError, match="learner.zero_stage=1"):
        deepspeed_config(bf16, world_size=1)
    bf16.model.dtype = "float16"
    with pytest.raises(ConfigError, match="model.dtype=bfloat16"):
        deepspeed_config(bf16, world_size=1)

"""The chunked log-prob/entropy path gives today's full-logits values and gradients.

Function level (float64): `chunked_logprobs_entropy` against `token_logprobs` / `token_entropy` of
``F.linear(hidden, weight)``, for chunk sizes that divide, do not divide and exceed the row count.
Learner level (float64): one accumulation of gradients over the same mini-batch with
``learner.logprob_chunk_tokens = 0`` (full logits) and = 5, with the entropy bonus, the KL term to
a frozen reference, tied and untied embeddings, and masked tokens (prompt columns, padding rows,
an overlong-filtered sample); then DeepSpeed ZeRO-0 and ZeRO-3 (float32) give the same step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from stream_dapo.config import Config
from stream_dapo.core.chunked_logprobs import chunked_logprobs_entropy
from stream_dapo.core.loss import token_entropy, token_logprobs
from stream_dapo.core.sampling import SamplingPolicy, sampling_logits
from stream_dapo.learner.lm_head import ChunkedLMHead
from stream_dapo.learner.trainer import Learner
from stream_dapo.testing.learner import BackwardOnlyEngine
from stream_dapo.testing.services import random_group, tiny_qwen2
from stream_dapo.transport.messages import Group


def _inputs(n: int, h: int, v: int, seed: int, bias: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {
        "hidden": torch.randn(2, n, h, generator=g, dtype=torch.float64).requires_grad_(),
        "weight": (0.5 * torch.randn(v, h, generator=g, dtype=torch.float64)).requires_grad_(),
        "targets": torch.randint(0, v, (2, n), generator=g),
    }
    if bias:
        out["bias"] = torch.randn(v, generator=g, dtype=torch.float64).requires_grad_()
    return out


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_full_logits_path(chunk: int, bias: bool) -> None:
    x = _inputs(n=7, h=5, v=11, seed=chunk, bias=bias)
    g = torch.Generator().manual_seed(100)
    up_logp, up_ent = torch.randn(2, 7, generator=g, dtype=torch.float64), torch.randn(2, 7, generator=g)

    logits = F.linear(x["hidden"], x["weight"], x.get("bias"))
    ref_logp, ref_ent = token_logprobs(logits, x["targets"]), token_entropy(logits)
    ref_grads = torch.autograd.grad(
        (ref_logp * up_logp).sum() + (ref_ent * up_ent.double()).sum(),
        [t for t in x.values() if t.requires_grad],
    )
    logp, ent = chunked_logprobs_entropy(
        x["hidden"], x["weight"], x["targets"], chunk_tokens=chunk, bias=x.get("bias")
    )
    assert logp.dtype == ent.dtype == torch.float64
    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(
        (logp * up_logp).sum() + (ent * up_ent.double()).sum(), [t for t in x.values() if t.requires_grad]
    )
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "policy",
    [
        SamplingPolicy(temperature=0.7),
        SamplingPolicy(temperature=0.7, top_p=0.9),
        SamplingPolicy(temperature=1.0, top_k=4),
        SamplingPolicy(temperature=0.6, top_p=0.8, top_k=5, min_p=0.05),
    ],
    ids=["T0.7", "T0.7-top-p0.9", "top-k4", "all"],
)
def test_with_a_sampling_policy_values_and_gradients_equal_the_full_sampling_logits(policy: Any) -> None:
    x = _inputs(n=9, h=5, v=13, seed=4, bias=True)
    # Targets from the kept set of each position, plus one outside it where something is cut.
    logits = F.linear(x["hidden"], x["weight"], x["bias"])
    z = sampling_logits(logits, policy)
    kept = torch.isfinite(z)
    targets = torch.where(kept, torch.rand(z.shape, generator=torch.Generator().manual_seed(1)), -1.0).argmax(
        -1
    )
    cut_somewhere = (~kept).any(-1)
    if bool(cut_somewhere.any()):
        i, j = map(int, cut_somewhere.nonzero()[0])
        targets[i, j] = int((~kept[i, j]).nonzero()[0])
    g = torch.Generator().manual_seed(7)
    up_logp, up_ent = torch.randn(2, 2, 9, generator=g, dtype=torch.float64)
    ref_logp, ref_ent = token_logprobs(z, targets), token_entropy(z)
    finite = torch.isfinite(ref_logp)
    assert bool(finite.any())
    params = [x["hidden"], x["weight"], x["bias"]]
    # A target outside the kept set has log p = -inf, a constant: it contributes no gradient.
    ref_grads = torch.autograd.grad(
        (torch.where(finite, ref_logp, 0.0) * up_logp).sum() + (ref_ent * up_ent).sum(), params
    )
    logp, ent = chunked_logprobs_entropy(
        x["hidden"], x["weight"], targets, chunk_tokens=4, bias=x["bias"], policy=policy
    )
    assert torch.equal(torch.isfinite(logp), finite)
    torch.testing.assert_close(logp[finite], ref_logp[finite], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(
        (torch.where(finite, logp, 0.0) * up_logp).sum() + (ent * up_ent).sum(), params
    )
    for got, want in zip(grads, ref_grads, strict=True):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_an_unused_entropy_adds_no_gradient_and_the_logprob_gradient_is_exact() -> None:
    x = _inputs(n=6, h=4, v=9, seed=3, bias=False)
    logits = F.linear(x["hidden"], x["weight"])
    ref = torch.autograd.grad(token_logprobs(logits, x["targets"]).sum(), [x["hidden"], x["weight"]])
    logp, _ = chunked_logprobs_entropy(x["hidden"], x["weight"], x["targets"], chunk_tokens=4)
    got = torch.autograd.grad(logp.sum(), [x["hidden"], x["weight"]])
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_hand_computed_values_on_a_two_token_vocabulary() -> None:
    # Zero hidden state: logits equal the bias, p = softmax([0, ln 3]) = [1/4, 3/4].
    hidden = torch.zeros(1, 1, 2, dtype=torch.float64)
    weight = torch.zeros(2, 2, dtype=torch.float64)
    bias = torch.tensor([0.0, np.log(3.0)], dtype=torch.float64)
    logp, ent = chunked_logprobs_entropy(hidden, weight, torch.tensor([[1]]), chunk_tokens=1, bias=bias)
    assert float(logp) == pytest.approx(np.log(0.75), abs=1e-14)
    assert float(ent) == pytest.approx(-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)), abs=1e-14)


def test_bad_targets_and_chunk_are_rejected_with_the_fix() -> None:
    x = _inputs(n=3, h=4, v=5, seed=0, bias=False)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 5\)"):
        chunked_logprobs_entropy(x["hidden"], x["weight"], x["targets"] + 5, chunk_tokens=2)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_logprobs_entropy(x["hidden"], x["weight"], x["targets"], chunk_tokens=0)
    with pytest.raises(ValueError, match="targets must have shape"):
        chunked_logprobs_entropy(x["hidden"], x["weight"], x["targets"][:, :2], chunk_tokens=2)


def test_the_head_is_a_plain_linear_outside_scoring_and_shares_the_tied_weight() -> None:
    model = tiny_qwen2(tied=True)
    ids = torch.randint(0, 64, (1, 9))
    before = model(input_ids=ids).logits
    from stream_dapo.learner.lm_head import install_chunked_head

    head = install_chunked_head(model)
    assert isinstance(head, ChunkedLMHead) and head.weight is model.get_input_embeddings().weight
    assert install_chunked_head(model) is head
    assert sorted(model.state_dict()) == sorted(tiny_qwen2(tied=True).state_dict())
    torch.testing.assert_close(model(input_ids=ids).logits, before)


# --------------------------------------------------------------------------------------------------
# Through the learner
# --------------------------------------------------------------------------------------------------


def _cfg(chunk: int, generator: dict[str, Any] | None = None, **algo: Any) -> Config:
    return Config.model_validate(
        {
            "model": {"max_prompt_len": 8, "path": "unused"},
            "generator": generator or {},
            "algo": {"group_size": 3, "max_response_len": 32, "overlong_cache_len": 4, **algo},
            "learner": {
                "mini_batch_samples": 6,
                "rollout_batch_prompts": 2,
                "micro_batch_tokens": 96,
                "logprob_chunk_tokens": chunk,
            },
        }
    )


def _groups(seed: int) -> list[Group]:
    """Prompts of different lengths (masked prompt columns in the window), rows of different lengths
    (padding), and one overlong-filtered sample (loss_weight 0)."""
    rng = np.random.default_rng(seed)
    return [
        random_group(rng, "a", 7, [21, 17, 9], [1.2, -0.6, -0.6], [1.0, 1.0, 0.0]),
        random_group(rng, "b", 3, [16, 12, 5], [-1.0, 0.5, 0.5], [1.0, 1.0, 1.0]),
    ]


def _float64_gradients(cfg: Config, tied: bool) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    learner = Learner(cfg, tiny_qwen2(seed=1, tied=tied), make_engine=BackwardOnlyEngine)
    learner.engine.module.double()  # in place: Parameters (and the tie) are kept
    if learner.ref_model is not None:
        learner.ref_model.double()
        with torch.no_grad():  # a reference that differs from the policy, so the KL term is not 0
            for p in learner.ref_model.parameters():
                p.mul_(0.9)
    batch = learner.prepare(_groups(seed=4))
    acc = learner.accumulate_gradients(batch)
    sums = {**acc.sums, **acc.weighted, "micro_batches": len(batch.micro_batches)}
    return sums, {n: p.grad.clone() for n, p in learner.engine.module.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(
    "algo",
    [
        {},
        {"entropy_coef": 0.01},
        {"kl_coef": 0.1, "entropy_coef": 0.003, "ratio_mode": "behaviour"},
    ],
    ids=["plain", "entropy-bonus", "kl+entropy"],
)
def test_learner_gradients_with_chunks_equal_the_full_logits_path(tied: bool, algo: dict[str, Any]) -> None:
    full_sums, full_grads = _float64_gradients(_cfg(0, **algo), tied)
    sums, grads = _float64_gradients(_cfg(5, **algo), tied)
    assert sums["micro_batches"] == full_sums["micro_batches"] >= 2
    if algo.get("kl_coef"):
        assert abs(full_sums["kl_ref"]) > 1e-6
    for name, value in full_sums.items():
        assert sums[name] == pytest.approx(value, rel=1e-11, abs=1e-13), name
    assert sorted(grads) == sorted(full_grads)
    for name, g in full_grads.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads[name], g, rtol=1e-10, atol=1e-13, msg=f"grad of {name}")


@pytest.mark.parametrize(
    "generator",
    [{"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}],
    ids=["T0.7", "T0.7-top-p0.9-top-k20"],
)
def test_learner_gradients_with_chunks_equal_the_full_path_under_the_generators_sampling(
    generator: dict[str, Any],
) -> None:
    algo = {"kl_coef": 0.1, "entropy_coef": 0.003}
    full_sums, full_grads = _float64_gradients(_cfg(0, generator, **algo), tied=True)
    sums, grads = _float64_gradients(_cfg(5, generator, **algo), tied=True)
    plain_sums, _ = _float64_gradients(_cfg(5, None, **algo), tied=True)
    assert sums["entropy"] != pytest.approx(plain_sums["entropy"], rel=1e-3)  # the policy is in effect
    for name, value in full_sums.items():
        assert sums[name] == pytest.approx(value, rel=1e-10, abs=1e-13), name
    for name, g in full_grads.items():
        assert bool(torch.isfinite(grads[name]).all()), name
        torch.testing.assert_close(grads[name], g, rtol=1e-9, atol=1e-13, msg=f"grad of {name}")


@pytest.mark.process
@pytest.mark.parametrize("zero_stage", [0, 3])
def test_deepspeed_step_with_chunks_equals_the_full_logits_step(zero_stage: int) -> None:
    metrics = {}
    for chunk in (0, 4):
        cfg = _cfg(chunk, entropy_coef=0.01)
        cfg.learner.zero_stage = zero_stage
        learner = Learner(cfg, tiny_qwen2(seed=2), source_dir=".")
        groups = _groups(seed=5)
        steps = (learner.train_step(groups), learner.train_step(groups))
        state = learner.gather_state_dict()
        assert state is not None
        metrics[chunk] = (*steps, state)
    for full, chunked in zip(metrics[0][:2], metrics[4][:2], strict=True):
        assert chunked.loss == pytest.approx(full.loss, rel=1e-5, abs=1e-7)
        assert chunked.entropy == pytest.approx(full.entropy, rel=1e-5)
        assert chunked.grad_norm == pytest.approx(full.grad_norm, rel=1e-4)
    for name, value in metrics[0][2].items():
        torch.testing.assert_close(metrics[4][2][name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_gradient_through_the_entropy_alone_is_exact() -> None:
    x = _inputs(n=5, h=4, v=9, seed=8, bias=True)
    logits = F.linear(x["hidden"], x["weight"], x["bias"])
    wrt = [x["hidden"], x["weight"], x["bias"]]
    ref = torch.autograd.grad(token_entropy(logits).pow(2).sum(), wrt)
    _, ent = chunked_logprobs_entropy(x["hidden"], x["weight"], x["targets"], chunk_tokens=3, bias=x["bias"])
    for a, b in zip(torch.autograd.grad(ent.pow(2).sum(), wrt), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

"""The sampling distribution the learner trains (temperature, min-p, top-k, top-p) and the mu gap.

Hand-computed on a four-token distribution p = (0.5, 0.3, 0.15, 0.05); the comparison against vLLM's
own sampler on the tiny model is tests/integration/test_behaviour_logprobs.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from stream_dapo.core import sampling
from stream_dapo.core.loss import PolicyLossParams, policy_loss, token_entropy, token_logprobs
from stream_dapo.core.sampling import SamplingPolicy, behaviour_gap, sampling_logits

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
LOGITS = PROBS.log().reshape(1, 1, 4) + 3.0  # an offset changes nothing


def _logprobs(policy: SamplingPolicy) -> torch.Tensor:
    z = sampling_logits(LOGITS, policy)
    return torch.log_softmax(z, dim=-1).reshape(-1)


def _expected(kept: list[float]) -> torch.Tensor:
    """log of the renormalised probabilities, -inf where a token is dropped (0 in ``kept``)."""
    t = torch.tensor(kept, dtype=torch.float64)
    return torch.where(t > 0, (t / t.sum()).log(), -math.inf)


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        (SamplingPolicy(), [0.5, 0.3, 0.15, 0.05]),
        # ascending cumulative mass 0.05, 0.20, 0.50, 1.0: top-p 0.9 drops what lies in the first 0.1
        (SamplingPolicy(top_p=0.9), [0.5, 0.3, 0.15, 0.0]),
        (SamplingPolicy(top_p=0.7), [0.5, 0.3, 0.0, 0.0]),
        (SamplingPolicy(top_p=0.3), [0.5, 0.0, 0.0, 0.0]),  # the top token always stays
        (SamplingPolicy(top_k=2), [0.5, 0.3, 0.0, 0.0]),
        (SamplingPolicy(top_k=4), [0.5, 0.3, 0.15, 0.05]),  # k >= vocabulary: off
        (SamplingPolicy(top_k=9), [0.5, 0.3, 0.15, 0.05]),
        (SamplingPolicy(min_p=0.4), [0.5, 0.3, 0.0, 0.0]),  # threshold 0.2
        (SamplingPolicy(top_k=3, top_p=0.9), [0.5, 0.3, 0.15, 0.0]),
        # top-p is applied to the top-k-renormalised mass: (0.5, 0.3) -> (0.625, 0.375); p = 0.6 drops 0.375
        (SamplingPolicy(top_k=2, top_p=0.6), [0.5, 0.0, 0.0, 0.0]),
        # temperature 0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025
        (SamplingPolicy(temperature=0.5), [0.25, 0.09, 0.0225, 0.0025]),
        # ... and top-p acts on the tempered mass: ascending cumsum (0.0068, 0.0685, 0.315, 1.0)
        (SamplingPolicy(temperature=0.5, top_p=0.9), [0.25, 0.09, 0.0, 0.0]),
        # temperature 2 takes square roots: top-p 0.95 then keeps all four (cumsum of the smallest 0.093)
        (SamplingPolicy(temperature=2.0, top_p=0.95), [0.5**0.5, 0.3**0.5, 0.15**0.5, 0.05**0.5]),
    ],
)
def test_the_sampling_distribution_is_tempered_truncated_and_renormalised(
    policy: SamplingPolicy, kept: list[float]
) -> None:
    got = _logprobs(policy)
    want = _expected(kept)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=1e-12)


def test_identity_policy_returns_the_logits_themselves() -> None:
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    assert sampling_logits(logits, SamplingPolicy()) is logits
    tempered = sampling_logits(logits, SamplingPolicy(temperature=0.5))
    assert tempered.dtype == torch.float32  # computed in float32 at least, like vLLM's sampler
    torch.testing.assert_close(tempered, logits.float() * 2.0)


def test_mask_is_computed_in_row_chunks_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, 37, generator=gen) * 3
    policy = SamplingPolicy(temperature=0.7, top_p=0.8, top_k=11, min_p=0.01)
    whole = sampling_logits(logits, policy)
    monkeypatch.setattr(sampling, "_MASK_CHUNK_ELEMENTS", 37 * 7)  # 7 rows at a time
    assert torch.equal(sampling_logits(logits, policy), whole)
    kept = torch.isfinite(whole).sum(dim=-1)
    assert int(kept.max()) <= 11 and int(kept.min()) >= 1


def test_gradient_flows_through_the_renormalised_softmax_only() -> None:
    z = LOGITS.clone().requires_grad_(True)
    policy = SamplingPolicy(temperature=0.5, top_k=2)
    logp = token_logprobs(sampling_logits(z, policy), torch.tensor([[1]]))
    logp.sum().backward()
    assert z.grad is not None  # a leaf that requires grad, after backward
    # d log pi_1 / dz = (onehot_1 - pi) / T over the kept tokens, 0 on the dropped ones.
    pi = torch.tensor([0.25, 0.09], dtype=torch.float64) / 0.34
    want = torch.tensor([-pi[0], 1 - pi[1], 0.0, 0.0], dtype=torch.float64) / 0.5
    torch.testing.assert_close(z.grad.reshape(-1), want, rtol=0, atol=1e-12)


def test_entropy_of_a_truncated_distribution_is_finite_with_a_finite_gradient() -> None:
    z = LOGITS.clone().requires_grad_(True)
    h = token_entropy(sampling_logits(z, SamplingPolicy(top_p=0.7)))
    p = torch.tensor([0.625, 0.375], dtype=torch.float64)
    torch.testing.assert_close(h.reshape(()), -(p * p.log()).sum(), rtol=0, atol=1e-12)
    h.sum().backward()
    assert z.grad is not None
    assert bool(torch.isfinite(z.grad).all())
    assert z.grad.reshape(-1)[2:].abs().max() == 0


def test_a_token_outside_the_current_kept_set_gets_no_gradient_and_a_finite_loss() -> None:
    """The sampled token (index 3) is excluded by the current policy's top-k: log pi = -inf."""
    z = LOGITS.expand(1, 2, 4).clone().requires_grad_(True)
    logp = token_logprobs(sampling_logits(z, SamplingPolicy(top_k=2)), torch.tensor([[3, 0]]))
    assert math.isinf(float(logp[0, 0].detach())) and math.isfinite(float(logp[0, 1].detach()))
    prox = torch.tensor([[math.log(0.05), math.log(0.625)]], dtype=torch.float64)
    loss, metrics = policy_loss(
        logp,
        prox.clone(),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2),
        PolicyLossParams(),
        prox_logprobs=prox,
        ref_logprobs=prox,
        entropy=token_entropy(sampling_logits(z, SamplingPolicy(top_k=2))),
    )
    loss.backward()
    assert z.grad is not None
    assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(z.grad).all())
    assert z.grad[0, 0].abs().max() == 0  # ratio ~0 on the excluded token: no gradient
    assert math.isfinite(metrics["kl_ref"]) and math.isfinite(metrics["entropy"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "greedy"),
        ({"temperature": 1e-6}, "greedy"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
    ],
)
def test_policies_that_are_not_a_distribution_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingPolicy(**kwargs)


def test_behaviour_gap_counts_bands_and_keeps_zero_ratios_out_of_the_mean() -> None:
    ratios = [1.0, 1.05, 0.95, 1.2, 3.0, 0.0, 0.4]  # pi_prox / mu; 0: prox outside the kept set
    mu = torch.full((1, 8), -1.0)
    prox = torch.tensor([[*(math.log(r) - 1.0 if r > 0 else -math.inf for r in ratios), 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])  # the last token is padding
    gap = behaviour_gap(prox, mu, mask)
    assert (gap.tokens, gap.finite, gap.outside_tight, gap.outside_wide) == (7, 6, 4, 3)
    logs = [abs(math.log(r)) for r in ratios if r > 0]
    assert gap.abs_sum == pytest.approx(sum(logs), abs=1e-6)
    assert gap.max_abs == pytest.approx(math.log(3.0), abs=1e-6)
    summary = gap.summary()
    assert summary is not None
    assert summary["mean_abs"] == pytest.approx(sum(logs) / 6, abs=1e-6)
    assert summary["max_abs"] == math.inf  # one ratio is 0
    assert (summary["outside_0.9_1.1"], summary["outside_0.5_2"]) == (4 / 7, 3 / 7)

    total = behaviour_gap(prox, mu, torch.zeros_like(mask))
    assert total.summary() is None
    total.add(gap)
    total.add(gap)
    assert (total.tokens, total.outside_wide, total.max_abs) == (14, 6, gap.max_abs)

"""The DAPO policy loss, log-probs and entropy, against hand-computed values.

Most cases use ratio_mode "behaviour" with behaviour log-probs 0, so that the ratio r = exp(logprobs)
can be read directly off the inputs, and float64 so that hand values hold to 1e-9.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stream_dapo.core.loss import PolicyLossParams, policy_loss, token_entropy, token_logprobs
from stream_dapo.core.loss_params import AggMode, RatioMode

F64 = torch.float64
LN = math.log


def _t(values: list, dtype: torch.dtype = F64, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


def _grad(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, leaf)
    return g


# --------------------------------------------------------------------------- log-probs and entropy


def test_token_logprobs_hand_values() -> None:
    # softmax([0, ln 3]) = [0.25, 0.75]
    logits = _t([[[0.0, LN(3.0)], [0.0, LN(3.0)]]])
    out = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(out, _t([[LN(0.75), LN(0.25)]]))  # [-0.2876821, -1.3862944]


def test_token_logprobs_equals_log_softmax_gather_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 4
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens), expected, rtol=1e-6, atol=1e-6)
    # Low-precision logits are computed in float32.
    assert token_logprobs(logits.to(torch.bfloat16), tokens).dtype == torch.float32


def test_token_logprobs_gradient_matches_log_softmax() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, 7, (2, 3), generator=gen)
    weights = torch.randn(2, 3, generator=gen, dtype=F64)
    g_ours = _grad((token_logprobs(logits, tokens) * weights).sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(g_ours, _grad((ref * weights).sum(), logits))


def test_token_logprobs_rejects_bad_tokens() -> None:
    logits = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\)"):
        token_logprobs(logits, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="tokens must be"):
        token_logprobs(logits, torch.tensor([[0, 1, 2]]))
    with pytest.raises(TypeError, match="integer"):
        token_logprobs(logits, torch.zeros(1, 2))


def test_token_entropy_hand_values() -> None:
    logits = _t([[[0.0, 0.0, -1e9], [0.0, LN(3.0), -1e9], [1.0, 1.0, 1.0]]])
    # [0.5, 0.5] -> ln 2; [0.25, 0.75] -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351; uniform(3) -> ln 3
    expected = _t([[LN(2.0), 0.25 * LN(4.0) + 0.75 * LN(4.0 / 3.0), LN(3.0)]])
    torch.testing.assert_close(token_entropy(logits), expected)
    assert expected[0, 1].item() == pytest.approx(0.5623351, abs=1e-7)


# --------------------------------------------------------------------------- the worked example
#
# Two samples, three tokens, ratio_mode "behaviour", behaviour log-probs 0 so r = exp(logprobs):
#   sample 0, A = +1, r = [1.5, 1.25, 1.0], mask [1, 1, 1]
#   sample 1, A = -1, r = [0.5, 1.1, (masked)], mask [1, 1, 0]
# Per-token loss -min(rA, clip(r)A), clip to [0.8, 1.28]:
#   (0,0) r 1.5 > 1.28 -> -1.28 (clipped, no gradient)   (0,1) -1.25   (0,2) -1.0
#   (1,0) r 0.5 < 0.8 -> min(-0.5, -0.8) = -0.8 -> +0.8 (clipped, no gradient)   (1,1) +1.1
# token-mean:          (-1.28 - 1.25 - 1.0 + 0.8 + 1.1) / 5            = -1.63 / 5  = -0.326
# seq-mean-token-mean: ((-3.53 / 3) + (1.9 / 2)) / 2 = (-1.1766667 + 0.95) / 2       = -0.1133333
# seq-mean-token-sum:  (-3.53 + 1.9) / 2                                               = -0.815
# With symmetric clipping [0.8, 1.2], (0,0) -> -1.2 and (0,1) r 1.25 is clipped too -> -1.2:
# token-mean: (-1.2 - 1.2 - 1.0 + 0.8 + 1.1) / 5 = -0.3.
# Gradient of token-mean w.r.t. logprobs: d(-A r)/dlogp = -A r on unclipped tokens, divided by 5:
#   clip-higher: [[0, -0.25, -0.2], [0, 0.22, 0]];  symmetric: [[0, 0, -0.2], [0, 0.22, 0]]

_R = [[1.5, 1.25, 1.0], [0.5, 1.1, 1.0]]
_A = [1.0, -1.0]
_M = [[1, 1, 1], [1, 1, 0]]


def _example(params: PolicyLossParams) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    logp = _t([[LN(r) for r in row] for row in _R], grad=True)
    loss, metrics = policy_loss(logp, torch.zeros(2, 3, dtype=F64), _t(_A), torch.tensor(_M), params)
    return loss, metrics, _grad(loss, logp)


@pytest.mark.parametrize(
    ("agg_mode", "expected"),
    [("token-mean", -0.326), ("seq-mean-token-mean", -0.11333333333), ("seq-mean-token-sum", -0.815)],
)
def test_worked_example_loss_for_each_aggregation(agg_mode: AggMode, expected: float) -> None:
    loss, metrics, _ = _example(PolicyLossParams(ratio_mode="behaviour", agg_mode=agg_mode))
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    assert metrics["pg_loss"] == pytest.approx(expected, abs=1e-9)


def test_worked_example_metrics() -> None:
    _, m, _ = _example(PolicyLossParams(ratio_mode="behaviour"))
    assert m["num_tokens"] == 5.0
    assert m["clip_frac_high"] == pytest.approx(0.2)  # token (0,0)
    assert m["clip_frac_low"] == pytest.approx(0.2)  # token (1,0)
    assert m["clip_frac_dual"] == 0.0
    assert m["ratio_mean"] == pytest.approx((1.5 + 1.25 + 1.0 + 0.5 + 1.1) / 5)  # 1.07
    assert m["masked_frac"] == 0.0
    assert (m["is_weight_mean"], m["is_weight_max"], m["is_weight_raw_max"]) == (1.0, 1.0, 1.0)
    # k3 = r - 1 - ln r: 0.0945349 + 0.0268564 + 0 + 0.1931472 + 0.0046898 = 0.3192283, / 5
    assert m["approx_kl_behaviour"] == pytest.approx(0.0638457, abs=1e-6)
    assert "entropy" not in m and "kl_ref" not in m


def test_clip_higher_changes_loss_and_gradient_versus_symmetric_clipping() -> None:
    loss_hi, m_hi, g_hi = _example(PolicyLossParams(ratio_mode="behaviour", eps_low=0.2, eps_high=0.28))
    loss_sym, m_sym, g_sym = _example(PolicyLossParams(ratio_mode="behaviour", eps_low=0.2, eps_high=0.2))
    assert loss_hi.item() == pytest.approx(-0.326, abs=1e-9)
    assert loss_sym.item() == pytest.approx(-0.3, abs=1e-9)
    torch.testing.assert_close(g_hi, _t([[0.0, -0.25, -0.2], [0.0, 0.22, 0.0]]))
    torch.testing.assert_close(g_sym, _t([[0.0, 0.0, -0.2], [0.0, 0.22, 0.0]]))
    assert m_hi["clip_frac_high"] == pytest.approx(0.2)
    assert m_sym["clip_frac_high"] == pytest.approx(0.4)  # r 1.25 now clipped too


def test_up_clipped_tokens_report_their_probability_under_the_ratio_denominator() -> None:
    # One sample, A = +1: mu = 0.1, 0.4, 0.5 and r = 1.5, 1.25, 1.0. With eps_high 0.2 the first
    # two are up-clipped (probabilities 0.1 + 0.4 over 3 tokens); with 0.28 only the first.
    mu = [0.1, 0.4, 0.5]
    behaviour = _t([[LN(p) for p in mu]])
    logp = _t([[LN(r * p) for r, p in zip([1.5, 1.25, 1.0], mu, strict=True)]], grad=True)
    adv, mask = _t([1.0]), torch.ones(1, 3)
    _, sym = policy_loss(logp, behaviour, adv, mask, PolicyLossParams(ratio_mode="behaviour", eps_high=0.2))
    _, hi = policy_loss(logp, behaviour, adv, mask, PolicyLossParams(ratio_mode="behaviour", eps_high=0.28))
    assert sym["clip_high_prob_density"] == pytest.approx(0.5 / 3)
    assert sym["clip_high_prob_density"] / sym["clip_frac_high"] == pytest.approx(0.25)
    assert hi["clip_high_prob_density"] / hi["clip_frac_high"] == pytest.approx(0.1)


def test_dual_clip_bounds_the_loss_of_a_huge_ratio_on_a_negative_advantage() -> None:
    # One sample, A = -1, r = [20, 3], c = 10. Token 0: -min(-20, -1.28) = 20 -> min(20, 10) = 10 (constant,
    # no gradient). Token 1: -min(-3, -1.28) = 3 < 10, gradient -A r = 3. token-mean over 2 tokens.
    def run(c: float | None) -> tuple[float, dict[str, float], torch.Tensor]:
        logp = _t([[LN(20.0), LN(3.0)]], grad=True)
        params = PolicyLossParams(ratio_mode="behaviour", dual_clip_c=c)
        loss, m = policy_loss(logp, torch.zeros(1, 2, dtype=F64), _t([-1.0]), torch.ones(1, 2), params)
        return loss.item(), m, _grad(loss, logp)

    loss, m, g = run(10.0)
    assert loss == pytest.approx((10.0 + 3.0) / 2)
    torch.testing.assert_close(g, _t([[0.0, 1.5]]))
    assert m["clip_frac_dual"] == pytest.approx(0.5)
    loss_off, m_off, g_off = run(None)
    assert loss_off == pytest.approx((20.0 + 3.0) / 2)
    torch.testing.assert_close(g_off, _t([[10.0, 1.5]]))
    assert m_off["clip_frac_dual"] == 0.0


def test_dual_clip_leaves_positive_advantages_alone() -> None:
    # A = +1, r = 20: -min(20, 1.28) = -1.28 whatever c is.
    logp = _t([[LN(20.0)]], grad=True)
    loss, m = policy_loss(
        logp,
        torch.zeros(1, 1, dtype=F64),
        _t([1.0]),
        torch.ones(1, 1),
        PolicyLossParams(ratio_mode="behaviour"),
    )
    assert loss.item() == pytest.approx(-1.28)
    assert m["clip_frac_dual"] == 0.0 and m["clip_frac_high"] == 1.0


# --------------------------------------------------------------------------- decoupled mode, IS weights


def test_decoupled_truncated_importance_weight() -> None:
    # mu = [0.2, 0.5], prox = [0.6, 0.4], pi = [0.6, 0.44], A = +1, C = 2.
    # w = min(prox/mu, 2) = [min(3, 2), 0.8] = [2, 0.8]; r = pi/prox = [1, 1.1] (inside the clip).
    # loss = (-2 * 1 - 0.8 * 1.1) / 2 = (-2 - 0.88) / 2 = -1.44; gradient -w r / 2 = [-1.0, -0.44].
    logp = _t([[LN(0.6), LN(0.44)]], grad=True)
    prox = _t([[LN(0.6), LN(0.4)]], grad=True)  # must not receive gradient
    mu = _t([[LN(0.2), LN(0.5)]])
    loss, m = policy_loss(logp, mu, _t([1.0]), torch.ones(1, 2), PolicyLossParams(), prox_logprobs=prox)
    assert loss.item() == pytest.approx(-1.44)
    loss.backward()
    torch.testing.assert_close(logp.grad, _t([[-1.0, -0.44]]))
    assert prox.grad is None
    assert m["is_weight_mean"] == pytest.approx(1.4)
    assert m["is_weight_max"] == pytest.approx(2.0)
    assert m["is_weight_raw_max"] == pytest.approx(3.0)
    assert m["ratio_mean"] == pytest.approx(1.05)
    # k3 of pi vs mu, r_b = pi/mu = [3, 0.88]: (3 - 1 - ln 3 + 0.88 - 1 - ln 0.88) / 2 = 0.4546105
    assert m["approx_kl_behaviour"] == pytest.approx(0.4546105, abs=1e-6)


def test_decoupled_masked_importance_weight_drops_tokens_outside_the_range() -> None:
    # prox/mu = [3, 0.8, 0.4] with C = 2: only 0.8 lies in [0.5, 2]. pi = prox so r = 1, A = +1.
    # loss = (0 - 1 + 0) / 3 (the normaliser counts the mask, dropped tokens included) = -1/3.
    logp = _t([[LN(0.6), LN(0.4), LN(0.2)]], grad=True)
    mu = _t([[LN(0.2), LN(0.5), LN(0.5)]])
    params = PolicyLossParams(is_mode="mask")
    loss, m = policy_loss(logp, mu, _t([1.0]), torch.ones(1, 3), params, prox_logprobs=logp.detach().clone())
    assert loss.item() == pytest.approx(-1.0 / 3.0)
    torch.testing.assert_close(_grad(loss, logp), _t([[0.0, -1.0 / 3.0, 0.0]]))
    assert m["masked_frac"] == pytest.approx(2.0 / 3.0)
    assert m["num_tokens"] == 1.0
    assert m["is_weight_mean"] == 1.0


def test_decoupled_mode_requires_prox_logprobs() -> None:
    with pytest.raises(ValueError, match="needs prox_logprobs"):
        policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2), PolicyLossParams()
        )


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("ratio_mode", ["behaviour", "decoupled"])
def test_non_finite_behaviour_logprobs_are_dropped_and_the_gradient_stays_finite(
    ratio_mode: RatioMode,
) -> None:
    # Token 0 is normal (r = 1, A = +1 -> loss -1); tokens 1-3 have mu = -inf, NaN, +inf and are dropped.
    # loss = -1 / 4 (the mask has 4 tokens); masked_frac = 3/4.
    logp = _t([[LN(0.5), LN(0.3), LN(0.3), LN(0.3)]], grad=True)
    mu = _t([[LN(0.5), -math.inf, math.nan, math.inf]])
    # In decoupled mode prox is finite everywhere and equals logp, so r = 1 and w = 1 on token 0.
    prox = logp.detach().clone() if ratio_mode == "decoupled" else None
    params = PolicyLossParams(ratio_mode=ratio_mode)
    loss, m = policy_loss(logp, mu, _t([1.0]), torch.ones(1, 4), params, prox_logprobs=prox)
    assert loss.item() == pytest.approx(-0.25)
    g = _grad(loss, logp)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, _t([[-0.25, 0.0, 0.0, 0.0]]))
    assert m["masked_frac"] == pytest.approx(0.75)
    assert m["num_tokens"] == 1.0
    assert all(math.isfinite(v) for v in m.values())


def test_non_finite_prox_logprobs_are_dropped_in_decoupled_mode() -> None:
    logp = _t([[0.0, 0.0]], grad=True)
    prox = _t([[0.0, math.nan]])
    loss, m = policy_loss(
        logp,
        torch.zeros(1, 2, dtype=F64),
        _t([1.0]),
        torch.ones(1, 2),
        PolicyLossParams(),
        prox_logprobs=prox,
    )
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(_grad(loss, logp), _t([[-0.5, 0.0]]))
    assert m["masked_frac"] == 0.5


def test_extreme_ratio_gives_a_finite_gradient() -> None:
    # log-ratio 200 would overflow exp(); the clamp at 20 keeps value and gradient finite.
    logp = _t([[200.0, 0.0]], grad=True)
    for adv in (1.0, -1.0):
        loss, _ = policy_loss(
            logp,
            torch.zeros(1, 2, dtype=F64),
            _t([adv]),
            torch.ones(1, 2),
            PolicyLossParams(ratio_mode="behaviour", dual_clip_c=None),
        )
        assert torch.isfinite(loss) and torch.isfinite(_grad(loss, logp)).all()


def test_empty_mask_gives_zero_loss_and_finite_metrics() -> None:
    logp = _t([[0.3, -0.2]], grad=True)
    loss, m = policy_loss(
        logp,
        torch.zeros(1, 2, dtype=F64),
        _t([1.0]),
        torch.zeros(1, 2),
        PolicyLossParams(ratio_mode="behaviour"),
    )
    assert loss.item() == 0.0
    torch.testing.assert_close(_grad(loss, logp), torch.zeros(1, 2, dtype=F64))
    assert m["num_tokens"] == 0.0 and m["masked_frac"] == 0.0
    assert all(math.isfinite(v) for v in m.values())


# --------------------------------------------------------------------------- KL and entropy terms


def test_k3_kl_to_reference_is_added_with_its_coefficient() -> None:
    # ref - logp = ln 2 on both tokens: k3 = 2 - ln 2 - 1 = 0.3068528. A = 0 so the surrogate is 0.
    # loss = 0.1 * 0.3068528; d k3 / d logp = 1 - exp(ref - logp) = -1, so gradient 0.1 * -1 / 2 = -0.05.
    logp = _t([[LN(0.25), LN(0.4)]], grad=True)
    ref = _t([[LN(0.5), LN(0.8)]])
    params = PolicyLossParams(ratio_mode="behaviour", kl_coef=0.1)
    loss, m = policy_loss(logp, logp.detach(), _t([0.0]), torch.ones(1, 2), params, ref_logprobs=ref)
    k3 = 2.0 - LN(2.0) - 1.0
    assert loss.item() == pytest.approx(0.1 * k3)
    assert m["kl_ref"] == pytest.approx(k3)
    torch.testing.assert_close(_grad(loss, logp), _t([[-0.05, -0.05]]))


def test_entropy_bonus_is_subtracted_with_its_coefficient() -> None:
    # A = 0; entropies [0.5, 1.0]: token-mean 0.75, loss = -0.01 * 0.75, d loss / d H = -0.01 / 2.
    ent = _t([[0.5, 1.0]], grad=True)
    params = PolicyLossParams(ratio_mode="behaviour", entropy_coef=0.01)
    zeros = torch.zeros(1, 2, dtype=F64)
    loss, m = policy_loss(zeros, zeros, _t([0.0]), torch.ones(1, 2), params, entropy=ent)
    assert loss.item() == pytest.approx(-0.0075)
    torch.testing.assert_close(_grad(loss, ent), _t([[-0.005, -0.005]]))
    assert m["entropy"] == pytest.approx(0.75)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps_low": 0.2, "eps_high": 0.1}, "must be >= eps_low"),
        ({"eps_low": 1.5}, r"eps_low must be in \[0, 1\]"),
        ({"dual_clip_c": 1.0}, "dual_clip_c must be > 1"),
        ({"is_cap": 1.0}, "is_cap must be"),
        (
            {"agg_mode": "mean"},
            "unknown agg_mode 'mean'; valid values: seq-mean-token-mean, seq-mean-token-sum, token-mean",
        ),
        ({"ratio_mode": "ppo"}, "valid values: behaviour, decoupled"),
        ({"is_mode": "clip"}, "valid values: icepop, mask, truncate"),
        ({"kl_coef": -0.1}, "kl_coef must be"),
    ],
)
def test_params_validation_names_the_fix(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolicyLossParams(**kwargs)  # type: ignore[arg-type]


def test_input_validation() -> None:
    z = torch.zeros(2, 3)
    p = PolicyLossParams(ratio_mode="behaviour")
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(z, z, torch.zeros(2, 3), z, p)
    with pytest.raises(ValueError, match="mask must have the shape"):
        policy_loss(z, z, torch.zeros(2), torch.ones(2, 4), p)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(z, z, torch.zeros(2), z, PolicyLossParams(ratio_mode="behaviour", kl_coef=0.1))
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(z, z, torch.zeros(2), z, PolicyLossParams(ratio_mode="behaviour", entropy_coef=0.1))
    with pytest.raises(ValueError, match="global_tokens must be > 0"):
        policy_loss(z, z, torch.zeros(2), z, p, global_tokens=0)


# --------------------------------------------------------------------------- gradient accumulation

_LENGTHS = [7, 2, 5, 1, 4, 6]  # unequal response lengths, padded to T = 7


def _accumulation_setup(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n, t, d, v = len(_LENGTHS), 7, 4, 5
    feats = torch.randn(n, t, d, generator=gen, dtype=F64)
    tokens = torch.randint(0, v, (n, t), generator=gen)
    w0 = torch.randn(d, v, generator=gen, dtype=F64)
    # The current weights moved away from the generator's, so ratios spread over the clip range.
    w = (w0 + 0.4 * torch.randn(d, v, generator=gen, dtype=F64)).requires_grad_(True)
    with torch.no_grad():
        behaviour = token_logprobs(feats @ w0, tokens)
        prox = token_logprobs(feats @ (w0 + 0.5 * (w - w0)), tokens)
    behaviour[2, 1] = -math.inf  # one broken behaviour log-prob rides along
    mask = (torch.arange(t).unsqueeze(0) < torch.tensor(_LENGTHS).unsqueeze(1)).to(F64)
    adv = torch.randn(n, generator=gen, dtype=F64)
    return {
        "feats": feats,
        "tokens": tokens,
        "w": w,
        "behaviour": behaviour,
        "prox": prox,
        "mask": mask,
        "adv": adv,
    }


def _micro_loss(
    s: dict[str, torch.Tensor],
    rows: list[int],
    params: PolicyLossParams,
    tokens: float | None,
    seqs: float | None,
) -> torch.Tensor:
    idx = torch.tensor(rows)
    logp = token_logprobs(s["feats"][idx] @ s["w"], s["tokens"][idx])
    loss, _ = policy_loss(
        logp,
        s["behaviour"][idx],
        s["adv"][idx],
        s["mask"][idx],
        params,
        prox_logprobs=s["prox"][idx],
        global_tokens=tokens,
        global_seqs=seqs,
    )
    return loss


def _accumulated_grad(
    s: dict[str, torch.Tensor], micro_batches: list[list[int]], params: PolicyLossParams, use_global: bool
) -> torch.Tensor:
    tokens = float(s["mask"].sum()) if use_global else None  # 25
    seqs = float((s["mask"].sum(-1) > 0).sum()) if use_global else None  # 6
    total = torch.zeros_like(s["w"])
    for rows in micro_batches:
        total += _grad(_micro_loss(s, rows, params, tokens, seqs), s["w"])
    return total


_MODES = [
    (a, r)
    for a in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
    for r in ("decoupled", "behaviour")
]


@pytest.mark.parametrize(("agg_mode", "ratio_mode"), _MODES)
def test_micro_batches_with_the_global_count_sum_to_the_full_batch_gradient(
    agg_mode: AggMode, ratio_mode: RatioMode
) -> None:
    s = _accumulation_setup()
    params = PolicyLossParams(agg_mode=agg_mode, ratio_mode=ratio_mode)
    full = _grad(_micro_loss(s, list(range(6)), params, None, None), s["w"])
    assert full.abs().max() > 1e-3  # the check below is not vacuous
    accumulated = _accumulated_grad(s, [[0, 1], [2, 3, 4], [5]], params, use_global=True)
    torch.testing.assert_close(accumulated, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("agg_mode", "ratio_mode"), _MODES)
def test_two_data_parallel_ranks_sum_to_the_full_batch_gradient(
    agg_mode: AggMode, ratio_mode: RatioMode
) -> None:
    s = _accumulation_setup()
    params = PolicyLossParams(agg_mode=agg_mode, ratio_mode=ratio_mode)
    full = _grad(_micro_loss(s, list(range(6)), params, None, None), s["w"])
    # Each rank accumulates its own micro-batches; the all-reduce sums the two ranks.
    rank0 = _accumulated_grad(s, [[0], [2, 4]], params, use_global=True)
    rank1 = _accumulated_grad(s, [[1, 3], [5]], params, use_global=True)
    torch.testing.assert_close(rank0 + rank1, full, rtol=0, atol=1e-6)


# The off-policy corrections of issue 40: sequence-level quantities are per row, and a row is one whole
# sample in every micro-batch, so the global counts keep accumulation exact for them too.
_CORRECTIONS = [
    {"is_level": "sequence"},
    {"is_level": "geometric", "is_mode": "mask", "is_cap": 1.3},
    {"is_mode": "icepop", "icepop_low": 0.8, "icepop_high": 1.25},
    {"is_level": "sequence", "is_mode": "icepop"},
    {"ratio_level": "sequence", "agg_mode": "seq-mean-token-mean"},
    {"ratio_level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4},
    {"surrogate": "cispo"},
    {"surrogate": "cispo", "eps_low": 1.0, "ratio_level": "sequence", "is_level": "geometric"},
]


@pytest.mark.parametrize("kwargs", _CORRECTIONS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_corrections_accumulate_over_micro_batches_and_ranks_to_the_full_batch_gradient(
    kwargs: dict[str, object],
) -> None:
    s = _accumulation_setup()
    params = PolicyLossParams(**kwargs)  # type: ignore[arg-type]
    full = _grad(_micro_loss(s, list(range(6)), params, None, None), s["w"])
    assert full.abs().max() > 1e-3
    accumulated = _accumulated_grad(s, [[0, 1], [2, 3, 4], [5]], params, use_global=True)
    torch.testing.assert_close(accumulated, full, rtol=0, atol=1e-6)
    rank0 = _accumulated_grad(s, [[0], [2, 4]], params, use_global=True)
    rank1 = _accumulated_grad(s, [[1, 3], [5]], params, use_global=True)
    torch.testing.assert_close(rank0 + rank1, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_per_micro_batch_normalisation_gives_a_different_gradient(agg_mode: AggMode) -> None:
    s = _accumulation_setup()
    params = PolicyLossParams(agg_mode=agg_mode)
    full = _grad(_micro_loss(s, list(range(6)), params, None, None), s["w"])
    naive = _accumulated_grad(s, [[0, 1], [2, 3, 4], [5]], params, use_global=False)
    assert (naive - full).abs().max() > 1e-2


@pytest.mark.process
def test_core_imports_no_service_dependencies() -> None:
    # The recipe core must stay importable without the transport, engine or config stacks.
    code = (
        "import sys, stream_dapo.core; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'zmq', 'vllm', 'deepspeed', 'prometheus_client', 'pydantic', 'msgpack'}); "
        "print(','.join(bad))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""

"""The off-policy corrections of the loss (issue 40), against hand-computed values and gradients, and
against float64 reference implementations written from each paper's formula.

Hand cases are in float64 so that hand values hold to 1e-9. The reference implementations loop over
samples with python/torch scalars and share no code with `stream_dapo.core.loss`.
"""

from __future__ import annotations

import math

import pytest
import torch

from stream_dapo.core.loss import PolicyLossParams, policy_loss

F64 = torch.float64
LN = math.log


def _t(values: list, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def _grad(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, leaf)
    return g


# --------------------------------------------------------------------------- behaviour weights
#
# Decoupled mode, pi = prox (so r = 1 and the clip is inactive), token-mean over 4 tokens:
#   sample 0, A = +1: prox = [0.6, 0.2], mu = [0.2, 0.4] -> rho = [3, 0.5]; product 1.5, geometric 1.2247449
#   sample 1, A = -1: prox = [0.4, 0.5], mu = [0.2, 0.2] -> rho = [2, 2.5]; product 5,   geometric 2.2360680
# Per-token loss -w * A * r = -w A; gradient d/dlogp = -w A r / 4 = -w A / 4.

_PROX = [[0.6, 0.2], [0.4, 0.5]]
_MU = [[0.2, 0.4], [0.2, 0.2]]
_SQRT_1_5 = math.sqrt(1.5)  # 1.2247449
_SQRT_5 = math.sqrt(5.0)  # 2.2360680


def _weights_example(**kwargs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    logp = _t([[LN(p) for p in row] for row in _PROX], grad=True)
    mu = _t([[LN(p) for p in row] for row in _MU])
    loss, m = policy_loss(
        logp,
        mu,
        _t([1.0, -1.0]),
        torch.ones(2, 2),
        PolicyLossParams(**kwargs),  # type: ignore[arg-type]
        prox_logprobs=logp.detach().clone(),
    )
    return loss.item(), _grad(loss, logp), m


@pytest.mark.parametrize(
    ("kwargs", "weights"),
    [
        # token TIS (the default): [min(3, 2), 0.5 | min(2, 2), min(2.5, 2)]
        ({}, [[2.0, 0.5], [2.0, 2.0]]),
        # sequence TIS: min(1.5, 2) on sample 0, min(5, 2) on sample 1
        ({"is_level": "sequence"}, [[1.5, 1.5], [2.0, 2.0]]),
        # geometric TIS: min(1.2247, 2), min(2.2361, 2)
        ({"is_level": "geometric"}, [[_SQRT_1_5, _SQRT_1_5], [2.0, 2.0]]),
        # sequence mask, C = 2.4: 1.5 in [1/2.4, 2.4] kept, 5 dropped
        ({"is_level": "sequence", "is_mode": "mask", "is_cap": 2.4}, [[1.0, 1.0], [0.0, 0.0]]),
        # geometric mask, C = 2.4: 1.2247 and 2.2361 both kept
        ({"is_level": "geometric", "is_mode": "mask", "is_cap": 2.4}, [[1.0, 1.0], [1.0, 1.0]]),
        # token mask, C = 2.2: 3 and 2.5 dropped, 0.5 and 2 kept with weight 1
        ({"is_mode": "mask", "is_cap": 2.2}, [[0.0, 1.0], [1.0, 0.0]]),
        # IcePop, band [0.4, 2.2]: 3 and 2.5 dropped, 0.5 and 2 kept with their own weight
        ({"is_mode": "icepop", "icepop_low": 0.4, "icepop_high": 2.2}, [[0.0, 0.5], [2.0, 0.0]]),
        # IcePop at the geometric level, band [0.4, 2.2]: 1.2247 kept, 2.2361 dropped
        (
            {"is_level": "geometric", "is_mode": "icepop", "icepop_low": 0.4, "icepop_high": 2.2},
            [[_SQRT_1_5, _SQRT_1_5], [0.0, 0.0]],
        ),
        # IcePop at the sequence level, band [0.5, 5.5]: products 1.5 and 5 both kept with their weight
        ({"is_level": "sequence", "is_mode": "icepop", "icepop_high": 5.5}, [[1.5, 1.5], [5.0, 5.0]]),
    ],
)
def test_behaviour_weight_modes_give_the_hand_computed_loss_and_gradient(
    kwargs: dict[str, object], weights: list[list[float]]
) -> None:
    loss, grad, m = _weights_example(**kwargs)
    w = weights
    # loss = (-w00 - w01 + w10 + w11) / 4; gradient -w A / 4
    assert loss == pytest.approx((-w[0][0] - w[0][1] + w[1][0] + w[1][1]) / 4, abs=1e-9)
    torch.testing.assert_close(grad, _t([[-w[0][0] / 4, -w[0][1] / 4], [w[1][0] / 4, w[1][1] / 4]]))
    kept = [x for row in w for x in row if x > 0]
    assert m["masked_frac"] == pytest.approx(1 - len(kept) / 4)
    assert m["num_tokens"] == len(kept)
    assert m["is_weight_mean"] == pytest.approx(sum(kept) / len(kept))
    assert m["is_weight_max"] == pytest.approx(max(kept))


def test_hand_values_of_the_behaviour_weight_table() -> None:
    # The table above written out for two rows, so a slip in the helper cannot hide them.
    assert _weights_example()[0] == pytest.approx(0.375)  # (-2 - 0.5 + 2 + 2) / 4
    loss, grad, m = _weights_example(is_level="sequence", is_mode="mask", is_cap=2.4)
    assert loss == pytest.approx(-0.5)
    torch.testing.assert_close(grad, _t([[-0.25, -0.25], [0.0, 0.0]]))
    assert m["masked_frac"] == 0.5
    assert m["is_weight_raw_max"] == pytest.approx(1.5)  # the kept sample's product (5 was dropped)
    loss, grad, _ = _weights_example(is_level="geometric")
    assert loss == pytest.approx((4.0 - 2 * 1.2247448714) / 4, abs=1e-9)  # 0.3876276
    torch.testing.assert_close(grad, _t([[-0.30618622, -0.30618622], [0.5, 0.5]]))


def test_sequence_weight_ignores_padding_and_broken_tokens() -> None:
    # One sample, A = +1, pi = prox; rho = [3, 0.5, (mu = -inf), (padding, mask 0, rho 100)].
    # The product over the finite mask tokens is 1.5 < C = 2, on the two kept tokens; the -inf token is
    # dropped. loss = -1.5 * 2 / 3 (three mask tokens); gradient -1.5 / 3 on the two kept tokens.
    logp = _t([[LN(0.6), LN(0.2), LN(0.3), LN(0.5)]], grad=True)
    mu = _t([[LN(0.2), LN(0.4), -math.inf, LN(0.005)]])
    params = PolicyLossParams(is_level="sequence")
    loss, m = policy_loss(
        logp, mu, _t([1.0]), _t([[1, 1, 1, 0]]), params, prox_logprobs=logp.detach().clone()
    )
    assert loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(_grad(loss, logp), _t([[-0.5, -0.5, 0.0, 0.0]]))
    assert m["masked_frac"] == pytest.approx(1 / 3)
    assert m["is_weight_max"] == pytest.approx(1.5)


# --------------------------------------------------------------------------- GSPO
#
# ratio_mode "behaviour" with mu = 0, so r_t = exp(logp_t). eps 0.2 / 0.28, seq-mean-token-mean:
#   sample 0, A = +1, r = [1.5, 1.0]: s_0 = sqrt(1.5) = 1.2247449 inside [0.8, 1.28] -> -s_0 on both tokens
#   sample 1, A = -1, r = [0.5, 0.5]: s_1 = 0.5 < 0.8 -> -min(-0.5, -0.8) = 0.8 (clipped, no gradient)
# loss = (-1.2247449 + 0.8) / 2 = -0.2123724. GSPO's gradient: d s_0 / d logp_t = s_0 / 2, so
# d loss / d logp_0t = -(1/2)(s_0/2) = -0.3061862 on both tokens of sample 0, 0 on sample 1.
# Token-level ratios on the same input: (-1.28 - 1.0) / 2 = -1.14 and 0.8 -> (-1.14 + 0.8) / 2 = -0.17.


def _gspo_example(ratio_level: str) -> tuple[float, torch.Tensor, dict[str, float]]:
    logp = _t([[LN(1.5), 0.0], [LN(0.5), LN(0.5)]], grad=True)
    params = PolicyLossParams(ratio_mode="behaviour", ratio_level=ratio_level, agg_mode="seq-mean-token-mean")  # type: ignore[arg-type]
    loss, m = policy_loss(logp, torch.zeros(2, 2, dtype=F64), _t([1.0, -1.0]), torch.ones(2, 2), params)
    return loss.item(), _grad(loss, logp), m


def test_gspo_sequence_ratio_hand_values_and_gradient() -> None:
    loss, grad, m = _gspo_example("sequence")
    assert loss == pytest.approx((-_SQRT_1_5 + 0.8) / 2, abs=1e-9)
    assert loss == pytest.approx(-0.2123724, abs=1e-7)
    torch.testing.assert_close(grad, _t([[-_SQRT_1_5 / 4, -_SQRT_1_5 / 4], [0.0, 0.0]]))
    assert m["seq_ratio_min"] == pytest.approx(0.5)
    assert m["seq_ratio_max"] == pytest.approx(_SQRT_1_5)
    assert m["ratio_mean"] == pytest.approx((2 * _SQRT_1_5 + 2 * 0.5) / 4)
    assert m["clip_frac_low"] == pytest.approx(0.5)  # both tokens of sample 1
    assert m["clip_frac_high"] == 0.0  # 1.2247 < 1.28: the sequence is not clipped, unlike its token 0


def test_token_ratio_on_the_gspo_example_differs() -> None:
    loss, grad, m = _gspo_example("token")
    assert loss == pytest.approx(-0.17, abs=1e-9)
    torch.testing.assert_close(grad, _t([[0.0, -0.25], [0.0, 0.0]]))
    assert m["clip_frac_high"] == pytest.approx(0.25)
    # The sequence-ratio spread is reported in token mode too: the same geometric means.
    assert (m["seq_ratio_min"], m["seq_ratio_max"]) == pytest.approx((0.5, _SQRT_1_5))


# --------------------------------------------------------------------------- CISPO
#
# ratio_mode "behaviour", mu = 0, eps 0.2 / 0.28, token-mean over 4 tokens:
#   sample 0, A = +1, r = [1.5, 1.0, 0.5] -> sg(clip(r)) = [1.28, 1.0, 0.8]
#   sample 1, A = -1, r = [20] (mask [1, 0, 0])   -> 1.28 (no dual clip in CISPO)
# loss = -(1.28 ln 1.5 + 1.0 ln 1 + 0.8 ln 0.5 - 1.28 ln 20) / 4
#      = -(0.5189953 + 0 - 0.5545177 - 3.8345373) / 4 = 0.9675149
# gradient -sg(clip(r)) A / 4 = [-0.32, -0.25, -0.2 | 0.32, 0, 0]: the up-clipped tokens keep theirs.


def _cispo_example(**kwargs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    logp = _t([[LN(1.5), 0.0, LN(0.5)], [LN(20.0), 0.0, 0.0]], grad=True)
    params = PolicyLossParams(ratio_mode="behaviour", surrogate="cispo", **kwargs)  # type: ignore[arg-type]
    mask = _t([[1, 1, 1], [1, 0, 0]])
    loss, m = policy_loss(logp, torch.zeros(2, 3, dtype=F64), _t([1.0, -1.0]), mask, params)
    return loss.item(), _grad(loss, logp), m


def test_cispo_hand_values_and_gradient() -> None:
    loss, grad, m = _cispo_example()
    expected = -(1.28 * LN(1.5) + 0.8 * LN(0.5) - 1.28 * LN(20.0)) / 4
    assert loss == pytest.approx(expected, abs=1e-12)
    assert loss == pytest.approx(0.9675149, abs=1e-7)
    torch.testing.assert_close(grad, _t([[-0.32, -0.25, -0.2], [0.32, 0.0, 0.0]]))
    assert m["clip_frac_high"] == pytest.approx(0.5)  # r 1.5 and r 20, whatever the sign of A
    assert m["clip_frac_low"] == pytest.approx(0.25)  # r 0.5
    assert m["clip_frac_dual"] == 0.0


def test_cispo_without_a_lower_bound_keeps_the_small_ratio() -> None:
    # eps_low 1 (MiniMax-M1's choice: no lower bound): the r = 0.5 token's weight is 0.5, not 0.8.
    loss, grad, m = _cispo_example(eps_low=1.0)
    assert loss == pytest.approx(-(1.28 * LN(1.5) + 0.5 * LN(0.5) - 1.28 * LN(20.0)) / 4, abs=1e-12)
    torch.testing.assert_close(grad, _t([[-0.32, -0.25, -0.125], [0.32, 0.0, 0.0]]))
    assert m["clip_frac_low"] == 0.0


def test_cispo_multiplies_the_behaviour_weight_in_decoupled_mode() -> None:
    # pi = prox (r = 1, IS weight 1), rho = prox/mu = [3, 0.5] truncated at 2: w = [2, 0.5], A = +1.
    # loss = -(2 ln 0.6 + 0.5 ln 0.2) / 2 = 1.3131075; gradient -w / 2 = [-1.0, -0.25].
    logp = _t([[LN(0.6), LN(0.2)]], grad=True)
    mu = _t([[LN(0.2), LN(0.4)]])
    loss, _ = policy_loss(
        logp,
        mu,
        _t([1.0]),
        torch.ones(1, 2),
        PolicyLossParams(surrogate="cispo"),
        prox_logprobs=logp.detach().clone(),
    )
    assert loss.item() == pytest.approx(-(2 * LN(0.6) + 0.5 * LN(0.2)) / 2, abs=1e-12)
    torch.testing.assert_close(_grad(loss, logp), _t([[-1.0, -0.25]]))


# --------------------------------------------------------------------------- float64 references
#
# Written from the papers' formulas, one sample at a time, on random inputs with unequal lengths.


def _random_batch(seed: int, spread: float = 0.3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 2, 7, 3, 6]
    n, t = len(lengths), 7
    mu = -torch.rand(n, t, generator=gen, dtype=F64) * 3 - 0.1
    prox = mu + spread * torch.randn(n, t, generator=gen, dtype=F64)
    logp = prox + spread * torch.randn(n, t, generator=gen, dtype=F64)
    mask = (torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(F64)
    adv = torch.randn(n, generator=gen, dtype=F64)
    return {"logp": logp, "prox": prox, "mu": mu, "mask": mask, "adv": adv, "lengths": torch.tensor(lengths)}


def _ours(b: dict[str, torch.Tensor], params: PolicyLossParams) -> tuple[torch.Tensor, torch.Tensor]:
    logp = b["logp"].clone().requires_grad_(True)
    loss, _ = policy_loss(logp, b["mu"], b["adv"], b["mask"], params, prox_logprobs=b["prox"])
    return loss, _grad(loss, logp)


def _reference_tis(b: dict[str, torch.Tensor], level: str, mode: str, p: PolicyLossParams) -> torch.Tensor:
    """Decoupled PPO with a behaviour weight: -(1/T) sum_i sum_t w_it min(r A, clip(r) A) (dual clip c),
    rho from the token ratios pi_prox/mu: per token, or the product / geometric mean over the sample."""
    logp = b["logp"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    for i, length in enumerate(b["lengths"].tolist()):
        a = float(b["adv"][i])
        token_rho = [math.exp(float(b["prox"][i, t] - b["mu"][i, t])) for t in range(length)]
        product = math.prod(token_rho)
        for t in range(length):
            rho = {"token": token_rho[t], "sequence": product, "geometric": product ** (1 / length)}[level]
            if mode == "truncate":
                w = min(rho, p.is_cap)
            elif mode == "mask":
                w = 1.0 if 1 / p.is_cap <= rho <= p.is_cap else 0.0
            else:  # IcePop: the ratio itself inside [a, b], 0 outside
                w = rho if p.icepop_low <= rho <= p.icepop_high else 0.0
            r = torch.exp(logp[i, t] - b["prox"][i, t])
            obj = torch.minimum(r * a, r.clamp(1 - p.eps_low, 1 + p.eps_high) * a)
            if a < 0 and p.dual_clip_c is not None:
                obj = torch.maximum(obj, torch.tensor(p.dual_clip_c * a, dtype=F64))
            total = total - w * obj
    loss = total / float(b["mask"].sum())
    return torch.stack([loss, *_grad(loss, logp).flatten()])


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask", "icepop"])
def test_behaviour_weights_match_the_float64_reference(level: str, mode: str) -> None:
    b = _random_batch(seed=1)
    # Bands wide enough that the geometric mean mostly passes and narrow enough that something is cut.
    cap = {"token": 1.3, "sequence": 2.0, "geometric": 1.15}[level]
    params = PolicyLossParams(is_level=level, is_mode=mode, is_cap=cap, icepop_low=0.8, icepop_high=1.3)  # type: ignore[arg-type]
    loss, grad = _ours(b, params)
    ref = _reference_tis(b, level, mode, params)
    assert grad.abs().max() > 1e-3
    torch.testing.assert_close(torch.stack([loss.detach(), *grad.flatten()]), ref, rtol=1e-10, atol=1e-12)


def _reference_gspo(b: dict[str, torch.Tensor], p: PolicyLossParams) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): J = (1/G) sum_i min(s_i A_i, clip(s_i) A_i),
    s_i = (prod_t pi_theta / pi_old)^(1/|y_i|), pi_old = mu."""
    logp = b["logp"].clone().requires_grad_(True)
    terms = []
    for i, length in enumerate(b["lengths"].tolist()):
        s = torch.prod(torch.exp(logp[i, :length] - b["mu"][i, :length])) ** (1.0 / length)
        a = float(b["adv"][i])
        terms.append(torch.minimum(s * a, s.clamp(1 - p.eps_low, 1 + p.eps_high) * a))
    loss = -torch.stack(terms).mean()
    return torch.stack([loss, *_grad(loss, logp).flatten()])


@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.2, 0.28), (3e-4, 4e-4), (0.05, 0.05)])
def test_gspo_matches_the_float64_reference(eps_low: float, eps_high: float) -> None:
    b = _random_batch(seed=2, spread=0.15)
    params = PolicyLossParams(
        ratio_mode="behaviour",
        ratio_level="sequence",
        agg_mode="seq-mean-token-mean",
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip_c=None,
    )
    loss, grad = _ours(b, params)
    ref = _reference_gspo(b, params)
    assert grad.abs().max() > 1e-3
    torch.testing.assert_close(torch.stack([loss.detach(), *grad.flatten()]), ref, rtol=1e-10, atol=1e-12)


def _reference_cispo(b: dict[str, torch.Tensor], p: PolicyLossParams) -> torch.Tensor:
    """CISPO (MiniMax-M1 2025): J = (1/sum_i |o_i|) sum_i sum_t sg(clip(r_it, 1-eps_low, 1+eps_high))
    A_i log pi_theta(o_it), r = pi_theta / pi_old, pi_old = mu; the loss is -J."""
    logp = b["logp"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    count = 0
    for i, length in enumerate(b["lengths"].tolist()):
        for t in range(length):
            r = math.exp(float(logp[i, t].detach() - b["mu"][i, t]))
            total = total + min(max(r, 1 - p.eps_low), 1 + p.eps_high) * float(b["adv"][i]) * logp[i, t]
            count += 1
    loss = -total / count
    return torch.stack([loss, *_grad(loss, logp).flatten()])


@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.2, 0.28), (1.0, 0.28), (1.0, 2.0)])
def test_cispo_matches_the_float64_reference(eps_low: float, eps_high: float) -> None:
    b = _random_batch(seed=3)
    params = PolicyLossParams(ratio_mode="behaviour", surrogate="cispo", eps_low=eps_low, eps_high=eps_high)
    loss, grad = _ours(b, params)
    ref = _reference_cispo(b, params)
    torch.testing.assert_close(torch.stack([loss.detach(), *grad.flatten()]), ref, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"is_mode": "icepop", "icepop_low": 1.0}, r"0 < icepop_low < 1 < icepop_high"),
        ({"icepop_high": 0.9}, "IcePop uses"),
        ({"icepop_low": 0.0}, "icepop_low"),
        ({"is_level": "seq"}, "valid values: geometric, sequence, token"),
        ({"ratio_level": "gspo"}, "valid values: sequence, token"),
        ({"surrogate": "ppo"}, "valid values: cispo, clip"),
        ({"ratio_mode": "behaviour", "is_level": "sequence"}, "set ratio_mode 'decoupled'"),
        ({"ratio_mode": "behaviour", "is_mode": "icepop"}, "set ratio_mode 'decoupled'"),
    ],
)
def test_correction_params_validation_names_the_fix(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolicyLossParams(**kwargs)  # type: ignore[arg-type]


def test_behaviour_mode_still_accepts_the_mask_it_always_accepted() -> None:
    PolicyLossParams(ratio_mode="behaviour", is_mode="mask")

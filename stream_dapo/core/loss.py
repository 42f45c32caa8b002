"""The DAPO policy loss with off-policy corrections, as pure functions on torch tensors.

Notation, per response token t of sample i: advantage A_i, behaviour log-prob mu_t (what the generator's
vLLM returned), proximal log-prob prox_t (the learner's no-grad log-prob at the start of consuming the
batch), current log-prob logp_t (with gradient).

Ratio modes (``PolicyLossParams.ratio_mode``):

- ``"decoupled"`` (default, decoupled PPO as in AReaL): r_t = exp(logp_t - prox_t) is clipped, and the
  staleness between the generator and the learner is corrected by a stop-gradient behaviour weight
  w_t = exp(prox_t - mu_t), truncated at C (``is_mode="truncate"``: w_t = min(w_t, C)) or turned into a
  0/1 mask (``is_mode="mask"``: w_t = 1 inside [1/C, C], 0 outside).
- ``"behaviour"``: mu plays the old policy of PPO: r_t = exp(logp_t - mu_t), w_t = 1.

Per-token loss, with clip(r) = clamp(r, 1 - eps_low, 1 + eps_high) (Clip-Higher when eps_high > eps_low)::

    l_t = -w_t * min(r_t * A_i, clip(r_t) * A_i)
    l_t = min(l_t, -c * A_i * w_t)          only where A_i < 0, when dual clip c is on

The dual clip is PPO's dual-clip bound: for A < 0 the objective max(min(rA, clip(r)A), cA) stops a
huge ratio on a bad action from producing an unbounded loss and gradient; in loss form (negated) that
is min(l_t, -cA) for w = 1, and the weight multiplies both sides since w >= 0.

Aggregation (``agg_mode``), with m the token mask:

- ``"token-mean"`` (DAPO): sum_it l_it m_it / global_tokens
- ``"seq-mean-token-mean"`` (GRPO): sum_i (sum_t l_it m_it / sum_t m_it) / global_seqs
- ``"seq-mean-token-sum"`` (Dr. GRPO-like): sum_it l_it m_it / global_seqs

``global_tokens`` and ``global_seqs`` must be counted over the whole mini-batch (all micro-batches and
all data-parallel ranks) and passed in: normalising per micro-batch silently reweights samples under
gradient accumulation. They are counted on the ``mask`` argument as given (see ``policy_loss``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stream_dapo.core.loss_params import AggMode, IsMode, PolicyLossParams, RatioMode

__all__ = [
    "AGGREGATIONS",
    "IS_MODES",
    "RATIO_MODES",
    "PolicyLossParams",
    "policy_loss",
    "token_entropy",
    "token_logprobs",
]

# Log-ratios are clamped to +-20 before exp: exp(20) ~ 4.9e8 is far beyond any clip bound, so the clamp
# changes nothing where the clip or dual clip is active, and it keeps exp() from overflowing to inf
# (whose gradient, multiplied by a zero from min/where, would be NaN).
_MAX_LOG_RATIO = 20.0


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probability of each given token under ``logits``.

    Computed as gathered logit minus logsumexp rather than ``log_softmax(...).gather``, so that no
    second [B, T, V] log-prob tensor is materialised. Computation is in float32 at least (float64 input
    stays float64); for bf16/fp16 logits this costs one float32 copy of the logits, which the precision
    of the log-probs needs.

    Args:
        logits: [B, T, V], the model's logits aligned with ``tokens`` (already shifted by one).
        tokens: [B, T] integer token ids in [0, V).

    Returns:
        [B, T] log-probs, float32 (or float64 for float64 logits).
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"tokens must be [B, T] = {tuple(logits.shape[:2])} to match logits, got {tuple(tokens.shape)}; "
            "shift logits and tokens so that logits[:, t] predicts tokens[:, t]"
        )
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor of token ids, got {tokens.dtype}")
    vocab = logits.shape[-1]
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(
            f"token ids must lie in [0, {vocab}) (the logits' vocabulary size), got range "
            f"[{int(tokens.min())}, {int(tokens.max())}]; check that tokenizer and model vocab sizes agree"
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(dtype)
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at every position, H = lse(z) - sum_v p_v z_v.

    Args:
        logits: [B, T, V]; entries at -inf (tokens a truncated sampling distribution excludes,
            ``stream_dapo.core.sampling.sampling_logits``) have probability 0.

    Returns:
        [B, T] entropies in nats, float32 (or float64 for float64 logits).
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.unsqueeze(-1))
    # Tokens a truncated sampling distribution masks to -inf have p = 0 and add nothing; zero their
    # logits first, or 0 * -inf would be NaN (in the value and in the gradient).
    finite_logits = logits.masked_fill(torch.isneginf(logits), 0.0)
    return lse - (probs * finite_logits).sum(dim=-1)


@dataclass(frozen=True)
class _RatioInputs:
    """What a ratio mode hands to the surrogate. All tensors [N, T], none carries gradient.

    Attributes:
        old: the log-prob in the ratio's denominator (prox or behaviour); arbitrary where not finite.
        finite: True where every log-prob this mode reads is finite.
        log_weight: log of the behaviour weight before truncation/masking (0 where not finite).
    """

    old: Tensor
    finite: Tensor
    log_weight: Tensor


def _decoupled_ratio(behaviour: Tensor, prox: Tensor | None) -> _RatioInputs:
    if prox is None:
        raise ValueError(
            "ratio_mode 'decoupled' needs prox_logprobs (the learner's no-grad log-probs at the start of "
            "consuming the batch); pass them, or use ratio_mode 'behaviour'"
        )
    finite = torch.isfinite(behaviour) & torch.isfinite(prox)
    # where() before any arithmetic on the non-finite values, so inf - inf never appears.
    log_weight = torch.where(finite, prox, 0.0) - torch.where(finite, behaviour, 0.0)
    return _RatioInputs(old=prox, finite=finite, log_weight=log_weight)


def _behaviour_ratio(behaviour: Tensor, prox: Tensor | None) -> _RatioInputs:
    # prox is not needed here; a learner that always computes it may still pass it.
    del prox
    finite = torch.isfinite(behaviour)
    return _RatioInputs(old=behaviour, finite=finite, log_weight=torch.zeros_like(behaviour))


RATIO_MODES: dict[RatioMode, Callable[[Tensor, Tensor | None], _RatioInputs]] = {
    "decoupled": _decoupled_ratio,
    "behaviour": _behaviour_ratio,
}


def _truncate_weight(log_weight: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling: w = min(exp(log_weight), C), computed in log space."""
    return torch.exp(torch.clamp(log_weight, max=math.log(cap)))


def _mask_weight(log_weight: Tensor, cap: float) -> Tensor:
    """Masked importance sampling: w = 1 where exp(log_weight) is in [1/C, C], else 0."""
    inside = log_weight.abs() <= math.log(cap)
    return inside.to(log_weight.dtype)


IS_MODES: dict[IsMode, Callable[[Tensor, float], Tensor]] = {
    "truncate": _truncate_weight,
    "mask": _mask_weight,
}


def _token_mean(values: Tensor, norm_mask: Tensor, tokens: Tensor, seqs: Tensor) -> Tensor:
    del norm_mask, seqs
    return values.sum() / tokens


def _seq_mean_token_mean(values: Tensor, norm_mask: Tensor, tokens: Tensor, seqs: Tensor) -> Tensor:
    del tokens
    per_seq_tokens = norm_mask.sum(dim=-1).clamp(min=1.0)
    return (values.sum(dim=-1) / per_seq_tokens).sum() / seqs


def _seq_mean_token_sum(values: Tensor, norm_mask: Tensor, tokens: Tensor, seqs: Tensor) -> Tensor:
    del norm_mask, tokens
    return values.sum() / seqs


# Each takes per-token values [N, T] already zeroed where they must not count, the normalisation mask
# [N, T], and the (global) token and sequence counts as 0-d tensors; returns a scalar.
AGGREGATIONS: dict[AggMode, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
}


def _check_inputs(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    optional: dict[str, Tensor | None],
) -> None:
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [N, T] (samples x response tokens), got {tuple(logprobs.shape)}")
    if not logprobs.dtype.is_floating_point:
        raise TypeError(f"logprobs must be a floating tensor, got {logprobs.dtype}")
    shape = logprobs.shape
    for name, tensor in {"behaviour_logprobs": behaviour_logprobs, "mask": mask, **optional}.items():
        if tensor is not None and tensor.shape != shape:
            raise ValueError(
                f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(tensor.shape)}; pad all "
                "per-token tensors of a micro-batch to the same length"
            )
    if advantages.shape != shape[:1]:
        raise ValueError(
            f"advantages must be [N] = ({shape[0]},), one per sample, got {tuple(advantages.shape)}; "
            "broadcasting to tokens happens inside the loss"
        )


def _resolve_count(value: float | None, local: Tensor, name: str) -> Tensor:
    if value is None:
        # An empty micro-batch yields a zero loss rather than 0/0.
        return local.clamp(min=1.0)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{name} must be > 0 (the count over the whole mini-batch, all ranks), got {value}; skip "
            "mini-batches with no valid tokens, or pass None to normalise locally"
        )
    return torch.as_tensor(float(value), dtype=local.dtype, device=local.device)


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    params: PolicyLossParams,
    *,
    prox_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DAPO clipped surrogate with behaviour-weight correction, dual clip, aggregation, KL and entropy.

    Args:
        logprobs: [N, T] current log-probs of the response tokens, with gradient.
        behaviour_logprobs: [N, T] generator log-probs mu (no gradient is taken through them).
        advantages: [N] per-sample advantage, broadcast over the sample's tokens.
        mask: [N, T] 1 (or True) for response tokens that count, 0 for prompt/padding/filtered samples.
        params: the switches.
        prox_logprobs: [N, T] the learner's no-grad log-probs at the start of the batch; required by
            ratio_mode "decoupled", ignored by "behaviour".
        ref_logprobs: [N, T] reference-policy log-probs; required when kl_coef > 0.
        entropy: [N, T] token entropies (with gradient, for the bonus); required when entropy_coef > 0,
            and reported as a metric whenever given.
        global_tokens: token count for "token-mean", summed over ``mask`` across every micro-batch and
            data-parallel rank of the mini-batch. None uses this call's ``mask.sum()``.
        global_seqs: sequence count for the "seq-mean-*" modes, the number of samples with at least one
            mask token across the mini-batch. None counts this call's.

    Tokens whose behaviour log-prob (or prox in decoupled mode) is NaN/inf, and tokens outside the
    [1/C, C] range in IS mask mode, are dropped: they contribute zero loss and zero gradient. They stay
    in the normalisers, which are therefore a function of ``mask`` alone, so a learner can count them
    once per mini-batch before the forward passes.

    Returns:
        (loss, metrics): the scalar loss, and python floats computed without gradient over the tokens
        that contributed: ``pg_loss``, ``clip_frac_low`` (A < 0 and r < 1 - eps_low),
        ``clip_frac_high`` (A > 0 and r > 1 + eps_high), ``clip_frac_dual`` (A < 0 and the dual bound
        active), ``clip_high_prob_density`` (the up-clipped tokens' probabilities under the ratio's
        denominator policy, summed and divided by the contributing tokens: divided by
        ``clip_frac_high`` it is their mean probability, DAPO's Fig. 3a), ``is_weight_mean``/``is_weight_max`` (w after truncation/masking),
        ``is_weight_raw_max`` (exp(prox - mu) before it; 1 in behaviour mode), ``masked_frac`` (dropped
        tokens / mask tokens), ``approx_kl_behaviour`` (k3 estimate of KL(mu || pi_theta) from tokens
        sampled from mu: r - 1 - log r with r = pi_theta / mu), ``ratio_mean``, ``num_tokens``
        (contributing tokens), and ``kl_ref`` / ``entropy`` when those terms are given.
    """
    _check_inputs(
        logprobs,
        behaviour_logprobs,
        advantages,
        mask,
        {"prox_logprobs": prox_logprobs, "ref_logprobs": ref_logprobs, "entropy": entropy},
    )
    if params.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            "kl_coef > 0 needs ref_logprobs; pass the reference model's log-probs or set kl_coef 0"
        )
    if params.entropy_coef > 0 and entropy is None:
        raise ValueError(
            "entropy_coef > 0 needs entropy (token_entropy of the logits); pass it or set it to 0"
        )

    dtype = logprobs.dtype
    behaviour = behaviour_logprobs.detach().to(dtype)
    prox = None if prox_logprobs is None else prox_logprobs.detach().to(dtype)
    adv = advantages.detach().to(dtype).unsqueeze(-1)
    given = mask.to(dtype) > 0

    ratio_inputs = RATIO_MODES[params.ratio_mode](behaviour, prox)
    weight = IS_MODES[params.is_mode](ratio_inputs.log_weight, params.is_cap)
    keep = given & ratio_inputs.finite & (weight > 0)

    # Sanitise before subtracting: a dropped token's log-ratio is exactly 0 and has zero gradient.
    old = torch.where(keep, ratio_inputs.old, logprobs.detach())
    log_ratio = torch.where(keep, logprobs - old, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)

    clipped_ratio = ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    clipped = torch.maximum(-adv * ratio, -adv * clipped_ratio)  # = -min(rA, clip(r)A)
    per_token = clipped
    if params.dual_clip_c is not None:
        dual_bound = -params.dual_clip_c * adv  # positive where A < 0
        per_token = torch.where(adv < 0, torch.minimum(clipped, dual_bound), clipped)
    per_token = torch.where(keep, weight * per_token, 0.0)

    norm_mask = given.to(dtype)
    tokens = _resolve_count(global_tokens, norm_mask.sum(), "global_tokens")
    seqs = _resolve_count(global_seqs, (norm_mask.sum(dim=-1) > 0).to(dtype).sum(), "global_seqs")
    aggregate = AGGREGATIONS[params.agg_mode]

    pg_loss = aggregate(per_token, norm_mask, tokens, seqs)
    loss = pg_loss
    kl_ref: Tensor | None = None
    if ref_logprobs is not None:
        ref = ref_logprobs.detach().to(dtype)
        kl_keep = keep & torch.isfinite(ref) & torch.isfinite(logprobs.detach())
        diff = torch.where(kl_keep, ref - logprobs, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        k3 = torch.where(kl_keep, torch.exp(diff) - diff - 1.0, 0.0)
        kl_ref = aggregate(k3, norm_mask, tokens, seqs)
        if params.kl_coef > 0:
            loss = loss + params.kl_coef * kl_ref
    entropy_mean: Tensor | None = None
    if entropy is not None:
        kept_entropy = torch.where(keep, entropy.to(dtype), 0.0)
        if params.entropy_coef > 0:
            loss = loss - params.entropy_coef * aggregate(kept_entropy, norm_mask, tokens, seqs)
        # The metric is a plain mean over contributing tokens, whatever the aggregation mode.
        entropy_mean = kept_entropy.detach().sum() / keep.to(dtype).sum().clamp(min=1.0)

    scalars = {"pg_loss": pg_loss}
    if kl_ref is not None:
        scalars["kl_ref"] = kl_ref
    if entropy_mean is not None:
        scalars["entropy"] = entropy_mean
    metrics = _loss_metrics(
        params, keep, given, adv, ratio, log_ratio, clipped, ratio_inputs, weight, scalars
    )
    return loss, metrics


@torch.no_grad()
def _loss_metrics(
    params: PolicyLossParams,
    keep: Tensor,
    given: Tensor,
    adv: Tensor,
    ratio: Tensor,
    log_ratio: Tensor,
    clipped: Tensor,
    ratio_inputs: _RatioInputs,
    weight: Tensor,
    scalars: dict[str, Tensor],
) -> dict[str, float]:
    """Token statistics over the contributing tokens, gathered with one device-to-host copy."""
    keep_f = keep.to(ratio.dtype)
    count = keep_f.sum()
    denom = count.clamp(min=1.0)

    def frac(condition: Tensor) -> Tensor:
        return (condition & keep).to(ratio.dtype).sum() / denom

    def mean(values: Tensor) -> Tensor:
        return (values * keep_f).sum() / denom

    neg = (adv < 0).expand_as(ratio)
    pos = (adv > 0).expand_as(ratio)
    if params.dual_clip_c is not None:
        dual_active = neg & (clipped > -params.dual_clip_c * adv)
    else:
        dual_active = torch.zeros_like(keep)
    # The log-ratio behaviour -> current. In decoupled mode logp - mu = (logp - prox) + (prox - mu).
    log_r_behaviour = log_ratio + torch.where(keep, ratio_inputs.log_weight, 0.0)
    k3_behaviour = torch.exp(log_r_behaviour) - 1.0 - log_r_behaviour
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    up_clipped = pos & (ratio > 1.0 + params.eps_high) & keep
    given_count = given.to(ratio.dtype).sum()
    names = [
        "clip_frac_low",
        "clip_frac_high",
        "clip_frac_dual",
        "clip_high_prob_density",
        "is_weight_mean",
        "is_weight_max",
        "is_weight_raw_max",
        "masked_frac",
        "approx_kl_behaviour",
        "ratio_mean",
        "num_tokens",
    ]
    values = [
        frac(neg & (ratio < 1.0 - params.eps_low)),
        frac(up_clipped),
        frac(dual_active),
        mean(torch.where(up_clipped, torch.exp(ratio_inputs.old), zero)),
        mean(weight),
        torch.where(keep, weight, zero).amax() if keep.numel() else zero,
        torch.where(keep, torch.exp(ratio_inputs.log_weight), zero).amax() if keep.numel() else zero,
        (given_count - count) / given_count.clamp(min=1.0),
        mean(k3_behaviour),
        mean(ratio),
        count,
    ]
    for name, scalar in scalars.items():
        names.append(name)
        values.append(scalar.detach())
    floats = torch.stack([v.to(ratio.dtype) for v in values]).cpu().tolist()
    return dict(zip(names, floats, strict=True))

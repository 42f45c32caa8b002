"""The DAPO policy loss with off-policy corrections, as pure functions on torch tensors.

Notation, per response token t of sample i: advantage A_i, behaviour log-prob mu_t (what the generator's
vLLM returned), proximal log-prob prox_t (the learner's no-grad log-prob at the start of consuming the
batch), current log-prob logp_t (with gradient).

The loss is assembled from five independent switches, each a small registry of pure functions below
(one documented place per correction). The defaults are DAPO's loss as it always was; every other
value is opt-in.

1. Ratio modes (``ratio_mode``, `RATIO_MODES`): what the policy ratio is taken against.

   - ``"decoupled"`` (default, decoupled PPO as in AReaL): r_t = exp(logp_t - prox_t), and the
     staleness between the generator and the learner is corrected by a stop-gradient behaviour weight
     on rho_t = exp(prox_t - mu_t).
   - ``"behaviour"``: mu plays the old policy of PPO: r_t = exp(logp_t - mu_t), w_t = 1.

2. Behaviour-weight granularity (``is_level``, `IS_LEVELS`), decoupled mode only: what rho is.

   - ``"token"`` (default): rho_t per token.
   - ``"sequence"``: the product over the sample's tokens, rho_i = prod_t rho_t, on every token of i
     (sequence-level TIS/MIS: TRL's sequence modes, verl's and SkyRL's sequence TIS).
   - ``"geometric"``: the geometric mean, rho_i = (prod_t rho_t)^(1/|y_i|), the length-normalised
     product (SkyRL's and verl's geometric sequence mask).

   Sequence values are taken over the sample's tokens that count (``mask``) and have finite log-probs.

3. Bounding (``is_mode``, `IS_MODES`) turns rho into the weight w:

   - ``"truncate"`` (default, truncated importance sampling): w = min(rho, C).
   - ``"mask"``: w = 1 where rho is in [1/C, C], else 0 (the token or sequence is dropped).
   - ``"icepop"`` (IcePop, inclusionAI's Ring-1T, 2025): w = rho where rho is in [a, b], else 0:
     both sides of the band are masked, the weight is kept inside it.

4. Ratio granularity (``ratio_level``, `RATIO_LEVELS`):

   - ``"token"`` (default): r_t as above.
   - ``"sequence"`` (GSPO, Zheng et al. 2025): s_i = (prod_t pi_theta/pi_old)^(1/|y_i|), the
     length-normalised sequence ratio, on every token of i in GSPO-token form,
     r_t = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t)): the value is s_i and the gradient of r_t is
     s_i * grad log pi_theta(y_t), so with agg_mode "seq-mean-token-mean" the loss and its gradient
     are GSPO's exactly (the clip then acts on whole sequences).

5. Surrogate (``surrogate``, `SURROGATES`), per token, with clip(r) = clamp(r, 1 - eps_low, 1 + eps_high):

   - ``"clip"`` (default, PPO with Clip-Higher when eps_high > eps_low)::

         l_t = -w_t * min(r_t * A_i, clip(r_t) * A_i)
         l_t = min(l_t, -c * A_i * w_t)          only where A_i < 0, when dual clip c is on

     The dual clip is PPO's dual-clip bound: for A < 0 the objective max(min(rA, clip(r)A), cA) stops
     a huge ratio on a bad action from producing an unbounded loss and gradient; in loss form
     (negated) that is min(l_t, -cA) for w = 1, and the weight multiplies both sides since w >= 0.
   - ``"cispo"`` (CISPO, MiniMax-M1 2025): l_t = -w_t * sg(clip(r_t)) * A_i * logp_t. The clipped ratio
     is a stop-gradient weight on the log-prob; no token's update is clipped away and there is no dual
     clip. The value is not a surrogate of the return (it contains logp); its gradient is the point.

Aggregation (``agg_mode``), with m the token mask:

- ``"token-mean"`` (DAPO): sum_it l_it m_it / global_tokens
- ``"seq-mean-token-mean"`` (GRPO): sum_i (sum_t l_it m_it / sum_t m_it) / global_seqs
- ``"seq-mean-token-sum"`` (Dr. GRPO-like): sum_it l_it m_it / global_seqs

``global_tokens`` and ``global_seqs`` must be counted over the whole mini-batch (all micro-batches and
all data-parallel ranks) and passed in: normalising per micro-batch silently reweights samples under
gradient accumulation. They are counted on the ``mask`` argument as given (see ``policy_loss``).
Sequence-level quantities need a sample's tokens in one row: the learner hands the loss one sample per row
(shared-prompt forward rows are unpacked into that per-sample view first, `stream_dapo.learner.packing`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stream_dapo.core.loss_params import (
    AggMode,
    IsLevel,
    IsMode,
    PolicyLossParams,
    RatioLevel,
    RatioMode,
    Surrogate,
)

__all__ = [
    "AGGREGATIONS",
    "IS_LEVELS",
    "IS_MODES",
    "RATIO_LEVELS",
    "RATIO_MODES",
    "SURROGATES",
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


def _token_level(log_weight: Tensor, valid: Tensor) -> Tensor:
    """Token-level behaviour weight: log rho_t as it is."""
    del valid
    return log_weight


def _sequence_level(log_weight: Tensor, valid: Tensor) -> Tensor:
    """Sequence-level weight: log prod_t rho_t = sum_t log rho_t over the valid tokens, on every token."""
    total = torch.where(valid, log_weight, 0.0).sum(dim=-1, keepdim=True)
    return total.expand_as(log_weight)


def _geometric_level(log_weight: Tensor, valid: Tensor) -> Tensor:
    """Geometric-mean weight: (1/|y|) sum_t log rho_t over the |y| valid tokens, on every token."""
    count = valid.to(log_weight.dtype).sum(dim=-1, keepdim=True).clamp(min=1.0)
    total = torch.where(valid, log_weight, 0.0).sum(dim=-1, keepdim=True)
    return (total / count).expand_as(log_weight)


# Each takes log rho [N, T] (no gradient) and the valid-token mask [N, T] (counted and finite); returns
# the log of the weight that `IS_MODES` bounds, [N, T].
IS_LEVELS: dict[IsLevel, Callable[[Tensor, Tensor], Tensor]] = {
    "token": _token_level,
    "sequence": _sequence_level,
    "geometric": _geometric_level,
}


def _truncate_weight(log_weight: Tensor, params: PolicyLossParams) -> Tensor:
    """Truncated importance sampling: w = min(exp(log_weight), C), computed in log space."""
    return torch.exp(torch.clamp(log_weight, max=math.log(params.is_cap)))


def _mask_weight(log_weight: Tensor, params: PolicyLossParams) -> Tensor:
    """Masked importance sampling: w = 1 where exp(log_weight) is in [1/C, C], else 0."""
    inside = log_weight.abs() <= math.log(params.is_cap)
    return inside.to(log_weight.dtype)


def _icepop_weight(log_weight: Tensor, params: PolicyLossParams) -> Tensor:
    """IcePop: w = exp(log_weight) where it lies in [a, b] = [icepop_low, icepop_high], else 0."""
    inside = (log_weight >= math.log(params.icepop_low)) & (log_weight <= math.log(params.icepop_high))
    return torch.where(inside, torch.exp(torch.where(inside, log_weight, 0.0)), 0.0)


IS_MODES: dict[IsMode, Callable[[Tensor, PolicyLossParams], Tensor]] = {
    "truncate": _truncate_weight,
    "mask": _mask_weight,
    "icepop": _icepop_weight,
}


def _token_log_ratio(logprobs: Tensor, old: Tensor, keep: Tensor) -> Tensor:
    """log r_t = logp_t - old_t on kept tokens (0 elsewhere), clamped to +-_MAX_LOG_RATIO."""
    return torch.where(keep, logprobs - old, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _sequence_log_ratio(logprobs: Tensor, old: Tensor, keep: Tensor) -> Tensor:
    """GSPO-token: log r_t = sg(log s_i) + logp_t - sg(logp_t), log s_i the mean of logp - old over the
    sample's kept tokens (clamped to +-_MAX_LOG_RATIO); 0 on tokens not kept."""
    token = torch.where(keep, logprobs.detach() - old, 0.0)
    count = keep.to(logprobs.dtype).sum(dim=-1, keepdim=True).clamp(min=1.0)
    seq = (token.sum(dim=-1, keepdim=True) / count).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.where(keep, seq + (logprobs - logprobs.detach()), 0.0)


# Each takes the current log-probs [N, T] (with gradient), the ratio's denominator [N, T] (no
# gradient, equal to logprobs where not kept) and the kept-token mask; returns log r [N, T].
RATIO_LEVELS: dict[RatioLevel, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
}


@dataclass(frozen=True)
class _SurrogateOut:
    """A surrogate's per-token loss before the behaviour weight, and where its bounds bound.

    Attributes:
        per_token: [N, T] l_t for w = 1 (with gradient).
        low / high: [N, T] bool, the tokens the lower / upper clip bound acted on.
        dual: [N, T] bool, the tokens the dual clip bound acted on.
    """

    per_token: Tensor
    low: Tensor
    high: Tensor
    dual: Tensor


def _clip_surrogate(logprobs: Tensor, ratio: Tensor, adv: Tensor, params: PolicyLossParams) -> _SurrogateOut:
    """PPO's clipped surrogate -min(rA, clip(r)A), with the dual clip for A < 0 when it is on."""
    del logprobs
    clipped_ratio = ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    clipped = torch.maximum(-adv * ratio, -adv * clipped_ratio)  # = -min(rA, clip(r)A)
    per_token = clipped
    neg = (adv < 0).expand_as(ratio)
    dual = torch.zeros_like(neg)
    if params.dual_clip_c is not None:
        dual_bound = -params.dual_clip_c * adv  # positive where A < 0
        per_token = torch.where(adv < 0, torch.minimum(clipped, dual_bound), clipped)
        dual = neg & (clipped.detach() > dual_bound)
    with torch.no_grad():
        low = neg & (ratio < 1.0 - params.eps_low)
        high = (adv > 0).expand_as(ratio) & (ratio > 1.0 + params.eps_high)
    return _SurrogateOut(per_token, low, high, dual)


def _cispo_surrogate(logprobs: Tensor, ratio: Tensor, adv: Tensor, params: PolicyLossParams) -> _SurrogateOut:
    """CISPO: -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp; every token keeps its gradient."""
    ratio = ratio.detach()
    is_weight = ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    low = ratio < 1.0 - params.eps_low
    high = ratio > 1.0 + params.eps_high
    return _SurrogateOut(-is_weight * adv * logprobs, low, high, torch.zeros_like(low))


# Each takes the current log-probs [N, T] (with gradient; 0 on tokens not kept), the ratio r [N, T]
# (with gradient), the advantages [N, 1] and the params.
SURROGATES: dict[Surrogate, Callable[[Tensor, Tensor, Tensor, PolicyLossParams], _SurrogateOut]] = {
    "clip": _clip_surrogate,
    "cispo": _cispo_surrogate,
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
    """DAPO's policy loss with the off-policy corrections the params select (module docstring).

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

    Tokens whose behaviour log-prob (or prox in decoupled mode) is NaN/inf, and tokens (or, at
    sequence level, whole samples) whose weight is 0 in IS mode "mask" or "icepop", are dropped: they
    contribute zero loss and zero gradient, and do not enter a sequence ratio. They stay
    in the normalisers, which are therefore a function of ``mask`` alone, so a learner can count them
    once per mini-batch before the forward passes.

    Returns:
        (loss, metrics): the scalar loss, and python floats computed without gradient over the tokens
        that contributed: ``pg_loss``, ``clip_frac_low`` (A < 0 and r < 1 - eps_low; with CISPO any A),
        ``clip_frac_high`` (A > 0 and r > 1 + eps_high; with CISPO any A), ``clip_frac_dual`` (A < 0
        and the dual bound active), ``clip_high_prob_density`` (the up-clipped tokens' probabilities
        under the ratio's denominator policy, summed and divided by the contributing tokens: divided
        by ``clip_frac_high`` it is their mean probability, DAPO's Fig. 3a),
        ``is_weight_mean``/``is_weight_max`` (w after truncation/masking, per token; a sequence weight
        counts once per token), ``is_weight_raw_max`` (rho before it, at the chosen granularity; 1 in
        behaviour mode), ``masked_frac`` (dropped tokens / mask tokens), ``approx_kl_behaviour`` (k3
        estimate of KL(mu || pi_theta) from tokens sampled from mu: r - 1 - log r with
        r = pi_theta / mu), ``ratio_mean``, ``seq_ratio_min``/``seq_ratio_max`` (extremes over the
        samples of the length-normalised sequence ratio exp(mean_t log r_t), GSPO's s_i; 1 without
        samples), ``num_tokens`` (contributing tokens), and ``kl_ref`` / ``entropy`` when given.
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
    valid = given & ratio_inputs.finite
    log_weight = IS_LEVELS[params.is_level](ratio_inputs.log_weight, valid)
    weight = IS_MODES[params.is_mode](log_weight, params)
    keep = valid & (weight > 0)

    # Sanitise before subtracting: a dropped token's log-ratio is exactly 0 and has zero gradient.
    old = torch.where(keep, ratio_inputs.old, logprobs.detach())
    log_ratio = RATIO_LEVELS[params.ratio_level](logprobs, old, keep)
    ratio = torch.exp(log_ratio)

    surrogate = SURROGATES[params.surrogate](torch.where(keep, logprobs, 0.0), ratio, adv, params)
    per_token = torch.where(keep, weight * surrogate.per_token, 0.0)

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
        keep, given, ratio, log_ratio, surrogate, ratio_inputs, log_weight, weight, scalars
    )
    return loss, metrics


@torch.no_grad()
def _loss_metrics(
    keep: Tensor,
    given: Tensor,
    ratio: Tensor,
    log_ratio: Tensor,
    surrogate: _SurrogateOut,
    ratio_inputs: _RatioInputs,
    log_weight: Tensor,
    weight: Tensor,
    scalars: dict[str, Tensor],
) -> dict[str, float]:
    """Token statistics over the contributing tokens, gathered with one device-to-host copy."""
    keep_f = keep.to(ratio.dtype)
    count = keep_f.sum()
    denom = count.clamp(min=1.0)
    log_ratio = log_ratio.detach()

    def frac(condition: Tensor) -> Tensor:
        return (condition & keep).to(ratio.dtype).sum() / denom

    def mean(values: Tensor) -> Tensor:
        return (values * keep_f).sum() / denom

    # The log-ratio behaviour -> current. In decoupled mode logp - mu = (logp - prox) + (prox - mu).
    log_r_behaviour = log_ratio + torch.where(keep, ratio_inputs.log_weight, 0.0)
    k3_behaviour = torch.exp(log_r_behaviour) - 1.0 - log_r_behaviour
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    up_clipped = surrogate.high & keep
    given_count = given.to(ratio.dtype).sum()
    # The length-normalised sequence ratio exp(mean_t log r_t) of every sample with a kept token (in
    # ratio_level "sequence" it is GSPO's s_i itself); 1 when there is none.
    seq_tokens = keep_f.sum(dim=-1)
    has_seq = seq_tokens > 0
    seq_log = (log_ratio * keep_f).sum(dim=-1) / seq_tokens.clamp(min=1.0)
    any_seq = bool(has_seq.any()) if has_seq.numel() else False
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
        "seq_ratio_min",
        "seq_ratio_max",
        "num_tokens",
    ]
    values = [
        frac(surrogate.low),
        frac(up_clipped),
        frac(surrogate.dual),
        mean(torch.where(up_clipped, torch.exp(ratio_inputs.old), zero)),
        mean(weight),
        torch.where(keep, weight, zero).amax() if keep.numel() else zero,
        torch.where(keep, torch.exp(log_weight), zero).amax() if keep.numel() else zero,
        (given_count - count) / given_count.clamp(min=1.0),
        mean(k3_behaviour),
        mean(ratio),
        torch.exp(seq_log[has_seq].amin()) if any_seq else one,
        torch.exp(seq_log[has_seq].amax()) if any_seq else one,
        count,
    ]
    for name, scalar in scalars.items():
        names.append(name)
        values.append(scalar.detach())
    floats = torch.stack([v.to(ratio.dtype) for v in values]).cpu().tolist()
    return dict(zip(names, floats, strict=True))

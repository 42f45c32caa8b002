"""The distribution a token was sampled from, and how far the behaviour log-probs are from it.

The policy the learner trains is the one the generators sample: the model's next-token logits z,
divided by the temperature T, then truncated by min-p, top-k and top-p (in that order, each
masking logits to -inf) and renormalised over what is left::

    pi(y | x) = softmax(trunc(z / T))_y

This is what vLLM 0.32 samples from and, with ``logprobs_mode = "processed_logprobs"``, what it
returns as the sampled token's log-prob (``vllm/v1/sample/sampler.py``: temperature, then the
argmax-invariant min-p processor, then ``apply_top_k_top_p``; its log-softmax of the masked
logits). So at identical weights pi_prox / mu = 1 up to float rounding, whatever the settings.

Why the truncated distribution rather than the tempered one: mu is the truncated distribution (it
is what sampled the token), so an untruncated pi would give every kept token a weight
pi/mu = (kept mass) < 1 that measures the truncation, not staleness, and would bias the clipped
ratio at staleness 0. The truncation set is recomputed from the learner's own logits (it depends
on theta; its gradient is zero almost everywhere, so the gradient flows through the renormalised
softmax over the kept set only). A sampled token that falls outside the current policy's kept set
gets log-prob -inf: ratio 0, no gradient; the loss drops tokens whose behaviour or proximal
log-prob is not finite. With top-p = 1, top-k off and min-p 0 the policy is the tempered softmax
and nothing is masked.

``behaviour_gap`` measures mu against the learner's proximal log-probs per token, over all trained
tokens and over the *fresh* ones (sampled by the very weights the proximal pass used), where any
gap is numerics or a sampling mismatch, never staleness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: the config validates with SamplingPolicy torch-free
    from torch import Tensor

__all__ = [
    "BAND_TIGHT",
    "BAND_WIDE",
    "BehaviourGap",
    "SamplingPolicy",
    "behaviour_gap",
    "sampling_logits",
    "truncation_mask",
]

BAND_TIGHT = (0.9, 1.1)
"""Ratio band pi_prox / mu that float32 on identical weights never leaves."""
BAND_WIDE = (0.5, 2.0)
"""The default truncation/mask band of the behaviour weight (algo.is_cap = 2)."""

GREEDY_TEMPERATURE = 1e-5
"""vLLM samples greedily below this temperature (``_SAMPLING_EPS``); its processed log-probs are
then those of the untempered logits, which no sampling policy the learner can define matches."""

# Rows of [rows, V] whose truncation mask is computed at once: bounds the sort's memory to about
# 2**24 elements (64 MiB of float32 plus its int64 indices) whatever the vocabulary.
_MASK_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class SamplingPolicy:
    """Temperature and truncation of the sampling distribution (see the module docstring).

    Attributes:
        temperature: T > 0; logits are divided by it.
        top_p: nucleus mass in (0, 1]; 1 turns it off.
        top_k: keep the k largest logits; 0 (or >= the vocabulary) turns it off.
        min_p: drop tokens whose probability is below min_p x the largest; 0 turns it off.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= GREEDY_TEMPERATURE):
            raise ValueError(
                f"temperature {self.temperature:g} is greedy decoding (vLLM samples the argmax below "
                f"{GREEDY_TEMPERATURE:g}): the G samples of a group are identical (dynamic sampling drops "
                "every group) and vLLM's log-probs are those of the untempered logits, not of what it "
                "sampled; set temperature > 0 (DAPO: 1.0)"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 turns it off), got {self.min_p}")

    @property
    def truncates(self) -> bool:
        """True when some tokens may be masked out (top-p < 1, top-k on or min-p > 0)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @property
    def is_identity(self) -> bool:
        """True when the sampling distribution is the model's softmax itself (T = 1, no truncation)."""
        return self.temperature == 1.0 and not self.truncates

    def describe(self) -> str:
        k = "off" if self.top_k == 0 else str(self.top_k)
        return f"temperature {self.temperature:g}, top-p {self.top_p:g}, top-k {k}, min-p {self.min_p:g}"


def truncation_mask(z: Tensor, policy: SamplingPolicy) -> Tensor:
    """True where vLLM's sampler masks a token: [N, V] tempered float32 logits -> [N, V] bool.

    The same rule, order and comparisons as vLLM 0.32 (min-p on the tempered probabilities; top-k
    keeps every logit >= the k-th largest; top-p sorts ascending, takes the softmax of the
    (top-k-masked) sorted logits, and drops positions whose cumulative mass is <= 1 - p, never the
    largest), so a boundary decision flips only when the two sides' logits round differently there.
    """
    import torch

    mask = torch.zeros_like(z, dtype=torch.bool)
    vocab = z.shape[-1]
    if policy.min_p > 0.0:
        probs = torch.softmax(z, dim=-1)
        mask |= probs < probs.amax(dim=-1, keepdim=True) * policy.min_p
    top_k = policy.top_k if 0 < policy.top_k < vocab else 0
    if top_k == 0 and policy.top_p >= 1.0:
        return mask
    masked = z.masked_fill(mask, -math.inf)
    if top_k:
        kth = torch.topk(masked, top_k, dim=-1).values[..., -1:]
        mask |= masked < kth
        masked = masked.masked_fill(mask, -math.inf)
    if policy.top_p < 1.0:
        sorted_z, order = masked.sort(dim=-1, descending=False)
        cumulative = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - policy.top_p
        drop[..., -1] = False  # the most likely token always stays
        mask |= torch.zeros_like(drop).scatter_(-1, order, drop)
    return mask


def sampling_logits(logits: Tensor, policy: SamplingPolicy) -> Tensor:
    """Logits of the sampling distribution: ``logits / T``, truncated tokens at -inf.

    ``token_logprobs`` and ``token_entropy`` of the result are the sampled distribution's log-probs
    and entropy. Differentiable in ``logits`` (the mask is computed without gradient). Returns the
    input itself when the policy is the identity, so the default costs nothing.

    Args:
        logits: [..., V] logits, any float dtype (computed in float32 at least, like vLLM's sampler).
        policy: the generator's sampling settings.

    Returns:
        [..., V] float32 (or float64) logits.
    """
    import torch

    if policy.is_identity:
        return logits
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if policy.temperature != 1.0:
        z = z / policy.temperature
    if not policy.truncates:
        return z
    flat = z.detach().reshape(-1, z.shape[-1])
    rows = max(1, _MASK_CHUNK_ELEMENTS // max(1, z.shape[-1]))
    with torch.no_grad():
        parts = [truncation_mask(flat[i : i + rows], policy) for i in range(0, flat.shape[0], rows)]
    mask = torch.cat(parts) if parts else torch.zeros_like(flat, dtype=torch.bool)
    return z.masked_fill(mask.reshape(z.shape), -math.inf)


# --------------------------------------------------------------------------------------------------
# Behaviour vs proximal log-probs
# --------------------------------------------------------------------------------------------------

_GAP_SUMS = ("tokens", "abs_sum", "finite", "outside_tight", "outside_wide")


@dataclass
class BehaviourGap:
    """Per-token d = log pi_prox - log mu over one subset of trained tokens, as sums (additive over
    micro-batches and ranks) and a max.

    A token whose proximal log-prob is -inf (outside the learner's truncation set) has ratio 0: it
    counts as outside both bands but not in the mean or max of |d| (``finite`` counts the others).
    """

    tokens: float = 0.0
    abs_sum: float = 0.0
    finite: float = 0.0
    outside_tight: float = 0.0
    outside_wide: float = 0.0
    max_abs: float = 0.0

    def add(self, other: BehaviourGap) -> None:
        for name in _GAP_SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs = max(self.max_abs, other.max_abs)

    def sums(self) -> list[float]:
        return [getattr(self, name) for name in _GAP_SUMS]

    @classmethod
    def from_reduced(cls, sums: list[float], max_abs: float) -> BehaviourGap:
        return cls(**dict(zip(_GAP_SUMS, sums, strict=True)), max_abs=max_abs)

    def summary(self) -> dict[str, float] | None:
        """mean_abs, max_abs, outside_0.9_1.1, outside_0.5_2 (shares of tokens) and tokens; None
        when the subset is empty."""
        if self.tokens <= 0:
            return None
        return {
            "tokens": int(self.tokens),
            "mean_abs": self.abs_sum / self.finite if self.finite else math.inf,
            "max_abs": self.max_abs if self.finite == self.tokens else math.inf,
            "outside_0.9_1.1": self.outside_tight / self.tokens,
            "outside_0.5_2": self.outside_wide / self.tokens,
        }


def behaviour_gap(prox: Tensor, behaviour: Tensor, mask: Tensor) -> BehaviourGap:
    """Gap statistics of the tokens where ``mask`` is true (all tensors [N, T]).

    Tokens whose behaviour log-prob is not finite are skipped (the loss drops them too).
    """
    import torch

    with torch.no_grad():
        return _behaviour_gap(prox, behaviour, mask)


def _behaviour_gap(prox: Tensor, behaviour: Tensor, mask: Tensor) -> BehaviourGap:
    import torch

    d_all = prox.float() - behaviour.float()
    take = mask.bool() & torch.isfinite(behaviour)
    d = d_all[take]
    finite = torch.isfinite(d)
    ratio = torch.exp(torch.where(finite, d, -math.inf))
    abs_d = d[finite].abs()

    def outside(band: tuple[float, float]) -> float:
        return float(((ratio < band[0]) | (ratio > band[1])).sum())

    return BehaviourGap(
        tokens=float(d.numel()),
        abs_sum=float(abs_d.double().sum()),
        finite=float(finite.sum()),
        outside_tight=outside(BAND_TIGHT),
        outside_wide=outside(BAND_WIDE),
        max_abs=float(abs_d.max()) if abs_d.numel() else 0.0,
    )

"""The switches and constants of the policy loss, with every bound on them checked once, here.

Torch-free (unlike `stream_dapo.core.loss`), so the config validates ``[algo]`` with this class at
load time: ``AlgoConfig.loss_params`` builds it from the keys of the same names, and a bad value is
refused there with this module's message, prefixed with its ``algo.`` key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["AggMode", "IsLevel", "IsMode", "PolicyLossParams", "RatioLevel", "RatioMode", "Surrogate"]

RatioMode = Literal["decoupled", "behaviour"]
"""The ratio modes; `stream_dapo.core.loss.RATIO_MODES` implements exactly these."""
IsMode = Literal["truncate", "mask", "icepop"]
"""How the behaviour importance weight is bounded; `stream_dapo.core.loss.IS_MODES` implements them."""
IsLevel = Literal["token", "sequence", "geometric"]
"""Granularity of the behaviour weight; `stream_dapo.core.loss.IS_LEVELS` implements them."""
RatioLevel = Literal["token", "sequence"]
"""Granularity of the policy ratio; `stream_dapo.core.loss.RATIO_LEVELS` implements them."""
Surrogate = Literal["clip", "cispo"]
"""The per-token objective; `stream_dapo.core.loss.SURROGATES` implements them."""
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
"""Loss aggregations; `stream_dapo.core.loss.AGGREGATIONS` implements them."""


def _check_mode(name: str, value: str, modes: object) -> None:
    valid = get_args(modes)
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid values: {', '.join(sorted(valid))}")


@dataclass(frozen=True)
class PolicyLossParams:
    """Switches and constants of ``policy_loss`` (see `stream_dapo.core.loss` for the formulas).

    Attributes:
        eps_low: lower clip, r >= 1 - eps_low (DAPO: 0.2); 1 removes the lower bound. With
            surrogate "cispo" it is CISPO's eps_low^IS.
        eps_high: upper clip, r <= 1 + eps_high (DAPO Clip-Higher: 0.28; naive GRPO: 0.2). With
            surrogate "cispo" it is CISPO's eps_high^IS.
        dual_clip_c: dual-clip bound c > 1 for negative advantages; None turns it off.
        ratio_mode: "decoupled" (clip against prox, behaviour weight) or "behaviour" (clip against mu).
        is_cap: C > 1, the truncation cap / mask range [1/C, C] of the behaviour weight.
        is_mode: "truncate", "mask" or "icepop" (decoupled mode only).
        is_level: "token", "sequence" (product over the response) or "geometric" (its geometric
            mean): what the behaviour weight is computed on (decoupled mode only).
        icepop_low, icepop_high: the band [a, b] of is_mode "icepop", 0 < a < 1 < b (IcePop: 0.5, 5).
        ratio_level: "token" (PPO/DAPO) or "sequence" (GSPO's length-normalised sequence ratio).
        surrogate: "clip" (PPO's clipped surrogate, dual clip) or "cispo" (clipped stop-gradient IS
            weight on the log-prob, no update clipping).
        agg_mode: "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".
        kl_coef: weight of the k3 KL to a reference policy (0 = off, DAPO's choice).
        entropy_coef: weight of the entropy bonus (0 = off).
    """

    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = 10.0
    ratio_mode: RatioMode = "decoupled"
    is_cap: float = 2.0
    is_mode: IsMode = "truncate"
    is_level: IsLevel = "token"
    icepop_low: float = 0.5
    icepop_high: float = 5.0
    ratio_level: RatioLevel = "token"
    surrogate: Surrogate = "clip"
    agg_mode: AggMode = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low <= 1.0:
            raise ValueError(
                f"eps_low must be in [0, 1] (DAPO uses 0.2; 1 removes the lower bound), got {self.eps_low}"
            )
        if not (math.isfinite(self.eps_high) and self.eps_high >= 0.0):
            raise ValueError(f"eps_high must be a finite number >= 0 (DAPO uses 0.28), got {self.eps_high}")
        # CISPO's IS-weight bounds are independent (MiniMax-M1: no lower bound, eps_low 1, and a small
        # eps_high); the PPO clip keeps Clip-Higher's rule.
        if self.surrogate == "clip" and self.eps_high < self.eps_low:
            raise ValueError(
                f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low}): Clip-Higher raises the "
                "upper bound only (DAPO: eps_low 0.2, eps_high 0.28); set eps_high to at least eps_low "
                "(eps_high = eps_low: symmetric clipping)"
            )
        if self.dual_clip_c is not None and not (math.isfinite(self.dual_clip_c) and self.dual_clip_c > 1.0):
            raise ValueError(
                f"dual_clip_c must be > 1 (typically 3 to 10), got {self.dual_clip_c}; use None to turn the "
                "dual clip off"
            )
        if not (math.isfinite(self.is_cap) and self.is_cap > 1.0):
            raise ValueError(f"is_cap must be a finite number > 1 (default 2), got {self.is_cap}")
        _check_mode("ratio_mode", self.ratio_mode, RatioMode)
        _check_mode("is_mode", self.is_mode, IsMode)
        _check_mode("is_level", self.is_level, IsLevel)
        _check_mode("ratio_level", self.ratio_level, RatioLevel)
        _check_mode("surrogate", self.surrogate, Surrogate)
        _check_mode("agg_mode", self.agg_mode, AggMode)
        if not (0.0 < self.icepop_low < 1.0 < self.icepop_high < math.inf):
            raise ValueError(
                f"the IcePop band [icepop_low, icepop_high] = [{self.icepop_low}, {self.icepop_high}] must "
                "satisfy 0 < icepop_low < 1 < icepop_high < inf, so that on-policy tokens (weight 1) pass; "
                "IcePop uses [0.5, 5]"
            )
        if self.ratio_mode == "behaviour" and (self.is_level != "token" or self.is_mode == "icepop"):
            # The behaviour weight is 1 there, so these would silently do nothing ("mask" predates this
            # check and stays accepted as the no-op it always was).
            raise ValueError(
                f"is_level {self.is_level!r} and is_mode {self.is_mode!r} correct the gap between prox and mu, "
                "which ratio_mode 'behaviour' does not have (its weight is 1); set ratio_mode 'decoupled', "
                "or is_level 'token' and is_mode 'truncate'"
            )
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0 (0 turns the term off), got {value}")

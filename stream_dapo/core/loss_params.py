"""The switches and constants of the policy loss, with every bound on them checked once, here.

Torch-free (unlike `stream_dapo.core.loss`), so the config validates ``[algo]`` with this class at
load time: ``AlgoConfig.loss_params`` builds it from the keys of the same names, and a bad value is
refused there with this module's message, prefixed with its ``algo.`` key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["AggMode", "IsMode", "PolicyLossParams", "RatioMode"]

RatioMode = Literal["decoupled", "behaviour"]
"""The ratio modes; `stream_dapo.core.loss.RATIO_MODES` implements exactly these."""
IsMode = Literal["truncate", "mask"]
"""How the behaviour importance weight is bounded; `stream_dapo.core.loss.IS_MODES` implements them."""
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
        eps_low: lower clip, r >= 1 - eps_low (DAPO: 0.2).
        eps_high: upper clip, r <= 1 + eps_high (DAPO Clip-Higher: 0.28; naive GRPO: 0.2).
        dual_clip_c: dual-clip bound c > 1 for negative advantages; None turns it off.
        ratio_mode: "decoupled" (clip against prox, behaviour weight) or "behaviour" (clip against mu).
        is_cap: C > 1, the truncation cap / mask range [1/C, C] of the behaviour weight.
        is_mode: "truncate" or "mask" (decoupled mode only).
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
    agg_mode: AggMode = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low must be in [0, 1) (DAPO uses 0.2), got {self.eps_low}")
        if not (math.isfinite(self.eps_high) and self.eps_high >= self.eps_low):
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
        _check_mode("agg_mode", self.agg_mode, AggMode)
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0 (0 turns the term off), got {value}")

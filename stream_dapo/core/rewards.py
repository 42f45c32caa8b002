"""Outcome rewards and DAPO's overlong reward shaping (paper section 3.4).

Generators call these on numpy arrays, one group (or batch of samples) at a time:

1. ``outcome_rewards``: the rule-based reward, +1 when the verifier says correct, -1 otherwise.
2. ``soft_overlong_penalty``: the length-aware penalty added on top, for responses that enter the last
   ``cache_len`` tokens of the length budget::

       R_length(|y|) = 0                                         |y| <= L_max - L_cache
                     = ((L_max - L_cache) - |y|) / L_cache * f    L_max - L_cache < |y| <= L_max
                     = -f                                        L_max < |y|

3. ``overlong_filter_mask``: overlong filtering masks truncated samples out of the loss (their reward
   still takes part in the group's mean and std; only their own tokens carry no gradient).

``shape_rewards`` applies all three according to a ``RewardShaping`` switch set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "RewardShaping",
    "ShapedRewards",
    "outcome_rewards",
    "overlong_filter_mask",
    "shape_rewards",
    "shape_scores",
    "soft_overlong_penalty",
]


def _as_bool_array(values: np.ndarray, name: str) -> np.ndarray:
    """Return ``values`` as a bool array, accepting bools or integer 0/1 flags only.

    Floats are refused on purpose: a float array here is almost always a reward (+1/-1) passed where
    the verifier's boolean verdict was meant, and silently thresholding it would hide that mistake.
    """
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        return arr
    if np.issubdtype(arr.dtype, np.integer):
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must hold only 0/1 (or True/False); got values {np.unique(arr)[:8]}")
        return arr.astype(np.bool_)
    raise TypeError(
        f"{name} must be a bool (or 0/1 integer) array, got dtype {arr.dtype}; pass the verifier's "
        "boolean verdict, not a reward"
    )


def outcome_rewards(correct: np.ndarray) -> np.ndarray:
    """Rule-based outcome reward: +1.0 where ``correct``, -1.0 elsewhere.

    Args:
        correct: any shape, bool (or 0/1 integers): the verifier's verdict per sample.

    Returns:
        float32 array of the same shape.
    """
    ok = _as_bool_array(correct, "correct")
    return np.where(ok, np.float32(1.0), np.float32(-1.0)).astype(np.float32)


def soft_overlong_penalty(
    lengths: np.ndarray, max_len: int, cache_len: int, factor: float = 1.0
) -> np.ndarray:
    """DAPO's soft overlong punishment, a penalty in ``[-factor, 0]`` (see the module docstring).

    Args:
        lengths: any shape, response lengths in tokens (integers; floats are accepted for analysis).
        max_len: L_max, the response length budget (the generator's max new tokens).
        cache_len: L_cache, the width of the punishment window at the end of the budget. 0 disables
            the soft punishment (all zeros).
        factor: the penalty reached at L_max (DAPO uses 1.0, as large as the outcome reward).

    Returns:
        float32 array of the same shape as ``lengths``; continuous and non-increasing in length.
    """
    if int(max_len) != max_len or max_len <= 0:
        raise ValueError(f"max_len must be a positive integer (the response token budget), got {max_len}")
    if int(cache_len) != cache_len or cache_len < 0:
        raise ValueError(
            f"cache_len must be a non-negative integer, got {cache_len}; use 0 to turn the soft "
            "punishment off"
        )
    if cache_len >= max_len:
        raise ValueError(
            f"cache_len ({cache_len}) must be smaller than max_len ({max_len}): the punishment window "
            "is the last cache_len tokens of the budget (DAPO uses 4096 of 20480)"
        )
    if not np.isfinite(factor) or factor < 0:
        raise ValueError(f"factor must be a finite number >= 0 (DAPO uses 1.0), got {factor}")
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.size and (not np.isfinite(arr).all() or (arr < 0).any()):
        raise ValueError("lengths must be finite and >= 0 (token counts of the responses)")
    if cache_len == 0:
        return np.zeros(arr.shape, dtype=np.float32)
    start = max_len - cache_len
    penalty = (start - arr) / cache_len * factor
    # Clamping to [-factor, 0] gives the three branches at once: 0 before the window, the linear ramp
    # inside it, and -factor at and beyond max_len.
    return np.clip(penalty, -factor, 0.0).astype(np.float32)


def overlong_filter_mask(truncated: np.ndarray) -> np.ndarray:
    """Per-sample loss mask for overlong filtering: 1.0 keeps a sample, 0.0 masks a truncated one.

    Args:
        truncated: any shape, bool (or 0/1): True where the response hit the length limit unfinished.

    Returns:
        float32 array of the same shape.
    """
    cut = _as_bool_array(truncated, "truncated")
    return np.where(cut, np.float32(0.0), np.float32(1.0)).astype(np.float32)


@dataclass(frozen=True)
class RewardShaping:
    """Which overlong-shaping ingredients are on, and their parameters.

    Attributes:
        soft_overlong: add ``soft_overlong_penalty`` to the outcome reward.
        max_response_len: L_max, the response token budget.
        overlong_cache_len: L_cache, the punishment window (must be > 0 when ``soft_overlong``).
        overlong_factor: penalty at L_max (>= 0).
        overlong_filter: mask truncated samples out of the loss.
    """

    soft_overlong: bool
    max_response_len: int
    overlong_cache_len: int
    overlong_factor: float
    overlong_filter: bool

    def __post_init__(self) -> None:
        if self.max_response_len <= 0:
            raise ValueError(f"max_response_len must be > 0, got {self.max_response_len}")
        if self.overlong_cache_len < 0 or self.overlong_cache_len >= self.max_response_len:
            raise ValueError(
                f"overlong_cache_len must be in [0, max_response_len) = [0, {self.max_response_len}), "
                f"got {self.overlong_cache_len} (it must be < max_response_len; the paper uses 4096 of 20480)"
            )
        if self.soft_overlong and self.overlong_cache_len == 0:
            raise ValueError(
                "soft_overlong is on but overlong_cache_len is 0: set overlong_cache_len > 0 "
                "(DAPO uses 4096 with a 20480 budget) or turn soft_overlong off"
            )
        if not np.isfinite(self.overlong_factor) or self.overlong_factor < 0:
            raise ValueError(f"overlong_factor must be a finite number >= 0, got {self.overlong_factor}")


@dataclass(frozen=True)
class ShapedRewards:
    """Result of ``shape_rewards``; every array has shape [S] (one entry per sample), float32.

    Attributes:
        rewards: outcome reward plus the soft overlong penalty (when on). Feed this to advantages.
        loss_mask: 1.0 for samples whose tokens count in the loss, 0.0 for samples masked by overlong
            filtering (all ones when filtering is off).
        penalty: the soft overlong part alone (zeros when off), for metrics.
    """

    rewards: np.ndarray
    loss_mask: np.ndarray
    penalty: np.ndarray


def shape_rewards(
    correct: np.ndarray, lengths: np.ndarray, truncated: np.ndarray, shaping: RewardShaping
) -> ShapedRewards:
    """Outcome reward plus the enabled overlong shaping for a set of samples.

    Args:
        correct: [S] bool, the verifier's verdict.
        lengths: [S] response lengths in tokens.
        truncated: [S] bool, True where generation stopped at the length limit.
        shaping: the switches and parameters.
    """
    return shape_scores(outcome_rewards(_as_bool_array(correct, "correct")), lengths, truncated, shaping)


def shape_scores(
    scores: np.ndarray, lengths: np.ndarray, truncated: np.ndarray, shaping: RewardShaping
) -> ShapedRewards:
    """Any real-valued reward plus the enabled overlong shaping (``shape_rewards`` for +1 / -1).

    Args:
        scores: [S] finite floats, the source's reward per sample (a user's function, a code reward).
        lengths: [S] response lengths in tokens.
        truncated: [S] bool, True where generation stopped at the length limit.
        shaping: the switches and parameters.
    """
    outcome = np.asarray(scores, dtype=np.float32)
    cut = _as_bool_array(truncated, "truncated")
    lens = np.asarray(lengths)
    if outcome.ndim != 1 or lens.shape != outcome.shape or cut.shape != outcome.shape:
        raise ValueError(
            "correct (or scores), lengths and truncated must be 1-D arrays of the same length (one entry per "
            f"sample); got shapes {outcome.shape}, {lens.shape}, {cut.shape}"
        )
    if not np.isfinite(outcome).all():
        raise ValueError("scores contain NaN or inf; the verifier pool maps those to the failure score")
    if shaping.soft_overlong:
        penalty = soft_overlong_penalty(
            lens, shaping.max_response_len, shaping.overlong_cache_len, shaping.overlong_factor
        )
    else:
        penalty = np.zeros(outcome.shape, dtype=np.float32)
    if shaping.overlong_filter:
        loss_mask = overlong_filter_mask(cut)
    else:
        loss_mask = np.ones(outcome.shape, dtype=np.float32)
    return ShapedRewards(rewards=(outcome + penalty).astype(np.float32), loss_mask=loss_mask, penalty=penalty)

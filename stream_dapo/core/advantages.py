"""Group-relative advantages (GRPO / DAPO): each sample is scored against its own prompt's group."""

from __future__ import annotations

import numpy as np

__all__ = ["compute_group_advantages"]


def compute_group_advantages(
    rewards: np.ndarray, *, scale_by_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Advantage of every sample relative to the other samples of the same prompt.

    ``A_i = (R_i - mean(R)) / (std(R) + eps)`` per group, or ``R_i - mean(R)`` when ``scale_by_std`` is
    False (Dr. GRPO style). The std is the population std (ddof=0), as in the GRPO/DAPO reference
    implementations; a group whose rewards are all equal gets all-zero advantages either way.

    Args:
        rewards: [G] for one group or [num_groups, G] for several groups of equal size.
        scale_by_std: divide by the group std.
        eps: added to the std so that near-constant groups do not explode; must be > 0.

    Returns:
        float32 array of the same shape as ``rewards``.
    """
    arr = np.asarray(rewards, dtype=np.float64)
    if arr.ndim not in (1, 2):
        raise ValueError(
            f"rewards must have shape [G] or [num_groups, G], got shape {arr.shape}; reshape groups of "
            "equal size into rows"
        )
    if arr.shape[-1] == 0:
        raise ValueError("rewards has an empty group (G = 0); every prompt needs at least one sample")
    if not np.isfinite(arr).all():
        raise ValueError("rewards contain NaN or inf; check the verifier and the overlong shaping inputs")
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    centred = arr - arr.mean(axis=-1, keepdims=True)
    if scale_by_std:
        centred = centred / (arr.std(axis=-1, ddof=0, keepdims=True) + eps)
    return centred.astype(np.float32)

"""DAPO dynamic sampling: drop prompt groups that carry no gradient.

With group-relative advantages, a group whose samples are all correct or all wrong has zero advantage
everywhere and so contributes nothing but noise to the batch size. The decision uses the verifier's
accuracy, never the shaped reward: overlong shaping can make an all-correct group's rewards differ,
which would let a useless group through.

For any real-valued reward the same holds of its scores (before shaping): ``score_filter`` keeps a
group iff its scores are not all equal. For DAPO's +1 / -1 that is exactly 0 < #correct < G.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = ["FilterDecision", "FilterReason", "dynamic_sampling_filter", "score_filter"]


class FilterReason(StrEnum):
    """Why a group was kept or dropped; also the label of the filtered-groups metric."""

    MIXED = "mixed"
    ALL_CORRECT = "all_correct"
    ALL_WRONG = "all_wrong"


@dataclass(frozen=True)
class FilterDecision:
    """Verdict on one group.

    Attributes:
        keep: send the group to the buffer.
        reason: the group's accuracy class (reported even when filtering is off).
        num_correct: samples the verifier accepted.
        group_size: G, samples in the group.
    """

    keep: bool
    reason: FilterReason
    num_correct: int
    group_size: int


def dynamic_sampling_filter(correct: np.ndarray, enabled: bool = True) -> FilterDecision:
    """Keep a group iff 0 < #correct < G (when ``enabled``); otherwise keep it and report its class.

    Args:
        correct: [G] bool (or 0/1 integers), the verifier's verdict per sample of one prompt.
        enabled: dynamic sampling on.
    """
    arr = np.asarray(correct)
    if arr.ndim != 1:
        raise ValueError(f"correct must be 1-D (one prompt's group), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("empty group: dynamic sampling needs at least one sample per prompt")
    if arr.dtype != np.bool_:
        if not np.issubdtype(arr.dtype, np.integer) or not np.isin(arr, (0, 1)).all():
            raise TypeError(
                f"correct must be bool (or 0/1 integers), got dtype {arr.dtype}; filter on the verifier's "
                "verdict, not on the shaped reward"
            )
        arr = arr.astype(np.bool_)
    return score_filter(np.where(arr, 1.0, -1.0), arr, enabled)  # DAPO's +1 / -1 scores


def score_filter(scores: np.ndarray, correct: np.ndarray, enabled: bool = True) -> FilterDecision:
    """Keep a group iff its ``scores`` are not all equal (when ``enabled``); else keep it and report.

    Args:
        scores: [G] finite floats, the reward's score per sample, before any shaping.
        correct: [G] bool, whether each score counts as correct (accuracy and the group's class).
        enabled: dynamic sampling on.

    The class: "mixed" when the scores differ; for equal scores "all_correct" when every one counts
    as correct, else "all_wrong" (equal scores below the bar, or a reward whose verdict is not a
    function of its score). For +1 / -1 scores this is ``dynamic_sampling_filter(correct)``.
    """
    values = np.asarray(scores, dtype=np.float64)
    verdict = np.asarray(correct)
    if values.ndim != 1 or verdict.shape != values.shape:
        raise ValueError(
            f"scores and correct must be 1-D of the same length (one prompt's group), got shapes "
            f"{values.shape} and {verdict.shape}"
        )
    if values.size == 0:
        raise ValueError("empty group: dynamic sampling needs at least one sample per prompt")
    if not np.isfinite(values).all():
        raise ValueError("scores contain NaN or inf; the verifier pool maps those to the failure score")
    if verdict.dtype != np.bool_:
        raise TypeError(f"correct must be bool, got dtype {verdict.dtype}")
    group_size = int(values.size)
    num_correct = int(verdict.sum())
    if not (values == values[0]).all():
        reason = FilterReason.MIXED
    elif num_correct == group_size:
        reason = FilterReason.ALL_CORRECT
    else:
        reason = FilterReason.ALL_WRONG
    keep = reason is FilterReason.MIXED or not enabled
    return FilterDecision(keep=keep, reason=reason, num_correct=num_correct, group_size=group_size)

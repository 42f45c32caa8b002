"""The DAPO recipe core: pure functions on numpy arrays (rewards, advantages, filter) and torch tensors
(the loss). Imports only numpy, torch and the standard library."""

from stream_dapo.core.advantages import compute_group_advantages
from stream_dapo.core.filtering import FilterDecision, FilterReason, dynamic_sampling_filter
from stream_dapo.core.loss import PolicyLossParams, policy_loss, token_entropy, token_logprobs
from stream_dapo.core.presets import PAPER_AIME, PRESETS, preset_overrides
from stream_dapo.core.rewards import (
    RewardShaping,
    ShapedRewards,
    outcome_rewards,
    overlong_filter_mask,
    shape_rewards,
    soft_overlong_penalty,
)

__all__ = [
    "PAPER_AIME",
    "PRESETS",
    "FilterDecision",
    "FilterReason",
    "PolicyLossParams",
    "RewardShaping",
    "ShapedRewards",
    "compute_group_advantages",
    "dynamic_sampling_filter",
    "outcome_rewards",
    "overlong_filter_mask",
    "policy_loss",
    "preset_overrides",
    "shape_rewards",
    "soft_overlong_penalty",
    "token_entropy",
    "token_logprobs",
]

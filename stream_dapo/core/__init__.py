"""The DAPO recipe core: pure functions on numpy arrays (rewards, advantages, filter), torch tensors
(the loss) and ints (the admission rule). Imports only numpy, torch and the standard library.

The loss, the one torch module, is imported on first use: the config validates with the admission
rule (`stream_dapo.core.admission`), the loss parameters (`core.loss_params`) and the reward shaping
(`core.rewards`), and `stream-dapo --help` / `config show` stay torch-free."""

from typing import TYPE_CHECKING, Any

from stream_dapo.core.admission import AdmissionError, AdmissionRule
from stream_dapo.core.advantages import compute_group_advantages
from stream_dapo.core.filtering import FilterDecision, FilterReason, dynamic_sampling_filter
from stream_dapo.core.loss_params import PolicyLossParams
from stream_dapo.core.presets import PAPER_AIME, PRESETS, preset_overrides
from stream_dapo.core.rewards import (
    RewardShaping,
    ShapedRewards,
    outcome_rewards,
    overlong_filter_mask,
    shape_rewards,
    soft_overlong_penalty,
)

if TYPE_CHECKING:
    from stream_dapo.core.loss import policy_loss, token_entropy, token_logprobs

_LOSS_NAMES = frozenset({"policy_loss", "token_entropy", "token_logprobs"})


def __getattr__(name: str) -> Any:
    if name in _LOSS_NAMES:
        from stream_dapo.core import loss

        return getattr(loss, name)
    raise AttributeError(f"module 'stream_dapo.core' has no attribute {name!r}")


__all__ = [
    "PAPER_AIME",
    "AdmissionError",
    "AdmissionRule",
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

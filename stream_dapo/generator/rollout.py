"""From a finished group of vLLM samples to the transport `Group` the buffer admits.

The order follows DESIGN.md and the paper:

1. score every response with its source's reward (the ``VerifierPool``: DAPO's +1 / -1 for math, a
   user's real-valued score, a code reward; a timeout or failure scores the reward's failure_score);
2. dynamic sampling decides on the scores, before any shaping: keep iff they are not all equal
   (for +1 / -1 that is 0 < #correct < G; any group of equal scores carries no gradient);
3. only for a kept group: the score plus the source's soft overlong punishment, the overlong-filter
   mask, and group-relative advantages over the shaped rewards;
4. pack arrays with the wire dtypes (int32 tokens and versions, float32 log-probs).

Everything here is plain data in, plain data out (the verifier is passed in), so it is unit-tested with
hand-made groups and no vLLM.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from stream_dapo.config import AlgoConfig, from_section
from stream_dapo.core.advantages import compute_group_advantages
from stream_dapo.core.filtering import FilterDecision, score_filter
from stream_dapo.core.rewards import RewardShaping, shape_scores
from stream_dapo.data.sources import DEFAULT_SOURCE
from stream_dapo.transport.messages import Group, Sample
from stream_dapo.verifier.core import VerifyResult
from stream_dapo.verifier.pool import ScoreItem

__all__ = [
    "ADVANTAGE_EPS",
    "FinishedGroup",
    "FinishedSample",
    "GroupOutcome",
    "RolloutSettings",
    "Verifier",
    "build_group",
    "process_group",
]

ADVANTAGE_EPS = 1e-6
"""Added to the group std; the same value as ``compute_group_advantages``' default."""


@dataclass
class FinishedSample:
    """One finished response as the engine returns it.

    Arrays have length L (response tokens, the EOS token included when generation stopped on it):
    ``token_ids`` int32, ``logprobs`` float32 (behaviour log-prob of each sampled token),
    ``versions`` int32 (policy version that sampled each token).
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    text: str
    finish_reason: str
    """vLLM's reason: "stop" (EOS or stop string), "length" (max tokens), "abort"."""
    cached_prompt_tokens: int = 0
    """Prompt tokens whose KV came from vLLM's prefix cache (a throughput figure)."""

    @property
    def truncated(self) -> bool:
        """Generation hit the length limit before the model ended its answer."""
        return self.finish_reason == "length"

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class FinishedGroup:
    """All G responses to one prompt, ready for post-processing."""

    group_id: str
    prompt_id: str
    gold: str
    prompt_token_ids: np.ndarray
    """int32 [P]."""
    created_at: float
    """Unix time the group was started in the engine."""
    samples: list[FinishedSample]
    start_version: int = 0
    """Policy version when the group was started (its first tokens' version)."""
    source: str = DEFAULT_SOURCE
    """The run's data source of the prompt: it names the reward and labels the figures."""
    data_source: str = ""
    """The row's ``data_source`` (verl's first reward argument)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """The row's ``extra_info`` (verl's fourth reward argument)."""

    @property
    def longest(self) -> int:
        """Tokens of the group's longest response: the decode steps the group spends in the engine."""
        return max((len(s) for s in self.samples), default=0)

    def tail_tokens(self) -> int:
        """Decode steps the group still ran after each of its response tokens, summed over them.

        The G responses start together; the i-th token (from 1) of a response is sampled at decode
        step i and the group is done at step M, its longest response, so that token waits M - i
        steps: a response of n tokens contributes M n - n (n + 1) / 2. Divided by the group's tokens
        and by M, this is a token's mean wait as a share of the group's time in the engine: just
        under 1/2 when the responses are equally long, more when short ones finish early and wait
        for the longest (`stream-dapo plan`'s token age).
        """
        m = self.longest
        return sum(m * n - n * (n + 1) // 2 for n in (len(s) for s in self.samples))


@dataclass(frozen=True)
class RolloutSettings:
    """The recipe switches post-processing needs (a view of ``AlgoConfig``).

    ``shaping`` is the run's overlong shaping; ``source_shaping`` the same with another L_max for
    each source that sets its own ``max_response_len``.
    """

    shaping: RewardShaping
    dynamic_sampling: bool = True
    adv_scale_by_std: bool = True
    source_shaping: dict[str, RewardShaping] = field(default_factory=dict)

    @classmethod
    def from_config(cls, algo: AlgoConfig, budgets: dict[str, int | None] | None = None) -> RolloutSettings:
        """From ``[algo]``; ``budgets``: each source's max_response_len (None: the run's)."""
        per_source = {
            name: dataclasses.replace(algo.shaping, max_response_len=budget)
            for name, budget in (budgets or {}).items()
            if budget is not None and budget != algo.max_response_len
        }
        return from_section(cls, algo, shaping=algo.shaping, source_shaping=per_source)

    def shaping_of(self, source: str) -> RewardShaping:
        return self.source_shaping.get(source, self.shaping)


class Verifier(Protocol):
    """What ``process_group`` needs of ``stream_dapo.verifier.VerifierPool``."""

    def score_batch(self, items: Sequence[ScoreItem]) -> list[VerifyResult]: ...


@dataclass
class GroupOutcome:
    """What became of one finished group.

    ``group`` is None when dynamic sampling dropped it; ``rewards`` and ``advantages`` are then empty
    (no shaping is done for a group that will not be trained on).
    """

    decision: FilterDecision
    results: list[VerifyResult]
    group: Group | None
    rewards: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    advantages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    verify_seconds: float = 0.0
    group_id: str = ""
    prompt_id: str = ""
    start_version: int = 0
    truncated: int = 0
    """Samples cut at max_response_len."""
    source: str = DEFAULT_SOURCE
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    """The reward's score of every sample, before shaping (also for a dropped group)."""
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Response tokens of every sample."""

    @property
    def accepted(self) -> bool:
        return self.group is not None


def build_group(
    finished: FinishedGroup,
    results: Sequence[VerifyResult],
    settings: RolloutSettings,
    generator_id: str,
) -> GroupOutcome:
    """Filter, shape, compute advantages and pack one group, given its verifier results."""
    samples = finished.samples
    if len(results) != len(samples):
        raise ValueError(
            f"group {finished.group_id}: {len(samples)} samples but {len(results)} verifier results"
        )
    for i, s in enumerate(samples):
        if len(s) == 0:
            raise ValueError(
                f"group {finished.group_id} sample {i} has no response tokens; set algo.max_response_len >= 1"
            )
        if not len(s) == s.logprobs.shape[0] == s.versions.shape[0]:
            raise ValueError(
                f"group {finished.group_id} sample {i}: tokens, logprobs and versions lengths differ "
                f"({len(s)}, {s.logprobs.shape[0]}, {s.versions.shape[0]})"
            )
    correct = np.array([r.correct for r in results], dtype=bool)
    scores = np.array([r.reward for r in results], dtype=np.float64)
    truncated = np.array([s.truncated for s in samples], dtype=bool)
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    decision = score_filter(scores, correct, enabled=settings.dynamic_sampling)
    outcome = GroupOutcome(
        decision=decision,
        results=list(results),
        group=None,
        group_id=finished.group_id,
        prompt_id=finished.prompt_id,
        start_version=finished.start_version,
        truncated=int(truncated.sum()),
        source=finished.source,
        scores=scores.astype(np.float32),
        lengths=lengths,
    )
    if not decision.keep:
        return outcome

    shaped = shape_scores(scores, lengths, truncated, settings.shaping_of(finished.source))
    advantages = compute_group_advantages(
        shaped.rewards, scale_by_std=settings.adv_scale_by_std, eps=ADVANTAGE_EPS
    )
    wire_samples = [
        Sample(
            tokens=s.token_ids.astype(np.int32, copy=False),
            logprobs=s.logprobs.astype(np.float32, copy=False),
            versions=s.versions.astype(np.int32, copy=False),
            reward=float(shaped.rewards[i]),
            correct=bool(correct[i]),
            truncated=bool(truncated[i]),
            advantage=float(advantages[i]),
            loss_weight=float(shaped.loss_mask[i]),
        )
        for i, s in enumerate(samples)
    ]
    group = Group(
        group_id=finished.group_id,
        prompt_id=finished.prompt_id,
        generator_id=generator_id,
        gold=finished.gold,
        prompt_tokens=np.asarray(finished.prompt_token_ids, dtype=np.int32),
        created_at=finished.created_at,
        samples=wire_samples,
    )
    outcome.group, outcome.rewards, outcome.advantages = group, shaped.rewards, advantages
    return outcome


def process_group(
    finished: FinishedGroup, verifier: Verifier, settings: RolloutSettings, generator_id: str
) -> GroupOutcome:
    """Score a finished group's responses with its source's reward, then ``build_group``. Safe to
    run on a worker thread."""
    start = time.perf_counter()
    results = verifier.score_batch(
        [
            ScoreItem(finished.source, s.text, finished.gold, finished.data_source, finished.extra_info)
            for s in finished.samples
        ]
    )
    seconds = time.perf_counter() - start
    outcome = build_group(finished, results, settings, generator_id)
    outcome.verify_seconds = seconds
    return outcome

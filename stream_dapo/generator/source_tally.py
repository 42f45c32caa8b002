"""Per-source figures of a generator: what each finished group adds to its source's metrics.

Every scored group is counted under its data source's name (``source`` label): samples, correct
ones, the score distribution, groups by filter outcome, response lengths, truncations, and reward
failures by reason. A failure (a user's function raised, hung, crashed its worker or returned NaN
or junk; a sandbox that could not run) is also logged with the prompt id, at most once per
``LOG_EVERY_S`` per source and reason, with the count of the ones not logged since.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from stream_dapo.generator.rollout import GroupOutcome
from stream_dapo.rewards.spec import FAILURE_REASONS
from stream_dapo.runtime.metrics import GeneratorMetrics

__all__ = ["LOG_EVERY_S", "SourceTally"]

log = logging.getLogger("stream_dapo.generator")

LOG_EVERY_S = 30.0


class SourceTally:
    """Counts outcomes per source into ``metrics``; ``clock`` is injectable for tests."""

    def __init__(self, metrics: GeneratorMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self._clock = clock
        self._logged_at: dict[tuple[str, str], float] = {}
        self._unlogged: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[tuple[str, str]] = Counter()
        """Reward failures so far by (source, reason)."""

    def count(self, outcome: GroupOutcome) -> None:
        mx, source = self.metrics, outcome.source
        mx.source_groups.labels(source=source, outcome=outcome.decision.reason.value).inc()
        mx.source_samples.labels(source=source).inc(len(outcome.results))
        mx.source_correct.labels(source=source).inc(outcome.decision.num_correct)
        mx.source_truncated.labels(source=source).inc(outcome.truncated)
        for score in outcome.scores:
            mx.source_score.labels(source=source).observe(float(score))
        for length in outcome.lengths:
            mx.source_response_length.labels(source=source).observe(int(length))
        for result in outcome.results:
            if result.reason in FAILURE_REASONS:
                self._failure(outcome, result.reason, result.extracted)

    def _failure(self, outcome: GroupOutcome, reason: str, detail: str | None) -> None:
        key = (outcome.source, reason)
        self.failures[key] += 1
        self.metrics.reward_failures.labels(source=outcome.source, reason=reason).inc()
        now = self._clock()
        if now - self._logged_at.get(key, float("-inf")) < LOG_EVERY_S:
            self._unlogged[key] += 1
            return
        self._logged_at[key] = now
        more = self._unlogged.pop(key, 0)
        log.warning(
            "source %s: reward failed (%s) on prompt %s%s; the sample scores the source's failure_score%s",
            outcome.source,
            reason,
            outcome.prompt_id,
            f": {detail}" if detail else "",
            f" ({more} more like it since the last report)" if more else "",
        )

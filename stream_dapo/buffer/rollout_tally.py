"""The generators' rollout tally, summed by the buffer and handed to the learner for tracking.

Each generator sends its running tally (groups finished by dynamic-sampling outcome, samples,
correct samples, truncated samples, response tokens) with every heartbeat and `groups` message. The buffer adds up the
increases per generator, so generators that join, leave or restart (their tally starts again from 0
after a hello) are counted once, and every `batch` reply carries the sum. The learner, the one
tracking writer, turns the increase between two batches into the generators' filtered-group share,
accuracy, truncation and length over that window (`stream_dapo.runtime.tracking.rollout_window`).

Statistics, not state: the tally is not journaled and restarts from 0 with the buffer.
"""

from __future__ import annotations

from stream_dapo.transport.messages import ROLLOUT_FIELDS, Rollouts


class RolloutTally:
    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(ROLLOUT_FIELDS, 0)
        self._last: dict[str, dict[str, int]] = {}

    def restart(self, generator_id: str) -> None:
        """The generator said hello: its next tally counts from 0."""
        self._last.pop(generator_id, None)

    def observe(self, generator_id: str, rollouts: Rollouts) -> None:
        """Add what `generator_id` finished since its previous report. A field that went down means
        the generator restarted without a hello the buffer saw: its whole tally is new."""
        tally = {k: getattr(rollouts, k) for k in ROLLOUT_FIELDS}
        last = self._last.get(generator_id, {})
        restarted = any(tally[k] < last.get(k, 0) for k in ROLLOUT_FIELDS)
        for key in ROLLOUT_FIELDS:
            self.totals[key] += tally[key] - (0 if restarted else last.get(key, 0))
        self._last[generator_id] = {k: int(tally[k]) for k in ROLLOUT_FIELDS}

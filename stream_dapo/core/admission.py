"""The admission / staleness rule: how many groups may be in line, and when a credited group may start.

Every other module asks this one: `Config` (its start-up check and `Config.admission`), the
buffer (`AdmissionPolicy`, its deadlock check), the planner (the inverse it reports) and the
generator (the lag gate on credits).

The argument, with B_v groups consumed per optimizer step (one policy version), S optimizer steps
per rollout batch and e = sync_every:

- A group at position k of the admission line (waiting in the buffer + credited to generators) is
  trained at most S + floor(k / B_v) versions after the learner version at which it was credited
  (S: the learner may have just taken a rollout batch).
- A generator starts a credited group only on weights at most e - 1 versions older than the credit
  (the lag rule, `may_start`); it waits for newer weights otherwise.
- So keeping k < (max_staleness - S - (e - 1) + 1) * B_v = `capacity` keeps every token's
  staleness <= max_staleness: admission paces generators instead of discarding their work.

Pure arithmetic on ints: no config, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AdmissionError", "AdmissionRule"]


class AdmissionError(ValueError):
    """The numbers would deadlock the run; the message names the setting that fixes it."""


@dataclass(frozen=True)
class AdmissionRule:
    """The staleness budget of one recipe and everything derived from it."""

    group_size: int
    """G: samples per group (algo.group_size)."""
    mini_batch_samples: int
    """Samples per optimizer step (learner.mini_batch_samples)."""
    rollout_batch_prompts: int
    """R: groups per rollout batch (learner.rollout_batch_prompts)."""
    max_staleness: int
    """algo.max_staleness."""
    sync_every: int = 1
    """e: weights are published every e optimizer steps (learner.sync_every)."""
    lockstep: bool = False
    """run.mode = "sync": a rollout batch is sampled from exactly the policy it is for (no lag)."""

    @property
    def groups_per_version(self) -> int:
        """B_v: groups consumed by one optimizer step (one policy version)."""
        return self.mini_batch_samples // self.group_size

    @property
    def steps_per_rollout(self) -> int:
        """S: optimizer steps (versions) per rollout batch."""
        return self.rollout_batch_prompts * self.group_size // self.mini_batch_samples

    @property
    def weight_lag(self) -> int:
        """Versions a generator's weights may trail the learner between publications (e - 1)."""
        return self.sync_every - 1

    @property
    def capacity(self) -> int:
        """Most groups allowed in the admission line: (max_staleness - S - (e - 1) + 1) * B_v, >= 0."""
        return max(0, self.capacity_at(self.max_staleness))

    def capacity_at(self, max_staleness: int) -> int:
        """The line the formula allows for another max_staleness (may be negative)."""
        slack = max_staleness - self.steps_per_rollout - self.weight_lag + 1
        return slack * self.groups_per_version

    def min_max_staleness(self, capacity: float | None = None) -> int:
        """The smallest max_staleness whose capacity holds `capacity` groups (default: one rollout batch).

        The inverse of `capacity_at`: (m - S - (e - 1) + 1) * B_v >= c  <=>  m >= ceil(c / B_v) + S + e - 2.
        """
        need = self.rollout_batch_prompts if capacity is None else capacity
        return math.ceil(need / self.groups_per_version - 1e-9) + self.steps_per_rollout + self.sync_every - 2

    def min_capacity_groups(self, checkpoint_every: int) -> int:
        """The smallest buffer.capacity_groups that cannot deadlock the learner.

        Leased groups stay in the buffer until the learner commits them at a checkpoint (every
        checkpoint_every versions). The learner asks for a rollout batch every S versions, and then
        up to (checkpoint_every - gcd(S, checkpoint_every)) * B_v groups can still be leased; the
        batch itself needs rollout_batch_prompts more.
        """
        steps = self.steps_per_rollout
        leased = (checkpoint_every - math.gcd(steps, checkpoint_every)) * self.groups_per_version
        return self.rollout_batch_prompts + leased

    # ------------------------------------------------------------------ the lag rule

    @property
    def max_lag(self) -> int:
        """How many versions older than its credit a generator's weights may be when it starts a
        group: e - 1 in async mode, 0 in lock-step mode."""
        return 0 if self.lockstep else self.weight_lag

    def may_start(self, weights_version: int, credit_version: int) -> bool:
        """Whether a generator on `weights_version` may start groups credited at `credit_version`.

        Without this gate a generator still fetching the newest weights starts groups that the
        buffer's staleness gate later drops."""
        return weights_version >= credit_version - self.max_lag

    # ------------------------------------------------------------------ deadlock checks

    def check_fills_rollout(self) -> int:
        """Raise AdmissionError unless the line holds one rollout batch; return the capacity."""
        if self.capacity < self.rollout_batch_prompts:
            raise AdmissionError(
                f"algo.max_staleness ({self.max_staleness}) leaves room for only {self.capacity} groups in "
                f"line = (max_staleness - {self.steps_per_rollout} steps per rollout - (learner.sync_every "
                f"{self.sync_every} - 1) + 1) * {self.groups_per_version} groups per step, fewer than one "
                f"rollout batch of learner.rollout_batch_prompts ({self.rollout_batch_prompts}): the run "
                f"would deadlock; set algo.max_staleness >= {self.min_max_staleness()} (or lower "
                "learner.sync_every or learner.rollout_batch_prompts)"
            )
        return self.capacity

    def check(self, capacity_groups: int, checkpoint_every: int) -> int:
        """Every deadlock check, for the buffer's start-up: the line holds a rollout batch and
        buffer.capacity_groups holds what stays leased plus one batch. Returns the capacity."""
        capacity = self.check_fills_rollout()
        need = self.min_capacity_groups(checkpoint_every)
        if capacity_groups < need:
            raise AdmissionError(
                f"buffer.capacity_groups ({capacity_groups}) is too small: up to "
                f"{need - self.rollout_batch_prompts} groups stay leased until a learner checkpoint commits "
                f"them (learner.checkpoint_every {checkpoint_every}) and a rollout batch needs "
                f"{self.rollout_batch_prompts} more, so the run would deadlock. Set buffer.capacity_groups "
                f">= {need}, or lower learner.checkpoint_every"
            )
        return capacity

"""What the replay buffer's state machine decides with and how it refuses input: `AdmissionPolicy`
(the numbers, taken from the config once), the input errors, their checks, and the `Record` type
of its effect log. Shared by the fleet (`fleet`), the queue (`queue`) and the facade (`replay`),
which re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AdmissionPolicy", "BufferInputError", "GeneratorIdTaken", "Record"]

Record = dict[str, Any]
"""One state change (or one part of a snapshot), as the journal stores it."""


class BufferInputError(ValueError):
    """A caller passed something the buffer cannot act on; the message says what to pass."""

    reason = "bad_request"
    """The `error` reply's reason."""


class GeneratorIdTaken(BufferInputError):
    """A hello for a generator id that another live process holds (two generators with one --index)."""

    reason = "generator_id_taken"


# --------------------------------------------------------------------------------------------------
# Admission policy (the rule itself lives in stream_dapo.core.admission)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionPolicy:
    """The numbers the buffer decides with, taken from the config once."""

    admission_capacity: int
    """`AdmissionRule.capacity`: waiting groups + outstanding credits never exceed it."""
    capacity_groups: int
    """buffer.capacity_groups: hard cap on waiting + leased; credits never exceed it either."""
    groups_per_version: int
    """B_v: the i-th group of a rollout is trained at learner version v + floor(i / B_v)."""
    max_staleness: int
    max_reuse: int
    group_size: int
    lockstep: bool = False
    """run.mode = "sync": credits only for the rollout batch the learner is about to take, granted
    once it has trained the previous one (generators wait for that version's weights)."""
    rollout_batch_prompts: int = 0
    """R: groups per rollout batch (learner.rollout_batch_prompts); used in lock-step mode."""
    generator_lease_s: float = 30.0
    """buffer.generator_lease_s: a generator's credits expire this long after it was last heard from."""
    in_flight_hold_s: float = 0.0
    """buffer.in_flight_hold_s: how long `serve` may hold the learner for reported in-flight groups
    (0: never)."""

    def __post_init__(self) -> None:
        for name in ("capacity_groups", "groups_per_version", "max_reuse", "group_size"):
            if getattr(self, name) < 1:
                raise BufferInputError(f"AdmissionPolicy.{name} must be >= 1, got {getattr(self, name)}")
        if self.admission_capacity < 0 or self.max_staleness < 0:
            raise BufferInputError("AdmissionPolicy.admission_capacity and max_staleness must be >= 0")
        if self.in_flight_hold_s < 0:
            raise BufferInputError(
                f"AdmissionPolicy.in_flight_hold_s must be >= 0, got {self.in_flight_hold_s}"
            )


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------


def check_id(value: Any, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise BufferInputError(f"{name} must be a non-empty string, got {value!r}")


def check_version(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BufferInputError(f"{name} must be an int >= 0 (optimizer steps taken), got {value!r}")


def check_count(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BufferInputError(f"{name} must be an int >= 0, got {value!r}")

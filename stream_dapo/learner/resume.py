"""What a resume may change: the resolved configuration stored with a checkpoint against today's.

A learner restarted on its checkpoint directory compares the configuration the checkpoint was written
with (`learner_state.json`, key "config") to its own. Settings that only steer what happens next
(learning rate and schedule, logging, cadences, ports, timeouts) are applied and logged as a diff;
settings the stored state was built on (the model, group size, staleness bound, sampling, sequence
shapes) are refused at start-up, naming the key, both values and the way out, instead of being
ignored (the restored optimizer's lr) or crashing later (a state dict of another shape).

The buffer does the same with the settings its state depends on (`BUFFER_SETTINGS`, stored in its
journal): `FIXED_FOR_BUFFER` refused, the rest applied and logged.

Pure functions on plain dicts (`Config.model_dump(mode="json")`), tested without DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUFFER_SETTINGS",
    "FIXED_FOR_BUFFER",
    "FIXED_ON_RESUME",
    "Change",
    "buffer_refusal",
    "config_changes",
    "refusal",
    "settings_of",
    "split_changes",
]

FIXED_ON_RESUME = (
    "model.path",
    "model.dtype",
    "model.max_prompt_len",
    "algo.group_size",
    "algo.max_staleness",
    "algo.max_response_len",
    "generator.temperature",
    "generator.top_p",
    "generator.top_k",
    "generator.min_p",
    "learner.zero_stage",
)
"""Settings a checkpoint's state depends on: a resume with another value is refused."""

FIXED_FOR_BUFFER = (
    "algo.group_size",
    "algo.max_staleness",
    "generator.temperature",
    "generator.top_p",
    "generator.top_k",
    "generator.min_p",
)
"""Settings the buffer's stored groups were made and admitted under: groups of another size, or
sampled at another temperature, would reach the learner mixed with new ones, and the staleness bound
is the learner's too. A restart with another value is refused."""

BUFFER_SETTINGS = (
    *FIXED_FOR_BUFFER,
    "buffer.capacity_groups",
    "buffer.max_reuse",
    "buffer.generator_lease_s",
    "buffer.in_flight_hold_s",
    "buffer.persist_every_s",
    "learner.mini_batch_samples",
    "learner.rollout_batch_prompts",
    "learner.sync_every",
    "learner.checkpoint_every",
    "run.mode",
)
"""What the buffer stores in its journal and compares on every start: the fixed ones above, and
those its admission policy is built from (applied on a restart, and logged)."""


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {self.old!r} -> {self.new!r}"


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Every dotted key whose value differs (a key on one side only counts, with None on the other)."""
    a, b = dict(_flatten(old)), dict(_flatten(new))
    return [Change(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def settings_of(config: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The dotted `keys` of a dumped configuration, as a flat dict."""
    flat = dict(_flatten(config))
    return {key: flat.get(key) for key in keys}


def split_changes(
    changes: list[Change], fixed: tuple[str, ...] = FIXED_ON_RESUME
) -> tuple[list[Change], list[Change]]:
    """(applied, refused): refused are the changes of `fixed` keys."""
    refused = [c for c in changes if c.key in fixed]
    return [c for c in changes if c.key not in fixed], refused


def refusal(refused: list[Change], checkpoint: str, out_dir: str) -> str:
    """The start-up error for `refused` changes: what, both values, and the ways out."""
    what = "; ".join(str(c) for c in refused)
    return (
        f"cannot resume {checkpoint} with a changed configuration: {what}. The checkpoint's state was "
        f"built with the old value(s): put them back to resume, or start a new run in another "
        f"run.out_dir (now {out_dir})"
    )


def buffer_refusal(refused: list[Change], state: str) -> str:
    """The buffer's start-up error for `refused` changes: what, both values, and the ways out."""
    what = "; ".join(str(c) for c in refused)
    return (
        f"the buffer's state in {state} was written with another configuration: {what}. Its stored "
        "groups were made and admitted under the old value(s): put them back to continue this run, or "
        "start an empty buffer (a new run.out_dir, or move the state files aside: the groups in them "
        "are then lost)"
    )

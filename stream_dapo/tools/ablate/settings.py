"""What the ladder measures and how a cell is told apart: the curve metrics, the time-to-target
metric, and the settings a fingerprint leaves out."""

from __future__ import annotations

import json
from typing import Any

from stream_dapo.config import SftConfig
from stream_dapo.config.schema import CodeSandboxConfig
from stream_dapo.core.presets import PRESET_FAMILIES, preset_family, preset_overrides

CURVE_METRICS: dict[str, str] = {
    "accuracy": "training-batch accuracy",
    "entropy": "policy entropy (nats/token)",
    "response_len_mean": "training-batch response length (tokens)",
    "truncation_rate": "training-batch truncation rate",
    "gen_accuracy": "generated samples' accuracy, all groups (training reward)",
    "gen_truncation_rate": "generated samples' truncation rate, all groups",
    "gen_response_len_mean": "generated samples' response length (tokens), all groups",
    "truncated_in_loss_share": "truncated samples trained with A != 0 (the overlong reward noise)",
    "clip_frac_low": "token share clipped below (A < 0, r < 1 - eps_low)",
    "clip_frac_high": "token share clipped above (A > 0, r > 1 + eps_high)",
    "clip_high_prob_mean": "mean probability of the up-clipped tokens (DAPO Fig. 3a)",
    "gen_filtered_share_all_correct": "generated groups all correct (DAPO Fig. 3b)",
    "gen_filtered_share_all_wrong": "generated groups all wrong",
}
"""learner/metrics.jsonl key -> plot title, one PNG each."""

TARGET_METRIC = "gen_accuracy"
"""The curve the steps/seconds-to-target figures read: every generated group counts, so it is the
same statistic with and without dynamic sampling (the trained batches' accuracy is not)."""
TARGET_WINDOW = 10
"""Trailing points averaged before comparing with the target (one point per rollout window)."""

CELL_RECORD = "ablation_cell.json"
UNRECORDED = "not recorded"
"""The machine or code version of a cell whose record was written before cells recorded it."""
# What does not change what a cell computes: where it listens and logs, and where it writes.
_UNCOMPARED_SECTIONS = ("transport", "metrics")
_UNCOMPARED_KEYS = (
    ("weights", "fetch_window"),
    ("weights", "delta"),
    ("weights", "peer_fanout"),
    ("weights", "peer_timeout_s"),
    ("weights", "peer_host"),
    ("generator", "group_log"),
)
"""How a version travels (issue 38: the fetch window, deltas, fan-out through other generators): the
weights that arrive are the same, checked bit for bit, whatever these say. And what is only recorded:
the generators' group log writes down each group's outcome and changes none."""
_NEUTRAL_SETTINGS: dict[tuple[str, str], Any] = {
    ("buffer", "in_flight_hold_s"): 0.0,
    ("warmup", "track_every"): 0,  # tracking never changes the warm weights; off, it is not even timed
    ("warmup", "track_prompts"): 32,
    ("warmup", "reference_min_greedy"): 0.0,  # no floor: one round of the reference phase, as before
    ("warmup", "reference_max_rounds"): 3,
    # The off-policy corrections of issue 40; their defaults are the loss as it was.
    ("algo", "is_level"): "token",
    ("algo", "icepop_low"): 0.5,
    ("algo", "icepop_high"): 5.0,
    ("algo", "ratio_level"): "token",
    ("algo", "surrogate"): "clip",
    # Issue 37's real-model path: off, the model and data are what they were.
    ("model", "source"): None,
    ("data", "gsm_symbolic"): None,
    ("data", "word_problems"): None,
    # Shared-prompt rows in the learner's forward: off, one row per sample as before.
    ("learner", "share_prompt"): False,
    # Shutdown bounds: how long a stop may take, never what is trained.
    ("metrics", "final_scrape_wait_s"): 0.0,
    ("run", "learner_stop_timeout_s"): 900.0,
    **{("sft", key): value for key, value in SftConfig().model_dump(mode="json").items()},
    # Issue 61's sources and code sandbox: one source and no code reward are the run as it was.
    ("data", "sources"): [],
    ("verifier", "code"): CodeSandboxConfig().model_dump(mode="json"),
}
"""Settings added after cells were first fingerprinted, with the value that behaves as the code did
before they existed. At that value a setting is left out of the fingerprint, so cells recorded
before it existed still match (`--set buffer.in_flight_hold_s=0` resumes them); at any other value
it counts, so cells that ran with and without it never share a table."""


def preset_changes(name: str) -> dict[str, tuple[object, object]]:
    """What preset ``name`` changes relative to the row it is read against: key -> (before, after).

    Table 1's rows are cumulative, so each is read against the row above it; the off-policy and
    leave-one-out arms are alternatives, so each is read against its family's first arm (token-tis,
    dapo-all). A family's first row (the baseline) changes nothing.
    """
    current = preset_overrides(name)  # raises for an unknown name
    family = preset_family(name)
    names = list(PRESET_FAMILIES[family])
    index = names.index(name)
    if index == 0:
        return {}
    previous = PRESET_FAMILIES[family][names[index - 1] if family == "table1" else names[0]]
    return {k: (previous.get(k), v) for k, v in current.items() if previous.get(k) != v}


def describe_changes(name: str) -> str:
    changes = preset_changes(name)
    if not changes:
        switches = PRESET_FAMILIES[preset_family(name)][name]
        return "baseline: " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in switches.items())
    return ", ".join(f"{k.split('.')[-1]} {a} → {b}" for k, (a, b) in changes.items())


def _toml_value(value: object) -> str:
    # JSON scalars are TOML scalars: true/false, numbers, double-quoted strings.
    return json.dumps(value)

"""Experiment tracking: the learner's per-step record in metrics.jsonl, Weights & Biases, TensorBoard.

One writer per run: only the learner's rank 0 builds a `Tracker` (`tracking.backends` names the
backends). It logs the resolved config once, then one row per optimizer step against the learner
version: the step's training metrics (loss, entropy, clip fractions, importance weights, grad norm,
throughput, weight-sync time) and the rollout statistics of the groups it trained (reward,
accuracy, response length, truncation, token staleness).

Tracking is never on the critical path of training: a backend that fails, at start-up (not
installed, bad API key, no network) or later (full disk), is reported once in the log, with the
fix, and dropped; the others and the run go on. W&B reads its own environment (WANDB_MODE=offline,
WANDB_API_KEY, WANDB_ENTITY, ...): nothing here overrides it.

The jsonl row is written as the learner computes it (`learner/metrics.jsonl`, one JSON object per
line, `version` first). W&B and TensorBoard get the same numbers as flat scalars named
`<section>/<key>` (`tracked_scalars`), so `train/loss` at step v in TensorBoard is `loss` in the
jsonl row with `version` v.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from stream_dapo.config import Config, config_to_toml

__all__ = [
    "Backend",
    "Tracker",
    "rollout_window",
    "staleness_quantiles",
    "tracked_scalars",
    "tracking_dir",
    "tracking_run_name",
]

log = logging.getLogger("stream_dapo.runtime.tracking")

SECTIONS: dict[str, tuple[str, ...]] = {
    "train": (
        "loss",
        "pg_loss",
        "kl_ref",
        "entropy",
        "grad_norm",
        "lr",
        "approx_kl_behaviour",
        "ratio_mean",
        "clip_frac_low",
        "clip_frac_high",
        "clip_frac_dual",
        "clip_high_prob_mean",
        "is_weight_mean",
        "is_weight_max",
        "masked_frac",
        "seq_ratio_min",
        "seq_ratio_max",
    ),
    "rollout": (
        "reward_mean",
        "accuracy",
        "response_len_mean",
        "truncation_rate",
        "truncated_in_loss_share",
        "groups",
        "samples",
        "staleness_p50",
        "staleness_p95",
        "staleness_max",
    ),
    "generators": (
        "gen_filtered_share_all_wrong",
        "gen_filtered_share_all_correct",
        "gen_accuracy",
        "gen_truncation_rate",
        "gen_response_len_mean",
        "gen_tokens_per_second",
        "gen_groups",
    ),
    "perf": (
        "tokens_per_second",
        "step_seconds",
        "batch_wait_seconds",
        "weight_sync_seconds",
        "packing_efficiency",
        "tokens",
        "loss_tokens",
        "micro_batches",
        "elapsed_s",
        "peak_rss_gib",
    ),
}
"""The scalars W&B and TensorBoard get, by section: `train/loss`, `rollout/accuracy`, `perf/...`;
`generators/accuracy` is the row's `gen_accuracy` (the `gen_` prefix is the section's name)."""

INSTALL_HINT = {
    "wandb": "pip install -e '.[wandb]'",
    "tensorboard": "pip install -e '.[tensorboard]'",
}


def staleness_quantiles(counts: Mapping[str, int] | Mapping[int, int]) -> dict[str, float]:
    """Token-weighted p50 / p95 / max of staleness from {staleness: trained tokens}.

    A quantile q is the smallest staleness s with at least q of the tokens at s or below (no
    interpolation: staleness is an integer). Empty counts give {}."""
    pairs = sorted((int(k), int(v)) for k, v in counts.items() if int(v) > 0)
    total = sum(v for _, v in pairs)
    if not total:
        return {}
    out: dict[str, float] = {}
    for name, q in (("staleness_p50", 0.5), ("staleness_p95", 0.95)):
        seen = 0
        for value, count in pairs:
            seen += count
            if seen >= q * total:
                out[name] = float(value)
                break
    out["staleness_max"] = float(pairs[-1][0])
    return out


def tracked_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The learner's jsonl row as `<section>/<key>` scalars (None and non-numbers left out)."""
    flat = dict(row)
    flat.update(staleness_quantiles(row.get("staleness_counts") or {}))
    out: dict[str, float] = {}
    for section, keys in SECTIONS.items():
        for key in keys:
            value = flat.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                out[f"{section}/{key.removeprefix('gen_')}"] = float(value)
    return out


def rollout_window(
    before: Mapping[str, int] | None, after: Mapping[str, int], group_size: int, seconds: float = 0.0
) -> dict[str, float]:
    """The generators' rollout statistics between two tallies of the buffer's `batch` replies
    (`stream_dapo.buffer.rollout_tally`): every group they finished in that window, the ones dynamic
    sampling dropped included, unlike the learner's own statistics of what it trained.

    Keys: gen_groups (finished), gen_filtered_share_all_wrong / _all_correct (of those),
    gen_accuracy (correct / (groups x group_size)), gen_truncation_rate and gen_response_len_mean
    (per sample), gen_tokens_per_second (response tokens over `seconds`, the window's length).
    Nothing for a window without groups or samples."""
    base = before or {}
    d = {k: int(after[k]) - int(base.get(k, 0)) for k in after}
    if any(v < 0 for v in d.values()):  # the buffer restarted: its tally counts from 0 again
        d = {k: int(v) for k, v in after.items()}
    out: dict[str, float] = {}
    groups = d["mixed"] + d["all_correct"] + d["all_wrong"]
    if groups > 0:
        out["gen_groups"] = float(groups)
        out["gen_filtered_share_all_wrong"] = d["all_wrong"] / groups
        out["gen_filtered_share_all_correct"] = d["all_correct"] / groups
        out["gen_accuracy"] = d["correct"] / (groups * group_size)
    if d["samples"] > 0:
        out["gen_truncation_rate"] = d["truncated"] / d["samples"]
        out["gen_response_len_mean"] = d["response_tokens"] / d["samples"]
    if seconds > 0:
        out["gen_tokens_per_second"] = d["response_tokens"] / seconds
    return out


def tracking_run_name(cfg: Config) -> str:
    return cfg.tracking.run_name or Path(cfg.run.out_dir).resolve().name


def tracking_dir(cfg: Config) -> Path:
    return Path(cfg.tracking.dir) if cfg.tracking.dir else Path(cfg.run.out_dir) / "tracking"


# --------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------


class Backend(Protocol):
    """One tracking destination. Any exception it raises drops it (see `Tracker`)."""

    name: str

    def log_config(self, cfg: Config) -> None: ...

    def log(self, step: int, row: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlBackend:
    """`learner/metrics.jsonl`: the row as computed, one line per step (cut back on resume by the
    learner); the resolved config once in `learner/config.json`."""

    name = "jsonl"

    def __init__(self, cfg: Config, resumed_at: int | None = None) -> None:
        self.dir = Path(cfg.run.out_dir) / "learner"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"

    def log_config(self, cfg: Config) -> None:
        from stream_dapo.runtime.disk import write_text_atomic

        write_text_atomic(self.dir / "config.json", json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")

    def close(self) -> None:
        pass


class WandbBackend:
    """A W&B run: the config as the run's config, scalars with `step` = learner version.

    The run's id is kept in `run.out_dir/learner/wandb-run.json`; a learner that resumes from a
    checkpoint (`resumed_at`) continues that W&B run (`resume="allow"`) instead of starting another.
    W&B keeps a run's steps increasing: steps the learner trains again after resuming from an older
    checkpoint than it had logged are dropped by W&B (with its warning); TensorBoard purges them."""

    name = "wandb"

    def __init__(self, cfg: Config, resumed_at: int | None = None) -> None:
        import wandb

        root = tracking_dir(cfg)
        t = cfg.tracking
        env = os.environ  # W&B's own variables win over the config: None lets wandb read them
        if "WANDB_DIR" not in env:
            root.mkdir(parents=True, exist_ok=True)
        id_file = wandb_run_file(cfg)
        run_id = _stored_wandb_id(id_file) if resumed_at is not None else None
        self.run = wandb.init(
            project=None if "WANDB_PROJECT" in env else t.project,
            name=None if "WANDB_NAME" in env else tracking_run_name(cfg),
            tags=None if "WANDB_TAGS" in env else (list(t.tags) or None),
            dir=None if "WANDB_DIR" in env else str(root),
            config=cfg.model_dump(mode="json"),
            id=None if "WANDB_RUN_ID" in env else (run_id or secrets.token_hex(4)),
            resume=None if "WANDB_RESUME" in env else "allow",
        )
        from stream_dapo.runtime.disk import write_text_atomic

        id_file.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(id_file, json.dumps({"id": self.run.id}) + "\n")
        log.info(
            "W&B run %s, id %s (%s%s), files in %s",
            self.run.name,
            self.run.id,
            self.run.settings.mode,
            f", continued at version {resumed_at}" if run_id else "",
            self.run.dir,
        )

    def log_config(self, cfg: Config) -> None:
        pass  # given to wandb.init: W&B records it as the run's config

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        self.run.log(tracked_scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()


class TensorboardBackend:
    """Event files in `<tracking dir>/tensorboard/<project>/<run name>/`: scalars with
    global_step = learner version, the config (TOML) and tags as text. A learner that resumes from
    its checkpoint at version v (`resumed_at`) purges the steps after v that the run had logged
    before it stopped (TensorBoard's `purge_step`): they are trained again, and shown once."""

    name = "tensorboard"

    def __init__(self, cfg: Config, resumed_at: int | None = None) -> None:
        import tensorboard  # noqa: F401  (torch's writer needs it; fail here with its own name)
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = tensorboard_logdir(cfg)
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(log_dir=str(self.logdir), flush_secs=10, purge_step=purge)
        log.info("TensorBoard event files in %s", self.logdir)

    def log_config(self, cfg: Config) -> None:
        # Markdown: indented lines render as code, so the TOML keeps its layout.
        text = "\n".join("    " + line for line in config_to_toml(cfg).splitlines())
        self.writer.add_text("config", text, global_step=0)
        if cfg.tracking.tags:
            self.writer.add_text("tags", ", ".join(cfg.tracking.tags), global_step=0)
        self.writer.flush()

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        for tag, value in tracked_scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tensorboard_logdir(cfg: Config) -> Path:
    return tracking_dir(cfg) / "tensorboard" / cfg.tracking.project / tracking_run_name(cfg)


def wandb_run_file(cfg: Config) -> Path:
    """Where the learner keeps its W&B run's id, to continue that run when it resumes."""
    return Path(cfg.run.out_dir) / "learner" / "wandb-run.json"


def _stored_wandb_id(path: Path) -> str | None:
    try:
        run_id = json.loads(path.read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


BackendFactory = Callable[[Config, "int | None"], Backend]
"""Builds a backend from the config and the version the learner resumed at (None: a fresh run)."""

BACKENDS: dict[str, BackendFactory] = {
    "jsonl": JsonlBackend,
    "wandb": WandbBackend,
    "tensorboard": TensorboardBackend,
}


# --------------------------------------------------------------------------------------------------
# The tracker
# --------------------------------------------------------------------------------------------------


class Tracker:
    """Fans each call out to the live backends; a backend that raises is reported once and dropped.

    ``Tracker.start(cfg)`` builds the backends `cfg.tracking.backends` names and logs the config;
    ``resumed_at``: the version the learner resumed from its checkpoint at (None: a fresh run), so
    that W&B continues its run and TensorBoard purges the steps after it. ``factories`` replaces the
    backend table (tests)."""

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self.failed: dict[str, str] = {}

    @classmethod
    def start(
        cls,
        cfg: Config,
        factories: Mapping[str, BackendFactory] | None = None,
        *,
        resumed_at: int | None = None,
    ) -> Tracker:
        table = BACKENDS if factories is None else factories
        tracker = cls([])
        for name in cfg.tracking.backends:
            try:
                tracker.backends.append(table[name](cfg, resumed_at))
            except Exception as exc:  # noqa: BLE001 (any failure of a tracker must not stop training)
                tracker._report(name, "starting", exc)
        tracker._each("logging the config", lambda b: b.log_config(cfg))
        return tracker

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        self._each(f"logging step {step}", lambda b: b.log(step, row))

    def close(self) -> None:
        self._each("closing", lambda b: b.close())
        self.backends.clear()

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception as exc:  # noqa: BLE001
                self.backends.remove(backend)
                self._report(backend.name, what, exc)

    def _report(self, name: str, what: str, exc: BaseException) -> None:
        self.failed[name] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ImportError):
            fix = f"install it ({INSTALL_HINT.get(name, 'pip install ' + name)})"
        else:
            fix = "fix the cause above"
        log.error(
            "tracking backend %s failed while %s (%s: %s); it is off for the rest of this run, training "
            "goes on. To use it, %s, or remove %r from tracking.backends",
            name,
            what,
            type(exc).__name__,
            exc,
            fix,
            name,
        )

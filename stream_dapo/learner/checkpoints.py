"""The learner's checkpoint directory: which checkpoint is current, pruning, and failed writes.

Layout of ``run.out_dir/checkpoints``::

    step_000020/    complete checkpoints (DeepSpeed state, HF export, learner state, trained-group log)
    step_000040/
    .step_000060.tmp/   one being written (renamed to step_000060/ when complete)
    latest          the name of the checkpoint to resume from ("step_000040")

A checkpoint counts once ``latest`` names it. After each new one, `prune_checkpoints` keeps the
newest ``learner.keep_checkpoints`` and never deletes the one ``latest`` names; when a write fails,
`discard_unfinished` removes what it left, so a restart finds ``latest`` and its directory intact.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from stream_dapo.disk import DiskFullError, no_space_left

__all__ = [
    "LATEST",
    "checkpoint_name",
    "discard_unfinished",
    "disk_full_error",
    "prune_checkpoints",
    "read_latest",
]

log = logging.getLogger("stream_dapo.learner")

LATEST = "latest"
"""File in ``checkpoints/`` naming the newest complete checkpoint directory."""
_STEP = re.compile(r"step_(\d+)")


def checkpoint_name(version: int) -> str:
    return f"step_{version:06d}"


def read_latest(root: Path) -> str | None:
    """The checkpoint ``latest`` names, or None when there is none yet."""
    try:
        return (root / LATEST).read_text().strip() or None
    except FileNotFoundError:
        return None


def prune_checkpoints(root: Path, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` ``step_*`` directories of ``root`` (by step number), never
    the one ``latest`` names; returns the names deleted. A directory that cannot be deleted is
    logged and left (pruning only saves space)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    latest = read_latest(root)
    steps = sorted(
        (p for p in root.iterdir() if p.is_dir() and _STEP.fullmatch(p.name)),
        key=lambda p: int(p.name.split("_", 1)[1]),
    )
    deleted = []
    for path in steps[:-keep]:
        if path.name == latest:
            continue
        try:
            shutil.rmtree(path)
        except OSError as exc:
            log.warning("cannot delete old checkpoint %s: %s", path, exc)
            continue
        deleted.append(path.name)
    if deleted:
        log.info(
            "deleted %d old checkpoint(s): %s (learner.keep_checkpoints = %d)", len(deleted), deleted, keep
        )
    return deleted


def discard_unfinished(root: Path, tmp: Path, final: Path) -> None:
    """Remove what a failed checkpoint write left: its temporary directory, and its renamed
    directory unless ``latest`` already names it (then it is the last good one)."""
    shutil.rmtree(tmp, ignore_errors=True)
    if final.name != read_latest(root):
        shutil.rmtree(final, ignore_errors=True)


def disk_full_error(root: Path, name: str, keep: int) -> DiskFullError:
    """The error for a checkpoint the disk had no room for (build it before `discard_unfinished`
    frees the space, so that the free space it reports is what the writer saw)."""
    latest = read_latest(root)
    resume = f"it resumes from {latest}" if latest else "with no checkpoint yet, it starts from model.path"
    return DiskFullError(
        f"{no_space_left(root)} while writing checkpoint {name}; the partial checkpoint is removed and "
        f"`latest` still names {latest or 'no checkpoint'}. Free space there (or lower "
        f"learner.keep_checkpoints, now {keep}) and restart the learner: {resume}",
        root,
    )

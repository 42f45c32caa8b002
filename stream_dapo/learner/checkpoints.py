"""The learner's checkpoints: their layout on disk, how one is written, which one is current.

Layout of ``run.out_dir/checkpoints``::

    step_000020/    complete checkpoints:
        deepspeed/              DeepSpeed state (weights, optimizer, LR schedule), tag `DS_TAG`
        learner_state.json      the learner's state (`LEARNER_STATE_FILE`: version, commit ids, ...)
        hf/                     the Hugging Face export of the weights
        trained_groups.jsonl    the trained-group log as of this version
    step_000040/
    .step_000060.tmp/   one being written (renamed to step_000060/ when complete)
    latest          the name of the checkpoint to resume from ("step_000040")

`Checkpoints` is the component the learner service uses: `write` a version (temporary directory,
rename, then ``latest``), `latest` to resume from, `prune`. A checkpoint counts once ``latest``
names it. After each new one, `prune_checkpoints` keeps the newest ``learner.keep_checkpoints``
and never deletes the one ``latest`` names; when a write fails, `discard_unfinished` removes what
it left, so a restart finds ``latest`` and its directory intact.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from stream_dapo.runtime.disk import DiskFullError, is_disk_full, no_space_left, write_text_atomic

__all__ = [
    "DS_TAG",
    "LATEST",
    "LEARNER_STATE_FILE",
    "CheckpointWriter",
    "Checkpoints",
    "checkpoint_name",
    "discard_unfinished",
    "disk_full_error",
    "prune_checkpoints",
    "read_latest",
]

log = logging.getLogger("stream_dapo.learner")

LATEST = "latest"
"""File in ``checkpoints/`` naming the newest complete checkpoint directory."""
DS_TAG = "deepspeed"
"""The DeepSpeed checkpoint tag: its state is in ``step_*/deepspeed/``."""
LEARNER_STATE_FILE = "learner_state.json"
"""The learner's state inside a checkpoint, readable without DeepSpeed."""
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


class CheckpointWriter(Protocol):
    """What `Checkpoints.write` needs of the learner (`trainer.Learner` is one)."""

    rank: int

    def barrier(self) -> None: ...

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: Mapping[str, Any] | None = None
    ) -> None:
        """The engine's state and the learner's (collective)."""
        ...

    def write_hf(self, directory: str | os.PathLike[str], state_dict: Mapping[str, Any] | None) -> None: ...


class Checkpoints:
    """The checkpoint directory of one run (layout in the module docstring).

    ``keep`` is learner.keep_checkpoints; ``trained_log``, when it exists, is copied into each
    checkpoint, so the log as of that version travels with it.
    """

    def __init__(self, root: Path, keep: int, trained_log: Path) -> None:
        self.root = root
        self.keep = keep
        self.trained_log = trained_log

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names, to resume from; None before the first one."""
        latest = self.root / LATEST
        return self.root / latest.read_text().strip() if latest.is_file() else None

    def write(
        self,
        learner: CheckpointWriter,
        version: int,
        state_dict: Mapping[str, Any] | None,
        extra_state: Mapping[str, Any],
    ) -> Path:
        """Write ``step_{version}`` atomically and point ``latest`` at it; returns its directory.

        Collective: every rank calls it, with its `gather_state_dict` result (None except on rank 0)
        for the HF export inside. A failed write leaves no partial checkpoint behind and ``latest``
        naming the last good one; a full disk raises DiskFullError ("no space left on ...", exit 1).
        """
        name = checkpoint_name(version)
        final, tmp = self.root / name, self.root / f".{name}.tmp"
        rank0 = learner.rank == 0
        try:
            if rank0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            learner.barrier()
            learner.save_checkpoint(tmp, extra_state=extra_state)
            learner.write_hf(tmp / "hf", state_dict)
            if rank0:
                if self.trained_log.exists():
                    shutil.copy2(self.trained_log, tmp / self.trained_log.name)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                write_text_atomic(self.root / LATEST, name + "\n")
        except Exception as exc:
            full = is_disk_full(exc, self.root)  # before the clean-up frees space
            error = disk_full_error(self.root, name, self.keep) if full else None
            if rank0:
                discard_unfinished(self.root, tmp, final)
            if error is None:
                raise
            raise error from exc
        return final

    def prune(self) -> list[str]:
        """`prune_checkpoints` with learner.keep_checkpoints (rank 0)."""
        return prune_checkpoints(self.root, self.keep)

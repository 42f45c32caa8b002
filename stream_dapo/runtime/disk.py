"""Files on disk: atomic replacement, and full disks recognised in whatever a writer raised.

Every file a service replaces goes through `atomic_file` (temporary file next to it, fsync, rename,
optionally fsync of the directory), so a crash leaves either the old content or the new one, and
a failed write leaves no temporary file behind. `write_text_atomic` / `write_bytes_atomic` are
the one-call forms.

Full disks: say so in words an operator acts on.

A full filesystem shows up differently per writer: Python's own files raise ``OSError`` with
``errno.ENOSPC`` (or ``EDQUOT`` over a quota), safetensors' Rust writer says "No space left on
device (os error 28)", and torch's zip writer (``torch.save``, so DeepSpeed checkpoints) raises a
bare ``RuntimeError`` such as ``[enforce fail at inline_container.cc:672] . unexpected pos 704 vs
598`` or ``basic_ios::clear: iostream error`` that names no cause. For that last kind,
`is_disk_full` looks at the free space of the filesystem being written: a write that failed there
with almost nothing left failed because the disk is full.

Services turn a full disk into `DiskFullError` ("no space left on <path>"), remove what they had
half-written, keep their last good state and exit 1 (``ExitCode.FAILURE``): the systemd units
restart on 1 (only 2 is in ``RestartPreventExitStatus``), so once space is freed the service
resumes from that state by itself.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "LOW_FREE_BYTES",
    "DiskFullError",
    "atomic_file",
    "free_bytes",
    "fsync_dir",
    "is_disk_full",
    "no_space_left",
    "temp_path",
    "write_bytes_atomic",
    "write_text_atomic",
]

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
LOW_FREE_BYTES = 64 * 1024 * 1024
"""A writer error that names no cause counts as a full disk when less than this is free."""
_NO_SPACE_TEXT = ("no space left on device", "os error 28", "storagefull", "disk quota exceeded")
# What torch's PyTorchStreamWriter raises when a write fails (it loses the errno).
_TORCH_WRITER_TEXT = ("inline_container.cc", "pytorchstreamwriter", "iostream error", "file write failed")


class DiskFullError(RuntimeError):
    """A write failed because its filesystem is full. The message starts "no space left on
    <path>" and names the fix; the service exits 1 so that its supervisor restarts it."""

    def __init__(self, message: str, path: str | Path) -> None:
        super().__init__(message)
        self.path = Path(path)


def no_space_left(path: str | Path) -> str:
    """The start of every full-disk message: ``no space left on <path> (<N> MB free)``."""
    free = free_bytes(path)
    return f"no space left on {path}" + (f" ({free / 1e6:.1f} MB free)" if free is not None else "")


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem of `path` (its nearest
    existing parent), or None when that cannot be told."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def is_disk_full(exc: BaseException, path: str | Path) -> bool:
    """Whether `exc` (or what it was raised from) is a write that failed for lack of space on the
    filesystem of `path`."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
            return True
        text = str(e).lower()
        if any(s in text for s in _NO_SPACE_TEXT):
            return True
        if isinstance(e, RuntimeError) and any(s in text for s in _TORCH_WRITER_TEXT):
            free = free_bytes(path)
            if free is not None and free < LOW_FREE_BYTES:
                return True
    return False


def temp_path(path: Path) -> Path:
    """Where `atomic_file` writes before the rename: a hidden name next to `path`, unique per process
    (a crash leaves ``.<name>.tmp-<pid>``, which writers that own a directory may sweep)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make a rename inside directory `path` durable (raises OSError when the directory cannot be
    opened or synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, *, tmp: Path | None = None, sync_dir: bool = False) -> Iterator[BinaryIO]:
    """Write `path` atomically: yields a binary file open on a temporary path (`tmp`, default
    `temp_path(path)`); when the block ends normally it is flushed, fsynced and renamed over `path`
    (then the directory is fsynced if `sync_dir`). If the block or any step raises, the temporary
    file is removed and `path` keeps its old content; raise inside the block to abandon a write."""
    tmp = temp_path(path) if tmp is None else tmp
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync_dir:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)  # gone after a successful rename


def write_bytes_atomic(path: Path, data: bytes, *, sync_dir: bool = False) -> None:
    """Replace `path` with `data` atomically (see `atomic_file`)."""
    with atomic_file(path, sync_dir=sync_dir) as f:
        f.write(data)


def write_text_atomic(path: Path, text: str, *, sync_dir: bool = False) -> None:
    """Replace `path` with `text` (UTF-8) atomically (see `atomic_file`); on failure the temporary
    file is removed and `path` keeps its old content."""
    write_bytes_atomic(path, text.encode(), sync_dir=sync_dir)

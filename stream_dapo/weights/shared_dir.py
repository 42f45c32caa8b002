"""Weights through a shared directory (NFS, a shared volume), both ends: the learner's
`SharedDirPublisher` and a generator's `SharedDirWeightSource` (``weights.method = "shared_dir"``).

The publisher writes ``v{version:08d}.safetensors`` to a temporary name, renames it into place,
then replaces ``LATEST`` (json: version, checksum, file, total_bytes) the same way and prunes all
but the newest ``keep`` versions. Readers see a whole file or none, and load one only after its
sha256 matched LATEST's checksum. A generator reads the file once, into memory, hashing it as it
reads (`read_shared_dir_image`), and its engine loads the tensors from that memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

from torch import Tensor

from stream_dapo.runtime.disk import fsync_dir, write_bytes_atomic
from stream_dapo.weights.base import (
    ChecksumMismatch,
    FileSource,
    WeightsError,
    WeightsPayload,
    WeightTarget,
    WeightUpdate,
    sha256_file,
    weights_file_name,
)
from stream_dapo.weights.image import WeightImage, close_all

__all__ = [
    "LATEST_FILE",
    "SharedDirPublisher",
    "SharedDirWeightSource",
    "read_shared_dir",
    "read_shared_dir_image",
]

LATEST_FILE = "LATEST"


class SharedDirPublisher:
    """Publishes versions as files in a directory that generators can read (NFS, a shared volume)."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".*.tmp-*"):  # left by a crash mid-write
            stale.unlink(missing_ok=True)

    def bound_ports(self) -> dict[str, int]:
        return {}  # files, no socket

    def publish(self, payload: WeightsPayload, state_dict: Mapping[str, Tensor] | None = None) -> Path:
        """Write the file, then LATEST (each via temp + rename), then prune. Returns the file's path."""
        final = self.directory / weights_file_name(payload.version)
        write_bytes_atomic(final, payload.data)
        latest = {
            "version": payload.version,
            "checksum": payload.checksum,
            "file": final.name,
            "total_bytes": payload.total_bytes,
        }
        write_bytes_atomic(self.directory / LATEST_FILE, (json.dumps(latest) + "\n").encode())
        with contextlib.suppress(OSError):  # best effort: some shared filesystems refuse it
            fsync_dir(self.directory)
        self._prune(payload.version)
        return final

    def close(self) -> None:
        pass

    def _prune(self, current: int) -> None:
        versions = sorted(
            int(p.name[1:9]) for p in self.directory.glob("v*.safetensors") if p.name[1:9].isdigit()
        )
        # Keep the newest `keep` up to the current one; anything newer than current is a dead lineage
        # (the learner resumed from an older checkpoint) and goes too.
        keep = {v for v in versions if v <= current}
        keep = set(sorted(keep)[-self.keep :])
        for v in versions:
            if v not in keep:
                (self.directory / weights_file_name(v)).unlink(missing_ok=True)


class SharedDirWeightSource(FileSource):
    """Reads the newest verified ``v*.safetensors`` named by ``LATEST`` into memory, once (hashed as
    it is read); the engine loads the tensors from there, without reading the file again."""

    startup: Literal["look", "answer", "announcement"] = "look"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, have: int) -> WeightUpdate | None:
        start = time.perf_counter()
        found = read_shared_dir_image(self.directory, have)
        if found is None:
            return None
        version, image = found
        self.latest_seen = version
        return WeightUpdate(version, None, image.nbytes, time.perf_counter() - start, data=image)

    def load(self, engine: WeightTarget, update: WeightUpdate) -> float:
        seconds = super().load(engine, update)
        if update.data is not None:
            update.data.recycle()  # loaded: its pages serve the next read
        return seconds

    def close(self) -> None:
        close_all()  # the spare image


def read_shared_dir(directory: str | os.PathLike[str], have_version: int) -> tuple[int, Path] | None:
    """The newest verified weights file in a shared directory, if its version differs from ours.

    Returns None when nothing is published yet or the published version equals ``have_version``.

    Raises:
        ChecksumMismatch: the file named by LATEST does not hash to its checksum.
    """
    return _newest(Path(directory), have_version, lambda path: (sha256_file(path), path))


def read_shared_dir_image(
    directory: str | os.PathLike[str], have_version: int
) -> tuple[int, WeightImage] | None:
    """As `read_shared_dir`, but the file's bytes, read once into shared memory (`weights.image`) and
    hashed as they are read."""
    return _newest(Path(directory), have_version, _read_hashed)


T = TypeVar("T")


def _read_hashed(path: Path, block: int = 1 << 22) -> tuple[str, WeightImage]:
    """(sha256 hex, bytes in shared memory) of ``path``, in one read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise WeightsError(f"{path} is empty; the publisher writes whole files: delete it and republish")
        data = WeightImage.new(size)
        view = data.view
        got = 0
        while got < size and (n := f.readinto(view[got : got + block])):
            h.update(view[got : got + n])
            got += n
    if got != size:
        data.close()
        raise WeightsError(
            f"{path} shrank while being read ({got} of {size} bytes): is something rewriting it?"
        )
    return h.hexdigest(), data


def _newest(root: Path, have_version: int, read: Callable[[Path], tuple[str, T]]) -> tuple[int, T] | None:
    for _attempt in range(3):
        latest = root / LATEST_FILE
        try:
            info = json.loads(latest.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WeightsError(
                f"{latest} is not valid json ({exc}); the publisher writes it atomically, so "
                "something else wrote it: delete it and let the learner publish again"
            ) from exc
        version = int(info["version"])
        if version == have_version:
            return None
        path = root / str(info.get("file", weights_file_name(version)))
        try:
            actual, got = read(path)
        except FileNotFoundError:
            continue  # pruned between reading LATEST and opening the file: a newer LATEST is there
        if actual != info["checksum"]:
            raise ChecksumMismatch(
                f"{path} has sha256 {actual[:16]}..., LATEST says {str(info['checksum'])[:16]}...; not loading it"
            )
        return version, got
    raise WeightsError(
        f"{root}: the file LATEST names keeps disappearing; is a publisher pruning too eagerly?"
    )

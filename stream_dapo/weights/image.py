"""A weight version's safetensors image in shared memory, written once by the generator's receiver
and mapped, not copied, by the engine's worker process.

vLLM runs its worker in another process, so bytes handed to the engine would be copied through its
RPC several times (msgpack, the engine core, the executor's queue). Instead the receiver assembles
the version straight into a POSIX shared-memory segment (`WeightImage`); the RPC carries only the
segment's name and size, and the worker maps the same pages (`map_image`) and loads the tensors as
views into them. Nothing touches a disk and no byte is read twice.

A generator keeps at most three images: the version it holds (the base of the next delta), the one
being fetched, and one spare (`WeightImage.recycle`): the next fetch of the same size reuses the
spare's pages, which are already mapped (fresh shared memory costs a page fault per 4 KiB on first
write, about as much time as the copy itself). Every image still open when the process exits is
unlinked then (`atexit`; a launcher that stops a generator's whole process group would kill
Python's resource tracker before it could), and the sources close theirs on `close()`. Shared memory comes from
/dev/shm on Linux, which containers often keep small (Docker: 64 MB; the Kubernetes manifests mount
an emptyDir of medium Memory there): a version that does not fit fails with a message naming the
fix, before anything is allocated.
"""

from __future__ import annotations

import _posixshmem  # the POSIX shm_open SharedMemory itself uses (Linux, macOS)
import atexit
import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Iterator
from multiprocessing.shared_memory import SharedMemory

from stream_dapo.weights.errors import WeightsError

__all__ = ["SHM_DIR", "WeightImage", "map_image"]

SHM_DIR = "/dev/shm"


_spare: WeightImage | None = None
_spare_lock = threading.Lock()
_open: weakref.WeakSet[WeightImage] = weakref.WeakSet()
"""Images of this process not closed yet: unlinked at exit."""


def close_all() -> None:
    """Close every image of this process (and the spare); at exit, and from sources' `close()`."""
    global _spare
    with _spare_lock:
        _spare = None
    for image in list(_open):
        image.close()


atexit.register(close_all)


class WeightImage:
    """``nbytes`` of shared memory (``view``), named ``name`` until `close`. `WeightImage.new`
    reuses the spare image when its size matches."""

    @classmethod
    def new(cls, nbytes: int) -> WeightImage:
        """An image of ``nbytes``: the spare one if it has that size (its old bytes still in it),
        else a new one."""
        global _spare
        with _spare_lock:
            spare, _spare = _spare, None
        if spare is not None and spare.nbytes == nbytes and spare._shm is not None:
            return spare
        if spare is not None:
            spare.close()
        return cls(nbytes)

    def recycle(self) -> None:
        """Done with it: keep it as the spare for the next `new` of its size (or free it)."""
        global _spare
        if self._shm is None or not self._linked:
            self.close()
            return
        with _spare_lock:
            old, _spare = _spare, self
        if old is not None and old is not self:
            old.close()

    def __init__(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"a weight image needs at least one byte, got {nbytes}")
        _check_room(nbytes)
        self._shm: SharedMemory | None = SharedMemory(create=True, size=nbytes)
        self.name = self._shm.name
        self.nbytes = nbytes
        self.view: memoryview = _buffer(self._shm)[:nbytes]
        self._linked = True
        _open.add(self)

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return bytes(self.view)

    def unlink(self) -> None:
        """Remove the name (the pages stay mapped here and in any process that mapped them)."""
        if self._linked and self._shm is not None:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()

    def close(self) -> None:
        """Unlink and unmap (idempotent). Views of ``view`` still held elsewhere keep the pages until
        they are released."""
        self.unlink()
        if self._shm is not None:
            with contextlib.suppress(BufferError):  # a view still exported: the GC unmaps it later
                self.view.release()
                self._shm.close()
            self._shm = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


@contextlib.contextmanager
def map_image(name: str, nbytes: int) -> Iterator[memoryview]:
    """Map the image ``name`` made by another process (the engine's worker side), read-only use.

    Mapped without Python's resource tracker: the generator owns the segment. Attaching through
    ``SharedMemory`` registers the name (Python < 3.13), and vLLM's processes share the generator's
    tracker, so undoing that registration here removed the generator's own: its unlink then made the
    tracker print a KeyError traceback and warn of a leak at exit. Opening the segment directly
    (3.13's ``track=False``) leaves the tracker to the generator."""
    mapped = _attach(name)
    view = memoryview(mapped)[:nbytes]
    try:
        if len(view) != nbytes:
            raise WeightsError(
                f"shared-memory weight image {name!r} holds {len(view)} bytes, expected {nbytes}"
            )
        yield view
    finally:
        with contextlib.suppress(BufferError):  # a tensor still holds the pages: the GC unmaps them later
            view.release()
            mapped.close()


def _attach(name: str) -> mmap.mmap:
    """The pages of shared-memory segment ``name``, mapped read-write, not tracked."""
    try:
        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise WeightsError(
            f"shared-memory weight image {name!r} is gone: the generator unlinked it before the engine "
            "mapped it (it retries with the next poll)"
        ) from None
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _buffer(shm: SharedMemory) -> memoryview:
    if shm.buf is None:  # only after close()
        raise WeightsError(f"shared-memory weight image {shm.name!r} is closed")
    return memoryview(shm.buf)


def _check_room(nbytes: int) -> None:
    if not os.path.isdir(SHM_DIR):
        return  # not Linux: the OS decides
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise WeightsError(
            f"a weight version of {nbytes / 1e6:.1f} MB does not fit in {SHM_DIR} ({free / 1e6:.1f} MB free): "
            "give the generator more shared memory (docker run --shm-size; Kubernetes: the dshm emptyDir's "
            "sizeLimit in ops/k8s/base/generator.yaml), at least twice the weights' size with weights.delta"
        )

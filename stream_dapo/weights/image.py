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
Python's resource tracker before it could), and the sources close theirs on `close()`. A process
killed outright (kill -9, the out-of-memory killer) unlinks nothing, and its segments would hold
their RAM until reboot: each image is named ``sdapo_<owner pid>_<random>`` and its owner holds a
lock on it while it lives, and `sweep_orphaned_images` (run when a generator or `stream-dapo run`
starts) removes the ones whose owner is gone. Shared memory comes from
/dev/shm on Linux, which containers often keep small (Docker: 64 MB; the Kubernetes manifests mount
an emptyDir of medium Memory there): a version that does not fit fails with a message naming the
fix, before anything is allocated.
"""

from __future__ import annotations

import _posixshmem  # the POSIX shm_open SharedMemory itself uses (Linux, macOS)
import atexit
import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from multiprocessing.shared_memory import SharedMemory

from stream_dapo.weights.errors import WeightsError

__all__ = ["NAME_PREFIX", "SHM_DIR", "WeightImage", "map_image", "sweep_orphaned_images"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"

NAME_PREFIX = "sdapo_"
"""Every image is named ``sdapo_<owner pid>_<8 hex digits>`` (at most 22 characters: within
macOS's 31 for a POSIX shared-memory name), so a sweep can tell this package's segments from
anyone else's (Python's ``psm_*``, vLLM's, PyTorch's) and read who made them."""

_NAME = re.compile(rf"^{NAME_PREFIX}([1-9][0-9]*)_[0-9a-f]{{8}}$")


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
        self._shm: SharedMemory | None = _create(nbytes)
        self.name = self._shm.name
        try:
            self._owner_lock = _hold(self.name)
        except BaseException:
            self._shm.close()
            self._shm.unlink()
            raise
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
        if self._owner_lock is not None:
            os.close(self._owner_lock)  # the name is gone: nothing left to sweep
            self._owner_lock = None

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


def sweep_orphaned_images(shm_dir: str = SHM_DIR, *, min_age_s: float = 60.0) -> list[tuple[str, int]]:
    """Remove the weight images that processes killed without their clean-up (kill -9, the
    out-of-memory killer) left in ``shm_dir``; returns the (name, bytes) of each, and logs them.

    A segment goes only when every test says its owner is dead:

    - its name is one this package makes (``sdapo_<pid>_<hex>``) and it belongs to this user;
    - no process with that pid runs here that could have made it: none, a zombie, or one that
      started after the segment was made (a restarted container's generator is pid 1 again, and its
      predecessor's images, in a pod's memory-backed /dev/shm, count against its memory limit);
    - nothing holds its owner lock: a live owner holds it until it unlinks the name, and the kernel
      drops it when the owner dies, however it dies. This keeps the images of a live generator in
      another PID namespace that shares the directory (Docker's ``--ipc=host``), whose pid means
      nothing here;
    - it is older than ``min_age_s``: an image whose owner has made it but not locked it yet is not.

    Anything else in the directory (Python's ``psm_*``, vLLM's and PyTorch's segments) is left alone.
    """
    removed: list[tuple[str, int]] = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:  # no such directory (not Linux) or unreadable: nothing to sweep
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None:
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, a link, or another user's
            continue
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_uid != os.getuid()
                or time.time() - st.st_ctime < min_age_s
                or _may_have_made(int(match.group(1)), st.st_ctime)
            ):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its owner lives (in another PID namespace)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append((entry.name, st.st_size))
        finally:
            os.close(fd)
    if removed:
        log.info(
            "removed %d weight image(s) that dead processes left in %s (%.1f MB): %s",
            len(removed),
            shm_dir,
            sum(size for _, size in removed) / 1e6,
            ", ".join(name for name, _ in removed),
        )
    return removed


def _may_have_made(pid: int, made_at: float) -> bool:
    """A process with this pid runs here and started before ``made_at`` (epoch seconds; 1 s of
    slack for the clocks' resolution). Without /proc, any live process with the pid counts."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    except FileNotFoundError:
        return False
    except OSError:
        return _pid_exists(pid)
    if fields[0] == "Z":  # a zombie: dead, only not reaped yet
        return False
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, in ticks
    return started <= made_at + 1.0


def _boot_time() -> float:
    """When this machine booted (epoch seconds), from /proc/stat's ``btime``."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("/proc/stat has no btime line")


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _create(nbytes: int) -> SharedMemory:
    """A new segment of ``nbytes`` named ``sdapo_<this pid>_<random>`` (`NAME_PREFIX`)."""
    while True:
        name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        with contextlib.suppress(FileExistsError):  # 1 in 4e9 per image alive: draw again
            return SharedMemory(name=name, create=True, size=nbytes)


def _hold(name: str) -> int | None:
    """The owner lock of image ``name``: a descriptor of the segment with a shared ``flock`` on it,
    kept until the name is unlinked. Only where the segments are files in `SHM_DIR` (Linux); None
    elsewhere, where nothing sweeps them."""
    path = os.path.join(SHM_DIR, name)
    if not os.path.isdir(SHM_DIR):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


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

"""Weight images left in /dev/shm by processes that died without their clean-up are swept, and
nothing else is: not a live owner's, not another program's.

Regression: a generator killed with SIGKILL (or by the out-of-memory killer) unlinks none of its
images; nothing removed them, and 2.1 GB of them were found holding RAM across runs.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dapo.weights.image import NAME_PREFIX, SHM_DIR, WeightImage, sweep_orphaned_images

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="POSIX shared memory is not a directory here"),
]

WAIT_FOR_STDIN = "import sys; print('up', flush=True); sys.stdin.read()"
"""A child that runs until the test closes its stdin (no clock involved)."""

HOLD_LOCK = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.flock(fd, fcntl.LOCK_SH)\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)
"""A live owner elsewhere (another PID namespace): it holds the segment's owner lock."""

KILLED_GENERATOR = (
    "import os, signal\n"
    "from stream_dapo.weights.image import WeightImage\n"
    "image = WeightImage(1 << 16)\n"
    "print(image.name, flush=True)\n"
    "os.killpg(0, signal.SIGKILL)\n"
)
"""A generator killed with its process group, as `stream-dapo run` or systemd kill one that does not
drain: no atexit, no finally, and Python's resource tracker (which would unlink what its process
registered when that process dies alone) dies with it."""


@pytest.fixture
def segments() -> Iterator[list[str]]:
    """Names of segments a test makes; whatever is left of them is removed afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))


def make_segment(made: list[str], name: str) -> str:
    """A real POSIX shared-memory segment of one page, named `name`, held by no one."""
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    made.append(name)
    try:
        os.ftruncate(fd, 4096)
    finally:
        os.close(fd)
    return name


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    assert child.wait(timeout=120) == 0
    return child.pid


def start(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() in ("up", "locked")
    return proc


def finish(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=120)  # a bound on failure only: it exits as soon as its stdin closes


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def test_images_are_named_for_their_owner() -> None:
    image = WeightImage(4096)
    try:
        assert re.fullmatch(rf"{NAME_PREFIX}{os.getpid()}_[0-9a-f]{{8}}", image.name)
        assert exists(image.name)
    finally:
        image.close()
    assert not exists(image.name)


def test_a_dead_owners_segment_is_removed_and_a_live_owners_is_kept(segments: list[str]) -> None:
    dead = make_segment(segments, f"{NAME_PREFIX}{dead_pid()}_{os.urandom(4).hex()}")
    owner = start(WAIT_FOR_STDIN)
    try:
        live = make_segment(segments, f"{NAME_PREFIX}{owner.pid}_{os.urandom(4).hex()}")
        not_ours = make_segment(segments, f"{NAME_PREFIX}{dead_pid()}_not-a-weight-image")
        own = WeightImage(4096)  # this process's, locked
        try:
            removed = sweep_orphaned_images(min_age_s=0)
            assert dead in [name for name, _ in removed] and exists(live) and exists(own.name)
            assert not exists(dead) and exists(not_ours)
            assert dict(removed)[dead] == 4096
            assert {live, own.name, not_ours}.isdisjoint(name for name, _ in removed)
        finally:
            own.close()
    finally:
        finish(owner)
    # Its owner gone, the live one's segment is an orphan too.
    assert live in [name for name, _ in sweep_orphaned_images(min_age_s=0)] and not exists(live)


def test_a_segment_locked_by_a_live_process_is_kept_whatever_its_pid(segments: list[str]) -> None:
    """Another PID namespace sharing /dev/shm (Docker's --ipc=host): the pid in the name is dead here,
    but the owner lives and holds the lock."""
    name = make_segment(segments, f"{NAME_PREFIX}{dead_pid()}_{os.urandom(4).hex()}")
    holder = start(HOLD_LOCK, os.path.join(SHM_DIR, name))
    try:
        removed = sweep_orphaned_images(min_age_s=0)
        assert name not in [n for n, _ in removed] and exists(name)
    finally:
        finish(holder)
    assert name in [n for n, _ in sweep_orphaned_images(min_age_s=0)] and not exists(name)


def test_a_young_segment_is_kept(segments: list[str]) -> None:
    """Between creating an image and locking it, its owner holds no lock yet."""
    name = make_segment(segments, f"{NAME_PREFIX}{dead_pid()}_{os.urandom(4).hex()}")
    sweep_orphaned_images(min_age_s=3600)
    assert exists(name)


def test_the_images_of_a_killed_generator_are_swept(segments: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_GENERATOR],
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert done.returncode == -9, done.stderr
    name = done.stdout.strip()
    segments.append(name)
    assert exists(name), "the killed process cleaned up after all: nothing to test"
    assert name in [n for n, _ in sweep_orphaned_images(min_age_s=0)] and not exists(name)

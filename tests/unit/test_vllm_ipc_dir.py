"""vLLM's IPC socket files and its workers' rendezvous file go to a directory of the process's own,
removed when it exits, or by the next process when it was killed (vLLM leaves them behind in the temp
directory otherwise: `stream_dapo.generator.vllm_utils.private_ipc_dir`, `engine_tempdir`)."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dapo.generator.vllm_utils import (
    IPC_PATH_MAX,
    OWN_DIR_PREFIX,
    OWNER_FILE,
    private_ipc_dir,
    remove_orphaned_dirs,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp directory shallow enough for unix sockets two levels below it (pytest's is not)."""
    with tempfile.TemporaryDirectory(prefix="sd-", dir="/tmp") as short:
        yield Path(short)


def test_one_directory_per_process_and_an_operators_path_wins(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = short_tmp
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "recorded")  # so that teardown restores "unset"
    monkeypatch.delenv("VLLM_RPC_BASE_PATH")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = private_ipc_dir()
    assert Path(first).parent == tmp_path and Path(first).is_dir()
    assert os.environ["VLLM_RPC_BASE_PATH"] == first
    assert private_ipc_dir() == first  # vLLM caches its environment: later engines bind here too
    assert len(list(tmp_path.iterdir())) == 1
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path / "operator"))
    assert private_ipc_dir() == str(tmp_path / "operator")
    assert not (tmp_path / "operator").exists()  # the operator's directory is theirs to make


def test_a_temp_directory_too_deep_for_a_socket_below_it_keeps_vllms_default(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "recorded")
    monkeypatch.delenv("VLLM_RPC_BASE_PATH")
    deep = short_tmp / ("d" * (IPC_PATH_MAX - 36 - len(str(short_tmp)) - 2))  # room for one uuid only
    deep.mkdir()
    assert len(str(deep)) + 1 + 36 <= IPC_PATH_MAX
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert private_ipc_dir() == str(deep)  # a subdirectory would pass the limit: vLLM's default
    assert "VLLM_RPC_BASE_PATH" not in os.environ and list(deep.iterdir()) == []


CHILD = """
import json, zmq
from stream_dapo.generator.vllm_utils import private_ipc_dir
own = private_ipc_dir()
from vllm.utils.network_utils import get_open_zmq_ipc_path
path = get_open_zmq_ipc_path()
zmq.Context().socket(zmq.PULL).bind(path)  # as vLLM's engine client does; never closed here
import os
print(json.dumps({"dir": own, "path": path, "files": os.listdir(own)}))
"""


@pytest.mark.process
def test_vllm_binds_its_sockets_there_and_nothing_is_left_after_exit(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    env["TMPDIR"] = str(short_tmp)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seen["dir"]).parent == short_tmp
    assert seen["path"].startswith(f"ipc://{seen['dir']}/")
    socket = seen["path"].rsplit("/", 1)[1]
    assert sorted(seen["files"]) == sorted([OWNER_FILE, socket])  # the socket was there
    assert not Path(seen["dir"]).exists()  # and went with the process
    assert [p for p in short_tmp.iterdir() if p.is_socket()] == []  # none in the temp directory


def _own_dir_like(base: Path, name: str, owner: str | None) -> Path:
    path = base / f"{OWN_DIR_PREFIX}{name}"
    path.mkdir()
    (path / "vllm_dist_0123").write_bytes(b"x" * 10)
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_only_directories_whose_owner_is_gone_are_removed(short_tmp: Path) -> None:
    gone = _own_dir_like(short_tmp, "gone0000", "pid 1\n")  # written, unlocked: its process died
    live = _own_dir_like(short_tmp, "live0000", "pid 2\n")
    starting = _own_dir_like(short_tmp, "new00000", "")  # made, not yet locked and written
    older = _own_dir_like(short_tmp, "old00000", None)  # from a version without owner files
    other = short_tmp / "vllm_dist_elsewhere"
    other.write_bytes(b"y")
    with open(live / OWNER_FILE) as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert remove_orphaned_dirs(short_tmp) == [gone]
    assert not gone.exists()
    assert all(p.is_dir() for p in (live, starting, older)) and other.is_file()
    assert remove_orphaned_dirs(short_tmp) == [live]  # its lock is free now


KILLED = """
import json, os, signal, tempfile
from stream_dapo.generator.vllm_utils import engine_tempdir
from vllm.utils.network_utils import get_file_store_init_method
with engine_tempdir() as own:
    store = get_file_store_init_method().removeprefix("file://")
    open(store, "wb").close()  # what torch's FileStore makes as the engine's workers meet
print(json.dumps({"dir": own, "store": store, "after": tempfile.gettempdir(),
                  "inductor": os.environ["TORCHINDUCTOR_CACHE_DIR"]}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no exit handler runs
"""

NEXT = """
import json
from stream_dapo.generator.vllm_utils import own_dir
print(json.dumps({"dir": own_dir()}))
"""


@pytest.mark.process
def test_a_killed_engines_rendezvous_file_is_removed_by_the_next_process(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR")}
    env["TMPDIR"] = str(short_tmp)
    run = {"cwd": REPO, "env": env, "capture_output": True, "text": True, "check": False}
    killed = subprocess.run([sys.executable, "-c", KILLED], **run)  # type: ignore[call-overload]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    seen = json.loads(killed.stdout.strip().splitlines()[-1])
    own = Path(seen["dir"])
    assert own.parent == short_tmp and Path(seen["store"]).parent == own
    assert Path(seen["store"]).is_file()  # left behind by the kill, inside its own directory
    assert seen["after"] == str(short_tmp)  # the temp directory is back once the engine started
    assert seen["inductor"] == str(short_tmp / f"torchinductor_{getpass.getuser()}")  # pinned where it was
    assert [p.name for p in short_tmp.glob("vllm_dist_*")] == []
    nxt = subprocess.run([sys.executable, "-c", NEXT], **run)  # type: ignore[call-overload]
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    assert not own.exists()  # removed by the next process's own_dir
    assert not Path(json.loads(nxt.stdout.strip().splitlines()[-1])["dir"]).exists()  # its own at its exit
    assert [p.name for p in short_tmp.iterdir() if p.name.startswith(OWN_DIR_PREFIX)] == []

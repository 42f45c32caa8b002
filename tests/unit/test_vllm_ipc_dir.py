"""vLLM's IPC socket files go to a directory of the process's own, removed when it exits (vLLM leaves
them behind in the temp directory otherwise: `stream_dapo.generator.vllm_utils.private_ipc_dir`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dapo.generator.vllm_utils import IPC_PATH_MAX, private_ipc_dir

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
    assert seen["files"] == [seen["path"].rsplit("/", 1)[1]]  # the socket file was there
    assert not Path(seen["dir"]).exists()  # and went with the process
    assert [p for p in short_tmp.iterdir() if p.is_socket()] == []  # none in the temp directory

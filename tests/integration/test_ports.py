"""Ports are bound, never picked: a service given port 0 binds one of the kernel's choosing and reports
it (run.out_dir/ports/<service>.json, /healthz), and its peers are told; nothing in the suite or the
library picks a free port, lets go of it and binds it later (`stream_dapo/runtime/ports.py`).

Regression: `make test` after `make run` on a machine doing other work failed in the shared pipeline
run with "cannot serve metrics on 127.0.0.1:33403: Address already in use": the tests picked ports,
released them, and the services bound them later, by which time another process had taken one.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import zmq

from stream_dapo.errors import ConfigError
from stream_dapo.runtime.ports import LISTEN_FDS_ENV, parse_listen_fds, ports_path
from stream_dapo.testing.services import HeldPorts, port_overrides, wait_ports
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import open_endpoint, request
from tests.conftest import REPO

ALLOWED = "port-pick:"
"""A line carrying this comment (with its reason) may pick a port: only where no process can hand a
listening socket over (vLLM's NCCL store, on two GPUs)."""


def _binds_port_0(node: ast.AST) -> bool:
    """`x.bind((host, 0))`."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".bind") and node.args):
        return False
    address = node.args[0]
    return isinstance(address, ast.Tuple) and ast.unparse(address.elts[-1]) == "0"


def _picks_then_binds(tree: ast.AST, lines: list[str]) -> list[int]:
    """Lines where a socket bound to port 0 hands its port out of the `with` block that closes it:
    returned from inside, or kept in a name that code after the block reads."""
    found: list[int] = []
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for block in [n for n in ast.walk(func) if isinstance(n, ast.With)]:
            if not any("socket" in ast.unparse(item.context_expr) for item in block.items):
                continue
            inner = list(ast.walk(block))
            binds_0 = any(_binds_port_0(n) for n in inner)
            if not binds_0:
                continue
            names = {
                t.id
                for n in inner
                if isinstance(n, ast.Assign) and "getsockname" in ast.unparse(n.value)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            returned = any(isinstance(n, ast.Return) and "getsockname" in ast.unparse(n) for n in inner)
            end = block.end_lineno or block.lineno
            used_after = any(
                isinstance(n, ast.Name) and n.id in names and n.lineno > end for n in ast.walk(func)
            )
            if (returned or used_after) and ALLOWED not in "".join(lines[max(0, block.lineno - 4) : end]):
                found.append(block.lineno)
    return found


def test_nothing_picks_a_free_port_and_binds_it_later() -> None:
    offenders = []
    for top in ("stream_dapo", "services", "tests", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            text = path.read_text()
            for line in _picks_then_binds(ast.parse(text), text.splitlines()):
                offenders.append(f"{path.relative_to(REPO)}:{line}")
            for name in ("free_port", "_free_port", "free_tcp_address"):
                name = "def " + name  # spelt apart, so that this file does not match itself
                if name in text:
                    offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert offenders == [], (
        "a port picked, released and bound later can be taken in between by any process on the machine; "
        "bind port 0 and read back what was bound (stream_dapo/runtime/ports.py, tests/helpers.HeldPorts):\n"
        + "\n".join(offenders)
    )


def test_the_guard_catches_the_pattern_it_is_for() -> None:
    picked = """
def free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def later():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve(port)

def held():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        serve(port)
"""
    assert _picks_then_binds(ast.parse(picked), picked.splitlines()) == [3, 8]


def test_inherited_sockets_are_named_by_setting() -> None:
    env = {
        "LISTEN_PID": "42",
        "LISTEN_FDS": "2",
        "LISTEN_FDNAMES": "transport.samples_port:metrics.buffer_port",
    }
    assert parse_listen_fds(env, 42) == {"transport.samples_port": 3, "metrics.buffer_port": 4}
    assert parse_listen_fds(env, 43) == {}, "systemd's variables are for the process it started"
    assert parse_listen_fds({LISTEN_FDS_ENV: "transport.weights_port=7"}, 1) == {"transport.weights_port": 7}
    with pytest.raises(ConfigError, match="setting=fd pairs"):
        parse_listen_fds({LISTEN_FDS_ENV: "transport.weights_port"}, 1)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_DAPO__")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_a_buffer_on_port_0_binds_what_nobody_holds_reports_it_and_serves_there(tmp_path: Path) -> None:
    """The services' ports cannot be taken between choosing and binding: with every port 0 the buffer
    binds while other sockets hold ports (as any busy machine's processes do), reports what it bound in
    its run directory and /healthz, and answers a generator's hello on the reported port."""
    out = tmp_path / "run"
    log = tmp_path / "buffer.log"
    sets = [*port_overrides(), f'run.out_dir="{out}"']
    with HeldPorts(*(f"other.{i}" for i in range(32))) as others, log.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dapo.cli", "buffer", *(a for s in sets for a in ("--set", s))],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        try:
            ports = wait_ports(out, "buffer", proc, timeout_s=120)
            assert set(ports) == {"transport.samples_port", "transport.batches_port", "metrics.buffer_port"}
            assert all(ports.values()) and not set(ports.values()) & set(others.ports.values())
            assert json.loads(ports_path(out, "buffer").read_text())["pid"] == proc.pid
            url = f"http://127.0.0.1:{ports['metrics.buffer_port']}/healthz"
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert json.loads(resp.read())["ports"] == ports
            ctx: zmq.Context = zmq.Context()
            address = f"tcp://127.0.0.1:{ports['transport.samples_port']}"
            with open_endpoint(ctx, zmq.DEALER, connect=address, max_bytes=1 << 20, peer="buffer") as gen:
                assert request(gen, m.Hello("generator-0", 0), timeout_ms=30_000, retries=0).type == m.CREDIT
            ctx.term()
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0, log.read_text()


def test_a_client_given_port_0_is_refused_naming_where_the_bound_port_is(tmp_path: Path) -> None:
    """0 means "any free port" to a server; a generator told to connect to port 0 exits 2 with the fix
    (read the buffer's report, pass the port), not a hang or a traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the model directory is checked first
    sets = [*port_overrides(), f'run.out_dir="{tmp_path / "run"}"', f"model.path={model}"]
    proc = subprocess.run(
        [sys.executable, "-m", "stream_dapo.cli", "generator", *(a for s in sets for a in ("--set", s))],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "transport.samples_port = 0" in proc.stderr and "ports/buffer.json" in proc.stderr
    assert "--set transport.samples_port=<port>" in proc.stderr and "Traceback" not in proc.stderr


def test_a_held_listening_socket_is_what_the_buffer_serves_on(tmp_path: Path) -> None:
    """A supervisor (systemd socket activation, the tests' restart drills) hands its listening sockets
    over; the buffer serves on them, whatever ports the config names."""
    out = tmp_path / "run"
    settings = ("transport.samples_port", "transport.batches_port", "metrics.buffer_port")
    sets = [*port_overrides(), f'run.out_dir="{out}"']
    with HeldPorts(*settings) as held:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dapo.cli", "buffer", *(a for s in sets for a in ("--set", s))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**_env(), **held.env(*settings)},
            pass_fds=held.fds(*settings),
        )
        try:
            assert wait_ports(out, "buffer", proc, timeout_s=120) == held.ports
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0
        with socket.socket() as probe:  # still held by the test after the buffer is gone
            with pytest.raises(OSError):
                probe.bind(("127.0.0.1", held.ports["transport.samples_port"]))

"""The ports a service bound, written where its peers and supervisors can read them.

A port set to 0 in the config means "any free port": the service binds port 0 (ZeroMQ's
``tcp://host:*``, an HTTP server on port 0) and the kernel chooses. Nothing picks a port, lets go of
it and binds it later, so nothing else on the machine can take it in between. What was bound is
reported in three places:

- ``run.out_dir/ports/<service>.json`` (``{"pid": ..., "ports": {"transport.samples_port": ...}}``),
  written atomically once every socket of the service is bound; `stream-dapo run` waits for it and
  passes the ports on to the services started after (``--set transport.samples_port=N``);
- the service's ``/healthz`` body (``"ports"``);
- the launcher's ``summary.json`` (``"ports"``).

Keys are the config settings that choose the port, so a reader can pass them straight to ``--set``.
A fixed port in the config (systemd, Kubernetes) is bound as it is and reported the same way.

A service can also be handed sockets already listening, so that its port is held across restarts
(nobody else can take it while the service is down, and peers find it where it was): systemd socket
activation (``LISTEN_FDS`` / ``LISTEN_FDNAMES`` naming the settings, e.g. ``FileDescriptorName=
transport.samples_port``), or ``STREAM_DAPO_LISTEN_FDS="transport.samples_port=5,metrics.buffer_port=6"``
from a supervisor that keeps them open (the tests' restart drills). An inherited socket wins over the
configured port of its setting.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from stream_dapo.errors import ConfigError
from stream_dapo.runtime.disk import write_text_atomic

__all__ = [
    "LISTEN_FDS_ENV",
    "PORTS_DIR",
    "ServiceExited",
    "endpoint_port",
    "fd_address",
    "inherited_fd",
    "parse_listen_fds",
    "ports_path",
    "read_bound_ports",
    "require_bound",
    "wait_bound_ports",
    "write_bound_ports",
    "zmq_bind_address",
    "zmq_listen",
]

PORTS_DIR = "ports"
"""Directory under run.out_dir with one `<service>.json` per running service."""


class ServiceExited(RuntimeError):
    """The service exited before it reported its ports."""


LISTEN_FDS_ENV = "STREAM_DAPO_LISTEN_FDS"
"""setting=fd,... of listening sockets a supervisor hands to a service (see the module docstring)."""

SD_LISTEN_FDS_START = 3


def parse_listen_fds(environ: Mapping[str, str], pid: int) -> dict[str, int]:
    """Inherited listening sockets by setting: STREAM_DAPO_LISTEN_FDS, and systemd's LISTEN_FDS
    (fds from 3, named by LISTEN_FDNAMES) when LISTEN_PID is this process."""
    fds: dict[str, int] = {}
    if environ.get("LISTEN_PID") == str(pid) and environ.get("LISTEN_FDS", "").isdigit():
        names = environ.get("LISTEN_FDNAMES", "").split(":")
        for i in range(int(environ["LISTEN_FDS"])):
            if i < len(names) and names[i]:
                fds[names[i]] = SD_LISTEN_FDS_START + i
    for item in filter(None, environ.get(LISTEN_FDS_ENV, "").split(",")):
        setting, sep, fd = item.partition("=")
        if not sep or not fd.strip().isdigit():
            raise ConfigError(f"{LISTEN_FDS_ENV} takes setting=fd pairs separated by commas, got {item!r}")
        fds[setting.strip()] = int(fd)
    return fds


def inherited_fd(setting: str) -> int | None:
    """The fd of a listening socket this process was handed for `setting`, if any."""
    return parse_listen_fds(os.environ, os.getpid()).get(setting)


def fd_address(fd: int) -> tuple[str, int]:
    """(host, port) a listening socket's fd is bound to (the fd stays open and ours)."""
    with socket.socket(fileno=os.dup(fd)) as s:
        host, port = s.getsockname()[:2]
    return str(host), int(port)


def zmq_bind_address(host: str, port: int) -> str:
    """The ZeroMQ address a server binds: port 0 becomes ``*`` (libzmq picks a free port)."""
    return f"tcp://{host}:{port if port else '*'}"


def zmq_listen(setting: str, host: str, port: int) -> tuple[str, int | None]:
    """(address, fd) for a ZeroMQ server socket of `setting`: an inherited socket's address and a
    duplicate of its fd for ZMQ_USE_FD (libzmq closes that copy with its socket), else the configured
    address with port 0 as ``*`` and no fd."""
    fd = inherited_fd(setting)
    if fd is None:
        return zmq_bind_address(host, port), None
    bound_host, bound_port = fd_address(fd)
    return f"tcp://{bound_host}:{bound_port}", os.dup(fd)


def endpoint_port(address: str) -> int:
    """The port of a bound ZeroMQ endpoint address: ``tcp://127.0.0.1:40123`` -> 40123."""
    tail = address.rsplit(":", 1)[-1]
    if not tail.isdigit():
        raise ValueError(f"{address!r} is not a bound tcp:// endpoint (no port after the last ':')")
    return int(tail)


def ports_path(out_dir: str | Path, service: str) -> Path:
    return Path(out_dir) / PORTS_DIR / f"{service}.json"


def write_bound_ports(out_dir: str | Path, service: str, ports: Mapping[str, int]) -> Path:
    """Record what `service` (this process) bound; written whole or not at all."""
    path = ports_path(out_dir, service)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"pid": os.getpid(), "ports": dict(ports)}, sort_keys=True))
    return path


def read_bound_ports(out_dir: str | Path, service: str, pid: int | None = None) -> dict[str, int] | None:
    """The ports `service` reported, or None when it has not (yet); with `pid`, only a report by
    that process counts (an earlier run's file is ignored)."""
    try:
        record = json.loads(ports_path(out_dir, service).read_text())
    except (OSError, ValueError):
        return None
    if pid is not None and record.get("pid") != pid:
        return None
    return {str(k): int(v) for k, v in record["ports"].items()}


def wait_bound_ports(
    out_dir: str | Path,
    service: str,
    exited: Callable[[], int | None],
    pid: int | None = None,
    timeout_s: float = 600.0,
    poll_s: float = 0.05,
) -> dict[str, int]:
    """Wait until `service` reports its ports (see `read_bound_ports`) and return them.

    `exited()` returns the service's exit code once it has exited (``Popen.poll``); then this
    raises ServiceExited at once instead of waiting out `timeout_s`, which only bounds a service
    that hangs before binding (TimeoutError).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        ports = read_bound_ports(out_dir, service, pid)
        if ports is not None:
            return ports
        code = exited()
        if code is not None:
            raise ServiceExited(f"{service} exited with code {code} before it reported its ports")
        if time.monotonic() > deadline:
            where = ports_path(out_dir, service)
            raise TimeoutError(f"{service} did not report its ports in {where} within {timeout_s:.0f} s")
        time.sleep(poll_s)


def require_bound(setting: str, port: int, server: str) -> int:
    """A client's port must be the one its server bound: 0 ("any free port") means nothing to a
    client. Raises ConfigError naming where to read the real one."""
    if port == 0:
        raise ConfigError(
            f"{setting} = 0 lets the {server} bind any free port, but this service connects to it and must "
            f"be told which: read it from run.out_dir/{PORTS_DIR}/{server}.json (or the {server}'s /healthz) "
            f"and pass --set {setting}=<port>, or give {setting} a fixed port (`stream-dapo run` does this for you)"
        )
    return port

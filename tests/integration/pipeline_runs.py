"""Short `stream-dapo run`s of the tiny pipeline for the integration tests, and the processes they left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil
import pytest

from stream_dapo.testing.services import tiny_overrides

ASYNC_STEPS = 6  # the session's async run (conftest.async_run)


def run_pipeline(
    tmp: Path,
    warm: Path,
    mode: str,
    steps: int,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    on_ports: Callable[[str, int], None] | None = None,
) -> tuple[int, dict, set[int], Path]:
    """`stream-dapo run --no-eval` on the tiny pipeline, every port 0 (each service binds one of the
    kernel's choosing and reports it); returns (rc, summary, every child pid seen, out). `on_ports`
    is called with (service, metrics port) as the services report them (a Prometheus to point)."""
    out = tmp / f"run-{mode}"
    overrides = tiny_overrides(warm, out) + [f"learner.total_steps={steps}", *extra]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--mode", mode]
    for item in overrides:
        argv += ["--set", item]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env) if env else None
    )
    seen: set[int] = set()
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            seen.update(p.pid for p in parent.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
        if on_ports is not None:
            report_metrics_ports(out, on_ports)
        time.sleep(0.5)
    output = proc.stdout.read() if proc.stdout else ""
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((out / "logs").glob("*.log"))
        )
        pytest.fail(f"run failed (rc {proc.returncode}):\n{output[-3000:]}\n{logs}")
    return proc.returncode, json.loads(summary_path.read_text()), seen, out


def report_metrics_ports(out: Path, on_ports: Callable[[str, int], None]) -> None:
    """(service, metrics port) of every service that has reported its ports in out/ports/."""
    from stream_dapo.runtime.ports import PORTS_DIR, read_bound_ports

    for path in sorted((out / PORTS_DIR).glob("*.json")):
        ports = read_bound_ports(out, path.stem) or {}
        for key, port in ports.items():
            if key.startswith("metrics."):
                on_ports(path.stem, port)


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out

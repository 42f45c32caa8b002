"""A real Prometheus server (Debian's `prometheus`) on loopback, scraping services started by a test."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.integration.ops_helpers import require_tool

ALERTS = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "alerts.yml"


JOBS = {
    "buffer": "stream-dapo-buffer",
    "learner": "stream-dapo-learner",
    "generator": "stream-dapo-generator",
}
"""Service name prefix -> job name of ops/prometheus/prometheus.yml."""


class LivePrometheus:
    """A running Prometheus: `url`, and `scrape(service, port)`, which adds a target (file-based
    service discovery: the services' ports are known only once they have bound them)."""

    def __init__(self, url: str, targets_dir: Path) -> None:
        self.url = url
        self.targets_dir = targets_dir
        self._targets: dict[str, str] = {}

    def scrape(self, service: str, port: int) -> None:
        target = f"127.0.0.1:{port}"
        if self._targets.get(service) == target:
            return
        self._targets[service] = target
        job = JOBS[service.split("-")[0]]
        groups = [{"targets": [t]} for s, t in sorted(self._targets.items()) if JOBS[s.split("-")[0]] == job]
        path = self.targets_dir / f"{job}.yml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(groups))
        tmp.replace(path)  # Prometheus never reads half a file


@contextlib.contextmanager
def live_prometheus(tmp: Path) -> Iterator[LivePrometheus]:
    """Start Prometheus on a port of the kernel's choosing, scraping every second with the job names of
    ops/prometheus/prometheus.yml and the rules of alerts.yml; yield it; stop it (its log is shown if
    it dies early)."""
    exe = require_tool("prometheus", "apt-get install -y prometheus")
    targets = tmp / "targets"
    targets.mkdir()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "alerts.yml")],
        "scrape_configs": [
            {
                "job_name": job,
                "file_sd_configs": [{"files": [str(targets / f"{job}.yml")], "refresh_interval": "1s"}],
            }
            for job in JOBS.values()
        ],
    }
    shutil.copy(ALERTS, tmp / "alerts.yml")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            "--web.listen-address=127.0.0.1:0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = _wait_ready(proc, tmp / "prometheus.log")
        yield LivePrometheus(url, targets)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _listening_port(pid: int) -> int | None:
    """The TCP port process `pid` listens on (Prometheus reports no bound port of its own)."""
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return None
    ports = [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN]
    return ports[0] if ports else None


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        port = _listening_port(proc.pid)
        if port is not None:
            url = f"http://127.0.0.1:{port}"
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return url
            except (urllib.error.URLError, ConnectionError):
                pass
        time.sleep(0.3)
    raise AssertionError(f"prometheus not ready after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """Result vector of an instant query through the HTTP API (`/api/v1/query`)."""
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])

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


@contextlib.contextmanager
def live_prometheus(tmp: Path, port: int, *, buffer: int, learner: int, generator: int) -> Iterator[str]:
    """Start Prometheus scraping every second with the job names of ops/prometheus/prometheus.yml and
    the rules of alerts.yml; yield its base URL; stop it (its log is shown if it dies early)."""
    exe = require_tool("prometheus", "apt-get install -y prometheus")
    jobs = {"stream-dapo-buffer": buffer, "stream-dapo-learner": learner, "stream-dapo-generator": generator}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "alerts.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}"]}]} for job, p in jobs.items()
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
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, tmp / "prometheus.log")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
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

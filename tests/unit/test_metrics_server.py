"""The /metrics server's probes: liveness and readiness answer separately, /healthz needs both."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from stream_dapo.metrics import start_metrics


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def served():
    registry, health, server = start_metrics("127.0.0.1", 0, stall_after_s=30.0)
    yield registry, health, server.port
    server.stop()


def codes(port: int) -> dict[str, int]:
    return {path: get(port, path)[0] for path in ("/livez", "/readyz", "/healthz")}


def test_a_live_service_that_is_not_ready_passes_liveness_only(served) -> None:
    _, _, port = served
    assert codes(port) == {"/livez": 200, "/readyz": 503, "/healthz": 503}


def test_a_ready_progressing_service_passes_every_probe(served) -> None:
    _, health, port = served
    health.ready = True
    health.detail["version"] = 7
    assert codes(port) == {"/livez": 200, "/readyz": 200, "/healthz": 200}
    body = json.loads(get(port, "/healthz")[1])
    assert body["ready"] is True and body["live"] is True and body["version"] == 7


def test_a_stalled_loop_fails_liveness_and_health_but_stays_ready(served) -> None:
    _, health, port = served
    health.ready = True
    health.last_progress -= 31.0
    assert codes(port) == {"/livez": 503, "/readyz": 200, "/healthz": 503}
    assert json.loads(get(port, "/livez")[1])["seconds_since_progress"] >= 31.0
    health.beat()
    assert codes(port) == {"/livez": 200, "/readyz": 200, "/healthz": 200}


def test_metrics_come_from_the_process_registry_and_unknown_paths_are_404(served) -> None:
    from prometheus_client import Counter

    registry, _, port = served
    Counter("stream_dapo_test_things", "Things.", registry=registry).inc(3)
    status, body = get(port, "/metrics")
    assert status == 200 and b"stream_dapo_test_things_total 3.0" in body
    status, body = get(port, "/nope")
    assert status == 404 and b"/livez" in body

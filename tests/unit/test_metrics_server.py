"""The /metrics server's probes: liveness and readiness answer separately, /healthz needs both."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stream_dapo.runtime.metrics import start_metrics


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


class HugeSeries(Collector):
    """One 32 MB series: more than loopback socket buffers hold, so a hang-up is seen mid-write."""

    def collect(self):
        family = GaugeMetricFamily("stream_dapo_test_blob", "A huge label value.", labels=["blob"])
        family.add_metric(["x" * (32 << 20)], 1.0)
        yield family


def test_a_scraper_that_hangs_up_mid_response_leaves_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Prometheus closes the connection when a scrape times out; the write then fails with
    # BrokenPipeError or ConnectionResetError, which is the scraper's business, not an error here.
    handled = threading.Event()
    shutdown_request = ThreadingHTTPServer.shutdown_request

    def shutdown_and_tell(self, request):  # runs after the handler (and any error report) is done
        shutdown_request(self, request)
        handled.set()

    monkeypatch.setattr(ThreadingHTTPServer, "shutdown_request", shutdown_and_tell)
    registry, _, server = start_metrics("127.0.0.1", 0)
    registry.register(HugeSeries())
    try:
        with caplog.at_level(logging.DEBUG), socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert client.recv(5) == b"HTTP/"  # the server is writing the response
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        assert handled.wait(30), "the server never finished the request"
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        err = capsys.readouterr().err
        for text in ("Traceback", "BrokenPipeError", "ConnectionResetError", "Exception occurred"):
            assert text not in err
        status, body = get(server.port, "/livez")  # and it keeps serving
        assert status == 200 and json.loads(body)["live"] is True
    finally:
        server.stop()


def test_a_stopping_service_serves_until_its_final_figures_were_scraped_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """metrics.final_scrape_wait_s: the last step's figures reach Prometheus before the exit."""
    from prometheus_client import Gauge

    registry, _, server = start_metrics("127.0.0.1", 0)
    step = Gauge("stream_dapo_test_step", "step", registry=registry)
    step.set(41)
    get(server.port, "/metrics")  # a scrape before the final figures: it does not count
    step.set(42)  # the last step, just before the stop
    before = server.scrapes
    stopper = threading.Thread(target=server.stop, args=(600.0,))
    with caplog.at_level(logging.INFO, logger="stream_dapo"):
        stopper.start()
        seen: list[bytes] = []
        while stopper.is_alive():  # Prometheus' next scrapes; the first one after the wait began ends it
            try:
                seen.append(get(server.port, "/metrics")[1])
            except OSError:
                break  # the server closed between our check and the request
        stopper.join()
    assert server.scrapes > before and seen
    assert b"stream_dapo_test_step 42.0" in seen[0]
    assert "final metrics scraped" in caplog.text
    with pytest.raises(OSError):
        get(server.port, "/metrics")


def test_without_a_wait_or_without_a_scraper_the_stop_does_not_wait_for_one() -> None:
    _, _, server = start_metrics("127.0.0.1", 0)
    assert server.linger(0.0) is False and server.scrapes == 0
    assert server.linger(0.05) is False  # nobody scrapes: the bound ends the wait
    server.stop(0.0)

"""The tests' live Prometheus listens on a port of the kernel's choosing and finds the services at the
ports they report (file-based service discovery), so nothing picks a port for it."""

from __future__ import annotations

import time
from pathlib import Path

from stream_dapo.runtime.metrics import BufferMetrics, start_metrics
from tests.integration.prometheus_live import live_prometheus, query


def test_live_prometheus_scrapes_a_service_on_the_port_it_reported(tmp_path: Path) -> None:
    registry, health, server = start_metrics("127.0.0.1", 0)
    BufferMetrics(registry).max_staleness.set(4)
    health.ready = True
    try:
        with live_prometheus(tmp_path) as prom:
            assert prom.url.startswith("http://127.0.0.1:") and not prom.url.endswith(":0")
            prom.scrape("buffer", server.port)
            deadline = time.monotonic() + 60  # only reached when the target is never scraped
            while not query(prom.url, 'up{job="stream-dapo-buffer"} == 1'):
                assert time.monotonic() < deadline, "the reported port was never scraped"
                time.sleep(0.2)
            (series,) = query(prom.url, "stream_dapo_buffer_max_staleness_versions")
            assert float(series["value"][1]) == 4.0
    finally:
        server.stop()

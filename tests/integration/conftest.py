"""The session's one async run of the tiny pipeline, shared by the end-to-end and the tracking tests.

It is scraped every second by a real Prometheus server (Debian's `prometheus`) and, where W&B and
TensorBoard are installed, tracks to both offline (``WANDB_MODE=offline``: no network, no account)
besides metrics.jsonl. One run serves both modules because a run is the expensive part of each: the
end-to-end tests assert what it trained and that nothing outlived it, the tracking tests read back
what it tracked.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pipeline_runs import ASYNC_STEPS, run_pipeline
from tests.integration.prometheus_live import live_prometheus

TRACKING_PROJECT = "stream-dapo-test"
TRACKING_TAGS = ["test", "tiny"]


def tracking_libraries_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("wandb", "tensorboard"))


@pytest.fixture(scope="session")
def async_run(tmp_path_factory: pytest.TempPathFactory, warm_model: Path) -> Iterator[tuple[Any, ...]]:
    """(rc, summary, child pids seen, out dir, Prometheus URL) of one async run of ASYNC_STEPS steps."""
    tmp = tmp_path_factory.mktemp("async")
    extra: list[str] = []
    if tracking_libraries_installed():
        extra = [
            'tracking.backends=["jsonl", "wandb", "tensorboard"]',
            f"tracking.tags={TRACKING_TAGS}".replace("'", '"'),
            f'tracking.project="{TRACKING_PROJECT}"',
        ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    with live_prometheus(tmp) as prom:
        result = run_pipeline(
            tmp, warm_model, "async", ASYNC_STEPS, extra=extra, env=env, on_ports=prom.scrape
        )
        yield (*result, prom.url)

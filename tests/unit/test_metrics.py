"""Metric helpers."""

from __future__ import annotations

import pytest


def test_observe_many_adds_what_as_many_single_observations_add() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from stream_dapo.runtime.metrics import observe_many, registry_samples

    one, bulk = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("stale", "x", buckets=(0, 1, 2, 4), registry=one)
    h2 = Histogram("stale", "x", buckets=(0, 1, 2, 4), registry=bulk)
    for value, count in ((0, 5), (1, 3), (3, 2), (9, 1), (2, 0)):
        for _ in range(count):
            h1.observe(value)
        observe_many(h2, value, count)

    def counted(registry: CollectorRegistry) -> dict[str, float]:
        return {k: v for k, v in registry_samples(registry).items() if not k.endswith("_created")}

    assert counted(bulk) == counted(one)
    assert registry_samples(bulk)['stale_bucket{le="2.0"}'] == 8.0  # 5 + 3; the 3s and the 9 above
    assert registry_samples(bulk)["stale_sum"] == 0 * 5 + 1 * 3 + 3 * 2 + 9


def test_learner_off_policy_gauges_show_the_masked_share_and_the_sequence_ratio_spread() -> None:
    import math

    from prometheus_client import CollectorRegistry

    from stream_dapo.runtime.metrics import LearnerMetrics

    registry = CollectorRegistry()
    mx = LearnerMetrics(registry)
    mx.set_off_policy(0.25, 0.5, 1.2247)
    value = registry.get_sample_value
    assert value("stream_dapo_learner_masked_tokens_ratio") == 0.25
    assert value("stream_dapo_learner_sequence_ratio", {"stat": "min"}) == 0.5
    assert value("stream_dapo_learner_sequence_ratio", {"stat": "max"}) == 1.2247
    mx.set_off_policy(0.0, None, None)  # a step that trained no token
    ratio_max = value("stream_dapo_learner_sequence_ratio", {"stat": "max"})
    assert ratio_max is not None and math.isnan(ratio_max)


@pytest.mark.process
def test_peak_rss_bytes_grows_by_what_the_process_touched() -> None:
    """In a fresh process: touching 256 MiB raises the peak by at least 200 MiB,
    and the figure never falls when the memory is freed."""
    import subprocess
    import sys

    code = (
        "from stream_dapo.runtime.metrics import peak_rss_bytes\n"
        "before = peak_rss_bytes()\n"
        "block = bytearray(256 << 20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "during = peak_rss_bytes()\n"
        "del block\n"
        "print(before, during, peak_rss_bytes())\n"
    )
    # Through sh, so the child is a fork of a small shell: Linux keeps a process's peak across exec
    # and starts a fork's at its parent's resident size, which for pytest may be gigabytes.
    argv = ["sh", "-c", '"$0" -c "$1"; exit $?', sys.executable, code]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    before, during, after = map(int, out.split())
    assert during - before >= 200 << 20
    assert after == during

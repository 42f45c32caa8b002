"""Metric helpers."""

from __future__ import annotations


def test_observe_many_adds_what_as_many_single_observations_add() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from stream_dapo.metrics import observe_many, registry_samples

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

"""bench/drills/verifier_hostile.py on the real pool: every hostile input scores -1, nothing runs."""

from __future__ import annotations

import math

import pytest


@pytest.mark.timeout(300)
def test_hostile_corpus_bench_reports_bounded_latency_and_no_execution() -> None:
    import bench.drills.verifier_hostile as bench

    d = bench.measure(repeats=1, timeout_s=5.0)
    assert d["inputs"] == len(d["per_input"]) > 30
    assert d["all_scored_minus_1"] and d["pool_still_verifies"]
    assert d["marker_file_created"] is False
    assert math.isfinite(d["worst_latency_s"]) and 0 < d["worst_latency_s"] < 5.0 + 5.0  # timeout + respawn
    assert sum(d["reasons"].values()) == d["inputs"]

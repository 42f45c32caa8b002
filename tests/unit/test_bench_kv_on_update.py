"""The figures bench/studies/kv_on_update.py derives from a run's files: token staleness and its quantiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.studies.kv_on_update import quantile, token_staleness


def test_quantiles_of_counted_values_are_the_smallest_value_covering_the_share() -> None:
    counts = {0: 50, 1: 30, 2: 15, 4: 5}  # 100 tokens
    assert quantile(counts, 0.5) == 0  # 50 of 100 at or below 0
    assert quantile(counts, 0.51) == 1
    assert quantile(counts, 0.95) == 2  # 95 at or below 2
    assert quantile(counts, 0.96) == 4
    assert quantile(counts, 1.0) == 4
    with pytest.raises(ValueError, match="no items"):
        quantile({}, 0.5)


def test_token_staleness_sums_the_learner_rows_and_leaves_out_unversioned_tokens(tmp_path: Path) -> None:
    rows = [
        {"version": 1, "staleness_counts": {"-1": 40, "0": 10, "1": 2}},
        {"version": 2, "staleness_counts": {"0": 5, "3": 1}},
        {"event": "checkpoint"},  # a row without counts
    ]
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert token_staleness(tmp_path) == {0: 15, 1: 2, 3: 1}

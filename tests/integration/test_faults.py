"""Fault drill over real processes: kill -9 the generator, the learner and the buffer mid-run.

The drill itself (start the services one by one, kill and restart each, account for every group)
lives in tests/fault_drill.py, shared with bench/drill.py, which prints the same report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault_drill import ElasticDrill, FaultDrill

pytestmark = pytest.mark.timeout(900)


def test_kill_each_service_and_recover(tmp_path: Path, warm_model: Path) -> None:
    report = FaultDrill(warm_model, tmp_path / "run", total_steps=10).run()

    assert [r.service for r in report.recoveries] == ["generator", "learner", "buffer"]
    learner = report.recoveries[1]
    assert learner.detail["checkpoint_version"] >= 4
    buffer = report.recoveries[2]
    assert buffer.detail["acknowledged_after_restart"] >= buffer.detail["acknowledged_before_kill"] > 0
    assert report.learner_exit_code == 0

    assert report.trained_versions == list(range(1, 11))
    assert report.groups_trained_twice == 0, "a group was trained twice in the surviving lineage"
    assert report.groups_lost == 0, "an acknowledged group was neither trained, held, nor dropped as stale"
    assert report.groups_trained_unacknowledged == 0
    assert report.max_staleness_trained <= report.max_staleness_allowed


def test_generators_join_and_leave_during_a_run(tmp_path: Path, warm_model: Path) -> None:
    """1 -> 3 -> 1 generators (one leaves by SIGTERM, one by kill -9), then one replaced by a new index."""
    report = ElasticDrill(warm_model, tmp_path / "run").run()

    assert [e["event"] for e in report.events] == [
        "scale 1 -> 3",
        "generator-1 leaves by SIGTERM (drain)",
        "generator-2 leaves by kill -9",
        "generator-0 replaced by generator-3",
    ]
    # Each departure's credits came back to the admission line (the drill waited for it: drained at
    # once, or at the lease's expiry), and the run went on without it.
    assert report.events[1]["exit_code"] == 0  # a drained generator exits cleanly
    d = report.drill
    # Stopped by SIGTERM after the drill: it drained (exit 0), every step in order from 1.
    assert d.learner_exit_code == 0 and d.trained_versions == list(range(1, len(d.trained_versions) + 1))
    assert len(d.trained_versions) > report.events[-1]["at_step"] >= 2
    assert d.groups_trained_twice == 0 and d.groups_lost == 0 and d.groups_trained_unacknowledged == 0
    assert d.max_staleness_trained <= d.max_staleness_allowed

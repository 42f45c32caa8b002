"""Fault drill over real processes: kill -9 the generator, the learner and the buffer mid-run.

The drill itself (start the services one by one, kill and restart each, account for every group)
lives in stream_dapo/testing/drills.py, shared with bench/drills/drill.py, which prints the same report. The
elastic-fleet drill with real vLLM generators (`bench/drills/drill.py --elastic`, minutes of vLLM start-ups)
is not run here; tests/integration/test_elastic_fleet.py checks the same promises with generator
stand-ins.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dapo.testing.drills import FaultDrill

pytestmark = pytest.mark.timeout(900)


def test_kill_each_service_and_recover(tmp_path: Path, warm_model: Path) -> None:
    report = FaultDrill(warm_model, tmp_path / "run").run()

    assert [r.service for r in report.recoveries] == ["generator", "learner", "buffer"]
    learner = report.recoveries[1]
    assert learner.detail["checkpoint_version"] >= 4
    buffer = report.recoveries[2]
    assert buffer.detail["acknowledged_after_restart"] >= buffer.detail["acknowledged_before_kill"] > 0
    assert report.learner_exit_code == 0  # stopped by SIGTERM after the drill: it drains and exits 0

    # Every version from 1 to where the drain stopped it, each once, past the learner's resume point.
    steps = len(report.trained_versions)
    assert steps > learner.detail["checkpoint_version"]
    assert report.trained_versions == list(range(1, steps + 1))
    assert report.groups_trained_twice == 0, "a group was trained twice in the surviving lineage"
    assert report.groups_lost == 0, "an acknowledged group was neither trained, held, nor dropped as stale"
    assert report.groups_trained_unacknowledged == 0
    assert report.max_staleness_trained <= report.max_staleness_allowed

"""End to end: `stream-dapo run` with real vLLM, ZeroMQ and DeepSpeed on a tiny model.

One short async run and one short sync run share a module-scoped warm model. Each asserts what the
design promises: the version advances, generators receive several weight versions, every learner
parameter changed, losses are finite, no trained token exceeds the staleness bound, no group is
trained twice, and no process outlives the run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stream_dapo.config import load_config
from tests.helpers import free_ports, tiny_overrides

pytestmark = pytest.mark.timeout(900)


def run_pipeline(tmp: Path, warm: Path, mode: str, steps: int) -> tuple[int, dict, set[int], Path]:
    out = tmp / f"run-{mode}"
    overrides = tiny_overrides(warm, out, free_ports(8)) + [f"learner.total_steps={steps}"]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--mode", mode]
    for item in overrides:
        argv += ["--set", item]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[int] = set()
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            seen.update(p.pid for p in parent.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.5)
    output = proc.stdout.read() if proc.stdout else ""
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((out / "logs").glob("*.log"))
        )
        pytest.fail(f"run failed (rc {proc.returncode}):\n{output[-3000:]}\n{logs}")
    return proc.returncode, json.loads(summary_path.read_text()), seen, out


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_every_parameter_changed(initial: Path, final: Path) -> None:
    from safetensors.torch import load_file

    before = load_file(str(next(initial.glob("*.safetensors"))))
    after = load_file(str(next(final.glob("*.safetensors"))))
    assert set(before) == set(after)
    unchanged = [name for name in before if before[name].equal(after[name])]
    assert unchanged == [], f"parameters the learner never changed: {unchanged}"


def test_async_run_trains_and_cleans_up(tmp_path: Path, warm_model: Path) -> None:
    steps = 6
    rc, summary, seen, out = run_pipeline(tmp_path, warm_model, "async", steps)
    assert rc == 0
    cfg = load_config([out / "config.toml"], environ={})
    assert summary["final_version"] == steps == summary["learner_steps"]
    assert summary["groups_trained"] == steps * cfg.groups_per_version
    assert summary["groups_trained_twice"] == 0
    assert summary["max_staleness_trained"] <= cfg.algo.max_staleness
    assert summary["groups_dropped_stale"] == 0
    assert summary["groups_accepted"] >= summary["groups_trained"]
    assert summary["generator_weight_updates"] >= 2
    rows = [json.loads(line) for line in (out / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert_every_parameter_changed(warm_model, out / "final")
    assert seen, "the launcher started no children"
    assert alive(seen) == [], "processes outlived the run"


def test_sync_run_is_on_policy_at_rollout_start(tmp_path: Path, warm_model: Path) -> None:
    steps = 4
    rc, summary, seen, out = run_pipeline(tmp_path, warm_model, "sync", steps)
    assert rc == 0
    cfg = load_config([out / "config.toml"], environ={})
    assert summary["final_version"] == steps
    # Lock-step: a rollout batch is generated with the weights the learner had when it asked, so the
    # worst staleness is the S - 1 steps within one batch.
    assert summary["max_staleness_trained"] <= cfg.steps_per_rollout - 1
    assert summary["groups_trained_twice"] == 0
    assert alive(seen) == []

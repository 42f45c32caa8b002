"""End to end: `stream-dapo run` with real vLLM, ZeroMQ and DeepSpeed on a tiny model.

One short async run (the session's `async_run`, tests/integration/conftest.py, which the tracking tests
read too) and one sync run stopped by SIGTERM, on the session's warm model. Each asserts what the design promises: the version advances, generators receive several weight versions, every learner
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
from stream_dapo.testing.services import tiny_overrides
from stream_dapo.tools.launch import DEFAULT_CONFIG
from tests.integration.pipeline_runs import ASYNC_STEPS, alive
from tests.integration.prometheus_live import query

pytestmark = pytest.mark.timeout(900)


def assert_every_parameter_changed(initial: Path, final: Path) -> None:
    from safetensors.torch import load_file

    before = load_file(str(next(initial.glob("*.safetensors"))))
    after = load_file(str(next(final.glob("*.safetensors"))))
    assert set(before) == set(after)
    unchanged = [name for name in before if before[name].equal(after[name])]
    assert unchanged == [], f"parameters the learner never changed: {unchanged}"


def assert_generator_followed_the_learner(summary: dict, cfg, steps: int) -> None:
    """What admission guarantees about weight updates, however fast the model or the machine.

    At learner version 0 the buffer can have credited at most admission_capacity groups still in
    line plus the one rollout batch the learner leased (leased groups leave the line); the learner
    reports a newer version only with its next batch request, S = steps_per_rollout versions later.
    Groups dropped by dynamic sampling return their credit, but they are never trained. So when
    the run trains more groups than that, some were credited at version >= S, and a generator
    starts a credited group only on weights at most sync_every - 1 versions older: it loaded an
    update to version >= S - (sync_every - 1). How many updates it loaded on the way depends on
    speed (it may jump straight to the newest version), so only one is guaranteed.
    """
    trained = steps * cfg.admission.groups_per_version
    credited_at_v0 = cfg.admission.capacity + cfg.learner.rollout_batch_prompts
    assert trained > credited_at_v0, "the run is too short to need weights newer than version 0"
    assert summary["generator_weight_updates"] >= 1
    assert summary["generator_policy_version"] >= cfg.admission.steps_per_rollout - (
        cfg.learner.sync_every - 1
    )


def test_async_run_trains_and_cleans_up(async_run, warm_model: Path) -> None:
    steps = ASYNC_STEPS
    rc, summary, seen, out, _ = async_run
    assert rc == 0
    cfg = load_config([out / "config.toml"], environ={})
    assert summary["final_version"] == steps == summary["learner_steps"]
    assert summary["groups_trained"] == steps * cfg.admission.groups_per_version
    assert summary["groups_trained_twice"] == 0
    assert summary["max_staleness_trained"] <= cfg.algo.max_staleness
    assert summary["groups_dropped_stale"] == 0
    assert summary["groups_accepted"] >= summary["groups_trained"]
    assert_generator_followed_the_learner(summary, cfg, steps)
    rows = [json.loads(line) for line in (out / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert_every_parameter_changed(warm_model, out / "final")
    assert seen, "the launcher started no children"
    assert alive(seen) == [], "processes outlived the run"
    assert_services_reported_the_ports_they_bound(summary, cfg)


def assert_services_reported_the_ports_they_bound(summary: dict, cfg) -> None:  # cfg: Config
    """Every port was 0 in the config: each service bound one of the kernel's choosing and reported
    it, and the launcher passed the buffer's and the learner's on to their peers."""
    assert cfg.transport.samples_port == cfg.transport.weights_port == cfg.metrics.buffer_port == 0
    ports = summary["ports"]
    assert set(ports["buffer"]) == {"transport.samples_port", "transport.batches_port", "metrics.buffer_port"}
    assert set(ports["learner"]) == {"transport.weights_port", "metrics.learner_port"}
    assert set(ports["generator-0"]) == {"metrics.generator_port"}
    every = [port for reported in ports.values() for port in reported.values()]
    assert all(every) and len(set(every)) == len(every), ports


# What DESIGN.md's metrics section requires, as the series each job must have sent Prometheus.
REQUIRED_SERIES = {
    "stream-dapo-generator": [
        "stream_dapo_generator_tokens_total",
        "stream_dapo_generator_samples_total",
        'stream_dapo_generator_groups_total{outcome="mixed"}',
        "stream_dapo_generator_reward_count",
        "stream_dapo_generator_accuracy_ratio",
        "stream_dapo_generator_response_length_tokens_count",
        "stream_dapo_generator_truncated_samples_total",
        "stream_dapo_generator_verifier_latency_seconds_count",
        "stream_dapo_generator_verifier_results_total",
        "stream_dapo_generator_credits_available",
        "stream_dapo_generator_weight_sync_seconds_count",
        "stream_dapo_generator_weight_sync_bytes_total",
        "stream_dapo_generator_policy_version",
        "stream_dapo_generator_tokens_per_second",
    ],
    "stream-dapo-buffer": [
        "stream_dapo_buffer_depth_groups",
        "stream_dapo_buffer_staleness_versions_count",
        "stream_dapo_buffer_dropped_stale_groups_total",
        "stream_dapo_buffer_credits_granted_total",
        "stream_dapo_buffer_credits_outstanding",
        "stream_dapo_buffer_learner_version",
        "stream_dapo_buffer_max_staleness_versions",
    ],
    "stream-dapo-learner": [
        "stream_dapo_learner_step",
        "stream_dapo_learner_policy_version",
        "stream_dapo_learner_loss",
        "stream_dapo_learner_entropy_nats",
        'stream_dapo_learner_clip_fraction{side="low"}',
        'stream_dapo_learner_clip_fraction{side="high"}',
        "stream_dapo_learner_importance_weight",
        "stream_dapo_learner_grad_norm",
        "stream_dapo_learner_tokens_per_second",
        "stream_dapo_learner_staleness_versions_count",
        "stream_dapo_learner_weight_sync_seconds_count",
        "stream_dapo_learner_weight_sync_bytes_total",
    ],
}


def test_prometheus_scraped_every_required_metric_from_its_job(async_run) -> None:
    """Query the live server's HTTP API: each required metric has a non-empty series, from the job
    of the service that owns it; the alert rules' recording rules evaluate on the live data."""
    *_, prom = async_run
    for job in REQUIRED_SERIES:
        (up,) = query(prom, f'max_over_time(up{{job="{job}"}}[15m])')
        assert float(up["value"][1]) == 1.0, f"{job} was never scraped successfully"
    missing = []
    for job, selectors in REQUIRED_SERIES.items():
        for selector in selectors:
            series = query(prom, f"last_over_time({selector}[15m])")
            jobs = {s["metric"].get("job") for s in series}
            if jobs != {job}:
                missing.append(f"{selector}: jobs {sorted(j or '?' for j in jobs)}")
            for s in series:  # shown with `pytest -s`: what Prometheus holds
                print(f"{job:22s} {selector:60s} {len(series)} series, last {s['value'][1]}")
    assert missing == [], "required series missing or from the wrong job:\n" + "\n".join(missing)
    # Prometheus saw the learner after a step. Which steps it saw depends on when its one-second
    # scrapes fall (the services report their ports, Prometheus finds them after they start, and the
    # last steps come back to back just before the learner exits), so no count of steps or changes
    # is asserted here: the run itself is checked to the step in test_async_run_trains_and_cleans_up.
    (step,) = query(prom, "max_over_time(stream_dapo_learner_step[15m])")
    assert 1 <= float(step["value"][1]) <= ASYNC_STEPS
    (bound,) = query(prom, "last_over_time(stream_dapo:staleness_bound_versions[15m])")
    assert float(bound["value"][1]) == 4.0, "the recording rule reads algo.max_staleness from the buffer"


def test_sync_run_is_on_policy_and_sigterm_stops_every_service_in_drain_order(
    tmp_path: Path, warm_model: Path
) -> None:
    """A sync run, stopped by SIGTERM once the learner is into its second rollout batch: every batch
    was generated on the weights the learner had when it asked, and the stop drains every service.

    Regression (SIGTERM): it killed the launcher alone and left the services (and vLLM) running,
    holding the ports, so `--resume` failed with "port in use"; no summary was written. One run
    checks both (the lock-step bound and the drain), each of which needs a whole pipeline start."""
    import signal

    out = tmp_path / "run"
    overrides = tiny_overrides(warm_model, out) + ["learner.total_steps=10000"]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--mode", "sync"]
    for item in overrides:
        argv += ["--set", item]
    cfg = load_config([DEFAULT_CONFIG], overrides, environ={})
    into_second_batch = cfg.admission.steps_per_rollout + 1
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    parent = psutil.Process(proc.pid)
    seen: set[int] = set()
    metrics = out / "learner" / "metrics.jsonl"
    try:
        # the learner took a step of its second rollout batch
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= into_second_batch):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            seen.update(p.pid for p in parent.children(recursive=True))
            time.sleep(0.5)
        seen.update(p.pid for p in parent.children(recursive=True))
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM"
    assert into_second_batch <= summary["learner_steps"] < 10000 and summary["groups_trained_twice"] == 0
    # Lock-step: a rollout batch is generated with the weights the learner had when it asked, so the
    # worst staleness is the S - 1 steps within one batch.
    assert summary["max_staleness_trained"] <= cfg.admission.steps_per_rollout - 1
    # Every service wrote its final figures: the summary does not read a stale scrape of the buffer.
    assert summary["groups_accepted"] >= summary["groups_trained"]
    assert {p.stem for p in (out / "final-metrics").glob("*.json")} >= {"buffer", "learner", "generator-0"}
    assert "Traceback" not in output
    assert alive(seen) == [], "services outlived the launcher: nothing holds their ports now"
    assert set(summary["ports"]) == {"buffer", "learner", "generator-0"}
    logs = {p.stem: p.read_text() for p in (out / "logs").glob("*.log")}
    assert "received SIGTERM" in logs["learner"] and "checkpoint" in logs["learner"]  # it drained

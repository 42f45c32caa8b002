"""ops/prometheus: the scrape config and rules pass promtool, and every alert is unit-tested."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from stream_dapo.config import MetricsConfig
from tests.integration.ops_helpers import referenced_names, require_tool, unknown_metrics

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "ops" / "prometheus"
INSTALL = "apt-get install -y prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_tool("promtool", INSTALL)
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=PROM)


def _load(name: str) -> Any:
    return yaml.safe_load((PROM / name).read_text())


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load("alerts.yml")["groups"] for rule in group["rules"]]


def test_scrape_config_passes_promtool() -> None:
    proc = _promtool("check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_pass_promtool() -> None:
    proc = _promtool("check", "rules", "alerts.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_unit_tests_pass() -> None:
    proc = _promtool("test", "rules", "alerts_test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in _load("alerts_test.yml")["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested staying quiet"
    assert {
        "StreamDapoGeneratorDown",
        "StreamDapoLearnerStalled",
        "StreamDapoStalenessNearBound",
        "StreamDapoFilteredGroupsHigh",
        "StreamDapoVerifierTimeoutsRising",
        "StreamDapoBufferStarving",
        "StreamDapoBufferFull",
        "StreamDapoWeightSyncSlow",
    } <= alerts


def test_learner_stall_is_the_step_gauge_not_changing() -> None:
    (rule,) = [r for r in _rules() if r.get("alert") == "StreamDapoLearnerStalled"]
    assert re.sub(r"\s+", "", rule["expr"]) == "changes(stream_dapo_learner_step[10m])==0"


def test_rules_only_use_metrics_the_services_export() -> None:
    records = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        expr = rule["expr"]
        assert unknown_metrics(expr, records) == set(), (rule.get("alert") or rule.get("record"), expr)
        uses = referenced_names(expr) or ({"up"} if re.search(r"\bup\b", expr) else set())
        assert uses or rule.get("record") == "stream_dapo:staleness_bound_versions", expr
    for case in _load("alerts_test.yml")["tests"]:
        for series in case["input_series"]:
            name = series["series"].split("{", 1)[0]
            assert name == "up" or not unknown_metrics(name), f"alerts_test.yml feeds unknown series {name}"


def test_scrape_targets_match_the_default_ports() -> None:
    defaults = MetricsConfig()
    jobs = {job["job_name"]: job for job in _load("prometheus.yml")["scrape_configs"]}
    assert set(jobs) == {"stream-dapo-buffer", "stream-dapo-learner", "stream-dapo-generator"}

    def ports(job: str) -> list[int]:
        return [int(t.rsplit(":", 1)[1]) for sc in jobs[job]["static_configs"] for t in sc["targets"]]

    assert ports("stream-dapo-buffer") == [defaults.buffer_port]
    assert ports("stream-dapo-learner") == [defaults.learner_port]
    gen = jobs["stream-dapo-generator"]["static_configs"]
    for sc in gen:
        (target,) = sc["targets"]
        index = int(sc["labels"]["generator"])
        assert int(target.rsplit(":", 1)[1]) == defaults.generator_port + index, target
    # Every job an alert selects on is scraped.
    selected = {m for r in _rules() for m in re.findall(r'job="([^"]+)"', r["expr"])}
    assert selected <= set(jobs)

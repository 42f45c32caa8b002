"""ops/grafana: the dashboard is valid JSON, its queries parse as PromQL, and they only use metric
names stream_dapo/runtime/metrics.py defines (so a renamed metric fails here, not on an empty panel)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.ops_helpers import referenced_names, require_tool, unknown_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "ops" / "grafana" / "stream-dapo.json"
# Grafana's interval variables, replaced by plausible values for the PromQL syntax check.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def _queries() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels(_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    panels = _panels(dash["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_query_uses_only_exported_metric_names() -> None:
    queries = _queries()
    assert len(queries) >= 20
    for title, expr in queries:
        assert referenced_names(expr), f"{title}: {expr} uses no stream_dapo metric"
        assert unknown_metrics(expr) == set(), f"{title}: {expr}"


@pytest.mark.parametrize(
    "metric",
    [
        "stream_dapo_generator_tokens_total",
        "stream_dapo_learner_tokens_total",
        "stream_dapo_generator_samples_total",
        "stream_dapo_learner_reward_mean",
        "stream_dapo_learner_accuracy_ratio",
        "stream_dapo_learner_entropy_nats",
        "stream_dapo_learner_clip_fraction",
        "stream_dapo_learner_staleness_versions_bucket",
        "stream_dapo_buffer_depth_groups",
        "stream_dapo_buffer_credits_outstanding",
        "stream_dapo_generator_weight_sync_seconds_bucket",
        "stream_dapo_generator_verifier_latency_seconds_bucket",
        "stream_dapo_learner_behaviour_logprob_abs_diff",
        "stream_dapo_learner_behaviour_ratio_out_of_range_ratio",
    ],
)
def test_dashboard_shows(metric: str) -> None:
    assert any(metric in referenced_names(expr) for _, expr in _queries()), metric


def test_queries_parse_as_promql(tmp_path: Path) -> None:
    """promtool has no expression checker, so each query becomes a recording rule it parses."""
    rules = []
    for i, (_, expr) in enumerate(_queries()):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    exe = require_tool("promtool", "apt-get install -y prometheus")
    proc = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

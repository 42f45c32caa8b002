"""docs/operations.md: the ports table agrees with the configuration defaults and the manifests."""

from __future__ import annotations

import re
from pathlib import Path

from stream_dapo.config import MetricsConfig, TransportConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"


def _ports_table() -> dict[str, int]:
    """config key (or torchrun flag) -> port, from the table under '## Ports'."""
    section = DOC.read_text().split("## Ports", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"\| (\d+)(?: \+ i)? \| (?:torchrun )?`([^`]+)`( \+ 1)?(?: \+ i)? \|", line)
        if m:
            key = m.group(2) + (" + 1" if m.group(3) else "")
            rows[key] = int(m.group(1))
    return rows


def test_ports_table_matches_the_config_defaults() -> None:
    t, mc = TransportConfig.model_validate({}), MetricsConfig.model_validate({})
    assert _ports_table() == {
        "transport.samples_port": t.samples_port,
        "transport.batches_port": t.batches_port,
        "transport.weights_port": t.weights_port,
        "transport.nccl_port": t.nccl_port,
        "--master-port": 29500,
        "metrics.buffer_port": mc.buffer_port,
        "metrics.learner_port": mc.learner_port,
        "metrics.generator_port": mc.generator_port,
    }


def test_rendezvous_port_is_the_one_the_units_and_manifests_use() -> None:
    env = (ROOT / "ops" / "systemd" / "env" / "learner.env").read_text()
    assert "MASTER_PORT=29500" in env
    assert 'value: "29500"' in (ROOT / "ops" / "k8s" / "base" / "learner.yaml").read_text()


def test_every_ops_file_the_guide_names_exists() -> None:
    for path in set(re.findall(r"`(ops/[^`\s]+)`", DOC.read_text())):
        assert (ROOT / path.rstrip("/")).exists(), path

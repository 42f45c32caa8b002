"""docs/metrics.md is generated from stream_dapo/runtime/metrics.py and must not drift from it."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from stream_dapo.runtime.metrics import BufferMetrics, GeneratorMetrics, LearnerMetrics
from stream_dapo.tools.metrics_docs import collect_metrics, render, series_names

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_committed_reference_matches_the_metric_classes() -> None:
    assert DOCS.read_text() == render(), (
        "docs/metrics.md is stale: regenerate it with `python -m stream_dapo.tools.metrics_docs > docs/metrics.md`"
    )


def test_reference_lists_every_metric_once_with_type_and_help() -> None:
    infos = list(collect_metrics())
    names = [m.name for m in infos]
    assert len(names) == len(set(names))
    text = render()
    for m in infos:
        assert f"| `{m.name}` | {m.type} |" in text
        assert m.help.replace("|", "\\|") in text
    counters = [m for m in infos if m.type == "counter"]
    assert counters and all(m.name.endswith("_total") for m in counters)


def test_series_names_are_what_the_services_expose() -> None:
    """Every series a registry exposes (labelled metrics given one child) is in series_names()."""
    registry = CollectorRegistry()
    for cls in (GeneratorMetrics, BufferMetrics, LearnerMetrics):
        instance = cls(registry)
        for metric in vars(instance).values():
            labelnames = getattr(metric, "_labelnames", ())
            if labelnames:
                metric.labels(*["x"] * len(labelnames))
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    exposed = {n for n in exposed if not n.endswith("_created")}
    assert exposed == series_names()

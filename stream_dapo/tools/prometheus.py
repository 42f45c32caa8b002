"""Reading Prometheus, one client for every tool: a service's own /metrics text (`scrape`, then
`metric_sum` and `histogram_quantile` over the samples; the launcher's live view, the drills) and
the Prometheus server's HTTP API (`instant_query`; the planner's `--from-prometheus`)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from stream_dapo.runtime.metrics import sample_key

__all__ = [
    "PrometheusError",
    "PrometheusUnreachable",
    "histogram_quantile",
    "instant_query",
    "metric_sum",
    "scrape",
]


class PrometheusError(ValueError):
    """Prometheus answered with an error, or with something that is not its JSON."""


class PrometheusUnreachable(PrometheusError):
    """No answer from the Prometheus server at all (wrong URL, down, timed out)."""


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """Prometheus text -> {'name{label="v"}': value}; empty when the service is not up."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample_key(sample.name, sample.labels)] = float(sample.value)
    return out


def metric_sum(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """Sum a metric over label sets (optionally only those matching `labels`)."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def histogram_quantile(samples: Mapping[str, float], name: str, q: float) -> float | None:
    """Upper bound of the bucket holding quantile q (Prometheus histogram_quantile, no interpolation)."""
    buckets = []
    for key, value in samples.items():
        if key.startswith(name + "_bucket{"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), value))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    target = q * buckets[-1][1]
    return next(le for le, count in buckets if count >= target)


def instant_query(base_url: str, promql: str, timeout_s: float) -> float | None:
    """One instant query against Prometheus' HTTP API; None when it returns no (finite) sample."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise PrometheusError(
            f"Prometheus at {base_url} answered {exc.code} to {promql!r}: {detail}"
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusUnreachable(
            f"cannot reach Prometheus at {base_url} ({reason}); check the URL (e.g. http://prometheus:9090)"
        ) from None
    except ValueError:
        raise PrometheusError(
            f"{base_url} did not answer with Prometheus JSON; is it Prometheus' base URL?"
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else body
        raise PrometheusError(f"Prometheus at {base_url} rejected {promql!r}: {error}")
    result = body.get("data", {}).get("result", [])
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise PrometheusError(f"unexpected Prometheus result for {promql!r}: {result[0]!r}") from None
    return value if math.isfinite(value) else None

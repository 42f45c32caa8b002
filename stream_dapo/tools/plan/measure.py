"""The planner's rates measured by Prometheus over a window (`--from-prometheus`)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterable

from stream_dapo.runtime.metrics import GeneratorMetrics, LearnerMetrics, catalogue, sample_name
from stream_dapo.tools.plan.model import PlanError, token_age_from_counts
from stream_dapo.tools.prometheus import PrometheusError, PrometheusUnreachable, instant_query

# --------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------

Query = Callable[[str, str, float], float | None]


def prometheus_query(base_url: str, promql: str, timeout_s: float) -> float | None:
    """`instant_query`, its errors as `PlanError`s that name the planner's way around them."""
    try:
        return instant_query(base_url, promql, timeout_s)
    except PrometheusUnreachable as exc:
        raise PlanError(f"{exc}, or pass the rates yourself: --gen-tps X --learn-tps Y") from None
    except PrometheusError as exc:
        raise PlanError(str(exc)) from None


_WINDOW = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


MEASURABLE = ("gen_tps", "learn_tps", "mean_response_len", "keep_fraction", "weight_sync_s", "token_age")
FLAGS = {
    "gen_tps": "--gen-tps",
    "learn_tps": "--learn-tps",
    "mean_response_len": "--mean-response-len",
    "keep_fraction": "--keep-fraction",
    "weight_sync_s": "--weight-sync-seconds",
    "prompt_len": "--prompt-len",
    "gen_scaling": "--gen-scaling",
    "token_age": "--token-age",
}


def measure_from_prometheus(
    base_url: str,
    window: str,
    wanted: Iterable[str],
    timeout_s: float = 10.0,
    query: Query = prometheus_query,
    full_engine: tuple[int, float] | None = None,
) -> dict[str, float]:
    """Rates over the last `window` for the `wanted` keys of `MEASURABLE`.

    gen_tps is the average over generator series of rate(tokens). With `full_engine` = (M, a) it is
    scaled to a full engine by the groups the generators held on average, m (their
    groups_in_flight gauge): x (M/m)^a, which is exact for a = 1 (tokens/s in proportion to the
    groups, idle spells included) and a lower bound for a < 1 where the engines idled. learn_tps is the learner's token
    rate divided by the fraction of time it was neither waiting for a batch nor publishing weights.
    """
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise PlanError(
            f"--from-prometheus {base_url!r}: write the base URL with its scheme, e.g. http://prometheus:9090"
        )
    if not _WINDOW.match(window):
        raise PlanError(f"--window {window!r} is not a Prometheus duration; write e.g. 30m or 2h")

    def need(promql: str, key: str, what: str) -> float:
        value = query(base_url, promql, timeout_s)
        if value is None:
            raise PlanError(
                f"Prometheus at {base_url} has no data for {what} over the last {window} ({promql}); check "
                f"that it scrapes the services (ops/prometheus/prometheus.yml), widen --window, or pass "
                f"{FLAGS[key]}"
            )
        return value

    def rate(metric: str, agg: str = "sum", selector: str = "") -> str:
        return f"{agg}(rate({metric}{selector}[{window}]))"

    gen, lrn = catalogue(GeneratorMetrics), catalogue(LearnerMetrics)
    out: dict[str, float] = {}
    wanted = set(wanted)
    if unknown := wanted - set(MEASURABLE):
        raise PlanError(f"cannot measure {sorted(unknown)} from Prometheus; measurable: {MEASURABLE}")
    if "gen_tps" in wanted:
        tps = need(rate(sample_name(gen.tokens), "avg"), "gen_tps", "generator tokens")
        if tps <= 0:
            raise PlanError(f"the generators produced no tokens over the last {window}; pass --gen-tps")
        out["gen_tps"] = tps
        if full_engine is not None:
            held_q = f"avg(avg_over_time({sample_name(gen.groups_in_flight)}[{window}]))"
            held = query(base_url, held_q, timeout_s)
            if held is not None and held > 0:
                full, scaling = full_engine
                out["gen_tps"] = tps * (full / min(held, full)) ** scaling
                out["gen_groups_held"] = min(held, full)
    if "learn_tps" in wanted:
        tokens = need(rate(sample_name(lrn.tokens)), "learn_tps", "learner tokens")
        waiting = query(base_url, rate(sample_name(lrn.batch_wait_seconds, "_sum")), timeout_s) or 0.0
        syncing = query(base_url, rate(sample_name(lrn.weight_sync_seconds, "_sum")), timeout_s) or 0.0
        busy = 1.0 - waiting - syncing
        if tokens <= 0 or busy < 0.05:
            raise PlanError(
                f"the learner trained {tokens:g} tokens/s and had data {max(busy, 0):.0%} of the last "
                f"{window}: too little to measure its throughput; pass --learn-tps"
            )
        out["learn_tps"] = tokens / busy
    if "mean_response_len" in wanted:
        total = need(rate(sample_name(gen.response_length, "_sum")), "mean_response_len", "response lengths")
        count = need(rate(sample_name(gen.response_length, "_count")), "mean_response_len", "responses")
        if count <= 0:
            raise PlanError(f"no response finished over the last {window}; pass --mean-response-len")
        out["mean_response_len"] = total / count
    if "keep_fraction" in wanted:
        metric = sample_name(gen.groups)
        kept = need(rate(metric, selector='{outcome="mixed"}'), "keep_fraction", "kept (mixed) groups")
        total = need(rate(metric), "keep_fraction", "finished groups")
        if total <= 0 or kept <= 0:
            raise PlanError(
                f"{kept:g} of {total:g} groups/s were kept over the last {window}: nothing to size for; "
                "pass --keep-fraction"
            )
        out["keep_fraction"] = kept / total
    if "weight_sync_s" in wanted:
        metric = sample_name(lrn.weight_sync_seconds)
        seconds = need(rate(metric + "_sum"), "weight_sync_s", "weight-sync time")
        count = need(rate(metric + "_count"), "weight_sync_s", "weight publications")
        if count <= 0:
            raise PlanError(
                f"the learner published no weights over the last {window}; pass --weight-sync-seconds"
            )
        out["weight_sync_s"] = seconds / count
    if "token_age" in wanted:
        # Soft: generators older than these counters leave it to the default.
        counts = [
            query(base_url, rate(sample_name(metric, suffix)), timeout_s)
            for metric, suffix in (
                (gen.group_tail_tokens, ""),
                (gen.response_length, "_sum"),
                (gen.group_longest, "_sum"),
                (gen.group_longest, "_count"),
            )
        ]
        if all(c is not None and c > 0 for c in counts):
            out["token_age"] = token_age_from_counts(*(float(c) for c in counts if c is not None))
    return out

"""Prometheus metrics and the /metrics, /healthz, /livez and /readyz HTTP server of every service.

Each process owns one `CollectorRegistry` (never the global one), so tests can start several
services in one interpreter. Names follow `stream_dapo_<component>_<what>_<unit>`; counters end
in `_total`; units are base units (seconds, bytes); labels are low-cardinality.

Metric definitions live here, one class per component, so `docs/metrics.md` can be generated
from them and names cannot drift between services.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from stream_dapo.errors import ConfigError
from stream_dapo.runtime.disk import write_text_atomic

log = logging.getLogger(__name__)

LENGTH_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GeneratorMetrics:
    """What a generator exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "stream_dapo_generator_"
        self.tokens = Counter(p + "tokens", "Response tokens generated.", registry=registry)
        self.samples = Counter(p + "samples", "Responses generated.", registry=registry)
        self.groups = Counter(
            p + "groups",
            "Groups finished, by outcome of the dynamic-sampling filter.",
            ["outcome"],
            registry=registry,
        )
        self.groups_sent = Counter(
            p + "groups_sent", "Groups sent to the buffer (resends included).", registry=registry
        )
        self.groups_acked = Counter(p + "groups_acked", "Groups the buffer acknowledged.", registry=registry)
        self.reward = Histogram(
            p + "reward", "Shaped reward per sample.", buckets=(-2, -1, -0.5, 0, 0.5, 1, 2), registry=registry
        )
        self.accuracy = Gauge(
            p + "accuracy_ratio", "Fraction correct over the last finished groups.", registry=registry
        )
        self.response_length = Histogram(
            p + "response_length_tokens", "Response length.", buckets=LENGTH_BUCKETS, registry=registry
        )
        self.truncated = Counter(
            p + "truncated_samples", "Responses stopped at max tokens.", registry=registry
        )
        self.verifier_latency = Histogram(
            p + "verifier_latency_seconds",
            "Verifier wall time per batch.",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.verifier_results = Counter(
            p + "verifier_results", "Verifier outcomes by reason.", ["reason"], registry=registry
        )
        self.source_samples = Counter(
            p + "source_samples",
            "Responses scored, by data source (data.sources; 'default' without it).",
            ["source"],
            registry=registry,
        )
        self.source_correct = Counter(
            p + "source_correct",
            "Responses whose score counts as correct (the source's correct_threshold), by data source: "
            "accuracy = rate(source_correct) / rate(source_samples).",
            ["source"],
            registry=registry,
        )
        self.source_score = Histogram(
            p + "source_score",
            "The reward's score per response before overlong shaping, by data source (mean = _sum / _count; "
            'le="0.0" counts every score at or below 0, a -1 included).',
            ["source"],
            # No negative bound: prometheus_client leaves a histogram's _sum out when it has one.
            buckets=(0, 0.25, 0.5, 0.75, 1),
            registry=registry,
        )
        self.source_groups = Counter(
            p + "source_groups",
            "Groups finished, by data source and outcome of the dynamic-sampling filter (filtered share = "
            "the all_correct and all_wrong outcomes over all; for real-valued scores, groups of equal scores).",
            ["source", "outcome"],
            registry=registry,
        )
        self.source_response_length = Histogram(
            p + "source_response_length_tokens",
            "Response length by data source.",
            ["source"],
            buckets=LENGTH_BUCKETS,
            registry=registry,
        )
        self.source_truncated = Counter(
            p + "source_truncated_samples",
            "Responses stopped at their source's max tokens, by data source.",
            ["source"],
            registry=registry,
        )
        self.reward_failures = Counter(
            p + "reward_failures",
            "Responses whose reward could not be computed and scored the source's failure_score, by data "
            "source and reason: timeout, worker_crashed, reward_error (the function raised), reward_nan, "
            "reward_not_number, and the code sandbox's code_sandbox_error.",
            ["source", "reason"],
            registry=registry,
        )
        self.credits_available = Gauge(
            p + "credits_available", "Credits held and not yet used.", registry=registry
        )
        self.groups_in_flight = Gauge(p + "groups_in_flight", "Groups being generated.", registry=registry)
        self.unacked_groups = Gauge(
            p + "unacked_groups", "Groups sent but not yet acknowledged.", registry=registry
        )
        self.policy_version = Gauge(
            p + "policy_version", "Weight version the engine samples from.", registry=registry
        )
        self.weight_sync_seconds = Histogram(
            p + "weight_sync_seconds",
            "Fetch + load time of one update.",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.weight_sync_bytes = Counter(
            p + "weight_sync_bytes", "Bytes of the weight versions loaded (full size).", registry=registry
        )
        self.weight_received_bytes = Counter(
            p + "weight_received_bytes",
            "Weight bytes that crossed the network for the versions loaded (a delta counts its compressed "
            "size; chunks the held version already had count nothing).",
            registry=registry,
        )
        self.weight_relay_sent_bytes = Counter(
            p + "weight_relay_sent_bytes",
            "Weight chunk bytes this generator's relay sent to other generators (weights.peer_fanout): the "
            "learner's egress it saved.",
            registry=registry,
        )
        self.weight_relays_dropped = Counter(
            p + "weight_relays_dropped",
            "Other generators' relays a weight transfer stopped asking (weights.peer_fanout), by reason: "
            "disconnected (its connection dropped), silent (no answer within weights.peer_timeout_s), refused "
            "(it answered an error or not_available), bad_chunk (a chunk failed its digest), queue_full (our "
            "queue to it stayed full). Each costs a retry from the next source and is reported to the learner.",
            ["reason"],
            registry=registry,
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "Connections to this generator's weight relay (weights.peer_fanout with transport.curve_dir) "
            "whose CurveZMQ handshake failed, by socket (weight_relay) and reason (as the buffer's).",
            ["socket", "reason"],
            registry=registry,
        )
        self.weight_delta_ratio = Gauge(
            p + "weight_delta_ratio",
            "Bytes received / full size of the last version loaded (1: the whole image; weights.delta).",
            registry=registry,
        )
        self.weights_behind = Gauge(
            p + "weights_behind_versions",
            "Newest version this generator's last weight poll saw published, minus the version it samples "
            "from (0 while it keeps up; the learner-side view is in the StreamDapoGeneratorWeightsBehind alert).",
            registry=registry,
        )
        self.weight_publish_to_loaded_seconds = Histogram(
            p + "weight_publish_to_loaded_seconds",
            "From the learner publishing a version to this generator sampling from it (the learner's and "
            "this host's wall clocks: skew between hosts shows here).",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.tokens_per_second = Gauge(
            p + "tokens_per_second", "Generated tokens per second (recent).", registry=registry
        )
        self.messages_rejected = Counter(
            p + "messages_rejected", "Malformed messages received.", ["reason"], registry=registry
        )
        self.groups_rejected = Counter(
            p + "groups_rejected", "Groups the buffer refused, by its reason.", ["reason"], registry=registry
        )
        self.stale_credit_replies = Counter(
            p + "stale_credit_replies",
            "Credit replies ignored: a second answer to a repeated request, or one no request waits for.",
            registry=registry,
        )
        self.groups_aborted = Counter(
            p + "groups_aborted", "Groups aborted unfinished (drain on shutdown).", registry=registry
        )
        self.prefix_cache_hit_tokens = Counter(
            p + "prefix_cache_hit_tokens", "Prompt tokens served from vLLM's prefix cache.", registry=registry
        )
        self.tokens_recomputed = Counter(
            p + "kv_recompute_tokens",
            "Context tokens weight swaps made the engine prefill again (generator.kv_on_update).",
            registry=registry,
        )
        self.group_tail_tokens = Counter(
            p + "group_tail_tokens",
            "Decode steps a group still ran after each of its response tokens, summed over tokens (a "
            "token's wait for its group's longest response; stream-dapo plan's token age).",
            registry=registry,
        )
        self.group_longest = Histogram(
            p + "group_longest_tokens",
            "Length of each finished group's longest response (the decode steps the group spent in the engine).",
            buckets=LENGTH_BUCKETS,
            registry=registry,
        )
        self.multi_version_samples = Counter(
            p + "multi_version_samples",
            "Responses whose tokens more than one weight version sampled.",
            registry=registry,
        )
        self.weight_hold_seconds = Counter(
            p + "weight_hold_seconds",
            "Seconds an update waited for in-flight groups, no new group starting (between-groups).",
            registry=registry,
        )
        self.engine_start_seconds = Gauge(
            p + "engine_start_seconds", "Time the vLLM engine took to start.", registry=registry
        )


class BufferMetrics:
    """What the replay buffer exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "stream_dapo_buffer_"
        self.depth = Gauge(p + "depth_groups", "Groups held, by state.", ["state"], registry=registry)
        self.groups_accepted = Counter(
            p + "groups_accepted", "Groups accepted from generators.", registry=registry
        )
        self.groups_duplicate = Counter(
            p + "groups_duplicate", "Groups dropped as duplicates by id.", registry=registry
        )
        self.groups_served = Counter(p + "groups_served", "Groups served to the learner.", registry=registry)
        self.groups_committed = Counter(
            p + "groups_committed", "Groups the learner committed.", registry=registry
        )
        self.groups_requeued = Counter(
            p + "groups_requeued", "Leased groups requeued after a learner restart.", registry=registry
        )
        self.dropped_stale = Counter(
            p + "dropped_stale_groups", "Groups dropped at dequeue for staleness.", registry=registry
        )
        self.learner_holds = Counter(
            p + "learner_holds",
            "Batch requests answered short so that reported in-flight groups stay trainable "
            "(buffer.in_flight_hold_s).",
            registry=registry,
        )
        self.learner_holds_expired = Counter(
            p + "learner_holds_expired",
            "Holds that ran past buffer.in_flight_hold_s: the learner went on without those groups.",
            registry=registry,
        )
        self.in_flight_reported = Gauge(
            p + "in_flight_reported_groups",
            "Groups the generators report started and not yet sent.",
            registry=registry,
        )
        self.staleness = Histogram(
            p + "staleness_versions",
            "Worst token staleness of served groups.",
            buckets=STALENESS_BUCKETS,
            registry=registry,
        )
        self.credits_granted = Counter(
            p + "credits_granted", "Credits granted to generators.", registry=registry
        )
        self.credits_outstanding = Gauge(
            p + "credits_outstanding", "Credits granted and not yet redeemed.", registry=registry
        )
        self.credit_capacity = Gauge(
            p + "credit_capacity_groups", "Admission capacity (groups in line).", registry=registry
        )
        self.learner_version = Gauge(
            p + "learner_version", "Learner version last reported.", registry=registry
        )
        self.max_staleness = Gauge(
            p + "max_staleness_versions",
            "The staleness bound the dequeue gate enforces (algo.max_staleness).",
            registry=registry,
        )
        self.messages_rejected = Counter(
            p + "messages_rejected", "Malformed messages received.", ["reason"], registry=registry
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "Connections whose CurveZMQ handshake failed, by socket and reason: not_allowed (a client key "
            "not in the allow-list), protocol or handshake (a wrong server key, no keys, another mechanism).",
            ["socket", "reason"],
            registry=registry,
        )
        self.persist_seconds = Histogram(
            p + "persist_seconds",
            "Time to persist state: a snapshot's encoding, write and fsync (on the compactor thread) "
            "and the journal rewrite after it.",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.seen_ids = Gauge(
            p + "seen_ids",
            "Group ids kept to drop resends: those generator processes may still resend (above their "
            "acked_below horizon) plus every id of a group sent unnumbered. Stays near the groups not yet "
            "acknowledged; growing with every group means unnumbered senders (older generators).",
            registry=registry,
        )
        self.groups_rejected = Counter(
            p + "groups_rejected", "Groups refused in acks, by reason.", ["reason"], registry=registry
        )
        self.oldest_waiting = Gauge(
            p + "oldest_waiting_seconds", "Age of the group at the front of the queue.", registry=registry
        )
        self.journal_bytes = Gauge(
            p + "journal_bytes", "Size of the journal since the last snapshot.", registry=registry
        )
        self.generators_expired = Counter(
            p + "generators_expired",
            "Generators whose credit lease expired (not heard from for buffer.generator_lease_s).",
            registry=registry,
        )
        self.live_generators = Gauge(
            p + "live_generators", "Generators heard from within buffer.generator_lease_s.", registry=registry
        )
        self.retried_requests = Counter(
            p + "retried_requests",
            "Requests (lease, commit, credit) that repeated an answered request id (answered as before, not applied again).",
            registry=registry,
        )


class LearnerMetrics:
    """What the learner exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "stream_dapo_learner_"
        self.step = Gauge(p + "step", "Optimizer steps taken (= policy version).", registry=registry)
        self.policy_version = Gauge(
            p + "policy_version", "Latest published weight version.", registry=registry
        )
        self.loss = Gauge(p + "loss", "Policy loss of the last step.", registry=registry)
        self.entropy = Gauge(p + "entropy_nats", "Mean token entropy of the last step.", registry=registry)
        self.clip_fraction = Gauge(
            p + "clip_fraction", "Fraction of tokens clipped.", ["side"], registry=registry
        )
        self.is_weight = Gauge(
            p + "importance_weight", "Behaviour importance weight statistic.", ["stat"], registry=registry
        )
        self.masked_tokens = Gauge(
            p + "masked_tokens_ratio",
            "Share of the last step's loss tokens the behaviour correction dropped (algo.is_mode mask or "
            "icepop, at token or sequence level, and non-finite log-probs).",
            registry=registry,
        )
        self.sequence_ratio = Gauge(
            p + "sequence_ratio",
            "Min/max over the last step's samples of the length-normalised sequence ratio "
            "exp(mean log(pi/pi_old)) (GSPO's s_i); NaN when no token was trained.",
            ["stat"],
            registry=registry,
        )
        self.grad_norm = Gauge(p + "grad_norm", "Gradient norm before clipping.", registry=registry)
        self.lr = Gauge(p + "learning_rate", "Current learning rate.", registry=registry)
        self.reward = Gauge(
            p + "reward_mean", "Mean reward of the samples of the last step.", registry=registry
        )
        self.accuracy = Gauge(
            p + "accuracy_ratio", "Fraction correct in the last step's samples.", registry=registry
        )
        self.tokens = Counter(
            p + "tokens",
            "Tokens trained on (prompt + response; with learner.share_prompt a group's prompt once).",
            registry=registry,
        )
        self.tokens_per_second = Gauge(
            p + "tokens_per_second", "Trained tokens per second (last step).", registry=registry
        )
        self.step_seconds = Histogram(
            p + "step_seconds", "Wall time of one optimizer step.", buckets=SECONDS_BUCKETS, registry=registry
        )
        self.staleness = Histogram(
            p + "staleness_versions",
            "Token staleness at the gradient step.",
            buckets=STALENESS_BUCKETS,
            registry=registry,
        )
        self.groups_trained = Counter(p + "groups_trained", "Groups trained on.", registry=registry)
        self.weight_sync_seconds = Histogram(
            p + "weight_sync_seconds",
            "Serialize + publish time of one version (the gather before it is not counted).",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.weight_sync_bytes = Counter(
            p + "weight_sync_bytes", "Weight bytes published.", registry=registry
        )
        self.weight_sent_bytes = Counter(
            p + "weight_sent_bytes",
            "Chunk bytes the weight server sent to generators (weights.method zmq), by encoding: raw chunks, "
            "or xor_zlib deltas against a version the generator holds.",
            ["encoding"],
            registry=registry,
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "Connections to the weight server whose CurveZMQ handshake failed, by socket and reason (as the "
            "buffer's).",
            ["socket", "reason"],
            registry=registry,
        )
        self.messages_rejected = Counter(
            p + "messages_rejected",
            "Requests the weight server refused: malformed, unexpected type or bad chunk index.",
            ["reason"],
            registry=registry,
        )
        self.stale_replies = Counter(
            p + "stale_replies",
            "Buffer replies dropped because they answer a request the learner no longer waits for.",
            registry=registry,
        )
        self.request_retries = Counter(
            p + "request_retries",
            "Requests to the buffer resent (same request id) after transport.timeout_s without a reply.",
            registry=registry,
        )
        self.batch_wait_seconds = Histogram(
            p + "batch_wait_seconds",
            "Time waiting for the buffer.",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.packing_efficiency = Gauge(
            p + "packing_efficiency_ratio", "Real tokens / processed tokens.", registry=registry
        )
        self.peak_rss = Gauge(
            p + "peak_resident_memory_bytes",
            "The learner process's peak resident memory so far (getrusage ru_maxrss); compare with "
            "`stream-dapo plan --memory`, which counts the training state, not the runtime around it.",
            registry=registry,
        )
        self.approx_kl = Gauge(
            p + "approx_kl_behaviour_nats",
            "k3 estimate of KL(behaviour || current policy) over the last step's trained tokens.",
            registry=registry,
        )
        self.behaviour_abs_diff = Gauge(
            p + "behaviour_logprob_abs_diff",
            "Mean |log pi_prox - log mu| (nats) over the last step's trained tokens; tokens=fresh: those "
            "sampled by the weights of the proximal pass, where any gap is numerics or a sampling "
            "mismatch (NaN when the step had none).",
            ["tokens"],
            registry=registry,
        )
        self.behaviour_out_of_range = Gauge(
            p + "behaviour_ratio_out_of_range_ratio",
            "Share of the last step's trained tokens whose pi_prox / mu is outside the band.",
            ["tokens", "band"],
            registry=registry,
        )
        self.checkpoint_seconds = Histogram(
            p + "checkpoint_seconds",
            "Time to write one checkpoint (+ HF export).",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )

    def set_off_policy(
        self, masked_frac: float, seq_ratio_min: float | None, seq_ratio_max: float | None
    ) -> None:
        """The off-policy correction's gauges from a step's rows (None: no trained token, NaN)."""
        self.masked_tokens.set(masked_frac)
        for stat, value in (("min", seq_ratio_min), ("max", seq_ratio_max)):
            self.sequence_ratio.labels(stat=stat).set(math.nan if value is None else value)


@dataclass
class Health:
    """Readiness (model loaded, peers reachable) and liveness (loop progressing) of a service."""

    stall_after_s: float = 300.0
    ready: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    last_progress: float = field(default_factory=time.monotonic)

    def beat(self) -> None:
        """Call from the main loop whenever it makes progress (or idles on purpose)."""
        self.last_progress = time.monotonic()

    def status(self, probe: str = "health") -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON body of one probe.

        `live`: the main loop made progress within `stall_after_s` (restart me if not).
        `ready`: the service can do its job (model loaded, peers reached): route work to me.
        `health`: both, for humans and for orchestrators with a single probe.
        """
        age = time.monotonic() - self.last_progress
        live = age < self.stall_after_s
        body = {"ready": self.ready, "live": live, "seconds_since_progress": round(age, 3), **self.detail}
        ok = {"live": live, "ready": self.ready, "health": self.ready and live}[probe]
        return (200 if ok else 503), body


class MetricsServer:
    """Serves `/metrics` from one registry and the probes of a `Health`, on a background thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Health,
        host: str = "127.0.0.1",
        port: int = 0,
        fd: int | None = None,
    ):
        """Binds host:port (0: any free port, see `port`), or adopts `fd`, a listening socket a
        supervisor handed over (`stream_dapo/runtime/ports.py`; the fd stays the caller's)."""
        self.registry = registry
        self.health = health
        self._scraped = threading.Condition()
        self._scrapes = 0
        handler = _make_handler(registry, health.status, self._count_scrape)
        self._server = ThreadingHTTPServer((host, port), handler, bind_and_activate=fd is None)
        if fd is not None:
            self._server.socket.close()
            self._server.socket = socket.socket(fileno=os.dup(fd))
            self._server.server_address = self._server.socket.getsockname()[:2]
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    @property
    def scrapes(self) -> int:
        """/metrics responses served so far."""
        with self._scraped:
            return self._scrapes

    def _count_scrape(self) -> None:
        with self._scraped:
            self._scrapes += 1
            self._scraped.notify_all()

    def linger(self, timeout_s: float) -> bool:
        """Keep serving until one more /metrics response went out (a scrape of the final figures),
        at most ``timeout_s``; True when one did. A service that exits right after its last step
        would otherwise leave that step out of Prometheus (which scrapes every scrape_interval)."""
        if timeout_s <= 0:
            return False
        with self._scraped:
            seen = self._scrapes
            return self._scraped.wait_for(lambda: self._scrapes > seen, timeout=timeout_s)

    def stop(self, final_scrape_wait_s: float = 0.0) -> None:
        """Stop serving; with ``final_scrape_wait_s`` (metrics.final_scrape_wait_s), first wait that
        long at most for one scrape of the final figures (`linger`)."""
        if final_scrape_wait_s > 0:
            log.info("waiting up to %.0f s for a scrape of the final metrics", final_scrape_wait_s)
            if self.linger(final_scrape_wait_s):
                log.info("final metrics scraped")
            else:
                log.warning(
                    "no scrape of the final metrics within %.0f s: Prometheus may miss the last figures "
                    "(the run's final-metrics file has them); raise metrics.final_scrape_wait_s above "
                    "its scrape_interval",
                    final_scrape_wait_s,
                )
        self._server.shutdown()
        self._server.server_close()


# path -> Health.status probe. Liveness and readiness are separate so an orchestrator does not
# restart a healthy generator whose buffer is away (not ready, but live).
_PROBES = {"/healthz": "health", "/health": "health", "/livez": "live", "/readyz": "ready"}


def _make_handler(
    registry: CollectorRegistry,
    health: Callable[[str], tuple[int, dict[str, Any]]],
    on_scrape: Callable[[], None] = lambda: None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def handle(self) -> None:
            # A scraper that gives up (Prometheus' scrape timeout) hangs up mid-request or
            # mid-response: its business, not an error of this service, so no traceback on stderr.
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path in _PROBES:
                code, status = health(_PROBES[path])
                body, ctype = json.dumps(status).encode(), "application/json"
            else:
                body, ctype, code = (
                    b"not found: try /metrics, /healthz, /livez or /readyz\n",
                    "text/plain",
                    404,
                )
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if path == "/metrics":
                on_scrape()  # after the body went out: the scrape has the figures

        def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: keep quiet
            return

    return Handler


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB, macOS in bytes).
    On Linux the figure starts at the parent's resident size when the process was forked and is kept
    across exec: a service started by a large parent reports at least that parent's size."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """``count`` observations of ``amount`` at once: the same buckets, count and sum as ``count``
    calls of ``observe``. The learner observes every trained token's staleness; at long-CoT batch
    sizes (millions of tokens per step) one call per token would cost seconds per step.
    prometheus_client has no bulk observe, so this adds to the histogram's own bucket and sum
    values, as ``Histogram.observe`` does (prometheus_client 0.2x); without them it loops."""
    if count <= 0:
        return
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if buckets is None or bounds is None or total is None:
        for _ in range(count):
            histogram.observe(amount)
        return
    histogram._raise_if_not_observable()
    total.inc(amount * count)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            buckets[i].inc(count)
            break


def sample_key(name: str, labels: dict[str, str]) -> str:
    """`name{k="v",...}` with labels sorted: one key per series, as the launcher's scrape reads it."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def registry_samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every series of `registry` now, keyed like `sample_key` (what a scrape of /metrics returns)."""
    return {
        sample_key(s.name, s.labels): float(s.value) for family in registry.collect() for s in family.samples
    }


# --------------------------------------------------------------------------------------------------
# Names, for readers of scrapes (launcher summary, planner queries, bench)
# --------------------------------------------------------------------------------------------------

Component = TypeVar("Component")


@functools.cache
def catalogue(component: Callable[[CollectorRegistry], Component]) -> Component:
    """A component's metric objects on a private registry that nothing serves, so code that reads
    scrapes takes the names from the definitions above: ``sample_name(catalogue(LearnerMetrics).step)``."""
    return component(CollectorRegistry())


def sample_name(metric: Counter | Gauge | Histogram, suffix: str = "") -> str:
    """The name a scrape shows for `metric`: a counter's ends in ``_total``; for a histogram pass
    ``suffix="_sum"``, ``"_count"`` or ``"_bucket"`` (none: its family name)."""
    (family,) = metric.describe()
    return family.name + ("_total" if family.type == "counter" else suffix)


FINAL_METRICS_DIR = "final-metrics"
"""Under run.out_dir: one `<service>.json` per service, its series at shutdown."""


def final_metrics_path(out_dir: str | Path, service: str) -> Path:
    return Path(out_dir) / FINAL_METRICS_DIR / f"{service}.json"


def write_final_metrics(registry: CollectorRegistry, path: Path) -> None:
    """The registry's last values as JSON, written atomically at shutdown.

    A scrape can miss what a service counted just before it exited; the launcher's summary reads
    these files instead, so its totals do not depend on when the last scrape landed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(registry_samples(registry), sort_keys=True))


def start_metrics(
    host: str,
    port: int,
    stall_after_s: float = 300.0,
    *,
    setting: str | None = None,
    registry: CollectorRegistry | None = None,
    health: Health | None = None,
) -> tuple[CollectorRegistry, Health, MetricsServer]:
    """One registry, one health record (new ones unless given) and a started server for this process.

    With `setting` (the config key of the port, e.g. "metrics.buffer_port"), a port that cannot be
    bound raises ConfigError naming that key, as every service reports it at start-up."""
    from stream_dapo.runtime.ports import inherited_fd

    registry = CollectorRegistry() if registry is None else registry
    health = Health(stall_after_s=stall_after_s) if health is None else health
    fd = inherited_fd(setting.split(" ")[0]) if setting else None
    try:
        server = MetricsServer(registry, health, host, port, fd).start()
    except OSError as exc:
        if setting is None:
            raise
        raise ConfigError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror}; set {setting} to a free port (0 picks one)"
        ) from exc
    return registry, health, server

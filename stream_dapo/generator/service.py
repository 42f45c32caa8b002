"""`stream-dapo generator --index I`: one vLLM generator service.

Start-up (fails here, with the fix, not at the first group): the model directory exists, the metrics
server binds ``metrics.generator_port + I``, the buffer answers ``hello`` within
``transport.timeout_s``, prompts load (shard I mod ``generator.num_generators``), the verifier pool and
the vLLM engine start, and the current weights are fetched and loaded before the first prompt (a late
joiner or a restarted generator must not sample from the initial model while the learner is at
version 100). Only then is the service ready.

Loop (``serve``), one engine step per turn; every call is non-blocking except the engine step:

    apply new weights -> read buffer replies (credits, acks, leases) -> heartbeat -> ask for credits
    -> start groups -> engine step -> hand finished groups to the verifier thread -> send verified
    groups -> resend unacknowledged ones -> gauges

The service sequences its collaborators: the buffer protocol is `BufferLink` (``buffer_link.py``:
hello, credits, the heartbeat lease, acks, resends), the weights are `WeightIntake`
(``weight_intake.py``: the late-joiner load, the watcher, the swap between steps), and verification
is a `VerifyQueue` (``verify_queue.py``) on a thread so the engine keeps stepping. Admission: a group
starts only with a credit from the buffer, and at most ``generator.max_groups_in_flight`` groups are
in the engine.

SIGTERM/SIGINT drain: stop asking for credits, let in-flight groups finish for up to
``transport.timeout_s`` and abort the rest, send what verified, report unused credits back (in
``filtered_total``), wait up to ``transport.timeout_s`` for acknowledgements, exit 0.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from prometheus_client import CollectorRegistry

from stream_dapo.generator.buffer_link import IDLE_POLL_MS, BufferLink
from stream_dapo.generator.errors import StartupError, StoppedBeforeStart
from stream_dapo.generator.group_log import GroupLog, GroupRecord
from stream_dapo.generator.prompts import PromptCursor
from stream_dapo.generator.rollout import FinishedGroup, GroupOutcome, RolloutSettings, process_group
from stream_dapo.generator.source_tally import SourceTally
from stream_dapo.generator.verify_queue import VerifyQueue
from stream_dapo.generator.weight_intake import WeightIntake
from stream_dapo.runtime.metrics import (
    GeneratorMetrics,
    Health,
    MetricsServer,
    final_metrics_path,
    start_metrics,
    write_final_metrics,
)
from stream_dapo.runtime.ports import require_bound, write_bound_ports
from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import messages as m
from stream_dapo.weights.base import RelayMetrics, WeightSource
from stream_dapo.weights.image import sweep_orphaned_images

if TYPE_CHECKING:
    from stream_dapo.config import GeneratorConfig, MetricsConfig, TransportConfig
    from stream_dapo.core.admission import AdmissionRule
    from stream_dapo.data.dataset import PromptItem, PromptStream
    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.generator.vllm_utils import CoreClaims
    from stream_dapo.verifier import VerifierPool

__all__ = [
    "GeneratorCollaborators",
    "GeneratorService",
    "GeneratorSettings",
    "StartupError",
    "StoppedBeforeStart",
]

log = logging.getLogger("stream_dapo.generator")

ACCURACY_WINDOW = 64
"""Groups over which the accuracy gauge is computed."""
RATE_WINDOW_S = 5.0


def process_name() -> str:
    """This process, for people and for the buffer: host, pid and a random token (a pid is reused)."""
    return f"{socket.gethostname()} pid {os.getpid()} ({secrets.token_hex(4)})"


# --------------------------------------------------------------------------------------------------
# What the service takes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratorSettings:
    """What the generator service reads of the configuration: three of its sections whole, and the
    few values it takes from others. `build_generator` (``root.py``) builds it once from the
    config (`generator_settings`); a test may build one directly or `dataclasses.replace` one."""

    index: int
    """--index: the generator's id, its metrics port offset, its prompt shard."""
    generator: GeneratorConfig
    transport: TransportConfig
    metrics: MetricsConfig
    out_dir: str
    """run.out_dir: bound ports and final figures go under it."""
    model_path: str
    """model.path: checked at start-up when the engine or the prompts are built from it."""
    generator_lease_s: float
    """buffer.generator_lease_s: how long a restart waits for the previous holder's lease."""
    weights_method: Literal["zmq", "shared_dir", "nccl"]
    """weights.method: whether the learner's weight port must be known at start-up."""
    shared_dir: Path
    """weights.shared_dir as resolved (default run.out_dir/weights), named when nothing is there yet."""
    rollout: RolloutSettings
    """The recipe switches of post-processing (algo.*)."""
    admission: AdmissionRule
    """The staleness budget (`Config.admission`): its lag gate decides when a credited group starts."""

    @property
    def generator_id(self) -> str:
        """How the buffer, the metrics and the files name this generator."""
        return f"generator-{self.index}"

    def __post_init__(self) -> None:
        index, count = self.index, self.generator.num_generators
        if index < 0:
            raise StartupError(f"--index must be >= 0, got {index}")
        if self.weights_method == "nccl" and index >= count:
            # Its process group has a fixed size: every member is counted in generator.num_generators.
            raise StartupError(
                f"--index {index} is outside 0..{count - 1}: with weights.method = "
                '"nccl" the weight group has a fixed membership; raise generator.num_generators (and restart '
                'the learner), or use weights.method = "zmq" or "shared_dir" for an elastic fleet'
            )


class GeneratorCollaborators(Protocol):
    """How ``start()`` builds each collaborator that was not injected, in its turn of the start-up
    order (prompts, then the verifier pool, the engine, the weight source). `build_generator` passes
    the one that builds them from the configuration (``root.ConfiguredCollaborators``)."""

    def load_prompts(self, alive: Callable[[], None]) -> tuple[PromptStream, PromptCursor]:
        """This generator's shard of the prompts and the cursor that keeps its position across
        restarts; `alive` is called while a large file is indexed."""
        ...

    def start_verifier(self) -> VerifierPool: ...

    def start_engine(self) -> RolloutEngine: ...

    def weight_source(self, relay_metrics: RelayMetrics) -> WeightSource:
        """The source of weights.method (nothing contacted yet); `relay_metrics` count what its
        fan-out does (bytes its relay sends, connections it refuses, other relays it drops)."""
        ...


# --------------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------------


class GeneratorService:
    """One generator: vLLM engine, verifier pool, buffer link, weight intake, metrics.

    ``start()`` performs every start-up check (raising ``StartupError`` with the fix), ``serve()``
    runs until ``request_stop()`` and drains, ``close()`` releases everything (idempotent).

    It reads what `settings` holds and never the configuration; `build_generator(cfg, index)`
    (``root.py``) composes both. Collaborators not given are built by ``start()`` with
    `collaborators`: the vLLM ``engine``, the ``verifier`` pool, the ``prompts`` stream (this
    generator's shard, position kept across restarts) and the ``weights`` source of
    ``weights.method``. Tests and benchmarks inject their own (``bench/drills/fuzz.py`` runs the
    service on a stand-in engine), and drive the loop's steps (`start_groups`, `verify`,
    `send_verified`, `update_gauges`) and those of `link` and `intake` one at a time.
    """

    def __init__(
        self,
        settings: GeneratorSettings,
        collaborators: GeneratorCollaborators,
        *,
        engine: RolloutEngine | None = None,
        verifier: VerifierPool | None = None,
        prompts: Iterator[PromptItem] | None = None,
        weights: WeightSource | None = None,
    ) -> None:
        self.settings = settings
        self.collaborators = collaborators
        self.index = settings.index
        self.generator_id = settings.generator_id
        self.holder = process_name()
        """Who this process is, in its hello: a generator id belongs to one live process."""
        t = settings.transport
        self.admission = settings.admission
        self._stop = threading.Event()
        self._engine_lost = False  # the engine's processes stopped with a stop signal (drain without it)
        self.verifying = VerifyQueue()
        self._accuracy: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self._rate = (time.monotonic(), 0)
        self._rollouts = dict.fromkeys(m.ROLLOUT_FIELDS, 0)
        """Running rollout tally since start (the heartbeat sends it; the learner tracks it)."""
        self._tokens_counted = 0
        self._recomputed_counted = 0
        self._closed = False
        self.engine: RolloutEngine | None = engine
        self.verifier: VerifierPool | None = verifier
        self.prompts: Iterator[PromptItem] | None = prompts
        self._cursor: PromptCursor | None = None
        self._stream: PromptStream | None = None
        """The prompts `start()` loaded (their position is what `_cursor` saves); None when injected."""
        self.registry = CollectorRegistry()
        self.metrics = GeneratorMetrics(self.registry)
        self.sources = SourceTally(self.metrics)
        self.health = Health()
        self.metrics_server: MetricsServer | None = None
        self._cores: CoreClaims | None = None
        """The CPU cores this generator's engine is bound to, claimed on this host (`claim_cores`)."""
        self.group_log: GroupLog | None = (
            GroupLog(Path(settings.out_dir) / "generators" / f"{self.generator_id}.groups.jsonl")
            if settings.generator.group_log
            else None
        )
        self.link = BufferLink(
            self.generator_id,
            self.holder,
            transport=t,
            generator=settings.generator,
            lease_s=settings.generator_lease_s,
            metrics=self.metrics,
            health=self.health,
            stop=self._stop,
            rollouts=lambda: self._rollouts,
            in_flight_versions=self.in_flight_versions,
        )
        self.intake = WeightIntake(
            weights,
            collaborators.weight_source,
            generator=settings.generator,
            timeout_s=t.timeout_s,
            weights_address=t.weights_address(),
            shared_dir=settings.shared_dir,
            metrics=self.metrics,
            health=self.health,
            stop=self._stop,
        )

    # ------------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Everything that can fail, in order of cost: files, ports, peers, prompts, engine, weights."""
        sweep_orphaned_images()  # the RAM a killed predecessor's weight images still hold
        if self.engine is None or self.prompts is None:
            self._check_model_dir()  # the engine's weights, the prompts' tokenizer
        self._check_peer_ports()
        self.start_metrics()
        self.link.connect()
        if self.prompts is None:
            self.prompts = self._stream = self._load_prompts()
        if self.verifier is None:
            self.start_verifier()
        if self.engine is None:
            self._start_engine()
        self.intake.load_initial(self._engine)
        self.health.detail.update(
            {
                "generator_id": self.generator_id,
                "buffer": self.link.address,
                "policy_version": self._engine.version,
            }
        )
        self.health.ready = True
        self.link.start_heartbeat()
        log.info(
            "%s ready: policy version %d, buffer %s",
            self.generator_id,
            self._engine.version,
            self.link.address,
        )

    def _check_model_dir(self) -> None:
        path = Path(self.settings.model_path)
        if not (path / "config.json").is_file():
            raise StartupError(
                f"model.path = {path} is not a Hugging Face model directory (no config.json); build the tiny "
                "default with `stream-dapo warmup` or set model.path"
            )

    def start_metrics(self) -> None:
        """Serve /metrics and the probes on ``metrics.generator_port + index``; record the port."""
        mc = self.settings.metrics
        port = mc.generator_port + self.index if mc.generator_port else 0
        *_, self.metrics_server = start_metrics(
            mc.host,
            port,
            setting=(
                f"metrics.generator_port (generator {self.index} serves on generator_port + {self.index}; "
                f"is another generator with --index {self.index} running on this host?)"
            ),
            registry=self.registry,
            health=self.health,
        )
        log.info("metrics on http://%s:%d/metrics and /healthz", mc.host, self.metrics_server.port)
        ports = {"metrics.generator_port": self.metrics_server.port}
        self.health.detail["ports"] = ports
        write_bound_ports(self.settings.out_dir, self.generator_id, ports)

    def _check_peer_ports(self) -> None:
        """The buffer's and the learner's ports must be known here: 0 ("any free port") is a
        server's setting, refused with where to read the bound port (`stream_dapo/runtime/ports.py`)."""
        t = self.settings.transport
        require_bound("transport.samples_port", t.samples_port, "buffer")
        if self.intake.source is None and self.settings.weights_method != "shared_dir":
            require_bound("transport.weights_port", t.weights_port, "learner")

    def _load_prompts(self) -> PromptStream:
        stream, self._cursor = self.collaborators.load_prompts(self.health.beat)  # live, not ready
        return stream

    def start_verifier(self) -> None:
        self.verifier = self.collaborators.start_verifier()

    def _start_engine(self) -> None:
        self.claim_cores()
        self.engine = self.collaborators.start_engine()
        self.metrics.engine_start_seconds.set(self.engine.startup_seconds)

    def claim_cores(self) -> None:
        """On the CPU: claim the cores the engine's threads will be bound to, and say so loudly when
        another engine on this host holds one of them (it would start after minutes, silently)."""
        from stream_dapo.generator.vllm_utils import CoreClaims, bound_cores, cpu_thread_env, is_cpu_platform

        if not is_cpu_platform():
            return
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or cpu_thread_env(
            self.settings.generator, index=self.index
        ).get("VLLM_CPU_OMP_THREADS_BIND", "")
        self._cores = CoreClaims(bound_cores(bind), f"{self.generator_id} ({self.holder})")
        if self._cores.conflicts:
            log.warning("%s", self._cores.describe(self.generator_id, bind))
            self.health.detail["core_conflicts"] = [core for core, _ in self._cores.conflicts]

    @property
    def _engine(self) -> RolloutEngine:
        assert self.engine is not None, "start() first"
        return self.engine

    # ------------------------------------------------------------------------------ the loop

    def request_stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        """Generate until ``request_stop()``, then drain."""
        try:
            while not self._stop.is_set():
                self.health.beat()
                self.intake.apply_new()
                self.link.read(timeout_ms=self._idle_wait_ms())
                self.link.check_lease()
                self.link.ask_for_credits(self._engine.num_in_flight)
                self.start_groups()
                self.verify(self._engine.step())
                self.send_verified()
                self.link.resend_unacked()
                self.update_gauges()
        except Exception as exc:  # noqa: BLE001 (re-raised unless a stop was asked for)
            self._engine_lost_on_stop(exc)
        self._drain()

    def _engine_lost_on_stop(self, exc: Exception) -> None:
        """An engine call failed. After a stop request that is the same signal reaching vLLM's
        processes (``kill -TERM -<pgid>``, a terminal's Ctrl-C, a container runtime stopping every
        process): drain without the engine. Any other time it is a failure: re-raised."""
        if not self._stop.is_set():
            raise exc
        self._engine_lost = True
        log.warning(
            "the engine stopped with the stop signal (%s: %s): draining without it; its groups in "
            "flight are dropped and their credits returned (signal only the generator's own pid to let "
            "them finish)",
            type(exc).__name__,
            exc,
        )

    def _idle_wait_ms(self) -> int:
        busy = self._engine.num_in_flight or len(self.verifying)
        return 0 if busy else IDLE_POLL_MS

    def start_groups(self) -> None:
        """Start a group per credit held, up to generator.max_groups_in_flight, unless the credits
        are for a newer policy or a weight update waits for the groups in flight."""
        assert self.prompts is not None
        engine = self._engine
        if not self.admission.may_start(engine.version, self.link.credit_version):
            return  # these credits are for a newer policy: wait for its weights (in-flight groups go on)
        if self.intake.holding:
            return
        started = False
        while (
            engine.num_in_flight < self.settings.generator.max_groups_in_flight and self.link.credits.take()
        ):
            engine.add_group(next(self.prompts))
            started = True
        if started and self._cursor is not None and self._stream is not None:
            self._cursor.save(self._stream.state)

    def verify(self, finished: list[FinishedGroup]) -> None:
        """Count the finished groups and hand them to the verifier thread."""
        verifier = self.verifier
        assert verifier is not None, "start() first"
        score = partial(
            process_group, verifier=verifier, settings=self.settings.rollout, generator_id=self.generator_id
        )
        for group in finished:
            self.count_finished(group)
            self.verifying.submit(group, score)

    def count_finished(self, group: FinishedGroup) -> None:
        self.metrics.group_tail_tokens.inc(group.tail_tokens())
        self.metrics.group_longest.observe(group.longest)
        for s in group.samples:
            self._rollouts["samples"] += 1
            self._rollouts["response_tokens"] += len(s)
            self._rollouts["truncated"] += int(s.truncated)
            self.metrics.samples.inc()
            self.metrics.response_length.observe(len(s))
            self.metrics.prefix_cache_hit_tokens.inc(s.cached_prompt_tokens)
            if len(s) and s.versions.min() != s.versions.max():
                self.metrics.multi_version_samples.inc()
            if s.truncated:
                self.metrics.truncated.inc()

    def send_verified(self) -> None:
        """Send each verified group in finishing order (a dropped one redeems its credit instead)."""
        for outcome in self.verifying.done():
            self._count_outcome(outcome)
            if outcome.group is None:
                self.link.credits.redeem_without_group()
            else:
                self.link.send_group(outcome.group)
        self.link.report_filtered()

    def in_flight_versions(self) -> list[int]:
        """The start version of every group started and not yet sent (in the engine or the
        verifier): the buffer holds the learner back so that they can still be trained."""
        return [*self._engine.start_versions(), *self.verifying.start_versions()]

    def _count_outcome(self, outcome: GroupOutcome) -> None:
        mx = self.metrics
        mx.groups.labels(outcome=outcome.decision.reason.value).inc()
        self._rollouts[outcome.decision.reason.value] += 1
        self._rollouts["correct"] += outcome.decision.num_correct
        mx.verifier_latency.observe(outcome.verify_seconds)
        for r in outcome.results:
            mx.verifier_results.labels(reason=r.reason).inc()
        self.sources.count(outcome)
        for reward in outcome.rewards:
            mx.reward.observe(float(reward))
        self._accuracy.append(outcome.decision.num_correct / outcome.decision.group_size)
        mx.accuracy.set(sum(self._accuracy) / len(self._accuracy))
        if self.group_log is not None:
            d = outcome.decision
            self.group_log.write(
                GroupRecord(
                    group_id=outcome.group_id,
                    prompt_id=outcome.prompt_id,
                    version=outcome.start_version,
                    size=d.group_size,
                    correct=d.num_correct,
                    truncated=outcome.truncated,
                    outcome=d.reason.value,
                    kept=outcome.accepted,
                    source=outcome.source,
                    mean_score=round(float(outcome.scores.mean()), 6) if len(outcome.scores) else None,
                )
            )

    def update_gauges(self) -> None:
        mx, engine = self.metrics, self._engine
        self.link.update_gauges()
        mx.groups_in_flight.set(engine.num_in_flight)
        mx.policy_version.set(engine.version)
        self.intake.update_gauges()
        new_tokens = engine.tokens_generated - self._tokens_counted
        if new_tokens:
            mx.tokens.inc(new_tokens)
            self._tokens_counted = engine.tokens_generated
        if engine.tokens_recomputed != self._recomputed_counted:
            mx.tokens_recomputed.inc(engine.tokens_recomputed - self._recomputed_counted)
            self._recomputed_counted = engine.tokens_recomputed
        now = time.monotonic()
        since, tokens_then = self._rate
        if now - since >= RATE_WINDOW_S:
            mx.tokens_per_second.set((engine.tokens_generated - tokens_then) / (now - since))
            self._rate = (now, engine.tokens_generated)

    # ------------------------------------------------------------------------------ drain / close

    def _drain(self) -> None:
        """Finish what is in flight (bounded), send it, report unused credits, wait for acks (bounded)."""
        engine, budget_s = self._engine, self.settings.transport.timeout_s
        log.info(
            "draining: %d groups in flight, %d unacknowledged", engine.num_in_flight, len(self.link.unacked)
        )
        deadline = time.monotonic() + budget_s
        try:
            while not self._engine_lost and engine.num_in_flight and time.monotonic() < deadline:
                self.verify(engine.step())
                self.link.read(timeout_ms=0)
        except Exception as exc:  # noqa: BLE001 (re-raised unless a stop was asked for)
            self._engine_lost_on_stop(exc)
        aborted = engine.abort_all(engine_alive=not self._engine_lost)
        self.metrics.groups_aborted.inc(aborted)
        self.link.return_credits(aborted)
        self.verifying.wait()
        self.send_verified()
        unacked = self.link.await_acks(budget_s)
        self.update_gauges()
        if unacked:
            log.warning("%d groups still unacknowledged after %.0f s; they are lost", unacked, budget_s)
        log.info("drained (%d groups aborted)", aborted)

    def _write_final_metrics(self) -> None:
        if self.engine is None:
            return  # it never generated anything
        path = final_metrics_path(self.settings.out_dir, self.generator_id)
        try:
            write_final_metrics(self.registry, path)
        except OSError as exc:
            log.warning("cannot write %s: %s (the run summary falls back to the last scrape)", path, exc)

    def close(self) -> None:
        """Write the final metrics, then stop threads, the engine, the pool and the sockets
        (idempotent).

        The figures are final once ``serve()`` has drained, and nothing below changes what a
        summary reads, so they are written first: a shutdown step that fails (`release` still runs
        the others and raises the first failure) or outlasts the launcher's bound cannot lose them.
        """
        if self._closed:
            return
        self._closed = True
        self._write_final_metrics()
        release(
            self.intake.close,
            self.link.stop_heartbeat,
            self.verifying.close,
            self.engine and self.engine.close,
            self.verifier and self.verifier.close,
            self._save_prompt_position,
            self.group_log and self.group_log.close,
            self.link.close,
            self._cores and self._cores.close,
            self.metrics_server
            and (lambda: self.metrics_server.stop(self.settings.metrics.final_scrape_wait_s)),
        )

    def _save_prompt_position(self) -> None:
        if self._cursor is not None and self._stream is not None:
            self._cursor.save(self._stream.state, force=True)

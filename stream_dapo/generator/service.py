"""`stream-dapo generator --index I`: one vLLM generator service.

Start-up (fails here, with the fix, not at the first group): the model directory exists, the metrics
server binds ``metrics.generator_port + I``, the buffer answers ``hello`` within
``transport.timeout_s``, prompts load (shard I mod ``generator.num_generators``), the verifier pool and
the vLLM engine start, and the current weights are fetched and loaded before the first prompt (a late
joiner or a restarted generator must not sample from the initial model while the learner is at
version 100). Only then is the service ready.

Loop (``serve``), one engine step per turn; every helper is non-blocking except the engine step:

    apply new weights -> read buffer replies (credits, acks, leases) -> heartbeat -> ask for credits
    -> start groups -> engine step -> hand finished groups to the verifier thread -> send verified
    groups -> resend unacknowledged ones -> gauges

Admission: a group starts only with a credit from the buffer (``credit_request{want}``), and at most
``generator.max_groups_in_flight`` groups are in the engine. A credit is redeemed at the buffer by the
group it started, or, for a group dynamic sampling dropped, by the increase of ``filtered_total`` (a
running total in every ``groups`` message and heartbeat). Credits are leases: a heartbeat every
``generator.heartbeat_s`` keeps them, and a generator the buffer has not heard from for
``buffer.generator_lease_s`` loses them (the buffer says so in the next heartbeat's ``lease`` reply,
and the generator drops what it held). So generators join and leave at any time, and any ``--index``
may join. A buffer that stops answering heartbeats makes ``/readyz`` fail (``/livez`` still passes).
Sent groups stay in ``UnackedGroups`` (``credits.py``, with the ``CreditLedger`` and the
``Heartbeat``) until the buffer acknowledges them and are
resent after ``transport.timeout_s`` or as soon as the connection to the buffer is re-established (the
buffer drops duplicates by id, so a resend is harmless).

Weights: a ``WeightWatcher`` thread (``weight_watcher.py``) polls, every ``generator.weight_poll_s``,
the ``WeightSource`` that ``weights.factory`` builds for ``weights.method`` (zmq download, shared
directory, or an NCCL announcement), and the loop has the source swap the newest version into the
engine between steps (``RolloutEngine`` pauses, loads, relabels, resumes). Verification runs on a
thread (the checks themselves in the verifier pool's processes) so the engine keeps stepping.

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
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import zmq
from prometheus_client import CollectorRegistry

from stream_dapo.generator.credits import CreditLedger, Heartbeat, UnackedGroups
from stream_dapo.generator.group_log import GroupLog, GroupRecord
from stream_dapo.generator.prompts import PromptCursor
from stream_dapo.generator.rollout import FinishedGroup, GroupOutcome, RolloutSettings, process_group
from stream_dapo.generator.source_tally import SourceTally
from stream_dapo.generator.weight_watcher import WeightWatcher
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
from stream_dapo.transport.codec import Message
from stream_dapo.transport.curve import curve_client
from stream_dapo.transport.messages import Group
from stream_dapo.transport.sockets import (
    CurveKeys,
    Endpoint,
    PeerUnavailable,
    RateLimitedWarnings,
    RemoteError,
    TransportTimeout,
    open_endpoint,
    request,
)
from stream_dapo.weights.base import RelayMetrics, WeightsError, WeightSource, WeightUpdate
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
]

log = logging.getLogger("stream_dapo.generator")

IDLE_POLL_MS = 50
"""Socket wait per turn when the engine has nothing to do (no busy spinning)."""
MAX_MESSAGES_PER_TURN = 64
ACCURACY_WINDOW = 64
"""Groups over which the accuracy gauge is computed."""
RATE_WINDOW_S = 5.0
UNACKED_FACTOR = 4
"""Stop asking for credits while more than this many times max_groups_in_flight groups wait for an
acknowledgement: the buffer is down or far behind, and new groups would only pile up here."""


def process_name() -> str:
    """This process, for people and for the buffer: host, pid and a random token (a pid is reused)."""
    return f"{socket.gethostname()} pid {os.getpid()} ({secrets.token_hex(4)})"


class StoppedBeforeStart(Exception):
    """A stop request came while start-up waited: exit 0 without having sent anything as this id."""


class StartupError(RuntimeError):
    """The service cannot start; the message names what is missing and the fix."""


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
    """One generator: vLLM engine, verifier pool, buffer and weight connections, metrics.

    ``start()`` performs every start-up check (raising ``StartupError`` with the fix), ``serve()``
    runs until ``request_stop()`` and drains, ``close()`` releases everything (idempotent).

    It reads what `settings` holds and never the configuration; `build_generator(cfg, index)`
    (``root.py``) composes both. Collaborators not given are built by ``start()`` with
    `collaborators`: the vLLM ``engine``, the ``verifier`` pool, the ``prompts`` stream (this
    generator's shard, position kept across restarts) and the ``weights`` source of
    ``weights.method``. Tests and benchmarks inject their own (``bench/drills/fuzz.py`` runs the
    service on a stand-in engine).
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
        self.buffer_address = t.buffer_address("samples")
        self.weights_address = t.weights_address()
        # Credits carry the learner version at which the buffer granted them; a credited group
        # starts only when the admission rule's lag gate allows it (`AdmissionRule.may_start`).
        self.admission = settings.admission
        self._credit_version = 0
        self.credits = CreditLedger(settings.generator.max_groups_in_flight, timeout_s=t.timeout_s)
        self.unacked = UnackedGroups(resend_after_s=t.timeout_s)
        self._stop = threading.Event()
        self._engine_lost = False  # the engine's processes stopped with a stop signal (drain without it)
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._verify_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self._verifying: deque[tuple[int, Future[GroupOutcome]]] = deque()
        """(start version, verification) of each finished group, in the order they finished."""
        self._in_flight_report: tuple[int, ...] = ()
        """`_in_flight_versions()` as of the main loop's last pass, for the heartbeat thread."""
        self._accuracy: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self._rejected_seen: Counter[str] = Counter()
        self._rate = (time.monotonic(), 0)
        self._heartbeat: Heartbeat | None = None
        self._warnings = RateLimitedWarnings(log)
        self._filtered_sent = 0
        self._rollouts = dict.fromkeys(m.ROLLOUT_FIELDS, 0)
        """Running rollout tally since start (the heartbeat sends it; the learner tracks it)."""
        self._tokens_counted = 0
        self._recomputed_counted = 0
        self._hold_since: float | None = None
        self._closed = False
        self.engine: RolloutEngine | None = engine
        self.buffer: Endpoint | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._disconnected = False
        self.watcher: WeightWatcher | None = None
        self.weights: WeightSource | None = weights
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
        """The CPU cores this generator's engine is bound to, claimed on this host (`_claim_cores`)."""
        self.group_log: GroupLog | None = (
            GroupLog(Path(settings.out_dir) / "generators" / f"{self.generator_id}.groups.jsonl")
            if settings.generator.group_log
            else None
        )

    # ------------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Everything that can fail, in order of cost: files, ports, peers, prompts, engine, weights."""
        sweep_orphaned_images()  # the RAM a killed predecessor's weight images still hold
        if self.engine is None or self.prompts is None:
            self._check_model_dir()  # the engine's weights, the prompts' tokenizer
        self._check_peer_ports()
        self._start_metrics()
        self._connect_buffer()
        if self.prompts is None:
            self.prompts = self._stream = self._load_prompts()
        if self.verifier is None:
            self._start_verifier()
        if self.engine is None:
            self._start_engine()
        self._load_initial_weights()
        self.health.detail.update(
            {
                "generator_id": self.generator_id,
                "buffer": self.buffer_address,
                "policy_version": self._engine.version,
            }
        )
        self.health.ready = True
        self._start_heartbeat()
        log.info(
            "%s ready: policy version %d, buffer %s",
            self.generator_id,
            self._engine.version,
            self.buffer_address,
        )

    def _check_model_dir(self) -> None:
        path = Path(self.settings.model_path)
        if not (path / "config.json").is_file():
            raise StartupError(
                f"model.path = {path} is not a Hugging Face model directory (no config.json); build the tiny "
                "default with `stream-dapo warmup` or set model.path"
            )

    def _start_metrics(self) -> None:
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
        if self.weights is None and self.settings.weights_method != "shared_dir":
            require_bound("transport.weights_port", t.weights_port, "learner")

    def _curve(self) -> CurveKeys | None:
        return curve_client(self.settings.transport.curve_dir)

    def _buffer_endpoint(self, curve: CurveKeys | None, send_timeout_ms: int = 5000) -> Endpoint:
        t = self.settings.transport
        return open_endpoint(
            self._ctx,
            zmq.DEALER,
            connect=self.buffer_address,
            max_bytes=t.max_message_bytes,
            peer="buffer",
            hwm=t.hwm,
            curve=curve,
            send_timeout_ms=send_timeout_ms,
        )

    def _connect_buffer(self) -> None:
        """Say hello. While another live process holds this generator id, the buffer refuses: wait
        for its lease to run out (a restart after a crash), or exit 2 naming both once the holder has
        outlived a lease (two generators with one --index)."""
        self.buffer = self._buffer_endpoint(self._curve())
        patience_s = self.settings.generator_lease_s + 2 * self.settings.generator.heartbeat_s
        refused_since: float | None = None
        while True:
            try:
                reply = self._hello()
                break
            except RemoteError as exc:
                if exc.reason == "sampling_mismatch":
                    raise StartupError(f"the buffer refused this generator: {exc.detail}") from None
                if exc.reason != "generator_id_taken":
                    raise
                now = time.monotonic()
                if refused_since is None:
                    refused_since = now
                    log.warning("%s; waiting up to %.0f s for that lease to run out", exc.detail, patience_s)
                if now - refused_since > patience_s:
                    raise StartupError(f"the buffer refused this generator: {exc.detail}") from None
                if self._stop.wait(self.settings.generator.heartbeat_s):
                    raise StoppedBeforeStart(
                        f"stopped while waiting for {self.generator_id} to be free"
                    ) from None
        log.info(
            "buffer at %s answered (learner version %d)", self.buffer_address, reply.body.learner_version
        )
        self._monitor = self.buffer.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)

    def _hello(self) -> Message:
        t = self.settings.transport
        assert self.buffer is not None
        try:
            return request(
                self.buffer,
                m.Hello(self.generator_id, 0, self.holder, m.Sampling.of(self.settings.generator)),
                timeout_ms=int(t.timeout_s * 1000),
                retries=0,
                accept=lambda msg: msg.type == m.CREDIT,
            )
        except TransportTimeout:
            raise PeerUnavailable(
                f"the buffer did not answer at {self.buffer_address} within {t.timeout_s:.0f} s: start "
                "`stream-dapo buffer` first (or fix transport.buffer_host / transport.samples_port"
                + (" / the Curve keys in transport.curve_dir" if t.curve_dir else "")
                + ")"
            ) from None

    def _load_prompts(self) -> PromptStream:
        stream, self._cursor = self.collaborators.load_prompts(self.health.beat)  # live, not ready
        return stream

    def _start_verifier(self) -> None:
        self.verifier = self.collaborators.start_verifier()

    def _start_engine(self) -> None:
        self._claim_cores()
        self.engine = self.collaborators.start_engine()
        self.metrics.engine_start_seconds.set(self.engine.startup_seconds)

    def _claim_cores(self) -> None:
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

    def _load_initial_weights(self) -> None:
        """The late-joiner rule: load the learner's current version before the first prompt."""
        if self.weights is None:
            mx = self.metrics
            self.weights = self.collaborators.weight_source(
                RelayMetrics(mx.weight_relay_sent_bytes, mx.connections_refused, mx.weight_relays_dropped)
            )
        self.weights.join(self._engine)
        self.watcher = WeightWatcher(
            self.weights, self.settings.generator.weight_poll_s, self.weights.first_version
        )
        update = self._first_weights()
        if update is not None:
            self._load_weights(update)
            self.watcher.loaded()
        elif self.weights.startup == "look":
            log.warning(
                "nothing published in %s yet: starting from the initial model (version 0)",
                self.settings.shared_dir,
            )
        self.watcher.start()

    def _look_for_weights(self) -> WeightUpdate | None:
        """The newest published version (shared directory), None when nothing is published yet. A
        newest file that cannot be used (a checksum mismatch, a LATEST something else wrote) is not
        loaded: as a running generator does, wait for the learner to publish a good one, live but
        not ready, instead of exiting."""
        assert self.watcher is not None
        warned = False
        while not self._stop.is_set():
            try:
                self.watcher.poll_once()
                return self.watcher.take()
            except WeightsError as exc:
                if not warned:
                    log.warning(
                        "%s; waiting for the learner to publish a good version (not ready meanwhile)", exc
                    )
                    warned = True
                self.health.beat()  # waiting on purpose: /livez passes, /readyz fails until then
                self._stop.wait(self.settings.generator.weight_poll_s)
        return None

    def _first_weights(self) -> WeightUpdate | None:
        """The learner's current version, if it differs from ours.

        `WeightSource.startup` says how long to wait: "look" once (nothing published yet means start
        from the initial model); "answer": up to 4 x transport.timeout_s for the weight server to
        answer; "announcement": as long for the first announced version, whose broadcast must be taken.
        """
        assert self.watcher is not None and self.weights is not None
        if self.weights.startup == "look":
            return self._look_for_weights()
        wait_s = 4 * self.settings.transport.timeout_s
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                if self.watcher.poll_once() is not None or self.weights.startup == "answer":
                    return self.watcher.take()
                log.info("waiting for the learner to announce its weights at %s", self.weights_address)
            except TransportTimeout:
                log.info("waiting for the learner's weight server at %s", self.weights_address)
            time.sleep(min(1.0, self.settings.generator.weight_poll_s))
        if self._stop.is_set():
            return None
        raise PeerUnavailable(
            f"no weights from the learner at {self.weights_address} within {wait_s:.0f} s: start "
            "`stream-dapo learner` (or fix transport.learner_host / transport.weights_port)"
        )

    # ------------------------------------------------------------------------------ the loop

    def request_stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        """Generate until ``request_stop()``, then drain."""
        try:
            while not self._stop.is_set():
                self.health.beat()
                self._apply_new_weights()
                self._read_buffer(timeout_ms=self._idle_wait_ms())
                self._check_lease()
                self._ask_for_credits()
                self._start_groups()
                finished = self._engine.step()
                self._verify(finished)
                self._send_verified()
                self._resend_unacked()
                self._update_gauges()
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
        busy = self._engine.num_in_flight or self._verifying
        return 0 if busy else IDLE_POLL_MS

    def _holding_for_weights(self) -> bool:
        """kv_on_update = "between-groups": an update waits for the in-flight groups to finish; no
        new group starts meanwhile (it would sample from weights already superseded)."""
        return (
            self.settings.generator.kv_on_update == "between-groups"
            and self.watcher is not None
            and self.watcher.pending
        )

    def _apply_new_weights(self) -> None:
        assert self.watcher is not None
        if self._holding_for_weights():
            now = time.monotonic()
            if self._hold_since is None:
                self._hold_since = now
            if self._engine.num_in_flight:
                return
            self.metrics.weight_hold_seconds.inc(now - self._hold_since)
        self._hold_since = None
        update = self.watcher.take()
        if update is None:
            return
        try:
            self._load_weights(update)
        except (FileNotFoundError, ValueError) as exc:  # refused before pausing: keep sampling
            log.warning("cannot load weights version %d (%s); polling again", update.version, exc)
            self.watcher.reset(self._engine.version)
        finally:
            self.watcher.loaded()

    def _load_weights(self, update: WeightUpdate) -> None:
        engine = self._engine
        assert self.weights is not None
        seconds = self.weights.load(engine, update)
        mx = self.metrics
        mx.weight_sync_seconds.observe(update.fetch_seconds + seconds)
        mx.weight_sync_bytes.inc(update.nbytes)
        wire = update.nbytes if update.wire_bytes is None else update.wire_bytes
        mx.weight_received_bytes.inc(wire)
        mx.weight_delta_ratio.set(wire / update.nbytes if update.nbytes else 1.0)
        if update.published_at > 0:
            mx.weight_publish_to_loaded_seconds.observe(max(0.0, time.time() - update.published_at))
        self.metrics.policy_version.set(engine.version)
        self.health.detail["policy_version"] = engine.version
        log.info(
            "now sampling from weights version %d (fetch %.2f s, load %.2f s)",
            engine.version,
            update.fetch_seconds,
            seconds,
        )

    def _read_buffer(self, timeout_ms: int) -> None:
        assert self.buffer is not None
        self._watch_connection()
        for i in range(MAX_MESSAGES_PER_TURN):
            got = self.buffer.recv(timeout_ms if i == 0 else 0)
            if got is None:
                return
            self._on_buffer_message(got[1])

    def _watch_connection(self) -> None:
        """After a reconnect (the buffer restarted, or the link dropped), resend unacknowledged groups
        and ask for credits again at once instead of waiting out transport.timeout_s."""
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
                self.health.ready = False  # /readyz fails, /livez still passes: no restart needed
                self.health.detail["buffer_connected"] = False
                log.warning("lost the connection to the buffer at %s; ZeroMQ reconnects", self.buffer_address)
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected = False
                self.health.ready = True
                self.health.detail["buffer_connected"] = True
                log.info("reconnected to the buffer: resending %d unacknowledged groups", len(self.unacked))
                self.unacked.expire()
                self.credits.forget_request()

    def _on_buffer_message(self, msg: Message) -> None:
        body = msg.body
        if isinstance(body, m.Credit):
            if not self.credits.granted(body.granted, time.monotonic(), msg.request_id):
                self.metrics.stale_credit_replies.inc()
            elif body.granted:
                self._credit_version = max(self._credit_version, body.learner_version)
        elif isinstance(body, m.Ack):
            self._on_ack(body)
        elif isinstance(body, m.Error):
            log.warning("the buffer answered error %s: %s", body.reason, body.detail)
        else:
            self.metrics.messages_rejected.labels(reason="unexpected_type").inc()
            self._warnings.warn("unexpected_type", "unexpected %r message from the buffer; ignored", msg.type)

    def _start_heartbeat(self) -> None:
        curve = self._curve()
        health = self.health
        self._heartbeat = Heartbeat(
            lambda: self._buffer_endpoint(curve, send_timeout_ms=0),
            self.generator_id,
            self.settings.generator.heartbeat_s,
            filtered_total=lambda: self.credits.filtered_total,
            progressing=lambda: time.monotonic() - health.last_progress < health.stall_after_s,
            rollouts=lambda: dict(self._rollouts),
            in_flight=lambda: list(self._in_flight_report),
        ).start()

    def _check_lease(self) -> None:
        """Drop held credits when the buffer took them back, and be unready while the buffer leaves
        heartbeats unanswered (it hangs or is gone; ZeroMQ reconnects by itself)."""
        beat = self._heartbeat
        if beat is None:
            return
        if beat.expired.is_set():
            beat.expired.clear()
            dropped = self.credits.lease_expired()
            log.warning(
                "the buffer had not heard from %s for buffer.generator_lease_s and took its credits back: "
                "dropping the %d held (groups in flight still go out)",
                self.generator_id,
                dropped,
            )
        silent_s = time.monotonic() - beat.last_answer
        responding = silent_s <= max(
            self.settings.transport.timeout_s, 3 * self.settings.generator.heartbeat_s
        )
        if responding != self.health.detail.get("buffer_responding", True):
            if responding:
                log.info("the buffer answers heartbeats again")
            else:
                log.warning(
                    "the buffer has not answered a heartbeat for %.0f s; not ready until it does", silent_s
                )
            self.health.detail["buffer_responding"] = responding
        self.health.ready = responding and not self._disconnected

    def _on_ack(self, body: m.Ack) -> None:
        result = self.unacked.ack(body.accepted, body.duplicates, body.rejected)
        self.metrics.groups_acked.inc(result.acked)
        for gid, reason in result.rejected:
            log.warning("the buffer rejected group %s: %s", gid, reason)
            self.metrics.groups_rejected.labels(reason=reason).inc()

    def _ask_for_credits(self) -> None:
        if len(self.unacked) > UNACKED_FACTOR * self.settings.generator.max_groups_in_flight:
            return
        req = self.credits.request(self._engine.num_in_flight, time.monotonic())
        if req is not None:
            self._send(m.CreditRequest(self.generator_id, req.want), request_id=req.request_id)

    def _start_groups(self) -> None:
        assert self.prompts is not None
        engine = self._engine
        if not self.admission.may_start(engine.version, self._credit_version):
            return  # these credits are for a newer policy: wait for its weights (in-flight groups go on)
        if self._holding_for_weights():
            return
        started = False
        while engine.num_in_flight < self.settings.generator.max_groups_in_flight and self.credits.take():
            engine.add_group(next(self.prompts))
            started = True
        if started and self._cursor is not None and self._stream is not None:
            self._cursor.save(self._stream.state)

    def _verify(self, finished: list[FinishedGroup]) -> None:
        verifier = self.verifier
        assert verifier is not None, "start() first"
        for group in finished:
            self._count_finished(group)
            self._verifying.append(
                (
                    group.start_version,
                    self._verify_pool.submit(
                        process_group, group, verifier, self.settings.rollout, self.generator_id
                    ),
                )
            )

    def _count_finished(self, group: FinishedGroup) -> None:
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

    def _send_verified(self) -> None:
        while self._verifying and self._verifying[0][1].done():
            outcome = self._verifying.popleft()[1].result()
            self._count_outcome(outcome)
            if outcome.group is None:
                self.credits.redeem_without_group()
            else:
                group = self.unacked.number(outcome.group)
                self.unacked.sent(group, time.monotonic())
                self._send_groups([group])
                self.metrics.groups_sent.inc()
        if self.credits.filtered_total != self._filtered_sent:
            self._send_groups([])

    def _send_groups(self, groups: list[Group]) -> None:
        self._send(
            m.Groups(
                self.generator_id,
                groups,
                filtered_total=self.credits.filtered_total,
                rollouts=m.Rollouts(**self._rollouts),
                in_flight_versions=list(self._snapshot_in_flight()),
                holder=self.holder,
                acked_below=self.unacked.acked_below,
            )
        )
        self._filtered_sent = self.credits.filtered_total

    def _in_flight_versions(self) -> list[int]:
        """The start version of every group started and not yet sent (in the engine or the
        verifier): the buffer holds the learner back so that they can still be trained."""
        return [*self._engine.start_versions(), *(v for v, _ in self._verifying)]

    def _snapshot_in_flight(self) -> tuple[int, ...]:
        """Refresh the report the heartbeat thread sends (a tuple: swapped whole, never mutated)."""
        self._in_flight_report = tuple(self._in_flight_versions())
        return self._in_flight_report

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

    def _resend_unacked(self) -> None:
        for group in self.unacked.due(time.monotonic()):
            log.info("resending unacknowledged group %s", group.group_id)
            self._send_groups([group])
            self.metrics.groups_sent.inc()

    def _send(self, body: m.Body, request_id: int | None = None) -> None:
        assert self.buffer is not None
        try:
            self.buffer.send(body, request_id=request_id)
        except TransportTimeout as exc:  # the queue to the buffer is full: unacked groups are resent later
            log.warning("%s", exc)

    def _update_gauges(self) -> None:
        mx, engine = self.metrics, self._engine
        self._snapshot_in_flight()
        mx.credits_available.set(self.credits.held)
        mx.groups_in_flight.set(engine.num_in_flight)
        mx.unacked_groups.set(len(self.unacked))
        mx.policy_version.set(engine.version)
        if self.weights is not None and self.weights.latest_seen >= 0:
            mx.weights_behind.set(max(0, self.weights.latest_seen - engine.version))
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
        assert self.buffer is not None
        for reason, n in (self.buffer.rejected - self._rejected_seen).items():
            mx.messages_rejected.labels(reason=reason).inc(n)
        self._rejected_seen = Counter(self.buffer.rejected)

    # ------------------------------------------------------------------------------ drain / close

    def _drain(self) -> None:
        """Finish what is in flight (bounded), send it, report unused credits, wait for acks (bounded)."""
        engine, budget_s = self._engine, self.settings.transport.timeout_s
        log.info("draining: %d groups in flight, %d unacknowledged", engine.num_in_flight, len(self.unacked))
        deadline = time.monotonic() + budget_s
        try:
            while not self._engine_lost and engine.num_in_flight and time.monotonic() < deadline:
                self._verify(engine.step())
                self._read_buffer(timeout_ms=0)
        except Exception as exc:  # noqa: BLE001 (re-raised unless a stop was asked for)
            self._engine_lost_on_stop(exc)
        aborted = engine.abort_all(engine_alive=not self._engine_lost)
        self.metrics.groups_aborted.inc(aborted)
        self.credits.redeem_without_group(aborted + self.credits.held)
        self.credits.held = 0
        for _, future in self._verifying:
            future.result()
        self._send_verified()
        deadline = time.monotonic() + budget_s
        while len(self.unacked) and time.monotonic() < deadline:
            self._read_buffer(timeout_ms=IDLE_POLL_MS)
            self._resend_unacked()
        self._update_gauges()
        if len(self.unacked):
            log.warning(
                "%d groups still unacknowledged after %.0f s; they are lost", len(self.unacked), budget_s
            )
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
        watcher_stopped = self.watcher is None or self.watcher.stop()
        if not watcher_stopped:
            # Its poll waits up to transport.timeout_s for a learner that may be gone. Closing the
            # source now would close its socket and shared memory under that thread (libzmq sockets
            # are not thread-safe; it ended close() with EBADF); the process exit releases them.
            log.warning(
                "the weight watcher is still inside a poll of the learner: leaving its weight source "
                "open (released at exit)"
            )
        release(
            self._heartbeat and self._heartbeat.stop,
            self.weights.close if self.weights is not None and watcher_stopped else None,
            lambda: self._verify_pool.shutdown(wait=False, cancel_futures=True),
            self.engine and self.engine.close,
            self.verifier and self.verifier.close,
            self._save_prompt_position,
            self.group_log and self.group_log.close,
            self._close_monitor,
            self.buffer and self.buffer.close,
            self._cores and self._cores.close,
            lambda: self._ctx.destroy(linger=0),
            self.metrics_server
            and (lambda: self.metrics_server.stop(self.settings.metrics.final_scrape_wait_s)),
        )

    def _save_prompt_position(self) -> None:
        if self._cursor is not None and self._stream is not None:
            self._cursor.save(self._stream.state, force=True)

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            assert self.buffer is not None
            self.buffer.socket.disable_monitor()
            self._monitor.close(linger=0)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

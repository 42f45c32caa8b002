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
Sent groups stay in ``UnackedGroups`` until the buffer acknowledges them and are
resent after ``transport.timeout_s`` or as soon as the connection to the buffer is re-established (the
buffer drops duplicates by id, so a resend is harmless).

Weights: a ``WeightWatcher`` thread polls every ``generator.weight_poll_s`` (``weights.method``: zmq
download, shared directory, or an NCCL announcement) and the loop swaps the engine to the newest
version between steps (``RolloutEngine`` pauses, loads, relabels, resumes). Verification runs on a
thread (the checks themselves in the verifier pool's processes) so the engine keeps stepping.

SIGTERM/SIGINT drain: stop asking for credits, let in-flight groups finish for up to
``transport.timeout_s`` and abort the rest, send what verified, report unused credits back (in
``filtered_total``), wait up to ``transport.timeout_s`` for acknowledgements, exit 0.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import zmq
from prometheus_client import CollectorRegistry

from stream_dapo.config import Config
from stream_dapo.exit_codes import ExitCode
from stream_dapo.generator.engine import WeightUpdateError
from stream_dapo.generator.prompts import PromptCursor, ShardLayout
from stream_dapo.generator.rollout import FinishedGroup, GroupOutcome, RolloutSettings, process_group
from stream_dapo.metrics import (
    GeneratorMetrics,
    Health,
    MetricsServer,
    final_metrics_path,
    start_metrics,
    write_final_metrics,
)
from stream_dapo.service_runner import run_service
from stream_dapo.transport import messages as m
from stream_dapo.transport.curve import curve_client
from stream_dapo.transport.messages import Group
from stream_dapo.transport.sockets import (
    WEIGHTS_MAX_BYTES,
    CurveKeys,
    Endpoint,
    PeerUnavailable,
    RateLimitedWarnings,
    TransportError,
    TransportTimeout,
    new_request_id,
    open_endpoint,
    request,
)

if TYPE_CHECKING:
    from stream_dapo.data.dataset import PromptStream
    from stream_dapo.generator.engine import RolloutEngine

__all__ = [
    "CreditLedger",
    "GeneratorService",
    "StartupError",
    "UnackedGroups",
    "WeightUpdate",
    "WeightWatcher",
    "add_arguments",
    "run",
]

log = logging.getLogger("stream_dapo.generator")

CREDIT_RETRY_S = 0.25
"""Wait after the buffer granted no credit before asking again (its line is full)."""
IDLE_POLL_MS = 50
"""Socket wait per turn when the engine has nothing to do (no busy spinning)."""
MAX_MESSAGES_PER_TURN = 64
ACCURACY_WINDOW = 64
"""Groups over which the accuracy gauge is computed."""
RATE_WINDOW_S = 5.0
UNACKED_FACTOR = 4
"""Stop asking for credits while more than this many times max_groups_in_flight groups wait for an
acknowledgement: the buffer is down or far behind, and new groups would only pile up here."""


class StartupError(RuntimeError):
    """The service cannot start; the message names what is missing and the fix."""


# --------------------------------------------------------------------------------------------------
# Bookkeeping (pure, unit-tested)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreditRequest:
    """One ``credit_request``: its request id is the same on every attempt, so the buffer answers a
    repeat (the reply was lost) with the grant it already made instead of granting again."""

    request_id: int
    want: int


@dataclass
class CreditLedger:
    """Credits held, the credit request in flight, and redemptions the buffer has not heard of.

    Example: with ``max_in_flight=4``, 1 group in flight and nothing held, ``request(1, now)`` asks
    for 3; a ``credit{granted=2}`` reply to that request makes ``held == 2``; two ``take()`` calls
    start two groups. At most one request is in flight. One unanswered for ``timeout_s``, or when
    the link to the buffer was re-established, is sent again with the same request id and want;
    only the first reply naming the request in flight counts (a second reply to a repeat carries
    the same grant and is ignored).
    """

    max_in_flight: int
    timeout_s: float
    retry_s: float = CREDIT_RETRY_S
    new_id: Callable[[], int] = new_request_id
    held: int = 0
    filtered_total: int = 0
    """Credits spent since the hello on groups the buffer will never receive (dropped by dynamic
    sampling, aborted, or unused at shutdown): a running total, sent with every ``groups`` message
    and heartbeat, so a lost or repeated report costs nothing (the buffer redeems the increase)."""
    pending: CreditRequest | None = None
    requested_at: float | None = None
    next_request_at: float = 0.0

    def want(self, in_flight: int) -> int:
        return max(0, self.max_in_flight - in_flight - self.held)

    def request(self, in_flight: int, now: float) -> CreditRequest | None:
        """The credit request to send now (a new one, or the one in flight again), or None."""
        if self.pending is not None:
            if self.requested_at is not None and now - self.requested_at < self.timeout_s:
                return None
            self.requested_at = now
            return self.pending
        if now < self.next_request_at:
            return None
        want = self.want(in_flight)
        if not want:
            return None
        self.pending, self.requested_at = CreditRequest(self.new_id(), want), now
        return self.pending

    def granted(self, n: int, now: float, request_id: int | None) -> bool:
        """Apply a ``credit`` reply. False (and nothing changes) unless it answers the request in
        flight: a late second reply to a repeated request, or a reply to a hello."""
        if n < 0:
            raise ValueError(f"granted must be >= 0, got {n}")
        if self.pending is None or request_id != self.pending.request_id:
            return False
        self.held += n
        self.pending, self.requested_at = None, None
        if n == 0:
            self.next_request_at = now + self.retry_s
        return True

    def forget_request(self) -> None:
        """The link to the buffer was re-established (its reply may be lost): send the request in
        flight again at once, or a new one if there is none."""
        self.requested_at = None
        self.next_request_at = 0.0

    def take(self) -> bool:
        """Use one credit to start a group."""
        if self.held <= 0:
            return False
        self.held -= 1
        return True

    def redeem_without_group(self, n: int = 1) -> None:
        """``n`` credits were spent (or will not be used) without a group reaching the buffer."""
        self.filtered_total += n

    def lease_expired(self) -> int:
        """The buffer took back our credits (it had not heard from us for its lease time): drop the
        ones held and ask again. Returns how many were dropped."""
        dropped, self.held = self.held, 0
        self.forget_request()
        return dropped


@dataclass
class _Pending:
    group: Group
    sent_at: float
    attempts: int = 1


@dataclass
class AckOutcome:
    """What one `ack` from the buffer settled among the groups awaiting acknowledgement."""

    acked: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    unknown: int = 0


class UnackedGroups:
    """Groups sent to the buffer and not yet acknowledged, resent after ``resend_after_s``."""

    def __init__(self, resend_after_s: float) -> None:
        self.resend_after_s = resend_after_s
        self._pending: dict[str, _Pending] = {}
        self.resent = 0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._pending

    def sent(self, group: Group, now: float) -> None:
        self._pending.setdefault(group.group_id, _Pending(group, now))

    def due(self, now: float) -> list[Group]:
        """Groups to resend now (oldest first); they count as sent again at ``now``."""
        out = []
        for p in self._pending.values():
            if now - p.sent_at >= self.resend_after_s:
                p.sent_at, p.attempts = now, p.attempts + 1
                out.append(p.group)
        self.resent += len(out)
        return out

    def expire(self) -> None:
        """Make every pending group due now (the connection to the buffer was re-established)."""
        for p in self._pending.values():
            p.sent_at = float("-inf")

    def ack(
        self, accepted: Iterable[str], duplicates: Iterable[str], rejected: Iterable[dict[str, str]]
    ) -> AckOutcome:
        """Apply an ``ack``: accepted and duplicate ids are done, rejected ones are dropped (the buffer
        will never take them; resending would not help)."""
        result = AckOutcome()
        for gid in [*accepted, *duplicates]:
            if self._pending.pop(gid, None) is None:
                result.unknown += 1
            else:
                result.acked += 1
        for item in rejected:
            if self._pending.pop(item["group_id"], None) is None:
                result.unknown += 1
            else:
                result.rejected.append((item["group_id"], item["reason"]))
        return result


@dataclass(frozen=True)
class WeightUpdate:
    """A newer weight version ready to load: a verified local file, or (NCCL) a broadcast to take."""

    version: int
    path: Path | None
    nbytes: int
    fetch_seconds: float = 0.0


Poll = Callable[[int], "WeightUpdate | None"]


class _Background:
    """A daemon thread running ``_run`` until ``stop()``; subclasses set ``name`` and ``_run``."""

    name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class WeightWatcher(_Background):
    """Polls for weights other than ``have`` every ``poll_s`` on a daemon thread.

    ``take()`` returns the newest version found since the last call (older undelivered ones are
    superseded). Until the taker calls ``loaded()`` the watcher fetches nothing: a fetch prunes old
    files from the cache, and with a learner that publishes faster than a load takes it pruned the
    very file being loaded (the engine then stopped, paused, on a missing file). Poll errors (learner
    restarting, a checksum mismatch) are logged and retried at the next poll; they never stop the
    generator.
    """

    name = "weight-watcher"

    def __init__(self, poll: Poll, poll_s: float, have: int) -> None:
        self._poll = poll
        self._poll_s = poll_s
        self._have = have
        self._lock = threading.Lock()
        self._ready: WeightUpdate | None = None
        self._loading = False
        self.errors = 0
        super().__init__()

    def take(self) -> WeightUpdate | None:
        """The newest fetched update, if any; no fetch happens until ``loaded()``."""
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is not None:
                self._loading = True
            return ready

    def loaded(self) -> None:
        """The update from ``take()`` is in the engine (or was given up on): fetch again."""
        with self._lock:
            self._loading = False

    def reset(self, have: int) -> None:
        """Forget what was fetched and not loaded (e.g. its file was pruned): poll relative to ``have``."""
        with self._lock:
            self._have, self._ready, self._loading = have, None, False

    def poll_once(self) -> WeightUpdate | None:
        with self._lock:
            if self._loading:
                return None
            have = self._have
        update = self._poll(have)
        if update is not None:
            with self._lock:
                self._have, self._ready = update.version, update
        return update

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll_once()
            except (TransportError, OSError, ValueError, RuntimeError) as exc:
                self.errors += 1
                log.warning("weight poll failed (retrying in %.1f s): %s", self._poll_s, exc)


# --------------------------------------------------------------------------------------------------
# Weight sources, one per weights.method
# --------------------------------------------------------------------------------------------------


class ZmqWeightSource:
    """Downloads newer versions from the learner's weight server into ``dest_dir`` (verified)."""

    def __init__(self, address: str, timeout_s: float, dest_dir: Path, curve: CurveKeys | None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.dest_dir = dest_dir
        self.curve = curve
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._endpoint: Endpoint | None = None

    def _ep(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = open_endpoint(
                self._ctx,
                zmq.DEALER,
                connect=self.address,
                max_bytes=WEIGHTS_MAX_BYTES,
                peer="learner weight server",
                curve=self.curve,
            )
        return self._endpoint

    def __call__(self, have: int) -> WeightUpdate | None:
        from stream_dapo.weights.receiver import fetch_weights_zmq

        start = time.perf_counter()
        try:
            version, path = fetch_weights_zmq(
                self._ep(), have, self.timeout_s, dest_dir=self.dest_dir, retries=0
            )
        except TransportTimeout:
            # A DEALER that timed out may still get the late reply: start the next poll on a fresh socket.
            self.close()
            raise
        if path is None:
            return None
        return WeightUpdate(version, path, path.stat().st_size, time.perf_counter() - start)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None


class SharedDirWeightSource:
    """Reads the newest verified ``v*.safetensors`` named by ``LATEST`` in a shared directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, have: int) -> WeightUpdate | None:
        from stream_dapo.weights.receiver import read_shared_dir

        start = time.perf_counter()
        found = read_shared_dir(self.directory, have)
        if found is None:
            return None
        version, path = found
        return WeightUpdate(version, path, path.stat().st_size, time.perf_counter() - start)

    def close(self) -> None:
        pass


class NcclAnnouncementSource(ZmqWeightSource):
    """Watches the learner's announcements only; the tensors then come by NCCL broadcast.

    Every broadcast must be taken (the learner waits for all receivers), so ``have`` is the last
    version received over NCCL, not the version of the initial model.
    """

    def __call__(self, have: int) -> WeightUpdate | None:
        reply = request(
            self._ep(),
            *m.weights_query(max(have, 0)),
            timeout_ms=int(self.timeout_s * 1000),
            retries=0,
            accept=lambda msg: msg.type in (m.WEIGHTS_MANIFEST, m.NOT_AVAILABLE),
        )
        if reply.type == m.NOT_AVAILABLE or reply.body["version"] == have:
            return None
        return WeightUpdate(int(reply.body["version"]), None, int(reply.body["total_bytes"]))


# --------------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------------


class Heartbeat(_Background):
    """Keeps the generator's credit lease on a thread of its own, so that a main loop that is busy
    (a long weight load, a slow engine step) does not lose its credits.

    Every ``every_s`` it sends ``heartbeat{generator_id, filtered_total}`` on its own connection to
    the buffer and reads the ``lease`` replies: ``expired`` is set when one says the buffer had taken
    the credits back, and ``last_answer`` is when the buffer last replied (readiness). It stops
    renewing while ``progressing()`` is false (the main loop made no progress for its liveness
    bound), so a hung generator loses its credits like a dead one.
    """

    name = "heartbeat"

    def __init__(
        self,
        connect: Callable[[], Endpoint],
        generator_id: str,
        every_s: float,
        filtered_total: Callable[[], int],
        progressing: Callable[[], bool],
    ) -> None:
        self._connect = connect
        self.generator_id = generator_id
        self.every_s = every_s
        self._filtered_total = filtered_total
        self._progressing = progressing
        self.expired = threading.Event()
        self.last_answer = time.monotonic()
        self.sent = 0
        super().__init__()

    def _run(self) -> None:
        endpoint = self._connect()  # a socket belongs to the thread that uses it
        try:
            while not self._stop.is_set():
                if self._progressing():
                    try:
                        endpoint.send(*m.heartbeat(self.generator_id, self._filtered_total()))
                        self.sent += 1
                    except TransportTimeout:  # the queue to a hung buffer is full: try again later
                        pass
                deadline = time.monotonic() + self.every_s
                while not self._stop.is_set() and (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
                    got = endpoint.recv(min(left_ms, 200))
                    if got is not None and got[1].type == m.LEASE:
                        self.last_answer = time.monotonic()
                        if got[1].body["expired"]:
                            self.expired.set()
        finally:
            endpoint.close()


class GeneratorService:
    """One generator: vLLM engine, verifier pool, buffer and weight connections, metrics.

    ``start()`` performs every start-up check (raising ``StartupError`` with the fix), ``serve()``
    runs until ``request_stop()`` and drains, ``close()`` releases everything (idempotent).
    """

    def __init__(self, cfg: Config, index: int = 0) -> None:
        if index < 0:
            raise StartupError(f"--index must be >= 0, got {index}")
        if cfg.weights.method == "nccl" and index >= cfg.generator.num_generators:
            # Its process group has a fixed size: every member is counted in generator.num_generators.
            raise StartupError(
                f"--index {index} is outside 0..{cfg.generator.num_generators - 1}: with weights.method = "
                '"nccl" the weight group has a fixed membership; raise generator.num_generators (and restart '
                'the learner), or use weights.method = "zmq" or "shared_dir" for an elastic fleet'
            )
        self.cfg = cfg
        self.index = index
        self.generator_id = f"generator-{index}"
        self.settings = RolloutSettings.from_config(cfg.algo)
        t = cfg.transport
        self.buffer_address = t.buffer_address("samples")
        self.weights_address = t.weights_address()
        # Credits carry the learner version at which the buffer granted them; a credited group
        # starts only when the admission rule's lag gate allows it (`AdmissionRule.may_start`).
        self.admission = cfg.admission
        self._credit_version = 0
        self.credits = CreditLedger(cfg.generator.max_groups_in_flight, timeout_s=t.timeout_s)
        self.unacked = UnackedGroups(resend_after_s=t.timeout_s)
        self._stop = threading.Event()
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._verify_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self._verifying: deque[Future[GroupOutcome]] = deque()
        self._accuracy: deque[float] = deque(maxlen=ACCURACY_WINDOW)
        self._rejected_seen: Counter[str] = Counter()
        self._rate = (time.monotonic(), 0)
        self._heartbeat: Heartbeat | None = None
        self._warnings = RateLimitedWarnings(log)
        self._filtered_sent = 0
        self._tokens_counted = 0
        self._closed = False
        self.engine: RolloutEngine | None = None
        self.buffer: Endpoint | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._disconnected = False
        self.watcher: WeightWatcher | None = None
        self._weights_source: Any = None
        self.verifier: Any = None
        self.prompts: PromptStream | None = None
        self._cursor: PromptCursor | None = None
        self.registry = CollectorRegistry()
        self.metrics = GeneratorMetrics(self.registry)
        self.health = Health()
        self.metrics_server: MetricsServer | None = None

    # ------------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Everything that can fail, in order of cost: files, ports, peers, prompts, engine, weights."""
        self._check_model_dir()
        self._start_metrics()
        self._connect_buffer()
        self.prompts = self._load_prompts()
        self._start_verifier()
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
        path = Path(self.cfg.model.path)
        if not (path / "config.json").is_file():
            raise StartupError(
                f"model.path = {path} is not a Hugging Face model directory (no config.json); build the tiny "
                "default with `stream-dapo warmup` or set model.path"
            )

    def _start_metrics(self) -> None:
        mc = self.cfg.metrics
        port = mc.generator_port + self.index if mc.generator_port else 0
        *_, self.metrics_server = start_metrics(
            mc.host,
            port,
            setting="metrics.generator_port (generator I serves on generator_port + I)",
            registry=self.registry,
            health=self.health,
        )
        log.info("metrics on http://%s:%d/metrics and /healthz", mc.host, self.metrics_server.port)

    def _curve(self) -> CurveKeys | None:
        return curve_client(self.cfg.transport.curve_dir)

    def _buffer_endpoint(self, curve: CurveKeys | None, send_timeout_ms: int = 5000) -> Endpoint:
        t = self.cfg.transport
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
        t = self.cfg.transport
        self.buffer = self._buffer_endpoint(self._curve())
        try:
            reply = request(
                self.buffer,
                *m.hello(self.generator_id, 0),
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
        log.info(
            "buffer at %s answered (learner version %d)", self.buffer_address, reply.body["learner_version"]
        )
        self._monitor = self.buffer.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)

    def _load_prompts(self) -> PromptStream:
        from transformers import AutoTokenizer

        from stream_dapo.data.dataset import load_prompts
        from stream_dapo.data.synthetic import ensure_synthetic_data

        data = self.cfg.data
        path = data.train_path
        if path is None:
            path = str(ensure_synthetic_data(data, Path(self.cfg.run.out_dir) / "data")[0])
        elif not Path(path).is_file():
            raise StartupError(
                f"data.train_path = {path} does not exist; point it at a .parquet or .jsonl file"
            )
        tokenizer = AutoTokenizer.from_pretrained(self.cfg.model.path)
        items, _stats = load_prompts(path, tokenizer, self.cfg.model.max_prompt_len)
        layout = ShardLayout.of(
            str(path), len(items), data.seed, self.cfg.generator.num_generators, self.index
        )
        self._cursor = PromptCursor(
            Path(self.cfg.run.out_dir) / "generators" / f"{self.generator_id}.prompts.json", layout
        )
        return self._cursor.stream(items)

    def _start_verifier(self) -> None:
        from stream_dapo.verifier import VerifierPool

        v = self.cfg.verifier
        self.verifier = VerifierPool(
            num_workers=v.workers, timeout_s=v.timeout_s, pattern=v.pattern, max_input_chars=v.max_input_chars
        )

    def _start_engine(self) -> None:
        from stream_dapo.generator.engine import RolloutEngine

        self.engine = RolloutEngine.start(self.cfg, index=self.index)
        self.metrics.engine_start_seconds.set(self.engine.startup_seconds)

    @property
    def _engine(self) -> RolloutEngine:
        assert self.engine is not None, "start() first"
        return self.engine

    def _weights_dir(self) -> Path:
        w = self.cfg.weights
        return Path(w.shared_dir) if w.shared_dir else Path(self.cfg.run.out_dir) / "weights"

    def _load_initial_weights(self) -> None:
        """The late-joiner rule: load the learner's current version before the first prompt."""
        method, t = self.cfg.weights.method, self.cfg.transport
        curve = self._curve()
        have = 0  # the initial model is version 0
        if method == "shared_dir":
            self._weights_source = SharedDirWeightSource(self._weights_dir())
        elif method == "zmq":
            dest = Path(self.cfg.run.out_dir) / "weights-cache" / self.generator_id
            self._weights_source = ZmqWeightSource(self.weights_address, t.timeout_s, dest, curve)
        else:
            self._weights_source = NcclAnnouncementSource(self.weights_address, t.timeout_s, Path(), curve)
            self._join_nccl()
            have = -1  # every broadcast must be received, the first one included
        self.watcher = WeightWatcher(self._weights_source, self.cfg.generator.weight_poll_s, have)
        update = self._first_weights(method)
        if update is not None:
            self._load_weights(update)
            self.watcher.loaded()
        elif method == "shared_dir":
            log.warning(
                "nothing published in %s yet: starting from the initial model (version 0)",
                self._weights_dir(),
            )
        self.watcher.start()

    def _first_weights(self, method: str) -> WeightUpdate | None:
        """The learner's current version, if it differs from ours.

        shared_dir: one look (nothing published yet means start from the initial model). zmq: wait up
        to 4 x transport.timeout_s for the weight server to answer. nccl: wait as long for the first
        announcement, since its broadcast must be taken.
        """
        assert self.watcher is not None
        if method == "shared_dir":
            self.watcher.poll_once()
            return self.watcher.take()
        wait_s = 4 * self.cfg.transport.timeout_s
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                if self.watcher.poll_once() is not None or method == "zmq":
                    return self.watcher.take()
                log.info("waiting for the learner to announce its weights at %s", self.weights_address)
            except TransportTimeout:
                log.info("waiting for the learner's weight server at %s", self.weights_address)
            time.sleep(min(1.0, self.cfg.generator.weight_poll_s))
        if self._stop.is_set():
            return None
        raise PeerUnavailable(
            f"no weights from the learner at {self.weights_address} within {wait_s:.0f} s: start "
            "`stream-dapo learner` (or fix transport.learner_host / transport.weights_port)"
        )

    def _join_nccl(self) -> None:
        from stream_dapo.weights.nccl import nccl_group_spec

        spec = nccl_group_spec(self.cfg)
        rank_base = 1 + self.index * self.cfg.generator.tensor_parallel_size
        ranks = self._engine.join_nccl(spec.host, spec.port, spec.world_size, rank_base)
        log.info("joined the NCCL weight group at %s:%d as ranks %s", spec.host, spec.port, ranks)

    # ------------------------------------------------------------------------------ the loop

    def request_stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        """Generate until ``request_stop()``, then drain."""
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
        self._drain()

    def _idle_wait_ms(self) -> int:
        busy = self._engine.num_in_flight or self._verifying
        return 0 if busy else IDLE_POLL_MS

    def _apply_new_weights(self) -> None:
        assert self.watcher is not None
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
        if update.path is None:
            seconds = engine.receive_weights_nccl(timeout_s=max(300.0, self.cfg.transport.timeout_s))
        else:
            seconds = engine.update_weights(update.path, update.version)
        self.metrics.weight_sync_seconds.observe(update.fetch_seconds + seconds)
        self.metrics.weight_sync_bytes.inc(update.nbytes)
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

    def _on_buffer_message(self, msg: Any) -> None:
        if msg.type == m.CREDIT:
            if not self.credits.granted(msg.body["granted"], time.monotonic(), msg.request_id):
                self.metrics.stale_credit_replies.inc()
            elif msg.body["granted"]:
                self._credit_version = max(self._credit_version, msg.body["learner_version"])
        elif msg.type == m.ACK:
            self._on_ack(msg.body)
        elif msg.type == m.ERROR:
            log.warning("the buffer answered error %s: %s", msg.body["reason"], msg.body["detail"])
        else:
            self.metrics.messages_rejected.labels(reason="unexpected_type").inc()
            self._warnings.warn("unexpected_type", "unexpected %r message from the buffer; ignored", msg.type)

    def _start_heartbeat(self) -> None:
        curve = self._curve()
        health = self.health
        self._heartbeat = Heartbeat(
            lambda: self._buffer_endpoint(curve, send_timeout_ms=0),
            self.generator_id,
            self.cfg.generator.heartbeat_s,
            filtered_total=lambda: self.credits.filtered_total,
            progressing=lambda: time.monotonic() - health.last_progress < health.stall_after_s,
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
        responding = silent_s <= max(self.cfg.transport.timeout_s, 3 * self.cfg.generator.heartbeat_s)
        if responding != self.health.detail.get("buffer_responding", True):
            if responding:
                log.info("the buffer answers heartbeats again")
            else:
                log.warning(
                    "the buffer has not answered a heartbeat for %.0f s; not ready until it does", silent_s
                )
            self.health.detail["buffer_responding"] = responding
        self.health.ready = responding and not self._disconnected

    def _on_ack(self, body: dict[str, Any]) -> None:
        result = self.unacked.ack(body["accepted"], body["duplicates"], body["rejected"])
        self.metrics.groups_acked.inc(result.acked)
        for gid, reason in result.rejected:
            log.warning("the buffer rejected group %s: %s", gid, reason)
            self.metrics.groups_rejected.labels(reason=reason).inc()

    def _ask_for_credits(self) -> None:
        if len(self.unacked) > UNACKED_FACTOR * self.cfg.generator.max_groups_in_flight:
            return
        req = self.credits.request(self._engine.num_in_flight, time.monotonic())
        if req is not None:
            self._send(*m.credit_request(self.generator_id, req.want), request_id=req.request_id)

    def _start_groups(self) -> None:
        assert self.prompts is not None
        engine = self._engine
        if not self.admission.may_start(engine.version, self._credit_version):
            return  # these credits are for a newer policy: wait for its weights (in-flight groups go on)
        started = False
        while engine.num_in_flight < self.cfg.generator.max_groups_in_flight and self.credits.take():
            engine.add_group(next(self.prompts))
            started = True
        if started and self._cursor is not None:
            self._cursor.save(self.prompts.state)

    def _verify(self, finished: list[FinishedGroup]) -> None:
        for group in finished:
            self._count_finished(group)
            self._verifying.append(
                self._verify_pool.submit(
                    process_group, group, self.verifier, self.settings, self.generator_id
                )
            )

    def _count_finished(self, group: FinishedGroup) -> None:
        for s in group.samples:
            self.metrics.samples.inc()
            self.metrics.response_length.observe(len(s))
            self.metrics.prefix_cache_hit_tokens.inc(s.cached_prompt_tokens)
            if s.truncated:
                self.metrics.truncated.inc()

    def _send_verified(self) -> None:
        while self._verifying and self._verifying[0].done():
            outcome = self._verifying.popleft().result()
            self._count_outcome(outcome)
            if outcome.group is None:
                self.credits.redeem_without_group()
            else:
                self._send_groups([outcome.group])
                self.unacked.sent(outcome.group, time.monotonic())
                self.metrics.groups_sent.inc()
        if self.credits.filtered_total != self._filtered_sent:
            self._send_groups([])

    def _send_groups(self, groups: list[Group]) -> None:
        self._send(*m.groups(self.generator_id, groups, filtered_total=self.credits.filtered_total))
        self._filtered_sent = self.credits.filtered_total

    def _count_outcome(self, outcome: GroupOutcome) -> None:
        mx = self.metrics
        mx.groups.labels(outcome=outcome.decision.reason.value).inc()
        mx.verifier_latency.observe(outcome.verify_seconds)
        for r in outcome.results:
            mx.verifier_results.labels(reason=r.reason).inc()
        for reward in outcome.rewards:
            mx.reward.observe(float(reward))
        self._accuracy.append(outcome.decision.num_correct / outcome.decision.group_size)
        mx.accuracy.set(sum(self._accuracy) / len(self._accuracy))

    def _resend_unacked(self) -> None:
        for group in self.unacked.due(time.monotonic()):
            log.info("resending unacknowledged group %s", group.group_id)
            self._send_groups([group])
            self.metrics.groups_sent.inc()

    def _send(self, msg_type: str, body: dict[str, Any], request_id: int | None = None) -> None:
        assert self.buffer is not None
        try:
            self.buffer.send(msg_type, body, request_id=request_id)
        except TransportTimeout as exc:  # the queue to the buffer is full: unacked groups are resent later
            log.warning("%s", exc)

    def _update_gauges(self) -> None:
        mx, engine = self.metrics, self._engine
        mx.credits_available.set(self.credits.held)
        mx.groups_in_flight.set(engine.num_in_flight)
        mx.unacked_groups.set(len(self.unacked))
        mx.policy_version.set(engine.version)
        new_tokens = engine.tokens_generated - self._tokens_counted
        if new_tokens:
            mx.tokens.inc(new_tokens)
            self._tokens_counted = engine.tokens_generated
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
        engine, budget_s = self._engine, self.cfg.transport.timeout_s
        log.info("draining: %d groups in flight, %d unacknowledged", engine.num_in_flight, len(self.unacked))
        deadline = time.monotonic() + budget_s
        while engine.num_in_flight and time.monotonic() < deadline:
            self._verify(engine.step())
            self._read_buffer(timeout_ms=0)
        aborted = engine.abort_all()
        self.metrics.groups_aborted.inc(aborted)
        self.credits.redeem_without_group(aborted + self.credits.held)
        self.credits.held = 0
        for future in self._verifying:
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
        path = final_metrics_path(self.cfg.run.out_dir, self.generator_id)
        try:
            write_final_metrics(self.registry, path)
        except OSError as exc:
            log.warning("cannot write %s: %s (the run summary falls back to the last scrape)", path, exc)

    def close(self) -> None:
        """Stop threads, the engine, the pool and the sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.watcher is not None:
            self.watcher.stop()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._weights_source is not None:
            self._weights_source.close()
        self._verify_pool.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None:
            self.engine.close()
        if self.verifier is not None:
            self.verifier.close()
        self._write_final_metrics()
        if self._cursor is not None and self.prompts is not None:
            self._cursor.save(self.prompts.state, force=True)
        if self._monitor is not None:
            assert self.buffer is not None
            self.buffer.socket.disable_monitor()
            self._monitor.close(linger=0)
        if self.buffer is not None:
            self.buffer.close()
        self._ctx.destroy(linger=0)
        if self.metrics_server is not None:
            self.metrics_server.stop()


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index",
        type=int,
        default=0,
        metavar="I",
        help="this generator's index in 0..generator.num_generators-1 (prompt shard, metrics port, seed)",
    )
    parser.epilog = (
        "Needs a running `stream-dapo buffer` (transport.samples_port) and learner weights "
        "(weights.method). Metrics on metrics.generator_port + I. SIGTERM drains and exits 0."
    )


def run(args: argparse.Namespace) -> int:
    """Start-up problems are 2 (a missing buffer 69); a weight update that fails is 1."""
    cfg: Config = args.cfg

    def start_and_serve(service: GeneratorService) -> None:
        service.start()
        service.serve()

    return run_service(
        "generator",
        cfg,
        lambda: GeneratorService(cfg, getattr(args, "index", 0)),
        start_and_serve,
        startup_errors={StartupError: ExitCode.CONFIG},
        serve_errors={StartupError: ExitCode.CONFIG, WeightUpdateError: ExitCode.FAILURE},
    )

"""`stream-dapo learner`: the DeepSpeed learner service.

Start-up (fails here, not at step 500): metrics server and weight publisher first (a port clash
fails in a second), then the model and DeepSpeed, resume from ``checkpoints/latest`` if there is
one, publish the current weights (version 0 before step 0, so a broken sync path fails at once),
and ``learner_hello`` to the buffer (which requeues groups leased to a learner that died).

Main loop, per rollout step: collect ``learner.rollout_batch_prompts`` groups from the buffer
(waiting with back-off while it answers ``empty``), split them into mini-batches of
``mini_batch_samples / group_size`` groups, compute the proximal log-probs of all of them once with
the current weights, then take one optimizer step per mini-batch. After each step: one line in
``learner/trained_groups.jsonl``, weights published every ``sync_every`` steps, a checkpoint every
``checkpoint_every`` steps followed by ``commit``, Prometheus metrics and one tracked row on rank 0
(`stream_dapo.runtime.tracking`: ``learner/metrics.jsonl``, W&B, TensorBoard, as ``tracking.backends`` says).

Checkpoints: ``checkpoints/step_{v:06d}/`` holds the DeepSpeed state (``deepspeed/``), an HF export
(``hf/``), ``learner_state.json`` and the trained-group log as of that version; written under a temporary name, renamed, then ``latest`` is
replaced. The state includes the ids the checkpoint commits, so a learner that died between the
rename and the commit resends it after its hello.

Stops at ``learner.total_steps`` (or ``--max-steps``): final checkpoint, HF export to
``{run.out_dir}/final/``, final weights published. SIGTERM/SIGINT drain: the current step finishes,
a checkpoint is written, exit 0.

Data parallel (torchrun / deepspeed launcher): rank 0 talks to the buffer and publishes; the other
ranks receive each rollout batch from it over the process group, and every rank agrees on stopping
through one all-reduce per poll, so a signal that reaches ranks at different times cannot split them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import zmq
from prometheus_client import CollectorRegistry

from stream_dapo.errors import ConfigError
from stream_dapo.learner import distributed
from stream_dapo.learner.checkpoints import LEARNER_STATE_FILE, Checkpoints, CheckpointWriter
from stream_dapo.learner.resume import Change, config_changes, refusal, split_changes
from stream_dapo.runtime.disk import write_text_atomic
from stream_dapo.runtime.metrics import (
    Health,
    LearnerMetrics,
    MetricsServer,
    final_metrics_path,
    observe_many,
    peak_rss_bytes,
    start_metrics,
    write_final_metrics,
)
from stream_dapo.runtime.ports import require_bound, write_bound_ports
from stream_dapo.runtime.service_runner import release
from stream_dapo.transport import codec
from stream_dapo.transport import messages as m
from stream_dapo.transport.curve import curve_client
from stream_dapo.transport.sockets import (
    Endpoint,
    PeerUnavailable,
    TransportError,
    TransportTimeout,
    new_request_id,
    open_endpoint,
    request,
)

if TYPE_CHECKING:  # torch and DeepSpeed load in start(), so `stream-dapo learner --help` is instant
    import torch

    from stream_dapo.config import LearnerConfig, MetricsConfig, TransportConfig
    from stream_dapo.core.loss_params import RatioMode
    from stream_dapo.learner.packing import MicroBatch
    from stream_dapo.learner.trainer import MiniBatch, StepMetrics
    from stream_dapo.runtime.tracking import Tracker
    from stream_dapo.weights.base import WeightPublisher

__all__ = ["LearnerCollaborators", "LearnerService", "LearnerSettings", "Trainer"]

log = logging.getLogger("stream_dapo.learner")

BATCH_BACKOFF_S = (0.05, 1.0)
"""First and largest sleep between batch requests while the buffer is empty."""

# Status codes rank 0 shares with the other ranks while it waits for data.
_WAITING, _DATA = 0, 1


# --------------------------------------------------------------------------------------------------
# What the service takes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner service reads of the configuration: three of its sections whole, and the
    few values it takes from others. `build_learner` (``root.py``) builds it once from the config
    (`learner_settings`); a test may build one directly or `dataclasses.replace` one."""

    learner: LearnerConfig
    transport: TransportConfig
    metrics: MetricsConfig
    out_dir: str
    """run.out_dir: checkpoints, the trained-group log, bound ports and final figures go under it."""
    total_steps: int
    """The version to train to: learner.total_steps, or --max-steps."""
    groups_per_version: int
    """Groups per optimizer step (`Config.admission`): the mini-batches a rollout batch is cut into."""
    group_size: int
    """algo.group_size: the generators' rollout figures are per sample."""
    ratio_mode: RatioMode
    """algo.ratio_mode: "decoupled" computes the proximal log-probs of a rollout batch's later
    mini-batches before its first step."""
    sampling: m.Sampling
    """The generators' sampling settings (generator.*), said in the hello: every peer must share them."""
    run_config: dict[str, Any]
    """The whole resolved configuration as JSON: stored in each checkpoint, and what a resume
    compares with the configuration it was written with (`resume.py`)."""

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {self.total_steps}")


class Trainer(CheckpointWriter, Protocol):
    """What the service needs of the model it trains (`trainer.Learner` is one): its steps, the
    collectives' device, its weights and its checkpoints."""

    version: int
    """Optimizer steps taken: the policy version."""
    device: torch.device

    def prepare(self, groups: Sequence[m.Group]) -> MiniBatch: ...

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch]) -> list[torch.Tensor]: ...

    def train_step(
        self, batch: MiniBatch, prox: Sequence[torch.Tensor] | None, prox_version: int | None
    ) -> StepMetrics: ...

    def gather_state_dict(self) -> dict[str, torch.Tensor] | None: ...

    def apply_optimizer_settings(
        self, lr: float, betas: tuple[float, float], weight_decay: float
    ) -> None: ...

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]: ...


class LearnerCollaborators(Protocol):
    """How ``start()`` builds the service's collaborators, in its order: the weight publisher (rank 0,
    first, so that a taken port fails in a second), the trainer (every rank; after the resume check,
    so a refused change does not load the model), the tracker (rank 0). `build_learner` passes the
    one that builds them from the configuration (``root.ConfiguredCollaborators``)."""

    def publisher(self, metrics: LearnerMetrics) -> WeightPublisher:
        """Started: bound, serving; `metrics` counts what it refuses and sends."""
        ...

    def trainer(self) -> Trainer:
        """Collective: every rank builds its own, inside the process group."""
        ...

    def tracker(self, resumed_at: int | None) -> Tracker: ...


# --------------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------------


class LearnerService:
    """The learner service; ``run()`` trains until done or stopped. Usable in-process (tests).

    It reads what `settings` holds and never the configuration; `collaborators` builds the trainer,
    the weight publisher and the tracker in ``start()``. `build_learner(cfg)` (``root.py``) composes
    both. Call `request_stop` (e.g. from a signal handler) to drain.
    """

    def __init__(self, settings: LearnerSettings, collaborators: LearnerCollaborators) -> None:
        self.settings = settings
        self.collaborators = collaborators
        self.total_steps = settings.total_steps
        self.out = Path(settings.out_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.trained_log = self.out / "learner" / "trained_groups.jsonl"
        self.checkpoints = Checkpoints(self.ckpt_root, settings.learner.keep_checkpoints, self.trained_log)
        self.metrics_log = self.out / "learner" / "metrics.jsonl"
        self.groups_per_version = settings.groups_per_version
        self._stop = threading.Event()
        self._ctx: zmq.Context[Any] | None = None
        self._buffer: Endpoint | None = None
        self._publisher: WeightPublisher | None = None
        self._metrics_server: MetricsServer | None = None
        self._uncommitted: list[str] = []
        self._last_checkpoint = -1
        self._last_published = -1
        self._started = time.monotonic()
        self._last_wait_s = 0.0
        self._last_prepare_s = 0.0
        self._last_proximal_s = 0.0
        self._last_sync_s: float | None = None
        self._rollouts_latest: dict[str, int] | None = None
        self._rollouts_at_batch: dict[str, int] | None = None
        self._rollouts_at_time: float | None = None
        self._rollout_window: dict[str, float] = {}
        self.tracker: Tracker | None = None
        self.learner: Trainer | None = None
        """Built in ``start()``."""
        self.health: Health | None = None
        self.rank, self.world_size = 0, 1

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, return from `run` (safe from a signal handler)."""
        self._stop.set()

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        """Train until ``total_steps`` or a stop request; returns the exit code (0)."""
        try:
            self.start()
            while self._learner.version < self.total_steps:
                groups = self._next_rollout()
                if groups is None:  # stop requested while waiting for data
                    break
                if not self._train_rollout(groups):
                    break
            self._finish(completed=self._learner.version >= self.total_steps)
        finally:
            self.close()
        return 0

    def _train_rollout(self, groups: list[m.Group]) -> bool:
        """Proximal log-probs once (for every mini-batch but the first), then one step per mini-batch.
        False when told to stop."""
        size = self.groups_per_version
        t0 = time.perf_counter()
        batches = [self._learner.prepare(groups[i : i + size]) for i in range(0, len(groups), size)]
        t1 = time.perf_counter()
        decoupled = self.settings.ratio_mode == "decoupled"
        prox_version = self._learner.version
        # The first mini-batch trains on the weights the rollout batch starts from, so its forward
        # gives its proximal log-probs (None); only the later ones need a pass before the first step.
        prox = [None] + [
            self._learner.compute_logprobs(b.micro_batches) if decoupled else None for b in batches[1:]
        ]
        self._last_prepare_s, self._last_proximal_s = t1 - t0, time.perf_counter() - t1
        for batch, batch_prox in zip(batches, prox, strict=True):
            metrics = self._learner.train_step(batch, batch_prox, prox_version)
            self._after_step(metrics, batch.group_ids)
            if self._learner.version >= self.total_steps or self._agree_to_stop():
                return self._learner.version >= self.total_steps
        return True

    def _after_step(self, metrics: StepMetrics, group_ids: list[str]) -> None:
        v = metrics.version
        self._uncommitted.extend(group_ids)
        if self.rank == 0:
            _append_jsonl(
                self.trained_log,
                {"version": v, "group_ids": group_ids, "max_staleness": metrics.max_staleness},
            )
        publish = v % self.settings.learner.sync_every == 0
        checkpoint = v % self.settings.learner.checkpoint_every == 0
        self._last_sync_s = None
        if publish or checkpoint:
            state_dict = self._learner.gather_state_dict()  # collective; once for both
            if publish:
                self._publish(state_dict)
            if checkpoint:
                self._checkpoint(state_dict)
        if self.rank == 0:  # after the publish, so the row has its time
            self._record_metrics(metrics)
        if self.health is not None:
            self.health.detail["version"] = v
            self.health.beat()

    def _finish(self, completed: bool) -> None:
        """Checkpoint what is not yet; on completion also export ``final/`` and publish (collective)."""
        v = self._learner.version
        need_checkpoint = v != self._last_checkpoint and v > 0
        if not (need_checkpoint or completed):
            log.info("stopped at version %d before training anything new", v)
            return
        state_dict = self._learner.gather_state_dict()
        if need_checkpoint:
            self._checkpoint(state_dict)
        if not completed:
            log.info("stopped at version %d (drained and checkpointed)", v)
            return
        self._learner.write_hf(self.out / "final", state_dict)
        if v != self._last_published:
            self._publish(state_dict)
        log.info("finished at version %d; HF export in %s", v, self.out / "final")

    # ------------------------------------------------------------------ start-up

    def start(self) -> None:
        import torch

        from stream_dapo.learner.trainer import init_distributed

        torch.set_num_threads(self.settings.learner.torch_threads)
        self.rank, self.world_size, _ = init_distributed()
        self._start_metrics()
        if self.rank == 0:
            self._start_publishers()
            self._report_ports()
        changed = self._check_resume_config()  # before the model: a refused change must not load it
        self.learner = self.collaborators.trainer()
        state = self._resume()
        if self.checkpoints.latest() is not None:
            lc = self.settings.learner
            self._learner.apply_optimizer_settings(lc.lr, lc.betas, lc.weight_decay)
            if changed:
                log.info("resumed with changed settings, applied: %s", "; ".join(str(c) for c in changed))
        if self.rank == 0:  # one writer per run
            resumed_at = self._learner.version if self.checkpoints.latest() is not None else None
            self.tracker = self.collaborators.tracker(resumed_at)
        self._publish(self._learner.gather_state_dict())
        if self.rank == 0:
            self._hello(state)
        if self.health is not None:
            self.health.ready = True
            self.health.detail["version"] = self._learner.version
        log.info(
            "learner ready at version %d (world size %d); training to %d",
            self._learner.version,
            self.world_size,
            self.total_steps,
        )

    @property
    def _learner(self) -> Trainer:
        assert self.learner is not None, "start() first"
        return self.learner

    def _start_metrics(self) -> None:
        mc = self.settings.metrics
        if self.rank == 0:
            registry, self.health, self._metrics_server = start_metrics(
                mc.host, mc.learner_port, setting="metrics.learner_port"
            )
        else:
            registry = CollectorRegistry()  # other ranks keep the objects but serve nothing
        self.metrics = LearnerMetrics(registry)

    def _start_publishers(self) -> None:
        t = self.settings.transport
        require_bound("transport.batches_port", t.batches_port, "buffer")
        self._ctx = zmq.Context()
        self._publisher = self.collaborators.publisher(self.metrics)
        client = curve_client(t.curve_dir)
        self._buffer = open_endpoint(
            self._ctx,
            zmq.DEALER,
            connect=t.buffer_address("batches"),
            max_bytes=t.max_message_bytes,
            peer="buffer",
            hwm=t.hwm,
            curve=client,
        )

    def _report_ports(self) -> None:
        """Tell supervisors and peers what rank 0 bound (`stream_dapo/runtime/ports.py`), before the slow
        model set-up, so that generators can be started while the learner loads."""
        assert self._publisher is not None and self._metrics_server is not None
        ports = {**self._publisher.bound_ports(), "metrics.learner_port": self._metrics_server.port}
        if self.health is not None:
            self.health.detail["ports"] = ports
        write_bound_ports(self.settings.out_dir, "learner", ports)

    def _check_resume_config(self) -> list[Change]:
        """Compare the configuration the latest checkpoint was written with to this one (`resume.py`):
        raise ConfigError for a change the checkpoint cannot take (model, group size, staleness,
        sampling, shapes); return the others, which apply. Ports and addresses are not compared."""
        path = self.checkpoints.latest()
        if path is None:
            return []
        try:
            stored = json.loads((path / LEARNER_STATE_FILE).read_text()).get("config")
        except (OSError, ValueError):
            return []  # loading the checkpoint reports what is wrong with it
        if not isinstance(stored, dict):
            log.info("%s stores no configuration (written by an older version): not compared", path)
            return []
        changes = config_changes(stored, self.settings.run_config)
        applied, refused = split_changes(
            [c for c in changes if not c.key.startswith(("transport.", "metrics."))]
        )
        if refused:
            raise ConfigError(refusal(refused, str(path), self.settings.out_dir))
        return applied

    def _resume(self) -> dict[str, Any]:
        """Load ``checkpoints/latest`` if present; cut the logs back to its version."""
        state: dict[str, Any] = {"version": 0, "commit_group_ids": []}
        path = self.checkpoints.latest()
        if path is not None:
            state = self._learner.load_checkpoint(path)
            self._last_checkpoint = self._learner.version
            log.info("resumed from %s at version %d", path, self._learner.version)
        if self.rank == 0:
            for path in (self.trained_log, self.metrics_log):
                _truncate_jsonl(path, max_version=self._learner.version)
        return state

    def _hello(self, state: dict[str, Any]) -> None:
        v = self._learner.version
        t = self.settings.transport
        try:
            self._request(m.LearnerHello(v, v, self.settings.sampling), attempts=3)
        except TransportTimeout as exc:
            raise PeerUnavailable(
                f"{exc} The learner needs the buffer at {t.buffer_address('batches')}: start `stream-dapo buffer` "
                "first, or fix transport.buffer_host / transport.batches_port"
            ) from exc
        if state.get("commit_group_ids"):  # the commit of the resumed checkpoint may never have been sent
            self._commit(v, list(state["commit_group_ids"]))

    # ------------------------------------------------------------------ data

    def _request(self, body: m.Body, attempts: int | None = None) -> codec.Message:
        """Send one request to the buffer and return its reply.

        Each attempt waits transport.timeout_s and all carry one request id, so the buffer answers a
        retry as it answered the first copy (a retried `batch_request` gets the same lease) and a late
        reply to an earlier request is dropped (counted), never read as this one's. With `attempts`
        None it waits as long as it takes: a buffer that restarts or hangs is a transient failure,
        so the learner stays live but not ready, and gives up only when asked to stop
        (TransportTimeout then).
        """
        assert self._buffer is not None
        rid = new_request_id()
        timeout_s = self.settings.transport.timeout_s
        tried = 0
        while True:
            tried += 1
            discarded = self._buffer.discarded
            try:
                reply = request(
                    self._buffer, body, timeout_ms=int(timeout_s * 1000), retries=0, request_id=rid
                )
            except TransportTimeout:
                if (tried >= attempts) if attempts is not None else self._stop.is_set():
                    raise
                self.metrics.request_retries.inc()
                self._buffer_reachable(False, f"no reply to {body.TYPE} for {tried * timeout_s:.0f} s")
                continue
            finally:
                self.metrics.stale_replies.inc(self._buffer.discarded - discarded)
            self._buffer_reachable(True)
            return reply

    def _buffer_reachable(self, reachable: bool, why: str = "") -> None:
        """Readiness follows the buffer: a learner waiting on a hung buffer is live but not ready."""
        if self.health is None:
            return
        self.health.beat()  # waiting on a peer on purpose: the learner itself is fine
        was = self.health.detail.get("buffer_reachable", True)
        self.health.detail["buffer_reachable"] = reachable
        if reachable and not was:
            log.info("the buffer answers again")
        if not reachable:
            log.warning(
                "%s at %s; retrying with the same request id",
                why,
                self.settings.transport.buffer_address("batches"),
            )
        self.health.ready = reachable

    def _next_rollout(self) -> list[m.Group] | None:
        """``rollout_batch_prompts`` groups, gathered on rank 0 and shared with every rank; None
        when a stop was requested while waiting (groups already leased return to the buffer's
        queue at the next ``learner_hello``)."""
        want = self.settings.learner.rollout_batch_prompts
        groups: list[m.Group] = []
        t0 = time.monotonic()
        delay = BATCH_BACKOFF_S[0]
        while True:
            got = self._request_groups(want - len(groups)) if self.rank == 0 and len(groups) < want else []
            groups.extend(got)
            status, stop = self._sync_status(_DATA if len(groups) >= want else _WAITING)
            if stop:
                return None
            if status == _DATA:
                break
            if got:  # a partial batch (the buffer's size limit): ask again at once
                continue
            if self.health is not None:
                self.health.beat()  # idling on purpose: the buffer is empty, the learner is fine
            time.sleep(delay)
            delay = min(delay * 2, BATCH_BACKOFF_S[1])
        self._last_wait_s = time.monotonic() - t0
        self.metrics.batch_wait_seconds.observe(self._last_wait_s)
        self._window_rollouts()
        return self._broadcast_groups(groups)

    def _request_groups(self, n: int) -> list[m.Group]:
        try:
            reply = self._request(m.BatchRequest(self._learner.version, n, 0))
        except TransportTimeout:  # only when stopping: nothing was leased that a hello will not requeue
            return []
        batch = reply.body
        if isinstance(batch, m.Batch):
            if batch.rollouts is not None:
                self._rollouts_latest = m.to_map(batch.rollouts)
            if batch.dropped_stale:
                log.warning("buffer dropped %d stale groups for this batch", batch.dropped_stale)
            return batch.groups
        if reply.type != m.EMPTY:
            raise TransportError(
                f"buffer answered batch_request with {reply.type!r}; expected batch or empty"
            )
        return []

    def _window_rollouts(self) -> None:
        """The generators' rollout statistics since the previous rollout batch (rank 0: the one
        that talks to the buffer), logged with each step of this batch."""
        from stream_dapo.runtime.tracking import rollout_window

        latest = self._rollouts_latest
        if latest is None:
            self._rollout_window = {}
            return
        now = time.monotonic()
        seconds = now - self._rollouts_at_time if self._rollouts_at_time is not None else 0.0
        self._rollout_window = rollout_window(
            self._rollouts_at_batch, latest, self.settings.group_size, seconds
        )
        self._rollouts_at_batch, self._rollouts_at_time = latest, now

    def _sync_status(self, status: int) -> tuple[int, bool]:
        """Rank 0's status and whether any rank was asked to stop (one all-reduce)."""
        mine = [status if self.rank == 0 else 0, int(self._stop.is_set())]
        first, stop = distributed.all_reduce(
            mine, "max", device=self._learner.device, world_size=self.world_size, integers=True
        )
        return int(first), bool(stop)

    def _agree_to_stop(self) -> bool:
        return self._sync_status(_WAITING)[1]

    def _broadcast_groups(self, groups: list[m.Group]) -> list[m.Group]:
        """Rank 0's groups on every rank, sent as one encoded `batch` message (no pickle)."""
        if self.world_size == 1:
            return groups
        data = codec.encode(m.Batch(groups, 0)) if self.rank == 0 else b""
        data = distributed.broadcast_bytes(
            data, rank=self.rank, device=self._learner.device, world_size=self.world_size
        )
        if self.rank == 0:
            return groups
        msg = codec.decode(data, max_bytes=len(data) + 1)
        return msg.body.groups

    # ------------------------------------------------------------------ weights, checkpoints, commits

    def _publish(self, state_dict: dict[str, Any] | None) -> None:
        """Publish the current version from rank 0. Every rank calls it with its `gather_state_dict`
        result (None except on rank 0), so the collectives before it line up."""
        from stream_dapo.weights.base import serialize_weights

        t0 = time.perf_counter()
        v = self._learner.version
        if self.rank == 0:
            assert state_dict is not None
            payload = serialize_weights(state_dict, v)
            assert self._publisher is not None, "rank 0 starts its publisher in start()"
            self._publisher.publish(payload, state_dict)
            seconds = time.perf_counter() - t0
            self.metrics.weight_sync_seconds.observe(seconds)
            self._last_sync_s = seconds
            self.metrics.weight_sync_bytes.inc(payload.total_bytes)
            self.metrics.policy_version.set(v)
            log.info(
                "published weights version %d (%.2f MB in %.3f s)", v, payload.total_bytes / 1e6, seconds
            )
        self._last_published = v

    def _checkpoint(self, state_dict: dict[str, Any] | None) -> None:
        """Checkpoint this version (`Checkpoints.write`: atomic, then ``latest``), then commit its
        groups to the buffer and prune old checkpoints. Collective; ``state_dict`` is this rank's
        `gather_state_dict` result, for the HF export inside."""
        t0 = time.perf_counter()
        v = self._learner.version
        ids = list(self._uncommitted)
        extra = {
            "commit_group_ids": ids,
            "trained_groups_lines": _count_lines(self.trained_log),
            "config": self.settings.run_config,  # what a resume is compared with
        }
        final = self.checkpoints.write(self._learner, v, state_dict, extra)
        if self.rank == 0:
            self._commit(v, ids)
            self.checkpoints.prune()
            self.metrics.checkpoint_seconds.observe(time.perf_counter() - t0)
        self._learner.barrier()
        self._uncommitted.clear()
        self._last_checkpoint = v
        log.info("checkpoint %s written in %.2f s", final, time.perf_counter() - t0)

    def _commit(self, version: int, group_ids: list[str]) -> None:
        try:
            self._request(m.Commit(version, group_ids), attempts=3 if self._stop.is_set() else None)
        except TransportTimeout as exc:
            # The ids are in the checkpoint's state: the next start-up resends them.
            log.error("commit of %d groups at version %d got no reply: %s", len(group_ids), version, exc)

    # ------------------------------------------------------------------ metrics

    def _record_metrics(self, s: StepMetrics) -> None:
        mx = self.metrics
        mx.step.set(s.version)
        mx.loss.set(s.loss)
        mx.entropy.set(s.entropy)
        for side in ("low", "high", "dual"):
            mx.clip_fraction.labels(side=side).set(getattr(s, f"clip_frac_{side}"))
        mx.is_weight.labels(stat="mean").set(s.is_weight_mean)
        mx.is_weight.labels(stat="max").set(s.is_weight_max)
        mx.set_off_policy(s.masked_frac, s.seq_ratio_min, s.seq_ratio_max)
        mx.approx_kl.set(s.approx_kl_behaviour)
        for tokens in ("all", "fresh"):
            gap = s.behaviour_gap.get(tokens)
            mx.behaviour_abs_diff.labels(tokens=tokens).set(gap["mean_abs"] if gap else math.nan)
            for band in ("0.9_1.1", "0.5_2"):
                share = gap[f"outside_{band}"] if gap else math.nan
                mx.behaviour_out_of_range.labels(tokens=tokens, band=band.replace("_", "-")).set(share)
        mx.grad_norm.set(s.grad_norm)
        mx.lr.set(s.lr)
        mx.reward.set(s.reward_mean)
        mx.accuracy.set(s.accuracy)
        mx.tokens.inc(s.tokens)
        mx.tokens_per_second.set(s.tokens_per_second)
        mx.step_seconds.observe(s.step_seconds)
        mx.groups_trained.inc(s.groups)
        mx.packing_efficiency.set(s.packing_efficiency)
        peak_rss = peak_rss_bytes()
        mx.peak_rss.set(peak_rss)
        for value, count in s.staleness_counts.items():
            observe_many(mx.staleness, max(value, 0), count)
        row = {
            **s.to_json(),
            "wall_time": round(time.time(), 3),
            "elapsed_s": round(time.monotonic() - self._started, 3),
            "batch_wait_seconds": round(self._last_wait_s, 4),
            # Per rollout batch (repeated on each of its steps): packing and the proximal pass.
            "prepare_seconds": round(self._last_prepare_s, 4),
            "proximal_seconds": round(self._last_proximal_s, 4),
            "weight_sync_seconds": round(self._last_sync_s, 4) if self._last_sync_s is not None else None,
            "peak_rss_gib": round(peak_rss / 2**30, 3),
            **{k: round(v, 6) for k, v in self._rollout_window.items()},
        }
        if self.tracker is not None:
            self.tracker.log(s.version, row)
        log.info(
            "step %d loss %.4f reward %.3f acc %.3f grad %.3f stale<=%d %.0f tok/s",
            s.version,
            s.loss,
            s.reward_mean,
            s.accuracy,
            s.grad_norm,
            s.max_staleness,
            s.tokens_per_second,
        )

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        if self.rank == 0 and self._metrics_server is not None:
            path = final_metrics_path(self.settings.out_dir, "learner")
            try:
                write_final_metrics(self._metrics_server.registry, path)
            except OSError as exc:
                log.warning("cannot write %s: %s (the run summary falls back to the last scrape)", path, exc)
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        release(
            self._publisher and self._publisher.close,
            self._buffer and self._buffer.close,
            self._ctx and self._ctx.term,
            self._metrics_server
            and (lambda: self._metrics_server.stop(self.settings.metrics.final_scrape_wait_s)),
        )
        self._publisher = self._buffer = self._ctx = self._metrics_server = None


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _count_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


def _truncate_jsonl(path: Path, max_version: int) -> None:
    """Keep the rows with ``version <= max_version`` (the steps the resumed checkpoint contains)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and int(json.loads(line)["version"]) <= max_version
    ]
    write_text_atomic(path, "".join(line + "\n" for line in kept))


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

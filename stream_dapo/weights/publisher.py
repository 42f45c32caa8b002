"""Learner side of weight sync: gather, serialise, checksum, publish.

A publication is a `WeightsPayload`: the full weights of one version as safetensors bytes plus their
sha256. Rank 0 builds it (`gather_full_state_dict` is collective under ZeRO-3) and hands it to the
publishers the config asks for:

- `WeightServer` serves it over ZeroMQ from a background thread with its own ROUTER socket, so
  generators fetch while the learner trains. Protocol (generator DEALER -> this ROUTER)::

      weights_query{have_version}  -> weights_manifest{version, checksum, total_bytes, chunk_bytes,
                                                       num_chunks, format}    (the current version)
                                   -> not_available{reason="no_weights_yet"}  (nothing published)
      chunk_request{version, index} -> chunk{version, index, data}
                                   -> not_available{reason="version_gone"}   (pruned: ask again)

  The manifest always describes the current version, whatever ``have_version`` says; the client
  compares (``have_version`` is informational, so a late joiner needs no special value). The last
  ``keep`` versions stay servable, so a fetch that straddles a publication still completes.
- `SharedDirPublisher` writes ``v{version:08d}.safetensors`` to a temporary name, renames it into
  place, then replaces ``LATEST`` (json: version, checksum, file, total_bytes) the same way and
  prunes all but the newest ``keep`` versions. Readers see a whole file or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import zmq
from torch import Tensor

from stream_dapo.disk import fsync_dir, write_bytes_atomic
from stream_dapo.transport import messages
from stream_dapo.transport.sockets import (
    WEIGHTS_MAX_BYTES,
    CurveKeys,
    Endpoint,
    PeerUnreachable,
    TransportTimeout,
    open_endpoint,
)

if TYPE_CHECKING:
    import prometheus_client

__all__ = [
    "LATEST_FILE",
    "SharedDirPublisher",
    "WeightServer",
    "WeightsPayload",
    "gather_full_state_dict",
    "serialize_weights",
    "sha256_file",
    "weights_file_name",
]

log = logging.getLogger(__name__)

LATEST_FILE = "LATEST"
REQUEST_MAX_BYTES = 64 * 1024
"""Queries and chunk requests are tiny; anything bigger sent to the weight server is rejected."""
_CHUNK_OVERHEAD = 64 * 1024


def weights_file_name(version: int) -> str:
    return f"v{version:08d}.safetensors"


@dataclass(frozen=True)
class WeightsPayload:
    """One version of the full weights: safetensors bytes and their sha256 (hex)."""

    version: int
    data: bytes
    checksum: str
    num_tensors: int

    @property
    def total_bytes(self) -> int:
        return len(self.data)


def serialize_weights(state_dict: Mapping[str, Tensor], version: int) -> WeightsPayload:
    """Safetensors bytes of ``state_dict`` (tensors moved to CPU, made contiguous) + sha256."""
    from safetensors.torch import save

    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}
    data = save(tensors, metadata={"format": "pt", "stream_dapo_version": str(version)})
    return WeightsPayload(version, data, hashlib.sha256(data).hexdigest(), len(tensors))


def sha256_file(path: str | os.PathLike[str], block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def gather_full_state_dict(
    module: torch.nn.Module, *, rank: int = 0, zero_stage: int = 0, tie_word_embeddings: bool | None = None
) -> dict[str, Tensor] | None:
    """Full weights of ``module`` on rank 0 as CPU tensors, None on other ranks.

    Under ZeRO-3 this is collective: every rank must call it. Parameters are gathered one at a time
    (``deepspeed.zero.GatheredParameters``) so rank 0 never holds more than the result plus one full
    parameter. A tied output embedding appears once, under the input embedding's name
    (``named_parameters`` already deduplicates shared tensors; ``lm_head.weight`` is dropped
    explicitly when the config ties them), which is what transformers and vLLM expect.
    """
    if tie_word_embeddings is None:
        tie_word_embeddings = bool(getattr(getattr(module, "config", None), "tie_word_embeddings", False))
    params = list(module.named_parameters())
    if tie_word_embeddings:
        params = [(n, p) for n, p in params if n != "lm_head.weight"]
    out: dict[str, Tensor] | None = {} if rank == 0 else None
    gathered: Any = None
    if zero_stage == 3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters
    for name, param in params:
        if gathered is not None:
            with gathered([param], modifier_rank=None):
                if out is not None:
                    out[name] = param.detach().to("cpu", copy=True)
        elif out is not None:
            out[name] = param.detach().to("cpu", copy=True)
    if out is not None:
        for name, buf in _persistent_buffers(module):
            out[name] = buf.detach().to("cpu", copy=True)
    return out


def _persistent_buffers(module: torch.nn.Module) -> Iterable[tuple[str, Tensor]]:
    for mod_name, mod in module.named_modules():
        for buf_name, buf in mod.named_buffers(recurse=False):
            if buf is not None and buf_name not in mod._non_persistent_buffers_set:
                yield (f"{mod_name}.{buf_name}" if mod_name else buf_name), buf


# --------------------------------------------------------------------------------------------------
# ZeroMQ weight server
# --------------------------------------------------------------------------------------------------


class WeightServer:
    """Serves published versions over a ROUTER socket from a daemon thread.

    ``bind`` is a ZeroMQ address (``tcp://0.0.0.0:5557``; ``tcp://127.0.0.1:*`` picks a free port,
    see `address`). The socket is created and bound in `start` (so a port clash fails there, in the
    caller) and used only by the serving thread afterwards. ``rejected_metric``, a Prometheus counter
    with a ``reason`` label (the learner's ``messages_rejected``), counts refused requests as
    `rejected` does.
    """

    def __init__(
        self,
        bind: str,
        *,
        chunk_bytes: int = 4 * 1024 * 1024,
        keep: int = 2,
        curve: CurveKeys | None = None,
        allowed_clients_dir: str | os.PathLike[str] | None = None,
        hwm: int = 1000,
        poll_ms: int = 50,
        rejected_metric: prometheus_client.Counter | None = None,
    ) -> None:
        if not 4096 <= chunk_bytes <= WEIGHTS_MAX_BYTES - _CHUNK_OVERHEAD:
            raise ValueError(
                f"weights.chunk_bytes must be in [4096, {WEIGHTS_MAX_BYTES - _CHUNK_OVERHEAD}] so a chunk fits "
                f"the receivers' message limit, got {chunk_bytes}"
            )
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.bind = bind
        self.chunk_bytes = chunk_bytes
        self.keep = keep
        self.curve = curve
        self.allowed_clients_dir = allowed_clients_dir
        if curve is not None and allowed_clients_dir is None:
            raise ValueError(
                "a Curve weight server needs allowed_clients_dir (transport.curve_dir/clients): without the "
                "allow-list any client that knows the server key could fetch the weights"
            )
        self.hwm = hwm
        self.poll_ms = max(10, poll_ms)
        self._payloads: OrderedDict[int, WeightsPayload] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._endpoint: Endpoint | None = None
        self._auth: Any = None
        self.address = bind
        self.stats: Counter[str] = Counter()
        """queries, manifests, chunks, bytes, not_available, errors (served by the thread)."""
        self.rejected: Counter[str] = Counter()
        """Requests refused, by reason: undecodable ones (the codec's reasons, answered with `error` by
        the endpoint), `unexpected_type` and `bad_chunk_index`."""
        self._rejected_metric = rejected_metric
        self._endpoint_rejected: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> WeightServer:
        self._ctx = zmq.Context()
        if self.curve is not None and self.allowed_clients_dir is not None:
            from stream_dapo.transport.curve import start_authenticator

            self._auth = start_authenticator(self._ctx, self.allowed_clients_dir)
        self._endpoint = open_endpoint(
            self._ctx,
            zmq.ROUTER,
            bind=self.bind,
            max_bytes=REQUEST_MAX_BYTES,
            peer="generator",
            hwm=self.hwm,
            curve=self.curve,
            curve_server=self.curve is not None,
            send_timeout_ms=0,  # a generator that stops reading loses its reply, not everyone their chunks
        )
        self.address = self._endpoint.address  # resolves tcp://host:* to the port actually bound
        self._thread = threading.Thread(target=self._serve, name="weight-server", daemon=True)
        self._thread.start()
        log.info("weight server listening on %s (chunks of %d bytes)", self.address, self.chunk_bytes)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._endpoint is not None:
            self._endpoint.close()
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
        self._thread = self._endpoint = self._ctx = self._auth = None

    def __enter__(self) -> WeightServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ publishing

    def publish(self, payload: WeightsPayload) -> None:
        """Make ``payload`` the current version; older ones beyond ``keep`` stop being served."""
        with self._lock:
            if self._payloads and payload.version < next(reversed(self._payloads)):
                log.warning(
                    "publishing version %d after %d: the learner went back to an older checkpoint",
                    payload.version,
                    next(reversed(self._payloads)),
                )
                self._payloads.clear()
            self._payloads[payload.version] = payload
            self._payloads.move_to_end(payload.version)
            while len(self._payloads) > self.keep:
                self._payloads.popitem(last=False)

    @property
    def current_version(self) -> int | None:
        with self._lock:
            return next(reversed(self._payloads)) if self._payloads else None

    def _current(self) -> WeightsPayload | None:
        with self._lock:
            return self._payloads[next(reversed(self._payloads))] if self._payloads else None

    def _get(self, version: int) -> WeightsPayload | None:
        with self._lock:
            return self._payloads.get(version)

    # ------------------------------------------------------------------ serving

    def _serve(self) -> None:
        ep = self._endpoint
        assert ep is not None
        while not self._stop.is_set():
            try:
                got = ep.recv(self.poll_ms)
                self._count_endpoint_rejections(ep)
                if got is None:
                    continue
                peer, msg = got
                assert peer is not None
                reply = self._answer(msg.type, msg.body)
                ep.send(*reply, to=peer, request_id=msg.request_id)
            except (PeerUnreachable, TransportTimeout) as exc:
                # The generator went away or stopped reading; it will ask again when it comes back.
                self.stats["errors"] += 1
                log.debug("weight server: %s", exc)
            except zmq.ZMQError as exc:
                if self._stop.is_set():
                    return
                self.stats["errors"] += 1
                log.warning("weight server socket error: %s", exc)
                time.sleep(self.poll_ms / 1000)

    def _answer(self, msg_type: str, body: dict[str, Any]) -> messages.Outgoing:
        if msg_type == messages.WEIGHTS_QUERY:
            return self._answer_query(body["have_version"])
        if msg_type == messages.CHUNK_REQUEST:
            return self._answer_chunk(body["version"], body["index"])
        return self._refuse(
            "unexpected_type", f"the weight server answers weights_query and chunk_request, not {msg_type}"
        )

    def _refuse(self, reason: str, detail: str) -> messages.Outgoing:
        self.stats["errors"] += 1
        self._count_rejected(reason, 1)
        return messages.error(reason, detail)

    def _count_endpoint_rejections(self, ep: Endpoint) -> None:
        """Forward the endpoint's decode failures (counted there, answered with `error`)."""
        for reason, total in ep.rejected.items():
            new = total - self._endpoint_rejected[reason]
            if new:
                self._endpoint_rejected[reason] = total
                self._count_rejected(reason, new)

    def _count_rejected(self, reason: str, n: int) -> None:
        self.rejected[reason] += n
        if self._rejected_metric is not None:
            self._rejected_metric.labels(reason=reason).inc(n)

    def _answer_query(self, have_version: int) -> messages.Outgoing:
        self.stats["queries"] += 1
        current = self._current()
        if current is None:
            self.stats["not_available"] += 1
            return messages.not_available(have_version, 0, "no_weights_yet")
        self.stats["manifests"] += 1
        return messages.weights_manifest(
            current.version, current.checksum, current.total_bytes, self.chunk_bytes
        )

    def _answer_chunk(self, version: int, index: int) -> messages.Outgoing:
        payload = self._get(version)
        if payload is None:
            self.stats["not_available"] += 1
            current = self.current_version
            return messages.not_available(version, current if current is not None else 0, "version_gone")
        num_chunks = -(-payload.total_bytes // self.chunk_bytes)
        if index >= num_chunks:
            return self._refuse(
                "bad_chunk_index", f"version {version} has {num_chunks} chunks, asked for {index}"
            )
        lo = index * self.chunk_bytes
        data = memoryview(payload.data)[lo : lo + self.chunk_bytes]
        self.stats["chunks"] += 1
        self.stats["bytes"] += len(data)
        return messages.chunk(version, index, data)


# --------------------------------------------------------------------------------------------------
# Shared directory
# --------------------------------------------------------------------------------------------------


class SharedDirPublisher:
    """Publishes versions as files in a directory that generators can read (NFS, a shared volume)."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".*.tmp-*"):  # left by a crash mid-write
            stale.unlink(missing_ok=True)

    def publish(self, payload: WeightsPayload) -> Path:
        """Write the file, then LATEST (each via temp + rename), then prune. Returns the file's path."""
        final = self.directory / weights_file_name(payload.version)
        write_bytes_atomic(final, payload.data)
        latest = {
            "version": payload.version,
            "checksum": payload.checksum,
            "file": final.name,
            "total_bytes": payload.total_bytes,
        }
        write_bytes_atomic(self.directory / LATEST_FILE, (json.dumps(latest) + "\n").encode())
        with contextlib.suppress(OSError):  # best effort: some shared filesystems refuse it
            fsync_dir(self.directory)
        self._prune(payload.version)
        return final

    def _prune(self, current: int) -> None:
        versions = sorted(
            int(p.name[1:9]) for p in self.directory.glob("v*.safetensors") if p.name[1:9].isdigit()
        )
        # Keep the newest `keep` up to the current one; anything newer than current is a dead lineage
        # (the learner resumed from an older checkpoint) and goes too.
        keep = {v for v in versions if v <= current}
        keep = set(sorted(keep)[-self.keep :])
        for v in versions:
            if v not in keep:
                (self.directory / weights_file_name(v)).unlink(missing_ok=True)

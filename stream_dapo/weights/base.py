"""Weight synchronisation, the parts every method shares: what a publication is, and the two
interfaces each method implements.

A publication is a `WeightsPayload`: the full weights of one version as safetensors bytes plus their
sha256. The learner's rank 0 builds it (`gather_full_state_dict` is collective under ZeRO-3) and
hands it to its `WeightPublisher`; a generator's `WeightSource` finds newer versions (polled by the
generator's weight watcher thread) and loads them into its engine between steps.

One module per method holds both ends: `zmq_chunks` (chunked over ZeroMQ, the CPU default),
`shared_dir` (safetensors files in a shared directory) and `nccl` (broadcast into vLLM workers,
announced over ZeroMQ); `factory` builds the pair that ``weights.method`` names.

Version rule: a publication is taken when its version differs from the one held, newer or older (an
older one means the learner resumed from a checkpoint, and the weights the generator holds belong
to a lineage that no longer exists). ``have = -1`` means "I have nothing".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor

from stream_dapo.weights.errors import ChecksumMismatch, WeightsError

if TYPE_CHECKING:
    import prometheus_client

    from stream_dapo.weights.image import WeightImage

__all__ = [
    "ChecksumMismatch",
    "RelayMetrics",
    "WeightPublisher",
    "WeightSource",
    "WeightTarget",
    "WeightUpdate",
    "WeightsError",
    "WeightsPayload",
    "gather_full_state_dict",
    "serialize_weights",
    "sha256_file",
    "weights_file_name",
]


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
    """Safetensors bytes of ``state_dict`` (tensors moved to CPU, made contiguous) + sha256.

    The bytes are a function of the state alone: the same state gives the same bytes and checksum
    whatever its version (which travels beside them, in ``WeightsPayload`` and every manifest). The
    header's metadata is one key, the ``format`` transformers checks: safetensors writes metadata
    keys in hash-map order, so a second key (the version, until it moved out) let the same state's
    header come out in either order."""
    from safetensors.torch import save

    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}
    data = save(tensors, metadata={"format": "pt"})
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


@dataclass(frozen=True)
class WeightUpdate:
    """A newer weight version ready to load: its verified safetensors bytes in memory (``data``), a
    verified local file (``path``), or (NCCL, both None) a broadcast to take."""

    version: int
    path: Path | None
    nbytes: int
    """Bytes of the full version."""
    fetch_seconds: float = 0.0
    data: WeightImage | None = field(default=None, repr=False, compare=False)
    wire_bytes: int | None = None
    """Bytes that crossed the network for it (deltas count their compressed size); None: nbytes."""
    published_at: float = 0.0
    """The learner's wall clock when it published the version (unix seconds); 0: unknown."""


@dataclass(frozen=True)
class RelayMetrics:
    """A generator's fan-out counters (weights.peer_fanout; the generator's metrics, none in tools and
    tests). Only the ZeroMQ method uses them."""

    sent: prometheus_client.Counter | None = None
    """Chunk bytes this generator's relay sent to other generators."""
    refused: prometheus_client.Counter | None = None
    """Labels socket, reason: connections to the relay whose Curve handshake failed."""
    dropped: prometheus_client.Counter | None = None
    """Label reason (`stream_dapo.weights.zmq_chunks.peers.DROPPED`): other generators' relays a
    transfer stopped asking."""


class WeightPublisher(Protocol):
    """The learner's end of one method (rank 0 only)."""

    def publish(self, payload: WeightsPayload, state_dict: Mapping[str, Tensor]) -> object:
        """Make `payload` (the serialised `state_dict`) the current version for every generator
        (what it returns, e.g. the file written, is for tests)."""
        ...

    def bound_ports(self) -> dict[str, int]:
        """The ports it listens on, by config setting (`stream_dapo/runtime/ports.py`); {} for none."""
        ...

    def close(self) -> None: ...


class WeightTarget(Protocol):
    """What a source loads into: the generator's engine (`stream_dapo.generator.engine.RolloutEngine`).
    Named here so that the weights package never imports the generator."""

    def update_weights(self, path: str | os.PathLike[str], version: int) -> float:
        """Swap to the weights in the safetensors file `path`, labelled `version`; returns seconds."""
        ...

    def update_weights_from_image(self, image: WeightImage, version: int) -> float:
        """Swap to the verified safetensors bytes in shared memory `image`, labelled `version`."""
        ...

    def join_nccl(self, host: str, port: int, world_size: int, rank_base: int) -> list[int]:
        """Join the learner's NCCL weight group; returns the workers' ranks."""
        ...

    def receive_weights_nccl(self, timeout_s: float) -> float:
        """Swap to the learner's next NCCL broadcast; returns seconds."""
        ...


class WeightSource(Protocol):
    """A generator's end of one method."""

    first_version: int
    """The version to poll against before anything is loaded: 0 (the initial model), or -1 where
    every publication must be taken, the first one included (NCCL)."""
    startup: Literal["look", "answer", "announcement"]
    """How long a starting generator waits for the learner: one look (nothing published means start
    from the initial model), until the weight server answers, or until a version is announced."""
    latest_seen: int
    """The newest version the last poll saw published (-1 before any): how far behind the loaded
    weights are is ``latest_seen - loaded``."""

    def join(self, engine: WeightTarget) -> None:
        """Start-up work with the engine before the first poll (NCCL: join the weight group)."""
        ...

    def __call__(self, have: int) -> WeightUpdate | None:
        """Poll: a version other than `have`, ready to load, or None. Runs on the watcher thread."""
        ...

    def load(self, engine: WeightTarget, update: WeightUpdate) -> float:
        """Swap `update` into `engine` (paused, loaded, resumed); returns the seconds it took."""
        ...

    def close(self) -> None: ...


class FileSource:
    """What the ZeroMQ and shared-directory sources share: an update is verified safetensors bytes in
    shared memory, which the engine's worker maps and loads from (or, from tools, a verified file)."""

    first_version = 0
    latest_seen = -1

    def join(self, engine: WeightTarget) -> None:
        pass

    def load(self, engine: WeightTarget, update: WeightUpdate) -> float:
        if update.data is not None:
            return engine.update_weights_from_image(update.data, update.version)
        assert update.path is not None
        return engine.update_weights(update.path, update.version)

    def close(self) -> None:
        pass

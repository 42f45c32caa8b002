"""NCCL broadcast of the weights from learner rank 0 into generator workers (GPU only), both ends:
the learner's `NcclPublisher` (announce on the ZeroMQ weight server, then broadcast) and a
generator's `NcclAnnouncementSource` (watch announcements, take each broadcast into the engine).

The group is separate from the learner's DeepSpeed process group: rank 0 is the learner's rank 0
(the sender), ranks 1..N are the generators' vLLM workers (generator i, tensor-parallel rank j is
rank ``1 + i * tp + j``). Rendezvous uses vLLM's ``StatelessProcessGroup`` (a TCPStore at
``transport.learner_host (or host) : transport.nccl_port``) and ``PyNcclCommunicator``, the pattern of vLLM's
RL examples, so neither side's global ``torch.distributed`` state is touched.

Every publication is self-describing, so receivers need no side channel; all broadcasts come from
rank 0 on the communicator's stream::

    1. header   int64[4]       [MAGIC, version, len(meta), number of tensors]
    2. meta     uint8[len]     json {"version": v, "tensors": [[name, dtype, shape], ...]}
    3. tensors  in meta order, each in its own dtype and shape

Weight sync is a protocol (pause -> start -> transfer -> finish -> resume): the learner still
announces each version over ZeroMQ (`WeightServer`: late joiners and checksums go that way); a
generator that sees a new manifest pauses sampling and calls `NcclWeightReceiver.receive`, loads
the tensors (``model.load_weights`` in a vLLM worker) and resumes. `NcclWeightSender.send` returns
once every receiver has taken the broadcast, or raises after ``timeout_s`` naming the likely cause.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from stream_dapo.transport import messages
from stream_dapo.transport.sockets import CurveKeys, request
from stream_dapo.weights.base import WeightsPayload, WeightTarget, WeightUpdate
from stream_dapo.weights.zmq_chunks import WeightServer, ZmqWeightSource

__all__ = [
    "NcclAnnouncementSource",
    "NcclGroupSpec",
    "NcclPublisher",
    "NcclWeightReceiver",
    "NcclWeightSender",
    "nccl_group_spec",
]

log = logging.getLogger(__name__)

MAGIC = 0x5DA905EED  # "stream-dapo weights" marker: a receiver out of step fails loudly
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.uint8,
        torch.int8,
        torch.float64,
    )
}


@dataclass(frozen=True)
class NcclGroupSpec:
    """Where the weight-broadcast group meets and how many ranks it has (sender included)."""

    host: str
    port: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(
                f"an NCCL weight group needs the learner and at least one worker, got {self.world_size}"
            )


def nccl_group_spec(cfg: Any) -> NcclGroupSpec:
    """The group of a resolved `Config`: at transport.nccl_port, one rank per vLLM worker."""
    gen = cfg.generator
    return NcclGroupSpec(
        host=cfg.transport.learner_host or cfg.transport.host,
        port=cfg.transport.nccl_port,
        world_size=1 + gen.num_generators * gen.tensor_parallel_size,
    )


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs CUDA GPUs; on the CPU set weights.method to 'zmq' (default) or 'shared_dir'"
        )


def _cuda_device(device: torch.device | int | None) -> torch.device:
    """The CUDA device to use: the given one (a device or its index), else the current one."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", int(device.index if isinstance(device, torch.device) else device))


def _join(spec: NcclGroupSpec, rank: int, device: torch.device) -> Any:
    from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

    return stateless_init_process_group(spec.host, spec.port, rank, spec.world_size, device)


def _wait(stream: torch.cuda.Stream, timeout_s: float, what: str) -> None:
    """Wait for the work queued on ``stream`` with a deadline (NCCL itself never times out)."""
    event = torch.cuda.Event()
    event.record(stream)
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{what} did not finish within {timeout_s:.0f} s: a generator worker is not receiving (crashed, "
                "or not polling weights). The NCCL group is now unusable; restart the generators and the learner"
            )
        time.sleep(0.005)


class NcclWeightSender:
    """The learner's end (rank 0). `connect` blocks until every worker has joined."""

    def __init__(
        self, spec: NcclGroupSpec, device: torch.device | int | None = None, *, timeout_s: float = 300.0
    ):
        _require_cuda("weights.method = 'nccl'")
        self.spec = spec
        self.device = _cuda_device(device)
        self.timeout_s = timeout_s
        self.comm: Any = None

    def connect(self) -> NcclWeightSender:
        log.info(
            "waiting for %d generator workers at %s:%d (NCCL weight group)",
            self.spec.world_size - 1,
            self.spec.host,
            self.spec.port,
        )
        self.comm = _join(self.spec, 0, self.device)
        return self

    def send(self, version: int, state_dict: Mapping[str, Tensor]) -> int:
        """Broadcast one version; returns the payload bytes. Blocks until received or timeout."""
        if self.comm is None:
            raise RuntimeError("call connect() before send()")
        names = list(state_dict)
        meta = json.dumps(
            {
                "version": version,
                "tensors": [
                    [n, str(state_dict[n].dtype).removeprefix("torch."), list(state_dict[n].shape)]
                    for n in names
                ],
            }
        ).encode()
        stream = torch.cuda.current_stream(self.device)
        header = torch.tensor([MAGIC, version, len(meta), len(names)], dtype=torch.int64, device=self.device)
        self.comm.broadcast(header, src=0, stream=stream)
        self.comm.broadcast(
            torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(self.device), src=0, stream=stream
        )
        total = 0
        for name in names:
            t = state_dict[name].detach().to(self.device, non_blocking=True).contiguous()
            self.comm.broadcast(t, src=0, stream=stream)
            total += t.numel() * t.element_size()
        _wait(stream, self.timeout_s, f"NCCL broadcast of weights version {version}")
        return total

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None


class NcclWeightReceiver:
    """A worker's end (rank >= 1). Use inside the process that owns the GPU (a vLLM worker)."""

    def __init__(self, spec: NcclGroupSpec, rank: int, device: torch.device | int | None = None):
        _require_cuda("NcclWeightReceiver")
        if not 1 <= rank < spec.world_size:
            raise ValueError(f"receiver rank must be in [1, {spec.world_size}), got {rank}")
        self.spec = spec
        self.rank = rank
        self.device = _cuda_device(device)
        self.comm: Any = None

    def connect(self) -> NcclWeightReceiver:
        self.comm = _join(self.spec, self.rank, self.device)
        return self

    def receive(self, timeout_s: float = 300.0) -> tuple[int, list[tuple[str, Tensor]]]:
        """Take the next publication: (version, [(name, tensor on this GPU), ...]) in send order."""
        if self.comm is None:
            raise RuntimeError("call connect() before receive()")
        stream = torch.cuda.current_stream(self.device)
        header = torch.zeros(4, dtype=torch.int64, device=self.device)
        self.comm.broadcast(header, src=0, stream=stream)
        _wait(stream, timeout_s, "waiting for a weights header")
        magic, version, meta_len, count = header.tolist()
        if magic != MAGIC:
            raise RuntimeError(
                f"NCCL weight stream out of step (header {header.tolist()}); restart both sides"
            )
        meta_buf = torch.empty(meta_len, dtype=torch.uint8, device=self.device)
        self.comm.broadcast(meta_buf, src=0, stream=stream)
        _wait(stream, timeout_s, "receiving the weights manifest")
        meta = json.loads(bytes(meta_buf.cpu().tolist()))
        if meta["version"] != version or len(meta["tensors"]) != count:
            raise RuntimeError(
                f"NCCL weights manifest disagrees with its header (version {version}, {count} tensors)"
            )
        out: list[tuple[str, Tensor]] = []
        for name, dtype, shape in meta["tensors"]:
            if dtype not in _DTYPES:
                raise RuntimeError(f"unsupported dtype {dtype} for {name} in the NCCL weight stream")
            t = torch.empty(shape, dtype=_DTYPES[dtype], device=self.device)
            self.comm.broadcast(t, src=0, stream=stream)
            out.append((name, t))
        _wait(stream, timeout_s, f"receiving weights version {version}")
        return int(version), out

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None


# --------------------------------------------------------------------------------------------------
# The method's two ends: the learner's publisher and a generator's source
# --------------------------------------------------------------------------------------------------


class NcclPublisher:
    """Announces each version on the ZeroMQ `WeightServer` (late joiners, checksums), then
    broadcasts its tensors to every worker of the group."""

    def __init__(self, server: WeightServer, sender: NcclWeightSender) -> None:
        self.server = server
        self.sender = sender

    def bound_ports(self) -> dict[str, int]:
        return {**self.server.bound_ports(), "transport.nccl_port": self.sender.spec.port}

    def publish(self, payload: WeightsPayload, state_dict: Mapping[str, Tensor]) -> None:
        self.server.publish(payload)
        self.sender.send(payload.version, state_dict)

    def close(self) -> None:
        self.server.stop()
        self.sender.close()


class NcclAnnouncementSource(ZmqWeightSource):
    """Watches the learner's announcements only; the tensors then come by NCCL broadcast.

    Every broadcast must be taken (the learner waits for all receivers), so ``have`` is the last
    version received over NCCL, not the version of the initial model (`first_version` is -1).
    `join` puts the engine's workers into the group as ranks ``rank_base ..``.
    """

    first_version = -1
    startup: Literal["look", "answer", "announcement"] = "announcement"

    def __init__(
        self,
        address: str,
        timeout_s: float,
        curve: CurveKeys | None,
        *,
        spec: NcclGroupSpec,
        rank_base: int,
        receive_timeout_s: float,
    ) -> None:
        super().__init__(address, timeout_s, curve, delta=False)
        self.spec = spec
        self.rank_base = rank_base
        self.receive_timeout_s = receive_timeout_s

    def join(self, engine: WeightTarget) -> None:
        spec = self.spec
        ranks = engine.join_nccl(spec.host, spec.port, spec.world_size, self.rank_base)
        log.info("joined the NCCL weight group at %s:%d as ranks %s", spec.host, spec.port, ranks)

    def load(self, engine: WeightTarget, update: WeightUpdate) -> float:
        return engine.receive_weights_nccl(timeout_s=self.receive_timeout_s)

    def __call__(self, have: int) -> WeightUpdate | None:
        reply = request(
            self._ep(),
            messages.WeightsQuery(max(have, 0)),
            timeout_ms=int(self.timeout_s * 1000),
            retries=0,
            accept=lambda msg: msg.type in (messages.WEIGHTS_MANIFEST, messages.NOT_AVAILABLE),
        )
        manifest = reply.body
        if isinstance(manifest, messages.WeightsManifest):
            self.latest_seen = manifest.version
        if not isinstance(manifest, messages.WeightsManifest) or manifest.version == have:
            return None
        return WeightUpdate(manifest.version, None, manifest.total_bytes)

"""The collectives the learner's processes share, written once: the device they communicate on, an
all-reduce of a few numbers, a broadcast of bytes from rank 0, and a barrier.

Each is the identity (or a no-op) in a one-process run, so callers need no ``world_size == 1``
branch of their own. torch is imported on use: the learner service module stays light for ``--help``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["all_reduce", "barrier", "broadcast_bytes", "comm_device"]


def comm_device(device: torch.device) -> torch.device:
    """Where collective tensors live: the training device under NCCL, the CPU under gloo."""
    import torch

    return device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(
    values: Sequence[float],
    op: Literal["sum", "max"],
    *,
    device: torch.device,
    world_size: int,
    integers: bool = False,
) -> list[float]:
    """`values` reduced over every rank (one collective), as float64, or int64 with `integers`."""
    if world_size == 1:
        return [int(v) for v in values] if integers else [float(v) for v in values]
    import torch

    dtype = torch.int64 if integers else torch.float64
    t = torch.tensor(list(values), dtype=dtype, device=comm_device(device))
    torch.distributed.all_reduce(
        t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
    )
    return t.cpu().tolist()


def broadcast_bytes(data: bytes, *, rank: int, device: torch.device, world_size: int) -> bytes:
    """Rank 0's `data` on every rank (two collectives: the size, then the bytes); other ranks pass b""."""
    if world_size == 1:
        return data
    import torch

    dev = comm_device(device)
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    torch.distributed.broadcast(size, src=0)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
        if rank == 0
        else torch.empty(int(size), dtype=torch.uint8, device=dev)
    )
    torch.distributed.broadcast(buf, src=0)
    return data if rank == 0 else buf.cpu().numpy().tobytes()


def barrier(world_size: int) -> None:
    if world_size > 1:
        import torch

        torch.distributed.barrier()

"""Tensors of a safetensors image held in memory, as views into it (no file, no copy).

The format: 8 bytes little-endian header length ``n``, ``n`` bytes of json
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the tensor
data, offsets relative to the end of the header. ``safetensors.torch.load`` would copy the whole
image into new tensors; the engine copies every tensor into its own parameters anyway, so views are
enough and save a pass over the bytes.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["SafetensorsError", "check_header", "tensors_from_buffer"]

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit

_DTYPES: dict[str, tuple[str, int]] = {  # safetensors name -> (torch dtype name, bytes per element)
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}


class SafetensorsError(ValueError):
    """The bytes are not a safetensors image this reader can use."""


def check_header(buf: bytes | bytearray | memoryview) -> dict[str, tuple[str, list[int], int, int]]:
    """{name: (torch dtype name, shape, begin, end)} with absolute byte offsets, checked against
    the buffer's size; raises SafetensorsError saying what is wrong. Needs no torch."""
    view = memoryview(buf).cast("B")
    if len(view) < 8:
        raise SafetensorsError(f"{len(view)} bytes is too short for a safetensors header")
    n = int.from_bytes(view[:8], "little")
    if n > _MAX_HEADER or 8 + n > len(view):
        raise SafetensorsError(f"header length {n} does not fit in {len(view)} bytes")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"the header is not json ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("the header is not a json object")
    start = 8 + n
    out: dict[str, tuple[str, list[int], int, int]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, itemsize = _DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"tensor {name!r}: unusable entry {info!r}") from None
        if min(shape, default=0) < 0 or end - begin != math.prod(shape) * itemsize or begin < 0:
            raise SafetensorsError(f"tensor {name!r}: offsets {begin}..{end} do not match {dtype} {shape}")
        if start + end > len(view):
            raise SafetensorsError(f"tensor {name!r} ends at byte {start + end}, past the {len(view)} bytes")
        out[name] = (dtype, shape, start + begin, start + end)
    if not out:
        raise SafetensorsError("the image holds no tensors")
    return out


def tensors_from_buffer(buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor of the image in ``buf`` (a 1-d uint8 CPU tensor), as views.

    A tensor whose offset is not a multiple of its element size (safetensors writers align them, so
    only a hand-made image) is copied instead."""
    import torch

    entries = check_header(buf.numpy().data)
    out = []
    for name, (dtype_name, shape, begin, end) in entries.items():
        dtype = getattr(torch, dtype_name)
        raw = buf[begin:end]
        if begin % dtype.itemsize:
            raw = raw.clone()
        out.append((name, raw.view(dtype).view(shape)))
    return out

"""Codec choice (issue 11): decode + validate of the project's messages by the tree's codec, by
msgspec Structs and by pydantic models, interleaved.

    .venv/bin/python -m bench.perf.codec_choice [--repeats 9] [--json OUT] [--label NAME]

The two prototypes below declare the `groups` and `credit_request` messages with the same rules as
the protocol (exact fields, bounds, string lengths, finite floats, strict bools, array dtype / 1-d /
minimum size / finite / non-negative, equal lengths per sample, 1..1024 samples) and decode the
codec's own wire bytes (arrays through the codec's ext payload format). "tree" is whatever
`stream_dapo.transport.codec.decode` is importable: run the script from a checkout of the code to
measure (`git archive 289e6bd | tar -x -C /tmp/old && cd /tmp/old && python
$REPO/bench/codec_choice.py --label 289e6bd --json $REPO/docs/results/codec_choice.json` measured the
hand-rolled validator this choice replaced). Each figure: messages/s, median over interleaved repeats
(rotated order, one warm-up) with [min, max]; ratios are paired per repeat against "tree". `--json`
merges this run's rows into OUT, replacing the rows of the same `--label`.

What it does not show: encoding, the sockets, or anything but one process on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import time
from pathlib import Path
from typing import Annotated, Any

import msgpack
import msgspec
import numpy as np
import pydantic

from bench.report import interleave, machine_info, paired_ratio, save_json, summary  # noqa: E402
from stream_dapo.transport.codec import (  # noqa: E402
    SCHEMA_VERSION,
    _unpack_array,  # noqa: E402
    decode,
    pack_value,
)

MAX = 256 << 20


def _check_array(a: Any, dtype: str, finite: bool = False, nonneg: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"expected a numpy {dtype} array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype) or a.ndim != 1:
        raise ValueError(f"expected 1-d {dtype}")
    if a.size < 1:
        raise ValueError("must have at least 1 elements")
    if finite and not bool(np.isfinite(a).all()):
        raise ValueError("must be finite everywhere")
    if nonneg and a.min() < 0:
        raise ValueError("must be >= 0 everywhere")
    return a


# ---------------------------------------------------------------- msgspec
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class MSample(msgspec.Struct, forbid_unknown_fields=True):
    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    reward: float
    correct: bool
    truncated: bool
    advantage: float
    loss_weight: Annotated[float, msgspec.Meta(ge=0.0)]

    def __post_init__(self) -> None:
        _check_array(self.tokens, "int32", nonneg=True)
        _check_array(self.logprobs, "float32", finite=True)
        _check_array(self.versions, "int32", nonneg=True)
        if not (
            math.isfinite(self.reward) and math.isfinite(self.advantage) and math.isfinite(self.loss_weight)
        ):
            raise ValueError("must be finite")
        if not len(self.tokens) == len(self.logprobs) == len(self.versions):
            raise ValueError("equal lengths")


class MGroup(msgspec.Struct, forbid_unknown_fields=True):
    group_id: Id
    prompt_id: Id
    generator_id: Id
    gold: str
    prompt_tokens: np.ndarray
    created_at: Annotated[float, msgspec.Meta(ge=0.0)]
    samples: Annotated[list[MSample], msgspec.Meta(min_length=1, max_length=1024)]

    def __post_init__(self) -> None:
        _check_array(self.prompt_tokens, "int32", nonneg=True)


class MGroups(msgspec.Struct, forbid_unknown_fields=True):
    generator_id: Id
    groups: list[MGroup]
    filtered_total: Annotated[int, msgspec.Meta(ge=0, le=1 << 53)] = 0


class MCreditRequest(msgspec.Struct, forbid_unknown_fields=True):
    generator_id: Id
    want: Count


class MEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    t: str
    b: msgspec.Raw
    id: int | None = None


def _ext(code: int, data: memoryview) -> np.ndarray:
    """The codec's array parser on a zero-copy view (its header slicing needs .decode)."""
    (n,) = struct.unpack_from("<B", data, 0)
    dtype_str = str(data[1 : 1 + n], "ascii")
    (ndim,) = struct.unpack_from("<B", data, 1 + n)
    shape = struct.unpack_from(f"<{ndim}q", data, 2 + n)
    dtype = np.dtype(dtype_str)
    offset = 2 + n + 8 * ndim
    count = math.prod(shape)
    if count * dtype.itemsize != len(data) - offset:
        raise ValueError("bad payload")
    return np.frombuffer(data, dtype, count, offset).reshape(shape)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is np.ndarray and isinstance(obj, np.ndarray):
        return obj
    raise TypeError(f"expected a numpy array, got {type(obj).__name__}")


ENV = msgspec.msgpack.Decoder(MEnvelope)
BODY: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "groups": msgspec.msgpack.Decoder(MGroups, ext_hook=_ext, dec_hook=_dec_hook),
    "credit_request": msgspec.msgpack.Decoder(MCreditRequest),
}


def msgspec_decode(data: bytes) -> Any:
    if len(data) > MAX:
        raise ValueError("oversized")
    env = ENV.decode(data)
    if env.v != 2:
        raise ValueError("bad_version")
    return BODY[env.t].decode(env.b)


# ---------------------------------------------------------------- pydantic
PArr = Annotated[Any, pydantic.PlainValidator(lambda a: a)]
PId = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=256)]
STRICT = pydantic.ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)


class PSample(pydantic.BaseModel):
    model_config = STRICT
    tokens: PArr
    logprobs: PArr
    versions: PArr
    reward: pydantic.FiniteFloat
    correct: bool
    truncated: bool
    advantage: pydantic.FiniteFloat
    loss_weight: Annotated[float, pydantic.Field(ge=0.0, allow_inf_nan=False)]

    @pydantic.model_validator(mode="after")
    def _arrays(self) -> PSample:
        _check_array(self.tokens, "int32", nonneg=True)
        _check_array(self.logprobs, "float32", finite=True)
        _check_array(self.versions, "int32", nonneg=True)
        if not len(self.tokens) == len(self.logprobs) == len(self.versions):
            raise ValueError("equal lengths")
        return self


class PGroup(pydantic.BaseModel):
    model_config = STRICT
    group_id: PId
    prompt_id: PId
    generator_id: PId
    gold: str
    prompt_tokens: PArr
    created_at: Annotated[float, pydantic.Field(ge=0.0)]
    samples: Annotated[list[PSample], pydantic.Field(min_length=1, max_length=1024)]

    @pydantic.model_validator(mode="after")
    def _arrays(self) -> PGroup:
        _check_array(self.prompt_tokens, "int32", nonneg=True)
        return self


class PGroups(pydantic.BaseModel):
    model_config = STRICT
    generator_id: PId
    groups: list[PGroup]
    filtered_total: Annotated[int, pydantic.Field(ge=0, le=1 << 53)] = 0


class PCreditRequest(pydantic.BaseModel):
    model_config = STRICT
    generator_id: PId
    want: Annotated[int, pydantic.Field(ge=0)]


PBODY: dict[str, type[pydantic.BaseModel]] = {"groups": PGroups, "credit_request": PCreditRequest}


def _msgpack_ext(code: int, data: bytes) -> np.ndarray:
    return _unpack_array(code, data)


def pydantic_decode(data: bytes) -> Any:
    if len(data) > MAX:
        raise ValueError("oversized")
    env = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_msgpack_ext, max_map_len=64)
    if env["v"] != 2 or set(env) - {"id"} != {"v", "t", "b"}:
        raise ValueError("envelope")
    return PBODY[env["t"]].model_validate(env["b"])


def _sample_map(rng: np.random.Generator, tokens: int, i: int) -> dict[str, Any]:
    return {
        "tokens": rng.integers(0, 150_000, tokens, dtype=np.int32),
        "logprobs": -rng.random(tokens, dtype=np.float32) * 5,
        "versions": np.full(tokens, 7, dtype=np.int32),
        "reward": 1.0 if i % 2 else -1.0,
        "correct": bool(i % 2),
        "truncated": False,
        "advantage": 1.0 if i % 2 else -1.0,
        "loss_weight": 1.0,
    }


def _groups(n_groups: int, tokens: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    groups = [
        {
            "group_id": f"{k:032x}",
            "prompt_id": "p-0",
            "generator_id": "gen-0",
            "gold": "42",
            "prompt_tokens": rng.integers(0, 150_000, 512, dtype=np.int32),
            "created_at": 1.7e9,
            "samples": [_sample_map(rng, tokens, i) for i in range(16)],
        }
        for k in range(n_groups)
    ]
    return pack_value({"v": SCHEMA_VERSION, "t": "groups", "b": {"generator_id": "gen-0", "groups": groups}})


def measure(repeats: int) -> list[dict[str, Any]]:
    cases = {
        "groups 1x16x1k": _groups(1, 1024),
        "groups 1x16x16k": _groups(1, 16 * 1024),
        "groups 8x16x64": _groups(8, 64),
        "credit_request": pack_value(
            {"v": SCHEMA_VERSION, "t": "credit_request", "b": {"generator_id": "gen-0", "want": 4}}
        ),
    }
    impls = {
        "tree": lambda d: decode(d, max_bytes=MAX),
        "msgspec": msgspec_decode,
        "pydantic": pydantic_decode,
    }
    for data in cases.values():  # every implementation accepts every case
        for fn in impls.values():
            fn(data)
    rows = []
    for name, data in cases.items():
        count = min(20_000, max(20, int(2e7 // len(data))))  # ~20 MB or 20+ messages per repeat

        def rounds(fn: Any, data: bytes = data, count: int = count) -> Any:
            def run() -> float:
                start = time.perf_counter()
                for _ in range(count):
                    fn(data)
                return count / (time.perf_counter() - start)

            return run

        rates = interleave({k: rounds(fn) for k, fn in impls.items()}, repeats, warmup=1)
        for impl, values in rates.items():
            s = summary(values)
            rows.append(
                {
                    "case": name,
                    "message_bytes": len(data),
                    "implementation": impl,
                    "msgs_per_s": round(s["median"]),
                    "min": round(s["min"]),
                    "max": round(s["max"]),
                    "vs_tree": round(paired_ratio(values, rates["tree"]), 2),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None, help="merge the rows into this file")
    parser.add_argument("--label", default="this tree", help="names the tree measured in the rows")
    args = parser.parse_args()
    rows = [{"tree": args.label, **row} for row in measure(args.repeats)]
    versions = f"msgspec {msgspec.__version__}, pydantic {pydantic.__version__}, msgpack {msgpack.version}"
    print(f"{versions}; {args.repeats} interleaved repeats; msgs/s median [min, max] (paired ratio vs tree)")
    for r in rows:
        print(
            f"{r['tree']:<10} {r['case']:<16} {r['message_bytes']:>8} B  {r['implementation']:<9}"
            f"{r['msgs_per_s']:>9} [{r['min']}, {r['max']}]  ({r['vs_tree']}x)"
        )
    if args.json is not None:
        old = json.loads(args.json.read_text()) if args.json.is_file() else {}
        kept = [r for r in old.get("rows", []) if r.get("tree") != args.label]
        out = {
            "repeats": args.repeats,
            "versions": versions,
            "machine": {k: v for k, v in machine_info().items() if k in ("cpu_model", "cpu_count", "python")},
            "rows": kept + rows,
        }
        save_json(args.json, out, indent=1)


if __name__ == "__main__":
    main()

"""Bytes <-> messages: msgpack with a schema version, numpy arrays as raw bytes, never pickle.

Wire format of one message (a msgpack map, the "envelope")::

    {"v": SCHEMA_VERSION, "t": <message type>, "b": <body map>[, "id": <request id>]}

"id" (an int in [0, 2**63)) pairs a request with its reply: a client sends it with a request, the
server copies it into the reply, and the client drops replies that name another id (a late answer
to an attempt it gave up on). A retried request keeps its id, so a server can recognise it and
answer it the way it answered the first copy. One-way messages carry none.

numpy arrays travel as msgpack ExtType code `EXT_NDARRAY` with this payload (little-endian)::

    u8  n            length of the dtype string
    n   bytes        numpy dtype string, e.g. b"<i4", b"<f4", b"|b1" (must be in ALLOWED_DTYPES)
    u8  ndim         0..MAX_NDIM
    i64 x ndim       shape (negative dims are rejected)
    ...              the elements, C order, exactly prod(shape) * itemsize bytes

bfloat16 is not a numpy dtype: send it as uint16 holding the raw bits and reinterpret on the
receiving side (``torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)``); "|u1"/"<i2" keep
the bits. Decoded arrays are read-only views of the received buffer: copy before mutating.

`decode` checks, in order: the size (before any parsing), the envelope and its version, the
message type, then decodes the body straight into its struct in `messages.MESSAGES` (msgspec:
msgpack syntax, array payloads and every rule the struct declares, in one pass; a declared type
bounds every length the decoder allocates). Every failure is a `CodecError` whose `reason` is one
of `REASONS`, short enough to be a metric label. `pack_value` / `unpack_value` are the schema-less
layer (the buffer journal): the same msgpack and array encoding, via msgpack-python, with explicit
limits on what the unpacker allocates.

`wire_bytes` estimates a group's encoded size from its arrays and strings, for batch size budgets.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import msgspec
import numpy as np

from stream_dapo.transport.messages import MESSAGES, Body, Group, decoding, schema_error
from stream_dapo.transport.messages import dec_hook as _dec_hook

SCHEMA_VERSION: Final = 2
"""Bump on any incompatible change to the envelope, the array encoding or a message schema."""

EXT_NDARRAY: Final = 1
MAX_NDIM: Final = 4

ALLOWED_DTYPES: Final = frozenset(
    np.dtype(name).newbyteorder("<").str
    for name in ("int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64", "bool")
)

# Limits on what the unpacker will allocate, independent of the total size: no body needs
# more than a few dozen keys per map, and a list of a million entries is already a bug.
MAX_STR_LEN: Final = 1 << 20
MAX_ARRAY_LEN: Final = 1 << 20
MAX_MAP_LEN: Final = 64

MAX_REQUEST_ID: Final = (1 << 63) - 1
REASONS: Final = ("oversized", "malformed", "bad_version", "unknown_type", "bad_schema", "bad_array")


class CodecError(ValueError):
    """A message could not be encoded or decoded.

    `reason` is one of REASONS (use it as a metric label); `detail` says what and how to fix it.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Message:
    """A decoded, validated message: `body` is an instance of `messages.MESSAGES[type]`."""

    type: str
    body: Any
    """The message's struct (`messages.Credit`, ...): read its fields, `msg.body.granted`."""
    request_id: int | None = None
    """The envelope's "id": set on requests and on the replies that answer them."""


# --------------------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------------------


def _array_payload(arr: np.ndarray) -> bytes:
    le = arr.dtype.newbyteorder("<") if arr.dtype.byteorder != "|" else arr.dtype
    if le.str not in ALLOWED_DTYPES:
        raise CodecError(
            "bad_array",
            f"dtype {arr.dtype} cannot be sent; allowed: {sorted(ALLOWED_DTYPES)} (bfloat16: send .view(uint16))",
        )
    if arr.ndim > MAX_NDIM:
        raise CodecError("bad_array", f"arrays have at most {MAX_NDIM} dimensions, got shape {arr.shape}")
    # No-op for the common case (native little-endian, C-contiguous); otherwise one copy.
    data = np.ascontiguousarray(arr, dtype=le)
    dtype_str = le.str.encode("ascii")
    header = struct.pack(f"<B{len(dtype_str)}sB{arr.ndim}q", len(dtype_str), dtype_str, arr.ndim, *arr.shape)
    # bytes.join copies the elements once, straight from the array's buffer.
    return b"".join((header, data.reshape(-1).view(np.uint8).data))


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_NDARRAY, _array_payload(arr))


class _ExtError(Exception):
    """Raised inside the unpacker's ext_hook; msgpack propagates it unchanged."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_VECTOR_HEADERS: Final = {
    struct.pack("<B3sB", 3, name.encode("ascii"), 1): np.dtype(name)
    for name in ALLOWED_DTYPES
    if len(name) == 3
}
"""The first 5 header bytes of a 1-d array of each allowed dtype (all of whose names have 3
characters) except bool: the common case, parsed with one lookup."""
_VECTOR_HEADERS.pop(b"\x03|b1\x01", None)


def _unpack_array(code: int, payload: bytes | memoryview) -> np.ndarray:
    """An array from its ext payload: bytes (msgpack) or a view of the received message (msgspec,
    no copy). The array is read-only either way."""
    if code != EXT_NDARRAY:
        raise _ExtError("malformed", f"unknown msgpack ext type {code}; only {EXT_NDARRAY} (ndarray) is used")
    dtype = _VECTOR_HEADERS.get(bytes(payload[:5]))
    if dtype is not None and len(payload) >= 13:
        (length,) = struct.unpack_from("<q", payload, 5)
        if length >= 0 and length * dtype.itemsize == len(payload) - 13:
            arr = np.frombuffer(payload, dtype, length, 13)
            if arr.flags.writeable:  # a view of a writable buffer the caller passed in
                arr.flags.writeable = False
            return arr
    try:
        (n,) = struct.unpack_from("<B", payload, 0)
        dtype_str = str(payload[1 : 1 + n], "ascii")
        (ndim,) = struct.unpack_from("<B", payload, 1 + n)
        if ndim > MAX_NDIM:
            raise _ExtError("bad_array", f"array has {ndim} dimensions, at most {MAX_NDIM} allowed")
        shape = struct.unpack_from(f"<{ndim}q", payload, 2 + n)
    except (struct.error, UnicodeDecodeError) as e:
        raise _ExtError("bad_array", f"truncated or corrupt array header: {e}") from None
    if dtype_str not in ALLOWED_DTYPES:
        raise _ExtError("bad_array", f"dtype {dtype_str!r} is not allowed; allowed: {sorted(ALLOWED_DTYPES)}")
    if any(d < 0 for d in shape):
        raise _ExtError("bad_array", f"negative dimension in shape {shape}")
    dtype = np.dtype(dtype_str)
    offset = 2 + n + 8 * ndim
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != len(payload) - offset:
        raise _ExtError(
            "bad_array",
            f"shape {shape} of {dtype_str} needs {count * dtype.itemsize} bytes, payload has {len(payload) - offset}",
        )
    if dtype.kind == "b" and count and np.frombuffer(payload, np.uint8, count, offset).max() > 1:
        # numpy would happily hold bool bytes other than 0/1, with undefined comparisons.
        raise _ExtError("bad_array", "bool array holds bytes other than 0 and 1")
    arr = np.frombuffer(payload, dtype, count, offset).reshape(shape)
    arr.flags.writeable = False
    return arr


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    raise TypeError(f"cannot encode {type(obj).__module__}.{type(obj).__qualname__}")


# --------------------------------------------------------------------------------------------
# Schema-less layer: msgpack + arrays, with limits. Also usable for spilling to disk.
# --------------------------------------------------------------------------------------------


# A Packer per thread, reused: msgpack.packb allocates a fresh 256 KiB buffer per call, which
# costs more than packing a 200 KB message into a warm one (~170 us vs ~10 us measured).
# Packers are not thread-safe, hence thread-local. After a large message (a weight chunk) the
# packer is dropped so its grown buffer is not held for the life of the thread.
_KEEP_PACKER_BELOW = 8 << 20
_packers = threading.local()


def pack_value(obj: Any) -> bytes:
    """msgpack-encode maps, lists, str, bytes, int, float, bool, None and numpy arrays."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
    try:
        # On error the Packer discards what it had written (autoreset), so it stays reusable.
        data: bytes = packer.pack(obj)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError("bad_schema", f"cannot encode value: {e}") from None
    if len(data) >= _KEEP_PACKER_BELOW:
        _packers.packer = None
    return data


def _size(data: bytes | bytearray | memoryview) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


def _oversized(n: int, max_bytes: int) -> CodecError:
    return CodecError(
        "oversized",
        f"message of {n} bytes exceeds the limit of {max_bytes} bytes; raise max_bytes on the "
        "receiving endpoint or send smaller messages (fewer groups per message, smaller weight chunks)",
    )


def unpack_value(data: bytes | bytearray | memoryview, *, max_bytes: int) -> Any:
    """Inverse of `pack_value`. Checks the size first, then parses under explicit limits."""
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    n = _size(data)
    if n > max_bytes:
        raise _oversized(n, max_bytes)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_unpack_array,
            max_bin_len=max_bytes,
            max_ext_len=max_bytes,
            max_str_len=min(MAX_STR_LEN, max_bytes),
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=MAX_MAP_LEN,
        )
    except _ExtError as e:
        raise CodecError(e.reason, e.detail) from None
    # ValueError covers msgpack's FormatError, StackError, ExtraData, limit and truncation errors,
    # and UnicodeDecodeError; UnpackException covers the rest of msgpack's own.
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise CodecError("malformed", f"not a valid msgpack message ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgspec.msgpack.Ext(EXT_NDARRAY, _array_payload(obj))
    raise TypeError(f"cannot encode {type(obj).__module__}.{type(obj).__qualname__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    t: Any
    b: msgspec.Raw
    id: Any = None


class _VersionOnly(msgspec.Struct):
    v: Any = None


_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)
_VERSION_ONLY = msgspec.msgpack.Decoder(_VersionOnly)
_BODIES = {
    name: msgspec.msgpack.Decoder(cls, ext_hook=_unpack_array, dec_hook=_dec_hook)
    for name, cls in MESSAGES.items()
}


def _message_class(msg_type: Any) -> type[Body]:
    if not isinstance(msg_type, str):
        raise CodecError("malformed", f"message type must be a string, got {type(msg_type).__name__}")
    try:
        return MESSAGES[msg_type]
    except KeyError:
        raise CodecError(
            "unknown_type",
            f"unknown message type {msg_type[:64]!r}; known: {sorted(MESSAGES)}. "
            "Are both sides running the same stream-dapo release?",
        ) from None


def _check_request_id(request_id: Any) -> None:
    if (
        not isinstance(request_id, int)
        or isinstance(request_id, bool)
        or not 0 <= request_id <= MAX_REQUEST_ID
    ):
        raise CodecError("malformed", f"request id must be an int in [0, 2**63), got {request_id!r}")


def encode(body: Body, request_id: int | None = None) -> bytes:
    """Encode one message (the struct says its type). Structs checked themselves when they were
    built, so a sender bug has already failed at the sender, naming the field."""
    if not isinstance(body, Body):
        raise CodecError(
            "unknown_type",
            f"expected a message struct from stream_dapo.transport.messages, got {type(body)!r}",
        )
    env: dict[str, Any] = {"v": SCHEMA_VERSION, "t": body.TYPE, "b": body}
    if request_id is not None:
        _check_request_id(request_id)
        env["id"] = request_id
    try:
        return _ENCODER.encode(env)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError("bad_schema", f"cannot encode {body.TYPE}: {e}") from None


def _envelope(data: bytes | bytearray | memoryview) -> _Envelope:
    try:
        return _ENVELOPE.decode(data)
    except msgspec.ValidationError as e:  # before DecodeError, its base class
        try:  # a peer of another version may also use another envelope: say so first
            version = _VERSION_ONLY.decode(data).v
        except (msgspec.DecodeError, RecursionError):
            version = None
        if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
            raise _bad_version(version) from None
        raise CodecError(
            "malformed",
            f"envelope must be a map with keys 'v' (int), 't', 'b' and optionally 'id' ({e})",
        ) from None
    except (msgspec.DecodeError, RecursionError) as e:
        raise CodecError("malformed", f"not a valid msgpack message ({type(e).__name__}: {e})") from None


def _bad_version(version: int) -> CodecError:
    return CodecError(
        "bad_version",
        f"peer speaks schema version {version}, this process speaks {SCHEMA_VERSION}; "
        "upgrade the older side so both run the same stream-dapo release",
    )


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int) -> Message:
    """Decode and validate one message; raise CodecError with a reason from REASONS.

    The body's arrays are read-only views of `data` (no copy), which they keep alive."""
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    n = _size(data)
    if n > max_bytes:
        raise _oversized(n, max_bytes)
    env = _envelope(data)
    if env.v != SCHEMA_VERSION:
        raise _bad_version(env.v)
    if env.id is not None:
        _check_request_id(env.id)
    msg_type = env.t
    decoder = _BODIES[_message_class(msg_type).TYPE]
    try:
        with decoding:
            body = decoder.decode(env.b)
    except _ExtError as e:
        raise CodecError(e.reason, e.detail) from None
    except msgspec.ValidationError as e:  # before DecodeError, its base class
        if "- at `key` in `" in str(e):  # a map key that is not a string: not msgpack we speak
            raise CodecError("malformed", f"map keys must be strings ({e})") from None
        raise CodecError("bad_schema", str(schema_error(e, msg_type))) from None
    except (msgspec.DecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise CodecError("malformed", f"not a valid msgpack message ({type(e).__name__}: {e})") from None
    return Message(msg_type, body, env.id)


# --------------------------------------------------------------------------------------------
# Size estimate
# --------------------------------------------------------------------------------------------

_WIRE_OVERHEAD_PER_SAMPLE = 160
"""msgpack keys, scalars and three array headers of one sample, rounded up."""
_WIRE_OVERHEAD_PER_GROUP = 256


def wire_bytes(group: Group) -> int:
    """An upper estimate of a group's encoded size: its array bytes plus per-field overhead.
    Used to keep a batch under the learner's message size limit."""
    arrays = group.prompt_tokens.nbytes + sum(
        s.tokens.nbytes + s.logprobs.nbytes + s.versions.nbytes for s in group.samples
    )
    strings = sum(len(x.encode()) for x in (group.group_id, group.prompt_id, group.generator_id, group.gold))
    return _WIRE_OVERHEAD_PER_GROUP + strings + arrays + _WIRE_OVERHEAD_PER_SAMPLE * len(group.samples)

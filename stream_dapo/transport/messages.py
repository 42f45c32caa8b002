"""The protocol between services: message schemas, one validator, and typed builders.

Every message body is a plain map checked against a declarative schema in `SCHEMAS`
(message type -> `Struct`). The specs below (`Int`, `Float`, `Array`, `ListOf`, `Struct`, ...)
each know how to check one value; `Struct.check` walks a body field by field, so adding a
message type means adding one entry to `SCHEMAS`, not writing a validator.

Bodies are strict: a missing field, an unknown field, or a value of the wrong type is an
error. Both sides of a connection run the same `SCHEMA_VERSION` (see `codec.py`), so an
unknown field is a bug in the sender, not a newer peer.

Samples travel as whole groups (`Group`), the unit of admission, acknowledgement, dedup
and training. `Sample` and `Group` are the typed views the generator, buffer and learner
work with; `to_wire()` / `from_wire()` convert to and from message bodies.

Message flow (DEALER client -> ROUTER server):

    generator -> buffer   "samples" socket   hello, credit_request, groups,  -> credit, ack,
                                              heartbeat                          lease
    learner   -> buffer   "batches" socket   learner_hello, batch_request,
                                              commit                          -> batch, empty
    generator -> learner  "weights" socket   weights_query, chunk_request     -> weights_manifest,
                                                                                 chunk, not_available
    anyone                                   error
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Body = dict[str, Any]
"""A message body: a map from field name to value, as `encode` takes it and `decode` returns it."""

Outgoing = tuple[str, Body]
"""(message type, body), what the builders below return: `endpoint.send(*hello("g0", 3))`."""


class SchemaError(ValueError):
    """A value does not match its schema. `path` locates it, e.g. ``groups[2].samples[0].tokens``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# --------------------------------------------------------------------------------------------
# Field specs: each checks one value and raises SchemaError naming the path.
# --------------------------------------------------------------------------------------------


class Spec:
    """A schema node. Subclasses check one kind of value."""

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    """A Python int (bool is rejected: True is not a version number)."""

    min: int | None = None
    max: int | None = None

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaError(path, f"expected int, got {_type_name(value)}")
        if self.min is not None and value < self.min:
            raise SchemaError(path, f"must be >= {self.min}, got {value}")
        if self.max is not None and value > self.max:
            raise SchemaError(path, f"must be <= {self.max}, got {value}")


@dataclass(frozen=True)
class Float(Spec):
    """A float (an int is accepted; msgpack keeps 1.0 a float, but builders may pass 1).

    Non-finite values are rejected by default: one NaN advantage poisons a whole batch.
    """

    min: float | None = None
    max: float | None = None
    finite: bool = True

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (float, int)) or isinstance(value, bool):
            raise SchemaError(path, f"expected float, got {_type_name(value)}")
        if self.finite and not math.isfinite(value):
            raise SchemaError(path, f"must be finite, got {value}")
        if self.min is not None and value < self.min:
            raise SchemaError(path, f"must be >= {self.min}, got {value}")
        if self.max is not None and value > self.max:
            raise SchemaError(path, f"must be <= {self.max}, got {value}")


@dataclass(frozen=True)
class Bool(Spec):
    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise SchemaError(path, f"expected bool, got {_type_name(value)}")


@dataclass(frozen=True)
class Str(Spec):
    min_len: int = 0
    max_len: int | None = None
    pattern: str | None = None
    """A regular expression the whole string must match."""
    choices: tuple[str, ...] | None = None

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise SchemaError(path, f"expected str, got {_type_name(value)}")
        if len(value) < self.min_len:
            raise SchemaError(path, f"must have at least {self.min_len} characters, got {len(value)}")
        if self.max_len is not None and len(value) > self.max_len:
            raise SchemaError(path, f"must have at most {self.max_len} characters, got {len(value)}")
        if self.pattern is not None and re.fullmatch(self.pattern, value) is None:
            raise SchemaError(path, f"must match {self.pattern!r}, got {value[:80]!r}")
        if self.choices is not None and value not in self.choices:
            raise SchemaError(path, f"must be one of {list(self.choices)}, got {value[:80]!r}")


@dataclass(frozen=True)
class Bytes(Spec):
    """Raw bytes. bytearray and memoryview are accepted for sending (weight chunks are slices
    of one large buffer); `decode` always yields bytes."""

    max_len: int | None = None

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SchemaError(path, f"expected bytes, got {_type_name(value)}")
        n = value.nbytes if isinstance(value, memoryview) else len(value)
        if self.max_len is not None and n > self.max_len:
            raise SchemaError(path, f"must have at most {self.max_len} bytes, got {n}")


@dataclass(frozen=True)
class Array(Spec):
    """A numpy array of one dtype and number of dimensions.

    Byte order is not checked here: the codec sends little-endian and converts on the way out.
    """

    dtype: str
    ndim: int
    min_size: int = 0
    finite: bool = False
    nonnegative: bool = False

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, np.ndarray):
            raise SchemaError(path, f"expected a numpy {self.dtype} array, got {_type_name(value)}")
        want = np.dtype(self.dtype)
        got = value.dtype
        if got.kind != want.kind or got.itemsize != want.itemsize:
            raise SchemaError(
                path, f"expected dtype {self.dtype}, got {got}; convert with .astype(np.{self.dtype})"
            )
        if value.ndim != self.ndim:
            raise SchemaError(path, f"expected {self.ndim}-d array, got shape {value.shape}")
        if value.size < self.min_size:
            raise SchemaError(path, f"must have at least {self.min_size} elements, got {value.size}")
        if value.size == 0:
            return
        if self.finite and not bool(np.isfinite(value).all()):
            raise SchemaError(path, "must be finite everywhere, found NaN or inf")
        if self.nonnegative and value.min() < 0:
            raise SchemaError(path, f"must be >= 0 everywhere, found {value.min()}")


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec
    min_len: int = 0
    max_len: int | None = None

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):
            raise SchemaError(path, f"expected list, got {_type_name(value)}")
        if len(value) < self.min_len:
            raise SchemaError(path, f"must have at least {self.min_len} items, got {len(value)}")
        if self.max_len is not None and len(value) > self.max_len:
            raise SchemaError(path, f"must have at most {self.max_len} items, got {len(value)}")
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]")


Check = Callable[[Mapping[str, Any]], str | None]
"""A cross-field rule on a struct whose fields already passed: returns a problem or None."""


@dataclass(frozen=True)
class Struct(Spec):
    """A map with exactly these fields, plus optional cross-field rules.

    Fields named in `optional` may be left out (a reader uses a documented default); all
    others are required.
    """

    name: str
    fields: Mapping[str, Spec]
    checks: tuple[Check, ...] = ()
    optional: frozenset[str] = frozenset()

    def check(self, value: Any, path: str, *, skip: frozenset[str] = frozenset()) -> None:
        """Check `value`; fields named in `skip` must be present but are not walked."""
        if not isinstance(value, Mapping):
            raise SchemaError(path, f"expected a {self.name} map, got {_type_name(value)}")
        missing = [k for k in self.fields if k not in value and k not in self.optional]
        if missing:
            raise SchemaError(path, f"{self.name} is missing field(s) {missing}")
        extra = [k for k in value if k not in self.fields]
        if extra:
            raise SchemaError(
                path,
                f"{self.name} has unknown field(s) {sorted(map(repr, extra))}; allowed: {list(self.fields)}",
            )
        for key, spec in self.fields.items():
            if key not in skip and key in value:
                spec.check(value[key], f"{path}.{key}")
        for rule in self.checks:
            problem = rule(value)
            if problem is not None:
                raise SchemaError(path, problem)


# --------------------------------------------------------------------------------------------
# The schemas.
# --------------------------------------------------------------------------------------------

MAX_SAMPLES_PER_GROUP = 1024
MAX_FILTERED_TOTAL = 1 << 53
"""Bound on `filtered_total`, the credits one generator process has spent without a group reaching
the buffer. It keeps a corrupt count from pushing the buffer's counters past what its journal can
store (msgpack integers end at 2**64 - 1)."""

ID = Str(min_len=1, max_len=256)
VERSION = Int(min=0)
COUNT = Int(min=0)
REASON = Str(min_len=1, max_len=128)
DETAIL = Str(max_len=8192)


def _equal_lengths(sample: Mapping[str, Any]) -> str | None:
    lengths = {k: len(sample[k]) for k in ("tokens", "logprobs", "versions")}
    if len(set(lengths.values())) != 1:
        return f"tokens, logprobs and versions must have equal lengths, got {lengths}"
    return None


def _chunk_count(manifest: Mapping[str, Any]) -> str | None:
    want = -(-manifest["total_bytes"] // manifest["chunk_bytes"])
    if manifest["num_chunks"] != want:
        return f"num_chunks must be ceil(total_bytes / chunk_bytes) = {want}, got {manifest['num_chunks']}"
    return None


ROLLOUT_FIELDS = ("mixed", "all_correct", "all_wrong", "samples", "correct", "truncated", "response_tokens")
"""A generator's rollout tally: groups finished by dynamic-sampling outcome (`FilterReason` values),
then samples, correct samples, truncated samples and response tokens."""
ROLLOUTS = Struct("rollouts", dict.fromkeys(ROLLOUT_FIELDS, Int(min=0, max=MAX_FILTERED_TOTAL)))

SAMPLE = Struct(
    "Sample",
    {
        "tokens": Array("int32", 1, min_size=1, nonnegative=True),
        "logprobs": Array("float32", 1, min_size=1, finite=True),
        "versions": Array("int32", 1, min_size=1, nonnegative=True),
        "reward": Float(),
        "correct": Bool(),
        "truncated": Bool(),
        "advantage": Float(),
        "loss_weight": Float(min=0.0),
    },
    checks=(_equal_lengths,),
)

GROUP = Struct(
    "Group",
    {
        "group_id": ID,
        "prompt_id": ID,
        "generator_id": ID,
        "gold": Str(),
        "prompt_tokens": Array("int32", 1, min_size=1, nonnegative=True),
        "created_at": Float(min=0.0),
        "samples": ListOf(SAMPLE, min_len=1, max_len=MAX_SAMPLES_PER_GROUP),
    },
)

# Message type names. Compare `msg.type` against these rather than string literals.
HELLO = "hello"
CREDIT_REQUEST = "credit_request"
GROUPS = "groups"
HEARTBEAT = "heartbeat"
CREDIT = "credit"
ACK = "ack"
LEASE = "lease"
LEARNER_HELLO = "learner_hello"
BATCH_REQUEST = "batch_request"
COMMIT = "commit"
BATCH = "batch"
EMPTY = "empty"
WEIGHTS_QUERY = "weights_query"
WEIGHTS_MANIFEST = "weights_manifest"
CHUNK_REQUEST = "chunk_request"
CHUNK = "chunk"
NOT_AVAILABLE = "not_available"
ERROR = "error"

WEIGHT_FORMATS = ("safetensors",)

SCHEMAS: dict[str, Struct] = {
    # generator -> buffer
    HELLO: Struct(HELLO, {"generator_id": ID, "policy_version": VERSION}),
    CREDIT_REQUEST: Struct(CREDIT_REQUEST, {"generator_id": ID, "want": COUNT}),
    # `filtered_total` (optional): credits this generator process has spent since its hello
    # without a group reaching the buffer (dynamic sampling dropped it, it was aborted, or it was
    # unused at shutdown). A running total, not a delta: a lost or repeated message loses or
    # doubles nothing, the next one carries the total again. May come with an empty `groups`.
    GROUPS: Struct(
        GROUPS,
        {
            "generator_id": ID,
            "groups": ListOf(GROUP),
            "filtered_total": Int(min=0, max=MAX_FILTERED_TOTAL),
            "rollouts": ROLLOUTS,
        },
        optional=frozenset({"filtered_total", "rollouts"}),
    ),
    # Every generator.heartbeat_s: the generator is alive, so its credits stay leased to it.
    # `rollouts` (optional, also in `groups`): the generator's running rollout tally since its
    # hello (statistics for tracking, not state: the buffer sums the increases and hands the sum to
    # the learner).
    HEARTBEAT: Struct(
        HEARTBEAT,
        {"generator_id": ID, "filtered_total": Int(min=0, max=MAX_FILTERED_TOTAL), "rollouts": ROLLOUTS},
        optional=frozenset({"rollouts"}),
    ),
    # buffer -> generator
    CREDIT: Struct(CREDIT, {"granted": COUNT, "learner_version": VERSION}),
    # The answer to a heartbeat: credits the buffer counts as this generator's, and whether they
    # expired since it last heard from it (then the generator must drop the credits it holds).
    LEASE: Struct(LEASE, {"credits": COUNT, "expired": Bool(), "learner_version": VERSION}),
    ACK: Struct(
        ACK,
        {
            "accepted": ListOf(ID),
            "duplicates": ListOf(ID),
            "rejected": ListOf(Struct("rejection", {"group_id": ID, "reason": REASON})),
        },
    ),
    # learner -> buffer
    LEARNER_HELLO: Struct(LEARNER_HELLO, {"learner_version": VERSION, "committed_through": VERSION}),
    BATCH_REQUEST: Struct(
        BATCH_REQUEST, {"learner_version": VERSION, "max_groups": Int(min=1), "max_tokens": COUNT}
    ),
    COMMIT: Struct(COMMIT, {"learner_version": VERSION, "group_ids": ListOf(ID)}),
    # buffer -> learner
    # `rollouts` (optional): every generator's rollout tally summed since the buffer started.
    BATCH: Struct(
        BATCH,
        {"groups": ListOf(GROUP), "dropped_stale": COUNT, "rollouts": ROLLOUTS},
        optional=frozenset({"rollouts"}),
    ),
    EMPTY: Struct(EMPTY, {"reason": REASON}),
    # generator <-> learner weights
    WEIGHTS_QUERY: Struct(WEIGHTS_QUERY, {"have_version": VERSION}),
    WEIGHTS_MANIFEST: Struct(
        WEIGHTS_MANIFEST,
        {
            "version": VERSION,
            "checksum": Str(pattern=r"[0-9a-f]{64}"),
            "total_bytes": COUNT,
            "chunk_bytes": Int(min=1),
            "num_chunks": COUNT,
            "format": Str(choices=WEIGHT_FORMATS),
        },
        checks=(_chunk_count,),
    ),
    CHUNK_REQUEST: Struct(CHUNK_REQUEST, {"version": VERSION, "index": COUNT}),
    CHUNK: Struct(CHUNK, {"version": VERSION, "index": COUNT, "data": Bytes()}),
    NOT_AVAILABLE: Struct(
        NOT_AVAILABLE, {"have_version": VERSION, "current_version": VERSION, "reason": REASON}
    ),
    # anyone
    ERROR: Struct(ERROR, {"reason": REASON, "detail": DETAIL}),
}


# --------------------------------------------------------------------------------------------
# Typed views of samples and groups.
# --------------------------------------------------------------------------------------------


def _as_array(value: Any, dtype: type[np.generic], path: str) -> np.ndarray:
    """Convert a sequence or array to a contiguous array of `dtype` without silent corruption:
    integers must fit int32, and floats are never turned into token ids."""
    arr = np.asarray(value)
    want = np.dtype(dtype)
    if arr.dtype == want:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return arr.astype(want)
    if want.kind == "i":
        if arr.dtype.kind not in "iu":
            raise SchemaError(path, f"expected integers, got dtype {arr.dtype}")
        info = np.iinfo(want)
        if arr.min() < info.min or arr.max() > info.max:
            raise SchemaError(path, f"values must fit in {want}, got range [{arr.min()}, {arr.max()}]")
    elif want.kind == "f" and arr.dtype.kind != "f":
        raise SchemaError(path, f"expected floats, got dtype {arr.dtype}")
    return arr.astype(want)


def _as_float(value: Any, path: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SchemaError(path, f"expected a number, got {_type_name(value)}")
    return float(value)


def _as_bool(value: Any, path: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SchemaError(path, f"expected bool, got {_type_name(value)}")
    return bool(value)


@dataclass(eq=False)
class Sample:
    """One response to a prompt, with what the learner needs to weigh each token.

    Arrays (all length L >= 1): `tokens` int32 response token ids, `logprobs` float32 behaviour
    log-probs from vLLM, `versions` int32 policy version that produced each token (it changes
    mid-sample when weights are swapped during generation). `loss_weight` is 0.0 when overlong
    filtering masks the sample. Lists and int64/float64 arrays are converted on construction;
    anything that does not fit raises SchemaError.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    reward: float
    correct: bool
    truncated: bool
    advantage: float
    loss_weight: float = 1.0

    def __post_init__(self) -> None:
        self.tokens = _as_array(self.tokens, np.int32, "Sample.tokens")
        self.logprobs = _as_array(self.logprobs, np.float32, "Sample.logprobs")
        self.versions = _as_array(self.versions, np.int32, "Sample.versions")
        self.reward = _as_float(self.reward, "Sample.reward")
        self.correct = _as_bool(self.correct, "Sample.correct")
        self.truncated = _as_bool(self.truncated, "Sample.truncated")
        self.advantage = _as_float(self.advantage, "Sample.advantage")
        self.loss_weight = _as_float(self.loss_weight, "Sample.loss_weight")
        SAMPLE.check(self.to_wire(), "Sample")

    def __len__(self) -> int:
        """Number of response tokens L."""
        return int(self.tokens.shape[0])

    def to_wire(self) -> Body:
        return {
            "tokens": self.tokens,
            "logprobs": self.logprobs,
            "versions": self.versions,
            "reward": self.reward,
            "correct": self.correct,
            "truncated": self.truncated,
            "advantage": self.advantage,
            "loss_weight": self.loss_weight,
        }

    @classmethod
    def from_wire(cls, d: Any, path: str = "Sample") -> Sample:
        """Validate a wire map strictly (exact dtypes, no conversion) and build a Sample."""
        SAMPLE.check(d, path)
        return cls._from_checked(d)

    @classmethod
    def _from_checked(cls, d: Mapping[str, Any]) -> Sample:
        # Skips __post_init__: `d` already passed SAMPLE, and re-checking every array of every
        # group on the receive path would double the validation cost for nothing.
        self = cls.__new__(cls)
        self.tokens, self.logprobs, self.versions = d["tokens"], d["logprobs"], d["versions"]
        self.reward, self.advantage = float(d["reward"]), float(d["advantage"])
        self.correct, self.truncated = d["correct"], d["truncated"]
        self.loss_weight = float(d["loss_weight"])
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return (
            _arrays_equal(self.tokens, other.tokens)
            and _arrays_equal(self.logprobs, other.logprobs)
            and _arrays_equal(self.versions, other.versions)
            and (self.reward, self.correct, self.truncated, self.advantage, self.loss_weight)
            == (other.reward, other.correct, other.truncated, other.advantage, other.loss_weight)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable; compare with ==, key groups by group_id


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


@dataclass(eq=False)
class Group:
    """All samples for one prompt (G responses): the unit the buffer admits, acks and trains.

    `group_id` is unique across the run (uuid4 hex); the buffer drops a resent group by it.
    `prompt_tokens` is int32 [P]; `created_at` is Unix time when generation started.
    """

    group_id: str
    prompt_id: str
    generator_id: str
    gold: str
    prompt_tokens: np.ndarray
    created_at: float
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt_tokens = _as_array(self.prompt_tokens, np.int32, "Group.prompt_tokens")
        self.created_at = _as_float(self.created_at, "Group.created_at")
        self.samples = list(self.samples)
        for i, s in enumerate(self.samples):
            if not isinstance(s, Sample):
                raise SchemaError(
                    f"Group.samples[{i}]", f"expected Sample, got {_type_name(s)}; build it with Sample(...)"
                )
        # Samples validated themselves on construction; check the group's own fields and count.
        GROUP.check(self._shallow(), "Group", skip=frozenset({"samples"}))
        n = len(self.samples)
        if not 1 <= n <= MAX_SAMPLES_PER_GROUP:
            raise SchemaError("Group.samples", f"must hold 1..{MAX_SAMPLES_PER_GROUP} samples, got {n}")

    def _shallow(self) -> Body:
        return {
            "group_id": self.group_id,
            "prompt_id": self.prompt_id,
            "generator_id": self.generator_id,
            "gold": self.gold,
            "prompt_tokens": self.prompt_tokens,
            "created_at": self.created_at,
            "samples": self.samples,
        }

    def to_wire(self) -> Body:
        d = self._shallow()
        d["samples"] = [s.to_wire() for s in self.samples]
        return d

    @classmethod
    def from_wire(cls, d: Any, path: str = "Group") -> Group:
        """Validate a wire map strictly (exact dtypes, no conversion) and build a Group.

        The Group shares the map's arrays; after `decode` they are read-only views.
        """
        GROUP.check(d, path)
        self = cls.__new__(cls)
        self.group_id, self.prompt_id, self.generator_id = d["group_id"], d["prompt_id"], d["generator_id"]
        self.gold, self.prompt_tokens = d["gold"], d["prompt_tokens"]
        self.created_at = float(d["created_at"])
        self.samples = [Sample._from_checked(s) for s in d["samples"]]
        return self

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def num_response_tokens(self) -> int:
        return sum(len(s) for s in self.samples)

    @property
    def num_tokens(self) -> int:
        """Tokens the learner processes for this group: each sample is a prompt+response sequence,
        so P * G + sum of response lengths. This is what a batch token budget counts."""
        return int(self.prompt_tokens.shape[0]) * len(self.samples) + self.num_response_tokens

    @property
    def min_version(self) -> int:
        """Oldest behaviour policy version of any token: what the staleness gate compares."""
        return min(int(s.versions.min()) for s in self.samples)

    @property
    def max_version(self) -> int:
        return max(int(s.versions.max()) for s in self.samples)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return (
            (self.group_id, self.prompt_id, self.generator_id, self.gold, self.created_at)
            == (other.group_id, other.prompt_id, other.generator_id, other.gold, other.created_at)
            and _arrays_equal(self.prompt_tokens, other.prompt_tokens)
            and self.samples == other.samples
        )

    __hash__ = None  # type: ignore[assignment]


def groups_from_body(body: Mapping[str, Any]) -> list[Group]:
    """The groups of a decoded `groups` or `batch` message, as Group objects."""
    return [Group.from_wire(g, f"groups[{i}]") for i, g in enumerate(body["groups"])]


# --------------------------------------------------------------------------------------------
# Builders: one per message type, so call sites get argument names and types checked.
# --------------------------------------------------------------------------------------------


def hello(generator_id: str, policy_version: int) -> Outgoing:
    return HELLO, {"generator_id": generator_id, "policy_version": policy_version}


def credit_request(generator_id: str, want: int) -> Outgoing:
    """`want`: how many groups the generator could start now."""
    return CREDIT_REQUEST, {"generator_id": generator_id, "want": want}


def groups(
    generator_id: str,
    items: Sequence[Group],
    filtered_total: int = 0,
    rollouts: Mapping[str, int] | None = None,
) -> Outgoing:
    """`filtered_total`: credits spent without a group since the generator's hello (a running
    total; each new one gives back a credit); sent only when non-zero. `rollouts`: the generator's
    rollout tally (as in `heartbeat`)."""
    body: Body = {"generator_id": generator_id, "groups": [g.to_wire() for g in items]}
    if filtered_total:
        body["filtered_total"] = filtered_total
    if rollouts is not None:
        body["rollouts"] = dict(rollouts)
    return GROUPS, body


def heartbeat(generator_id: str, filtered_total: int, rollouts: Mapping[str, int] | None = None) -> Outgoing:
    body: Body = {"generator_id": generator_id, "filtered_total": filtered_total}
    if rollouts is not None:
        body["rollouts"] = dict(rollouts)
    return HEARTBEAT, body


def lease(credits: int, expired: bool, learner_version: int) -> Outgoing:
    return LEASE, {"credits": credits, "expired": expired, "learner_version": learner_version}


def credit(granted: int, learner_version: int) -> Outgoing:
    return CREDIT, {"granted": granted, "learner_version": learner_version}


def ack(
    accepted: Sequence[str], duplicates: Sequence[str] = (), rejected: Sequence[tuple[str, str]] = ()
) -> Outgoing:
    """`rejected`: (group_id, reason) pairs."""
    return ACK, {
        "accepted": list(accepted),
        "duplicates": list(duplicates),
        "rejected": [{"group_id": gid, "reason": reason} for gid, reason in rejected],
    }


def learner_hello(learner_version: int, committed_through: int) -> Outgoing:
    """`committed_through`: the last version whose groups are in a checkpoint; the buffer requeues
    groups it leased to the learner after that."""
    return LEARNER_HELLO, {"learner_version": learner_version, "committed_through": committed_through}


def batch_request(learner_version: int, max_groups: int, max_tokens: int = 0) -> Outgoing:
    """`max_tokens`: token budget over `Group.num_tokens`; 0 means no budget."""
    return BATCH_REQUEST, {
        "learner_version": learner_version,
        "max_groups": max_groups,
        "max_tokens": max_tokens,
    }


def commit(learner_version: int, group_ids: Sequence[str]) -> Outgoing:
    """Groups durably trained, i.e. included in a checkpoint."""
    return COMMIT, {"learner_version": learner_version, "group_ids": list(group_ids)}


def batch(items: Sequence[Group], dropped_stale: int, rollouts: Mapping[str, int] | None = None) -> Outgoing:
    body: Body = {"groups": [g.to_wire() for g in items], "dropped_stale": dropped_stale}
    if rollouts is not None:
        body["rollouts"] = dict(rollouts)
    return BATCH, body


def empty(reason: str) -> Outgoing:
    return EMPTY, {"reason": reason}


def weights_query(have_version: int) -> Outgoing:
    return WEIGHTS_QUERY, {"have_version": have_version}


def weights_manifest(
    version: int, checksum: str, total_bytes: int, chunk_bytes: int, format: str = "safetensors"
) -> Outgoing:
    """`checksum`: sha256 hex of the full payload; `num_chunks` is derived."""
    return WEIGHTS_MANIFEST, {
        "version": version,
        "checksum": checksum,
        "total_bytes": total_bytes,
        "chunk_bytes": chunk_bytes,
        "num_chunks": -(-total_bytes // chunk_bytes) if chunk_bytes > 0 else 0,
        "format": format,
    }


def chunk_request(version: int, index: int) -> Outgoing:
    return CHUNK_REQUEST, {"version": version, "index": index}


def chunk(version: int, index: int, data: bytes | bytearray | memoryview) -> Outgoing:
    return CHUNK, {"version": version, "index": index, "data": data}


def not_available(have_version: int, current_version: int, reason: str) -> Outgoing:
    return NOT_AVAILABLE, {"have_version": have_version, "current_version": current_version, "reason": reason}


def error(reason: str, detail: str) -> Outgoing:
    return ERROR, {"reason": reason, "detail": detail}

"""The protocol between services: every message declared once, as a msgspec `Struct`.

A declaration is the whole schema. Its fields and their annotations give the msgpack map on the
wire (field names in declaration order), the typed decoder (`codec.decode` returns the struct,
receivers read `msg.body.granted`, never a string key), the encoder, and equality. What msgspec's
`Meta` constraints cannot say is written once as an annotation too: `Vector` for a numpy array
field (exact dtype from the annotation, 1-d, a minimum size, finite or non-negative everywhere),
`FINITE` for a float that must be finite, and `_cross_check` for a rule between fields.

Bodies are strict: a missing field, an unknown field, or a value of the wrong type is an error.
Both sides of a connection run the same `SCHEMA_VERSION` (see `codec.py`), so an unknown field is
a bug in the sender, not a newer peer. A struct is checked where it is made: decoded ones by the
decoder, built ones (`Sample(...)`, `Hello(...)`) on construction, which also converts what can be
converted exactly (lists and wider ints to int32 arrays, ints to floats) and raises `SchemaError`
naming the field for anything else. So a sender bug fails at the sender, with the field's path,
and `encode` does not check again.

Samples travel as whole groups (`Group`), the unit of admission, acknowledgement, dedup and
training.

Message flow (DEALER client -> ROUTER server):

    generator -> buffer   "samples" socket   Hello, CreditRequest, Groups,   -> Credit, Ack,
                                              Heartbeat                          Lease
    learner   -> buffer   "batches" socket   LearnerHello, BatchRequest,
                                              Commit                          -> Batch, Empty
    generator -> learner  "weights" socket   WeightsQuery, ChunkRequest      -> WeightsManifest,
                                                                                 Chunk, NotAvailable
    anyone                                   Error
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar, get_args, get_origin, get_type_hints

import msgspec
import numpy as np
import numpy.typing as npt


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
# Field rules msgspec's Meta cannot state, and the shared field types.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vector:
    """Annotates a 1-d numpy array field. The dtype is the annotation's (`NDArray[np.int32]`) and
    must match exactly on the wire; byte order is the codec's business (little-endian)."""

    min_size: int = 0
    finite: bool = False
    nonnegative: bool = False


FINITE: Final = "finite"
"""Annotates a float field that must be finite: one NaN advantage poisons a whole batch."""

MAX_SAMPLES_PER_GROUP = 1024
MAX_FILTERED_TOTAL = 1 << 53
"""Bound on `filtered_total`, the credits one generator process has spent without a group reaching
the buffer. It keeps a corrupt count from pushing the buffer's counters past what its journal can
store (msgpack integers end at 2**64 - 1)."""

MAX_IN_FLIGHT_REPORTED = 65536
"""Bound on `in_flight_versions`: more groups than one generator keeps in its engine and verifier."""

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Version = Annotated[int, msgspec.Meta(ge=0)]
InFlightVersions = Annotated[list[Version], msgspec.Meta(max_length=MAX_IN_FLIGHT_REPORTED)]
Count = Annotated[int, msgspec.Meta(ge=0)]
BaseVersion = Annotated[int, msgspec.Meta(ge=-1)]
"""A weight version, or -1 for none."""
Digest = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
"""A chunk digest: 32 raw bytes of sha256 or BLAKE3 (`WeightsManifest.digest`)."""
DigestName = Literal["sha256", "blake3"]
"""The hash of a manifest's chunk digests (`stream_dapo.weights.delta` computes them)."""
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Detail = Annotated[str, msgspec.Meta(max_length=8192)]
Tally = Annotated[int, msgspec.Meta(ge=0, le=MAX_FILTERED_TOTAL)]
FiniteFloat = Annotated[float, FINITE]
TokenIds = Annotated[npt.NDArray[np.int32], Vector(min_size=1, nonnegative=True)]


# --------------------------------------------------------------------------------------------
# The base struct: checks on decode and on construction.
# --------------------------------------------------------------------------------------------


class _Decoding(threading.local):
    """`with decoding:` structs made inside come from the wire (or a journal): checked strictly,
    never converted. The codec wraps its decoders in it. Per thread, and re-entrant."""

    active = False
    depth = 0

    def __enter__(self) -> None:
        self.depth += 1
        self.active = True

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        self.active = self.depth > 0


decoding = _Decoding()


@dataclass(frozen=True)
class _Rules:
    """What `Wire.__post_init__` checks or converts in one struct class, read from its annotations."""

    arrays: tuple[tuple[str, np.dtype[Any], Vector], ...]
    floats: tuple[str, ...]
    finite: tuple[str, ...]
    bools: tuple[str, ...]
    blobs: tuple[str, ...]
    struct_lists: tuple[tuple[str, type], ...]


_RULES: dict[type, _Rules] = {}


def _rules(cls: type) -> _Rules:
    rules = _RULES.get(cls)
    if rules is not None:
        return rules
    hints = get_type_hints(cls, include_extras=True)
    arrays: list[tuple[str, np.dtype[Any], Vector]] = []
    floats: list[str] = []
    finite: list[str] = []
    bools: list[str] = []
    blobs: list[str] = []
    struct_lists: list[tuple[str, type]] = []
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        tp, extras = hints[name], []
        if get_origin(tp) is Annotated:
            tp, *extras = get_args(tp)
        if get_origin(tp) is np.ndarray:
            vector = next((x for x in extras if isinstance(x, Vector)), Vector())
            arrays.append((name, np.dtype(get_args(get_args(tp)[1])[0]), vector))
        elif tp is float:
            floats.append(name)
            if FINITE in extras:
                finite.append(name)
        elif tp is bool:
            bools.append(name)
        elif tp is bytes or tp is memoryview:
            blobs.append(name)
        elif (
            get_origin(tp) is list and isinstance(get_args(tp)[0], type) and issubclass(get_args(tp)[0], Wire)
        ):
            struct_lists.append((name, get_args(tp)[0]))
    rules = _RULES[cls] = _Rules(
        tuple(arrays), tuple(floats), tuple(finite), tuple(bools), tuple(blobs), tuple(struct_lists)
    )
    return rules


class Wire(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every struct on the wire: checks itself on decode and on construction."""

    def __post_init__(self) -> None:
        rules = _rules(type(self))
        if decoding.active:
            self._check(rules)
        else:
            self._build(rules)

    def _cross_check(self) -> str | None:
        """A rule between fields that already passed: returns the problem, or None."""
        return None

    def _check(self, rules: _Rules) -> None:
        # ValueError: msgspec reports it with the struct's path; "@field: " names the field.
        for name, dtype, vector in rules.arrays:
            problem = _array_problem(getattr(self, name), dtype, vector)
            if problem is not None:
                raise ValueError(f"@{name}: {problem}")
        for name in rules.finite:
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"@{name}: must be finite, got {value}")
        problem = self._cross_check()
        if problem is not None:
            raise ValueError(problem)

    def _build(self, rules: _Rules) -> None:
        cls = type(self).__name__
        for name, dtype, _ in rules.arrays:
            setattr(self, name, _as_array(getattr(self, name), dtype, f"{cls}.{name}"))
        for name in rules.floats:
            setattr(self, name, _as_float(getattr(self, name), f"{cls}.{name}"))
        for name in rules.bools:
            setattr(self, name, _as_bool(getattr(self, name), f"{cls}.{name}"))
        for name, item in rules.struct_lists:
            values = list(getattr(self, name))
            for i, value in enumerate(values):
                if not isinstance(value, item):
                    raise SchemaError(
                        f"{cls}.{name}[{i}]",
                        f"expected {item.__name__}, got {_type_name(value)}; build it with {item.__name__}(...)",
                    )
            setattr(self, name, values)
        # Every declared rule, once, the way the receiver applies it: nested structs were checked
        # when they were built and pass through unchanged.
        fields = {name: getattr(self, name) for name in self.__struct_fields__}
        for name in rules.blobs:  # bytes, or a bytearray / memoryview sent without a copy
            if not isinstance(fields[name], (bytes, bytearray, memoryview)):
                raise SchemaError(f"{cls}.{name}", f"expected bytes, got {_type_name(fields[name])}")
            fields[name] = b""
        with decoding:
            try:
                checked = msgspec.convert(fields, type(self), dec_hook=dec_hook)
            except msgspec.ValidationError as exc:
                raise schema_error(exc, cls) from None
        for name in self.__struct_fields__:
            if name not in rules.blobs:
                setattr(self, name, getattr(checked, name))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_equal(getattr(self, f), getattr(other, f)) for f in self.__struct_fields__)

    __hash__ = None  # type: ignore[assignment]  # mutable; key groups by group_id


W = TypeVar("W", bound=Wire)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    return bool(a == b)


def _array_problem(value: np.ndarray, dtype: np.dtype[Any], vector: Vector) -> str | None:
    if value.dtype != dtype:
        return f"expected dtype {dtype}, got {value.dtype}; convert with .astype(np.{dtype})"
    if value.ndim != 1:
        return f"expected 1-d array, got shape {value.shape}"
    if value.size < vector.min_size:
        return f"must have at least {vector.min_size} elements, got {value.size}"
    if value.size == 0:
        return None
    if vector.finite and not bool(np.isfinite(value).all()):
        return "must be finite everywhere, found NaN or inf"
    if vector.nonnegative and value.min() < 0:
        return f"must be >= 0 everywhere, found {value.min()}"
    return None


def dec_hook(tp: Any, obj: Any) -> Any:
    """msgspec's hook for the one custom field type, numpy arrays (the codec's ext hook made them)."""
    if get_origin(tp) is np.ndarray:
        if isinstance(obj, np.ndarray):
            return obj
        dtype = np.dtype(get_args(get_args(tp)[1])[0])
        raise TypeError(f"expected a numpy {dtype} array, got {_type_name(obj)}")
    raise TypeError(f"no decoder for {tp}")


def _as_array(value: Any, dtype: np.dtype[Any], path: str) -> np.ndarray:
    """Convert a sequence or array to a contiguous array of `dtype` without silent corruption:
    integers must fit int32, and floats are never turned into token ids."""
    arr = np.asarray(value)
    if arr.dtype == dtype:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return arr.astype(dtype)
    if dtype.kind == "i":
        if arr.dtype.kind not in "iu":
            raise SchemaError(path, f"expected integers, got dtype {arr.dtype}")
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise SchemaError(path, f"values must fit in {dtype}, got range [{arr.min()}, {arr.max()}]")
    elif dtype.kind == "f" and arr.dtype.kind != "f":
        raise SchemaError(path, f"expected floats, got dtype {arr.dtype}")
    return arr.astype(dtype)


def _as_float(value: Any, path: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SchemaError(path, f"expected a number, got {_type_name(value)}")
    return float(value)


def _as_bool(value: Any, path: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SchemaError(path, f"expected bool, got {_type_name(value)}")
    return bool(value)


_REWRITES: tuple[tuple[re.Pattern[str], Any], ...] = tuple(
    (re.compile(pattern), rewrite)
    for pattern, rewrite in (
        (r"Expected `object`, got `(.+)`", lambda m: f"expected a map, got {m[1]}"),
        (r"Expected `(\w+)`, got `(.+)`", lambda m: f"expected {m[1]}, got {m[2]}"),
        (r"Expected `(?:int|float)` (>=|<=|>|<) (\S+)", lambda m: f"must be {m[1]} {m[2]}"),
        (
            r"Expected `(str|array|bytes)` of length (>=|<=) (\d+)",
            lambda m: (
                f"must have at {'least' if m[2] == '>=' else 'most'} {m[3]} "
                f"{ {'str': 'characters', 'array': 'items', 'bytes': 'bytes'}[m[1]] }"
            ),
        ),
        (r"Expected `str` matching regex '(.*)'", lambda m: f"must match {m[1]!r}"),
        (r"Object missing required field `(.+)`", lambda m: f"is missing field {m[1]!r}"),
        (r"Object contains unknown field `(.+)`", lambda m: f"has unknown field {m[1]!r}"),
        (r"Invalid enum value (.+)", lambda m: f"is not an allowed value: {m[1]}"),
    )
)


def schema_error(exc: msgspec.ValidationError, root: str) -> SchemaError:
    """msgspec's "Expected `int`, got `str` - at `$.policy_version`" as the house's SchemaError
    ("hello.policy_version: expected int, got str")."""
    text, _, where = str(exc).rpartition(" - at `")
    if not text:
        text, where = where, "$`"
    path = root + where[1:-1]
    if text.startswith("@"):  # a field's rule, raised by its struct
        field, _, text = text[1:].partition(": ")
        path = f"{path}.{field}"
    for pattern, rewrite in _REWRITES:
        match = pattern.fullmatch(text)
        if match is not None:
            return SchemaError(path, rewrite(match))
    return SchemaError(path, text)


# --------------------------------------------------------------------------------------------
# Samples and groups.
# --------------------------------------------------------------------------------------------


class Sample(Wire):
    """One response to a prompt, with what the learner needs to weigh each token.

    Arrays (all length L >= 1): `tokens` int32 response token ids, `logprobs` float32 behaviour
    log-probs from vLLM, `versions` int32 policy version that produced each token (it changes
    mid-sample when weights are swapped during generation). `loss_weight` is 0.0 when overlong
    filtering masks the sample.
    """

    tokens: TokenIds
    logprobs: Annotated[npt.NDArray[np.float32], Vector(min_size=1, finite=True)]
    versions: TokenIds
    reward: FiniteFloat
    correct: bool
    truncated: bool
    advantage: FiniteFloat
    loss_weight: Annotated[float, FINITE, msgspec.Meta(ge=0.0)] = 1.0

    def _cross_check(self) -> str | None:
        lengths = {"tokens": len(self.tokens), "logprobs": len(self.logprobs), "versions": len(self.versions)}
        if len(set(lengths.values())) != 1:
            return f"tokens, logprobs and versions must have equal lengths, got {lengths}"
        return None

    def __len__(self) -> int:
        """Number of response tokens L."""
        return int(self.tokens.shape[0])


class Group(Wire, omit_defaults=True):
    """All samples for one prompt (G responses): the unit the buffer admits, acks and trains.

    `group_id` is unique across the run (uuid4 hex); the buffer drops a resent group by it.
    `prompt_tokens` is int32 [P]; `created_at` is Unix time when generation started. A decoded
    Group's arrays are read-only views of the received message. `seq` (left out when None): the
    sending process's number for the group, in the order it first sent its groups (0, 1, 2, ...);
    with `Groups.acked_below` it lets the buffer forget the ids its sender can no longer resend.
    None: a sender that does not number its groups (the buffer keeps such an id for good).
    """

    group_id: Id
    prompt_id: Id
    generator_id: Id
    gold: str
    prompt_tokens: TokenIds
    created_at: Annotated[float, FINITE, msgspec.Meta(ge=0.0)]
    samples: Annotated[list[Sample], msgspec.Meta(min_length=1, max_length=MAX_SAMPLES_PER_GROUP)] = []
    seq: Count | None = None

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


def to_map(struct: Wire) -> dict[str, Any]:
    """A struct as nested maps with its numpy arrays kept: the form `pack_value` stores (the
    buffer journal holds groups this way)."""
    out: dict[str, Any] = msgspec.to_builtins(
        struct, builtin_types=(np.ndarray, bytes, bytearray, memoryview)
    )
    return out


def from_map(cls: type[W], value: Any, path: str | None = None) -> W:
    """Check a map (`to_map`'s output read back) against `cls` strictly and build it."""
    with decoding:
        try:
            return msgspec.convert(value, cls, dec_hook=dec_hook)
        except msgspec.ValidationError as exc:
            raise schema_error(exc, path or cls.__name__) from None


# --------------------------------------------------------------------------------------------
# The messages: one struct each; `TYPE` is the name in the envelope.
# --------------------------------------------------------------------------------------------


class Body(Wire):
    """A message body. `TYPE`: the message type the envelope names."""

    TYPE: ClassVar[str]


class Rollouts(Wire):
    """A generator's rollout tally: groups finished by dynamic-sampling outcome (`FilterReason`
    values), then samples, correct samples, truncated samples and response tokens."""

    mixed: Tally
    all_correct: Tally
    all_wrong: Tally
    samples: Tally
    correct: Tally
    truncated: Tally
    response_tokens: Tally


ROLLOUT_FIELDS: tuple[str, ...] = Rollouts.__struct_fields__


# generator -> buffer


class Sampling(Wire):
    """The sampling settings of training rollouts (generator.temperature, top_p, top_k, min_p): the
    generators sample with them and the learner computes its log-probs with them, so every service
    must run with the same ones; each says its own in its hello and the buffer refuses a mismatch."""

    temperature: FiniteFloat
    top_p: FiniteFloat
    top_k: Count
    min_p: FiniteFloat

    KEYS: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k", "min_p")

    @classmethod
    def of(cls, settings: Any) -> Sampling:
        """From anything with these four attributes (the config's `generator` section)."""
        return cls(*(getattr(settings, key) for key in cls.KEYS))


class Hello(Body, omit_defaults=True):
    """`holder` (left out when empty): the process that says hello (host, pid, a random token). A
    generator id belongs to one live process; the buffer refuses a hello from another one.
    `sampling` (left out by older generators): the generator's sampling settings; the buffer refuses
    a hello whose settings differ from its own (and so from the learner's, see `LearnerHello`)."""

    TYPE = "hello"
    generator_id: Id
    policy_version: Version
    holder: Detail = ""
    sampling: Sampling | None = None


class CreditRequest(Body):
    TYPE = "credit_request"
    generator_id: Id
    want: Count
    """How many groups the generator could start now."""


class Groups(Body, omit_defaults=True):
    """Finished groups. `filtered_total` (left out when 0): credits this generator process has spent
    since its hello without a group reaching the buffer (dynamic sampling dropped it, it was aborted,
    or it was unused at shutdown). A running total, not a delta: a lost or repeated message loses or
    doubles nothing, the next one carries the total again. May come with an empty `groups`.
    `rollouts` (optional): the generator's rollout tally, as in `Heartbeat`. `in_flight_versions`
    (optional), as in `Heartbeat`, as of after these groups.

    `holder` (left out when empty): the sending process, as in its `Hello`. `acked_below` (left out
    when 0): every group this process numbered (`Group.seq`) below it has been acknowledged to it
    (accepted, duplicate or rejected), and it never sends one of them again. The buffer keeps a
    numbered group's id only until its sender's `acked_below` passes it: a resend numbered below is
    a duplicate by construction, so dedup stays exact with memory bounded by what is unacknowledged."""

    TYPE = "groups"
    generator_id: Id
    groups: list[Group]
    filtered_total: Tally = 0
    rollouts: Rollouts | None = None
    in_flight_versions: InFlightVersions | None = None
    holder: Detail = ""
    acked_below: Count = 0


class Heartbeat(Body, omit_defaults=True):
    """Every generator.heartbeat_s: the generator is alive, so its credits stay leased to it.
    `rollouts` (optional): its running rollout tally since its hello (statistics for tracking, not
    state: the buffer sums the increases and hands the sum to the learner). `in_flight_versions`
    (optional; left out by generators that do not report it): the policy version each group it has
    started and not yet sent (in the engine or the verifier) was started at, so that the buffer can
    hold the learner back before those groups go stale (buffer.in_flight_hold_s). A full report each
    time, not a delta."""

    TYPE = "heartbeat"
    generator_id: Id
    filtered_total: Tally
    rollouts: Rollouts | None = None
    in_flight_versions: InFlightVersions | None = None


# buffer -> generator


class Credit(Body):
    TYPE = "credit"
    granted: Count
    learner_version: Version


class Lease(Body):
    """The answer to a heartbeat: credits the buffer counts as this generator's, and whether they
    expired since it last heard from it (then the generator must drop the credits it holds)."""

    TYPE = "lease"
    credits: Count
    expired: bool
    learner_version: Version


class Rejection(Wire):
    group_id: Id
    reason: Reason


class Ack(Body):
    TYPE = "ack"
    accepted: list[Id] = []
    duplicates: list[Id] = []
    rejected: list[Rejection] = []


# learner -> buffer


class LearnerHello(Body, omit_defaults=True):
    """`committed_through`: the last version whose groups are in a checkpoint; the buffer requeues
    groups it leased to the learner after that. `sampling` (left out by older learners): the
    learner's sampling settings; the buffer refuses a hello whose settings differ from its own."""

    TYPE = "learner_hello"
    learner_version: Version
    committed_through: Version
    sampling: Sampling | None = None


class BatchRequest(Body):
    """`max_tokens`: token budget over `Group.num_tokens`; 0 means no budget."""

    TYPE = "batch_request"
    learner_version: Version
    max_groups: Annotated[int, msgspec.Meta(ge=1)]
    max_tokens: Count = 0


class Commit(Body):
    """Groups durably trained, i.e. included in a checkpoint."""

    TYPE = "commit"
    learner_version: Version
    group_ids: list[Id]


# buffer -> learner


class Batch(Body, omit_defaults=True):
    """`rollouts` (optional): every generator's rollout tally summed since the buffer started."""

    TYPE = "batch"
    groups: list[Group]
    dropped_stale: Count
    rollouts: Rollouts | None = None


class Empty(Body):
    TYPE = "empty"
    reason: Reason


# generator <-> learner weights


PeerAddress = Annotated[str, msgspec.Meta(max_length=256, pattern="^(tcp://[^ ]+)?$")]
CurveKey = Annotated[str, msgspec.Meta(pattern="^([0-9A-Za-z.:+=^!/*?&<>()\\[\\]{}@%$#-]{40})?$")]
"""A CurveZMQ public key in Z85 (40 characters), or empty where Curve is off."""
MAX_PEERS = 16


class WeightsQuery(Body, omit_defaults=True):
    """Optional (weights.peer_fanout, left out when empty): `relay`, the address where the asker
    serves the chunks of the versions it holds or is fetching, and `relay_key`, that socket's Curve
    public key; `unreachable`, relays that failed the asker since its last query (the learner stops
    handing them out)."""

    TYPE = "weights_query"
    have_version: Version
    relay: PeerAddress = ""
    relay_key: CurveKey = ""
    unreachable: Annotated[list[PeerAddress], msgspec.Meta(max_length=MAX_PEERS)] = []


class PeerSource(Wire):
    """A receiver that serves a version's chunks (`WeightsManifest.peers`): its relay's address and
    Curve public key (empty where Curve is off)."""

    address: Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern="^tcp://[^ ]+$")]
    key: CurveKey = ""


class WeightsManifest(Body, omit_defaults=True):
    """`checksum`: sha256 hex of the full payload; build with `WeightsManifest.of` to derive
    `num_chunks`.

    Optional (left out when empty, so older peers' bytes are unchanged): `chunk_digests`, the hash
    (`digest`) of each chunk of the payload (32 bytes each, `num_chunks` of them), which lets a
    receiver check each chunk as it arrives and skip the chunks its base version already holds;
    `state_checksum`, sha256 hex of the concatenated chunk digests, the checksum of the full state a
    receiver checks after assembling it (from its own digests of what it assembled); `published_at`:
    the learner's wall clock (unix seconds) when the version was published (publish -> loaded, per
    generator); `digest`, the hash of `chunk_digests`: "sha256" when left out (what servers sent
    before it existed, so their manifests decode unchanged), "blake3" from servers since (a receiver
    older than the field refuses such a manifest as having an unknown field, rather than checking
    its chunks against the wrong hash; `stream_dapo.weights.delta` says why BLAKE3)."""

    TYPE = "weights_manifest"
    version: Version
    checksum: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    total_bytes: Count
    chunk_bytes: Annotated[int, msgspec.Meta(ge=1)]
    num_chunks: Count
    # A factory, not a plain default: omit_defaults leaves factory defaults on the wire, so the
    # field is always sent, as it was before the optional fields below existed.
    format: Literal["safetensors"] = msgspec.field(default_factory=lambda: "safetensors")
    chunk_digests: list[Digest] = []
    state_checksum: Annotated[str, msgspec.Meta(pattern="^([0-9a-f]{64})?$")] = ""
    published_at: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    peers: Annotated[list[PeerSource], msgspec.Meta(max_length=MAX_PEERS)] = []
    """Where to ask for the chunks first (weights.peer_fanout): the asker's parent in the relay
    tree, then its ancestors; the learner serves what none of them does."""
    digest: DigestName = "sha256"

    @classmethod
    def of(
        cls,
        version: int,
        checksum: str,
        total_bytes: int,
        chunk_bytes: int,
        *,
        chunk_digests: list[bytes] | None = None,
        state_checksum: str = "",
        published_at: float = 0.0,
        peers: list[PeerSource] | None = None,
        digest: DigestName = "sha256",
    ) -> WeightsManifest:
        num_chunks = -(-total_bytes // chunk_bytes) if chunk_bytes > 0 else 0
        return cls(
            version,
            checksum,
            total_bytes,
            chunk_bytes,
            num_chunks,
            chunk_digests=list(chunk_digests or []),
            state_checksum=state_checksum,
            published_at=published_at,
            peers=list(peers or []),
            digest=digest,
        )

    def _cross_check(self) -> str | None:
        want = -(-self.total_bytes // self.chunk_bytes)
        if self.num_chunks != want:
            return f"num_chunks must be ceil(total_bytes / chunk_bytes) = {want}, got {self.num_chunks}"
        if self.chunk_digests and len(self.chunk_digests) != self.num_chunks:
            return f"chunk_digests must hold one digest per chunk ({self.num_chunks}), got {len(self.chunk_digests)}"
        if bool(self.chunk_digests) != bool(self.state_checksum):
            return "chunk_digests and state_checksum come together (both or neither)"
        return None


class ChunkRequest(Body, omit_defaults=True):
    """`base_version` / `base_checksum` (optional): the version the asker holds and that version's
    `state_checksum`; the server may then answer with a delta against it (`Chunk.encoding`). The
    checksum names the base's content, so a base from another lineage (the learner resumed from an
    older checkpoint and reused the version number) is never mistaken for the server's."""

    TYPE = "chunk_request"
    version: Version
    index: Count
    base_version: BaseVersion = -1
    base_checksum: Annotated[str, msgspec.Meta(pattern="^([0-9a-f]{64})?$")] = ""

    def _cross_check(self) -> str | None:
        if (self.base_version >= 0) != bool(self.base_checksum):
            return "base_version and base_checksum come together (both or neither)"
        return None


class Chunk(Body, omit_defaults=True):
    """`data`: bytes, or a bytearray / memoryview slice of one large buffer when sending (weight
    chunks, sent uncopied); when decoded, a memoryview of the received message, not a copy (a
    weight chunk is then copied once, from the frame ZeroMQ received into to its place in the
    image; ``bytes(data)`` for a copy of one's own). The wire is msgpack bin either way.
    `encoding` (optional, "raw" when left out): "raw", the chunk's bytes; "xor_zlib", zlib of the
    chunk XOR the same chunk of `base_version` (which the asker named in its request)."""

    TYPE = "chunk"
    version: Version
    index: Count
    data: memoryview
    encoding: Literal["raw", "xor_zlib"] = "raw"
    base_version: BaseVersion = -1

    def _cross_check(self) -> str | None:
        if (self.encoding == "raw") != (self.base_version < 0):
            return 'a "xor_zlib" chunk names its base_version, a "raw" one none'
        return None


class NotAvailable(Body):
    TYPE = "not_available"
    have_version: Version
    current_version: Version
    reason: Reason


# anyone


class Error(Body):
    TYPE = "error"
    reason: Reason
    detail: Detail


MESSAGES: dict[str, type[Body]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        CreditRequest,
        Groups,
        Heartbeat,
        Credit,
        Lease,
        Ack,
        LearnerHello,
        BatchRequest,
        Commit,
        Batch,
        Empty,
        WeightsQuery,
        WeightsManifest,
        ChunkRequest,
        Chunk,
        NotAvailable,
        Error,
    )
}
"""Message type (as the envelope names it) -> its struct."""

# Message type names. Compare `msg.type` against these rather than string literals.
HELLO = Hello.TYPE
CREDIT_REQUEST = CreditRequest.TYPE
GROUPS = Groups.TYPE
HEARTBEAT = Heartbeat.TYPE
CREDIT = Credit.TYPE
ACK = Ack.TYPE
LEASE = Lease.TYPE
LEARNER_HELLO = LearnerHello.TYPE
BATCH_REQUEST = BatchRequest.TYPE
COMMIT = Commit.TYPE
BATCH = Batch.TYPE
EMPTY = Empty.TYPE
WEIGHTS_QUERY = WeightsQuery.TYPE
WEIGHTS_MANIFEST = WeightsManifest.TYPE
CHUNK_REQUEST = ChunkRequest.TYPE
CHUNK = Chunk.TYPE
NOT_AVAILABLE = NotAvailable.TYPE
ERROR = Error.TYPE

"""Codec and message schemas: exact round-trips, every rejection reason, fuzzed bad input."""

from __future__ import annotations

import struct
from typing import Any, cast

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stream_dapo.transport import messages as m
from stream_dapo.transport.codec import (
    EXT_NDARRAY,
    MAX_STR_LEN,
    SCHEMA_VERSION,
    CodecError,
    Message,
    decode,
    encode,
    pack_value,
    unpack_value,
    wire_bytes,
)
from stream_dapo.transport.messages import Group, Sample, SchemaError, from_map, to_map

# Hypothesis' per-example deadline is a timing assertion; the test machine is shared and slow.
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX = 1 << 24

ALLOWED_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64", "bool"]


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Exact structural equality: same types, arrays bit-for-bit (NaN payloads and -0.0 included)."""
    if isinstance(a, m.Wire):
        assert type(b) is type(a), path
        assert_same(to_map(a), to_map(b), path)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert (b.dtype, b.shape) == (a.dtype.newbyteorder("<"), a.shape), path
        assert np.ascontiguousarray(a, dtype=b.dtype).tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (bytearray, memoryview)) or isinstance(b, memoryview):
        assert bytes(b) == bytes(a), path  # a weight chunk's data decodes as a view
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


def make_sample(length: int = 3, version: int = 0, **overrides: Any) -> Sample:
    kwargs: dict[str, Any] = {
        "tokens": np.arange(1, length + 1, dtype=np.int32),
        "logprobs": np.full(length, -0.5, dtype=np.float32),
        "versions": np.full(length, version, dtype=np.int32),
        "reward": 1.0,
        "correct": True,
        "truncated": False,
        "advantage": 0.75,
        "loss_weight": 1.0,
    }
    kwargs.update(overrides)
    return Sample(**kwargs)


def make_group(group_id: str = "g-1", samples: list[Sample] | None = None) -> Group:
    return Group(
        group_id=group_id,
        prompt_id="p-7",
        generator_id="gen-0",
        gold="42",
        prompt_tokens=np.array([101, 102, 103], dtype=np.int32),
        created_at=1_700_000_000.25,
        samples=samples
        if samples is not None
        else [make_sample(3), make_sample(2, reward=-1.0, correct=False)],
    )


def raw_envelope(body: Any, *, t: Any = "hello", v: Any = SCHEMA_VERSION, **extra: Any) -> bytes:
    return msgpack.packb({"v": v, "t": t, "b": body, **extra}, use_bin_type=True)


def raw_array(dtype_str: str, shape: tuple[int, ...], data: bytes) -> msgpack.ExtType:
    d = dtype_str.encode()
    header = struct.pack(f"<B{len(d)}sB{len(shape)}q", len(d), d, len(shape), *shape)
    return msgpack.ExtType(EXT_NDARRAY, header + data)


def reason_of(data: bytes, max_bytes: int = MAX) -> str:
    with pytest.raises(CodecError) as info:
        decode(data, max_bytes=max_bytes)
    return info.value.reason


# --------------------------------------------------------------------------------------------
# Strategies: valid bodies of every message type.
# --------------------------------------------------------------------------------------------

ids = st.text(min_size=1, max_size=40)
versions = st.integers(0, 2**63 - 1)
counts = st.integers(0, 2**31)
finite = st.floats(allow_nan=False, allow_infinity=False)
reasons = st.text(min_size=1, max_size=60)


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    n = draw(st.integers(1, 40))
    return Sample(
        tokens=draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2**31 - 1))),
        logprobs=draw(hnp.arrays(np.float32, n, elements=st.floats(-65504.0, 0.0, width=32))),
        versions=draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2**31 - 1))),
        reward=draw(finite),
        correct=draw(st.booleans()),
        truncated=draw(st.booleans()),
        advantage=draw(finite),
        loss_weight=draw(st.floats(0.0, 1e6)),
    )


@st.composite
def groups(draw: st.DrawFn) -> Group:
    p = draw(st.integers(1, 30))
    return Group(
        group_id=draw(ids),
        prompt_id=draw(ids),
        generator_id=draw(ids),
        gold=draw(st.text(max_size=100)),
        prompt_tokens=draw(hnp.arrays(np.int32, p, elements=st.integers(0, 2**31 - 1))),
        created_at=draw(st.floats(0.0, 1e10)),
        samples=draw(st.lists(samples(), min_size=1, max_size=4)),
    )


hex_digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
tallies = st.integers(0, m.MAX_FILTERED_TOTAL)
rollout_tallies = st.none() | st.builds(m.Rollouts, *[tallies] * len(m.ROLLOUT_FIELDS))
in_flight_reports = st.none() | st.lists(versions, max_size=20)

STRATEGIES: dict[str, st.SearchStrategy[m.Body]] = {
    "hello": st.builds(m.Hello, ids, versions),
    "credit_request": st.builds(m.CreditRequest, ids, counts),
    "groups": st.builds(
        m.Groups, ids, st.lists(groups(), max_size=3), tallies, rollout_tallies, in_flight_reports
    ),
    "heartbeat": st.builds(m.Heartbeat, ids, tallies, rollout_tallies, in_flight_reports),
    "credit": st.builds(m.Credit, counts, versions),
    "lease": st.builds(m.Lease, counts, st.booleans(), versions),
    "ack": st.builds(m.Ack, st.lists(ids), st.lists(ids), st.lists(st.builds(m.Rejection, ids, reasons))),
    "learner_hello": st.builds(m.LearnerHello, versions, versions),
    "batch_request": st.builds(m.BatchRequest, versions, st.integers(1, 10_000), counts),
    "commit": st.builds(m.Commit, versions, st.lists(ids)),
    "batch": st.builds(m.Batch, st.lists(groups(), max_size=3), counts, rollout_tallies),
    "empty": st.builds(m.Empty, reasons),
    "weights_query": st.builds(m.WeightsQuery, versions),
    "weights_manifest": st.builds(
        m.WeightsManifest.of, versions, hex_digests, st.integers(0, 2**40), st.integers(1, 2**30)
    ),
    "chunk_request": st.builds(m.ChunkRequest, versions, counts),
    "chunk": st.builds(m.Chunk, versions, counts, st.binary(max_size=2000)),
    "not_available": st.builds(m.NotAvailable, versions, versions, reasons),
    "error": st.builds(m.Error, reasons, st.text(max_size=200)),
}


# --------------------------------------------------------------------------------------------
# Round-trips
# --------------------------------------------------------------------------------------------


def test_every_message_type_has_a_round_trip_strategy() -> None:
    # A new message type without a round-trip test fails here.
    assert set(STRATEGIES) == set(m.MESSAGES)


@pytest.mark.parametrize("msg_type", sorted(STRATEGIES))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_type_round_trips_exactly(msg_type: str, data: st.DataObject) -> None:
    body = data.draw(STRATEGIES[msg_type])
    assert body.TYPE == msg_type  # the struct is the type it is registered as
    msg = decode(encode(body), max_bytes=MAX)
    assert msg.type == msg_type
    assert_same(body, msg.body)
    assert msg.body == body


@FAST
@given(st.lists(groups(), min_size=1, max_size=3))
def test_groups_survive_encode_decode_as_equal_objects(gs: list[Group]) -> None:
    msg = decode(encode(m.Groups("gen-0", gs)), max_bytes=MAX)
    assert msg.body.groups == gs


@FAST
@given(
    hnp.arrays(
        st.sampled_from(ALLOWED_DTYPES).map(np.dtype),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_arrays_of_every_allowed_dtype_and_shape_round_trip_bit_for_bit(arr: np.ndarray) -> None:
    out = unpack_value(pack_value({"a": arr}), max_bytes=MAX)["a"]
    assert_same(arr, out)


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">i2"])
def test_big_endian_arrays_arrive_little_endian_with_the_same_values(dtype: str) -> None:
    arr = np.array([[1, -2, 300], [4, 5, -6]], dtype=dtype)
    out = unpack_value(pack_value(arr), max_bytes=MAX)
    assert out.dtype == np.dtype(dtype).newbyteorder("<")
    assert out.tolist() == [[1, -2, 300], [4, 5, -6]]


def test_non_contiguous_arrays_are_sent_in_c_order() -> None:
    arr = np.arange(12, dtype=np.int64).reshape(3, 4).T[::2]
    out = unpack_value(pack_value(arr), max_bytes=MAX)
    assert out.tolist() == arr.tolist() == [[0, 4, 8], [2, 6, 10]]


def test_arrays_travel_as_raw_bytes_not_element_lists() -> None:
    arr = np.arange(10_000, dtype=np.int32)
    data = pack_value(arr)
    # 40,000 bytes of elements plus a header of a few bytes; a list would cost ~3 bytes per element more.
    assert 40_000 < len(data) < 40_000 + 32


def test_decoded_arrays_are_read_only_views() -> None:
    msg = decode(encode(m.Groups("gen-0", [make_group()])), max_bytes=MAX)
    tokens = msg.body.groups[0].samples[0].tokens
    assert not tokens.flags.writeable
    assert tokens.tolist() == [1, 2, 3]


def test_weight_chunks_accept_memoryview_slices_and_arrive_as_views_of_the_message() -> None:
    payload = bytes(range(256)) * 4
    view = memoryview(payload)[100:612]
    wire = bytearray(encode(m.Chunk(3, 1, view)))
    msg = decode(wire, max_bytes=MAX)
    assert msg.body.data == payload[100:612]
    assert type(msg.body.data) is memoryview
    at = bytes(wire).index(payload[100:612])
    wire[at] ^= 0xFF  # the decoded data is the received message's memory, not a copy of it
    assert msg.body.data[0] == payload[100] ^ 0xFF
    assert m.Chunk(3, 1, view).data is view  # sent without a copy
    assert to_map(m.Chunk(3, 1, view))["data"] is view


# --------------------------------------------------------------------------------------------
# Sample and Group
# --------------------------------------------------------------------------------------------


def test_group_token_counts_and_version_range() -> None:
    g = make_group(
        samples=[
            make_sample(2, versions=np.array([5, 6], dtype=np.int32)),
            make_sample(4, versions=np.array([4, 4, 7, 7], dtype=np.int32)),
        ]
    )
    assert g.num_samples == 2
    assert g.num_response_tokens == 6
    assert g.num_tokens == 3 * 2 + 6  # P=3 prompt tokens per sample, plus responses
    assert (g.min_version, g.max_version) == (4, 7)


def test_sample_converts_lists_and_wide_ints_exactly() -> None:
    # Lists where the annotations say arrays, on purpose: the conversion is what is tested.
    tokens, logprobs = cast(Any, [1, 2, 2**31 - 1]), cast(Any, [-0.25, -1.5, 0.0])
    s = Sample(tokens, logprobs, np.array([0, 1, 1], dtype=np.int64), 1, True, False, -2)
    assert s.tokens.dtype == np.int32 and s.tokens.tolist() == [1, 2, 2**31 - 1]
    assert s.logprobs.dtype == np.float32 and s.logprobs.tolist() == [-0.25, -1.5, 0.0]
    assert s.versions.dtype == np.int32 and s.versions.tolist() == [0, 1, 1]
    assert (s.reward, s.advantage, s.loss_weight) == (1.0, -2.0, 1.0)
    assert type(s.reward) is float and len(s) == 3


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"tokens": [1.5, 2.0, 3.0]}, r"Sample.tokens: expected integers"),
        ({"tokens": np.array([1, 2, 2**31], dtype=np.int64)}, r"must fit in int32"),
        ({"tokens": [1, 2]}, r"equal lengths"),
        ({"tokens": [], "logprobs": [], "versions": []}, r"at least 1 elements"),
        ({"tokens": [1, -2, 3]}, r"Sample.tokens: must be >= 0"),
        ({"logprobs": [0.0, float("nan"), 0.0]}, r"Sample.logprobs: must be finite"),
        ({"advantage": float("inf")}, r"Sample.advantage: must be finite"),
        ({"loss_weight": -0.5}, r"Sample.loss_weight: must be >= 0.0"),
        ({"reward": "1.0"}, r"Sample.reward: expected a number"),
        ({"correct": 1}, r"Sample.correct: expected bool"),
    ],
)
def test_bad_samples_fail_at_construction_naming_the_field(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        make_sample(3, **overrides)


def test_group_rejects_empty_and_oversized_sample_lists_and_raw_maps() -> None:
    with pytest.raises(SchemaError, match=r"Group.samples: must have at least 1 items"):
        make_group(samples=[])
    with pytest.raises(SchemaError, match=r"Group.samples: must have at most 1024 items"):
        make_group(samples=[make_sample(1)] * 1025)
    with pytest.raises(SchemaError, match=r"Group.samples\[0\]: expected Sample"):
        make_group(samples=[to_map(make_sample(1))])  # type: ignore[list-item]
    with pytest.raises(SchemaError, match=r"Group.group_id: must have at least 1 characters"):
        make_group(group_id="")


def test_from_wire_is_strict_about_dtypes_where_the_constructor_converts() -> None:
    wire = to_map(make_group())
    assert from_map(Group, wire) == make_group()
    wire["samples"][1]["tokens"] = wire["samples"][1]["tokens"].astype(np.int64)
    with pytest.raises(SchemaError, match=r"Group.samples\[1\].tokens: expected dtype int32, got int64"):
        from_map(Group, wire)


def test_weights_manifest_builder_derives_the_chunk_count() -> None:
    assert m.WeightsManifest.of(4, "ab" * 32, total_bytes=10, chunk_bytes=4).num_chunks == 3
    assert m.WeightsManifest.of(4, "ab" * 32, total_bytes=8, chunk_bytes=4).num_chunks == 2
    with pytest.raises(
        SchemaError, match=r"WeightsManifest: num_chunks must be ceil\(total_bytes / chunk_bytes\) = 3"
    ):
        m.WeightsManifest(4, "ab" * 32, 10, 4, 2)


def test_wire_bytes_is_an_upper_estimate_of_the_encoded_size() -> None:
    big = Group(
        "b" * 200,
        "p",
        "gen-0",
        "42",
        np.arange(300, dtype=np.int32),
        1.0,
        [make_sample(1000) for _ in range(16)],
    )
    for group in (make_group(), big):
        single = len(encode(m.Batch([group], 0)))
        assert single <= wire_bytes(group) < single * 1.5 + 1000


# --------------------------------------------------------------------------------------------
# Rejections, one reason each
# --------------------------------------------------------------------------------------------

HELLO_BODY: dict[str, Any] = {"generator_id": "gen-0", "policy_version": 3}


@pytest.mark.parametrize("data", [b"", b"\xc1", b"hello world", b"\x93\x01\x02", b"\xff" * 64])
def test_garbage_bytes_are_malformed(data: bytes) -> None:
    assert reason_of(data) == "malformed"


def test_every_truncation_of_a_valid_message_is_malformed() -> None:
    data = encode(m.Groups("gen-0", [make_group()]))
    # The envelope map ends with the body, so every strict prefix is an incomplete message.
    assert {reason_of(data[:n]) for n in range(len(data))} == {"malformed"}


def test_size_is_checked_before_parsing() -> None:
    data = encode(m.Groups("gen-0", [make_group()]))
    assert decode(data, max_bytes=len(data)).type == "groups"
    with pytest.raises(CodecError) as info:
        decode(data, max_bytes=len(data) - 1)
    assert info.value.reason == "oversized"
    assert f"{len(data)} bytes exceeds the limit of {len(data) - 1}" in info.value.detail
    # Garbage one byte over the limit is reported as oversized: it was never parsed.
    assert reason_of(b"\xc1" * 101, max_bytes=100) == "oversized"


def test_wrong_version_names_both_versions_and_says_to_upgrade() -> None:
    with pytest.raises(CodecError) as info:
        decode(raw_envelope(HELLO_BODY, v=SCHEMA_VERSION + 1), max_bytes=MAX)
    assert info.value.reason == "bad_version"
    assert f"version {SCHEMA_VERSION + 1}" in info.value.detail
    assert f"speaks {SCHEMA_VERSION}" in info.value.detail
    assert "upgrade the older side" in info.value.detail


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb([1, "hello", {}]),
        msgpack.packb({"t": "hello", "b": HELLO_BODY}),
        raw_envelope(HELLO_BODY, v=True),
        raw_envelope(HELLO_BODY, extra="x"),
        msgpack.packb(
            {"v": SCHEMA_VERSION, "t": "hello", "b": HELLO_BODY, b"x": 1}
        ),  # str and bytes keys mixed
        raw_envelope(HELLO_BODY, t=7),
        msgpack.packb({"v": SCHEMA_VERSION, "t": "hello", "b": {1: 2}}),  # non-string map key
        msgpack.packb(
            {"v": SCHEMA_VERSION, "t": "hello", "b": {**cast(dict[Any, Any], HELLO_BODY), b"raw": 1}}
        ),  # bytes key
        raw_envelope(HELLO_BODY, id=-1),
        raw_envelope(HELLO_BODY, id="7"),
        raw_envelope(HELLO_BODY, id=True),
        raw_envelope(HELLO_BODY, id=1 << 63),
    ],
)
def test_bad_envelopes_are_malformed(data: bytes) -> None:
    assert reason_of(data) == "malformed"


def test_nesting_too_deep_is_malformed() -> None:
    deep = b"\x91" * 100_000 + b"\xc0"  # [[[...[nil]...]]]
    assert reason_of(deep) == "malformed"
    head = b"\x83" + b"".join(msgpack.packb(x) for x in ("v", SCHEMA_VERSION, "t", "hello", "b"))
    assert reason_of(head + deep) == "malformed"  # as the body


def test_a_request_id_travels_in_the_envelope_and_only_when_given() -> None:
    hello = m.Hello(**HELLO_BODY)
    with_id = decode(encode(hello, request_id=(1 << 63) - 1), max_bytes=MAX)
    assert with_id.request_id == (1 << 63) - 1 and with_id.body == hello
    without = decode(encode(hello), max_bytes=MAX)
    assert without.request_id is None
    assert set(msgpack.unpackb(encode(hello))) == {"v", "t", "b"}
    with pytest.raises(CodecError, match="request id"):
        encode(hello, request_id=-3)


def test_a_filtered_total_beyond_its_bound_is_bad_schema() -> None:
    """Regression: the buffer adds the filtered count to counters its journal stores as msgpack
    integers, so an unbounded count (2**64 - 1 decodes fine) could stop it. The schema bounds it."""
    for count in (2**64 - 1, m.MAX_FILTERED_TOTAL + 1):
        for t, body in (
            ("groups", {"generator_id": "gen-0", "groups": [], "filtered_total": count}),
            ("heartbeat", {"generator_id": "gen-0", "filtered_total": count}),
        ):
            assert reason_of(raw_envelope(body, t=t)) == "bad_schema"
    largest = encode(m.Groups("gen-0", [], filtered_total=m.MAX_FILTERED_TOTAL))
    assert decode(largest, max_bytes=MAX).body.filtered_total == m.MAX_FILTERED_TOTAL
    assert "filtered_total" not in msgpack.unpackb(encode(m.Groups("gen-0", [])))["b"]  # left out when 0
    assert decode(encode(m.Groups("gen-0", [])), max_bytes=MAX).body.filtered_total == 0


def test_an_in_flight_report_is_optional_bounded_and_never_negative() -> None:
    """Generators that predate it leave it out (None: the buffer holds nothing for them); an empty
    report is sent as such (it clears the holds); a negative version or an oversized list is
    bad_schema."""
    assert "in_flight_versions" not in msgpack.unpackb(encode(m.Heartbeat("gen-0", 0)))["b"]
    assert decode(encode(m.Heartbeat("gen-0", 0)), max_bytes=MAX).body.in_flight_versions is None
    empty = decode(encode(m.Heartbeat("gen-0", 0, None, [])), max_bytes=MAX).body
    assert empty.in_flight_versions == []
    both = decode(encode(m.Groups("gen-0", [], in_flight_versions=[4, 2])), max_bytes=MAX).body
    assert both.in_flight_versions == [4, 2]
    for bad in ([-1], [0] * (m.MAX_IN_FLIGHT_REPORTED + 1)):
        body = {"generator_id": "gen-0", "filtered_total": 0, "in_flight_versions": bad}
        assert reason_of(raw_envelope(body, t="heartbeat")) == "bad_schema"


def test_unknown_type_is_reported_as_such() -> None:
    with pytest.raises(CodecError) as info:
        decode(raw_envelope({}, t="teleport"), max_bytes=MAX)
    assert info.value.reason == "unknown_type"
    assert "'teleport'" in info.value.detail


def _bad_group_wire(**sample_changes: Any) -> dict[str, Any]:
    wire = to_map(make_group())
    wire["samples"][0].update(sample_changes)
    return {"generator_id": "gen-0", "groups": [wire]}


@pytest.mark.parametrize(
    ("msg_type", "body", "where"),
    [
        ("hello", {"generator_id": "gen-0"}, "hello: is missing field 'policy_version'"),
        ("hello", {**HELLO_BODY, "extra": 1}, "hello: has unknown field 'extra'"),
        (
            "hello",
            {**HELLO_BODY, "generator_id": "x" * (MAX_STR_LEN + 1)},
            "must have at most 256 characters",
        ),
        ("hello", {**HELLO_BODY, "policy_version": "3"}, "hello.policy_version: expected int, got str"),
        ("hello", {**HELLO_BODY, "policy_version": True}, "hello.policy_version: expected int, got bool"),
        ("hello", {**HELLO_BODY, "policy_version": -1}, "hello.policy_version: must be >= 0"),
        (
            "batch_request",
            {"learner_version": 1, "max_groups": 0, "max_tokens": 0},
            "max_groups: must be >= 1",
        ),
        ("groups", _bad_group_wire(tokens=np.zeros(3, np.float32)), "groups.groups[0].samples[0].tokens"),
        ("groups", _bad_group_wire(tokens=np.zeros((3, 1), np.int32)), "expected 1-d array"),
        ("groups", _bad_group_wire(versions=np.zeros(2, np.int32)), "equal lengths"),
        ("groups", _bad_group_wire(advantage=float("nan")), "samples[0].advantage: must be finite"),
        ("groups", _bad_group_wire(correct=1), "samples[0].correct: expected bool"),
        (
            "weights_manifest",
            {
                "version": 1,
                "checksum": "ab" * 32,
                "total_bytes": 10,
                "chunk_bytes": 4,
                "num_chunks": 2,
                "format": "safetensors",
            },
            "num_chunks must be ceil(total_bytes / chunk_bytes) = 3",
        ),
        (
            "weights_manifest",
            {
                "version": 1,
                "checksum": "AB" * 32,
                "total_bytes": 8,
                "chunk_bytes": 4,
                "num_chunks": 2,
                "format": "safetensors",
            },
            "checksum: must match",
        ),
    ],
)
def test_schema_violations_are_bad_schema_and_name_the_field(msg_type: str, body: Any, where: str) -> None:
    with pytest.raises(CodecError) as decoded:
        decode(
            msgpack.packb({"v": SCHEMA_VERSION, "t": msg_type, "b": body}, default=pack_value_default),
            max_bytes=MAX,
        )
    assert decoded.value.reason == "bad_schema"
    assert where in decoded.value.detail
    # The same declaration checks a struct built from that map the same way.
    with pytest.raises(SchemaError) as built:
        from_map(m.MESSAGES[msg_type], body, msg_type)
    assert str(built.value) == decoded.value.detail


def test_a_struct_built_with_a_bad_value_fails_at_the_sender_naming_the_field() -> None:
    with pytest.raises(SchemaError, match=r"^Hello.policy_version: must be >= 0$"):
        m.Hello("gen-0", -1)
    with pytest.raises(SchemaError, match=r"^BatchRequest.max_groups: expected int, got str$"):
        m.BatchRequest(1, "8")  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"^Ack.rejected\[0\]: expected Rejection, got tuple"):
        m.Ack([], [], [("g-1", "stale")])  # type: ignore[list-item]
    with pytest.raises(SchemaError, match=r"^WeightsManifest.checksum: must match"):
        m.WeightsManifest.of(1, "AB" * 32, 8, 4)


def pack_value_default(obj: Any) -> Any:
    """msgpack `default` hook packing arrays the codec's way, for hand-built envelopes that
    bypass encode's validation: packs the array alone, then reads it back as a raw ExtType."""
    return msgpack.unpackb(pack_value(obj), ext_hook=msgpack.ExtType)


def _sample_body_with(tokens: msgpack.ExtType) -> bytes:
    wire = to_map(make_group())
    sample = wire["samples"][0]
    body = {"generator_id": "gen-0", "groups": [wire]}
    sample["tokens"] = tokens
    return msgpack.packb({"v": SCHEMA_VERSION, "t": "groups", "b": body}, default=pack_value_default)


def test_an_ext_code_we_never_use_is_malformed() -> None:
    assert reason_of(_sample_body_with(msgpack.ExtType(42, b""))) == "malformed"
    # Where no array belongs, any ext value is just the wrong type.
    assert reason_of(raw_envelope({**HELLO_BODY, "policy_version": msgpack.ExtType(42, b"")})) == "bad_schema"


@pytest.mark.parametrize(
    ("ext", "fragment"),
    [
        (raw_array("<i4", (4,), b"\x00" * 12), "needs 16 bytes, payload has 12"),
        (raw_array("<i4", (3,), b"\x00" * 16), "needs 12 bytes, payload has 16"),
        (raw_array("<i4", (-1, -3), b"\x00" * 12), "negative dimension"),
        (raw_array("<i4", (1, 1, 1, 1, 3), b"\x00" * 12), "at most 4"),
        (raw_array("|O", (3,), b"\x00" * 24), "'|O' is not allowed"),
        (raw_array("|V4", (3,), b"\x00" * 12), "'|V4' is not allowed"),
        (raw_array("<U1", (3,), b"\x00" * 12), "'<U1' is not allowed"),
        (raw_array("|b1", (3,), b"\x01\x02\x00"), "other than 0 and 1"),
        (msgpack.ExtType(EXT_NDARRAY, b"\x03<i4\x02\x01"), "truncated or corrupt array header"),
        (msgpack.ExtType(EXT_NDARRAY, b""), "truncated or corrupt array header"),
    ],
)
def test_broken_arrays_are_bad_array(ext: msgpack.ExtType, fragment: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(_sample_body_with(ext), max_bytes=MAX)
    assert info.value.reason == "bad_array"
    assert fragment in info.value.detail


@pytest.mark.parametrize(
    "arr",
    [
        np.array([object(), 1], dtype=object),
        np.zeros(3, dtype="V8"),
        np.zeros(3, dtype=[("a", "<i4")]),
        np.array(["x"]),
        np.zeros((1, 1, 1, 1, 1), dtype=np.int8),
        np.zeros(2, dtype=np.complex64),
    ],
)
def test_unsendable_arrays_are_refused_at_the_sender(arr: np.ndarray) -> None:
    with pytest.raises(CodecError) as info:
        pack_value({"a": arr})
    assert info.value.reason == "bad_array"


def test_encode_refuses_unknown_types_and_non_wire_values() -> None:
    with pytest.raises(CodecError) as info:
        encode({"generator_id": "gen-0", "policy_version": 3})  # type: ignore[arg-type]
    assert info.value.reason == "unknown_type"
    with pytest.raises(CodecError) as info:
        pack_value({"x": {1, 2}})
    assert info.value.reason == "bad_schema"


def test_decode_demands_a_positive_limit() -> None:
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        decode(b"\x80", max_bytes=0)


# --------------------------------------------------------------------------------------------
# Fuzz: nothing but CodecError ever escapes decode.
# --------------------------------------------------------------------------------------------

VALID = [
    encode(m.Groups("gen-0", [make_group()])),
    encode(m.Hello("gen-0", 3)),
    encode(m.Ack(["a", "b"], ["c"], [m.Rejection("d", "stale")])),
    encode(m.WeightsManifest.of(2, "0f" * 32, 1000, 300)),
    encode(m.Chunk(2, 1, memoryview(b"\x00\x01" * 50))),
]


def decodes_or_codec_error(data: bytes) -> Message | None:
    try:
        return decode(data, max_bytes=1 << 16)
    except CodecError as e:
        assert e.reason in {
            "oversized",
            "malformed",
            "bad_version",
            "unknown_type",
            "bad_schema",
            "bad_array",
        }
        return None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_raise_codec_error(data: bytes) -> None:
    decodes_or_codec_error(data)


wire_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=12) | st.binary(max_size=4), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(m.MESSAGES) + ["nope"]), wire_trees, st.sampled_from([0, 1, 2, "1"]))
def test_random_msgpack_trees_in_an_envelope_only_ever_raise_codec_error(
    msg_type: str, body: Any, version: Any
) -> None:
    decodes_or_codec_error(msgpack.packb({"v": version, "t": msg_type, "b": body}))
    decodes_or_codec_error(msgpack.packb(body))


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid body with one field replaced by a random tree: exercises every field's check."""
    struct = draw(st.sampled_from(sorted(STRATEGIES)).flatmap(STRATEGIES.__getitem__))
    body = to_map(struct)
    key = draw(st.sampled_from(sorted(body)))
    return struct.TYPE, {**body, key: draw(wire_trees)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid_bodies())
def test_valid_bodies_with_one_random_field_only_ever_raise_codec_error(
    out: tuple[str, dict[str, Any]],
) -> None:
    msg_type, body = out
    decodes_or_codec_error(
        msgpack.packb({"v": SCHEMA_VERSION, "t": msg_type, "b": body}, default=pack_value_default)
    )


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=8),
    st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_mutated_valid_messages_only_ever_raise_codec_error(
    base: bytes, flips: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(base)
    for pos, bit in flips:
        data[pos % len(data)] ^= 1 << bit
    if cut is not None:
        del data[cut % len(data) :]
    decodes_or_codec_error(bytes(data))

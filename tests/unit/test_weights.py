"""Weight publication and reception: ZeroMQ chunked transfer over loopback, and the shared directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq
from safetensors.torch import load, load_file
from transformers import Qwen2ForCausalLM

from stream_dapo.testing.services import tiny_qwen2
from stream_dapo.transport import messages
from stream_dapo.transport.codec import encode
from stream_dapo.transport.sockets import open_endpoint, request
from stream_dapo.weights import (
    LATEST_FILE,
    ChecksumMismatch,
    SharedDirPublisher,
    WeightServer,
    WeightsPayload,
    fetch_weights_zmq,
    gather_full_state_dict,
    read_shared_dir,
    serialize_weights,
)

CHUNK = 4096  # the smallest allowed chunk: the tiny model spans many of them


tiny_model = tiny_qwen2


def payload_of(seed: int, version: int) -> WeightsPayload:
    sd = gather_full_state_dict(tiny_model(seed))
    assert sd is not None
    return serialize_weights(sd, version)


@pytest.fixture
def server():
    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=CHUNK) as srv:
        yield srv


def test_chunked_transfer_reassembles_bit_identically(server: WeightServer, tmp_path: Path) -> None:
    payload = payload_of(0, version=3)
    assert payload.total_bytes > 10 * CHUNK
    server.publish(payload)
    version, path = fetch_weights_zmq(server.address, have_version=-1, timeout=60.0, dest_dir=tmp_path)
    assert version == 3 and path is not None
    assert path.name == "v00000003.safetensors"
    assert path.read_bytes() == payload.data
    assert server.stats["chunks"] == -(-payload.total_bytes // CHUNK)
    assert server.stats["bytes"] == payload.total_bytes
    for name, tensor in load(payload.data).items():
        assert torch.equal(load_file(path)[name], tensor)
    # Asking again with the version we now hold transfers nothing.
    assert fetch_weights_zmq(server.address, have_version=3, timeout=60.0, dest_dir=tmp_path) == (3, None)
    assert list(tmp_path.glob(".*")) == []  # no temp files left behind


def test_checksum_mismatch_is_detected_and_nothing_is_kept(server: WeightServer, tmp_path: Path) -> None:
    good = payload_of(0, version=1)
    corrupted = bytearray(good.data)
    corrupted[len(corrupted) // 2] ^= 0xFF
    server.publish(WeightsPayload(1, bytes(corrupted), good.checksum, good.num_tensors))
    with pytest.raises(ChecksumMismatch, match="version 1"):
        fetch_weights_zmq(server.address, have_version=-1, timeout=60.0, dest_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_late_joiner_gets_the_current_version(server: WeightServer, tmp_path: Path) -> None:
    assert fetch_weights_zmq(server.address, have_version=-1, timeout=60.0, dest_dir=tmp_path) == (-1, None)
    payloads = [payload_of(seed, version=v) for v, seed in enumerate((0, 1, 2))]
    for p in payloads:
        server.publish(p)
    version, path = fetch_weights_zmq(server.address, have_version=-1, timeout=60.0, dest_dir=tmp_path)
    assert version == 2 and path is not None and path.read_bytes() == payloads[2].data
    # A generator holding version 0 (the initial weights) also moves to the current one.
    version, path = fetch_weights_zmq(server.address, have_version=0, timeout=60.0, dest_dir=tmp_path / "g2")
    assert (
        version == 2
        and path is not None
        and hashlib.sha256(path.read_bytes()).hexdigest() == payloads[2].checksum
    )


def test_pruned_version_is_reported_gone_and_bad_requests_do_not_stop_the_server(
    server: WeightServer,
) -> None:
    for v in range(3):  # keep=2: version 0 is no longer served
        server.publish(payload_of(0, version=v))
    ctx: zmq.Context[Any] = zmq.Context.instance()
    with open_endpoint(ctx, zmq.DEALER, connect=server.address, max_bytes=1 << 24) as ep:
        reply = request(ep, messages.ChunkRequest(0, 0), timeout_ms=5000, retries=0)
        assert reply.type == messages.NOT_AVAILABLE and reply.body.reason == "version_gone"
        assert reply.body.current_version == 2
        ep.socket.send(b"\x00 not msgpack")
        got = ep.recv(5000)
        assert got is not None and got[1].type == messages.ERROR
        reply = request(ep, messages.ChunkRequest(1, 0), timeout_ms=5000, retries=0)
        assert reply.type == messages.CHUNK and reply.body.index == 0


def test_refused_requests_are_counted_by_reason_in_the_learners_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from stream_dapo.runtime.metrics import LearnerMetrics

    registry = CollectorRegistry()
    metrics = LearnerMetrics(registry)
    # An ipc address only this test can reach: on TCP any process on the machine may connect to the
    # port and send something, and this test counts every rejection exactly (CI once saw a second
    # "malformed" from a stranger on a reused port).
    with WeightServer(
        f"ipc://{tmp_path}/weights", chunk_bytes=CHUNK, rejected_metric=metrics.messages_rejected
    ) as srv:
        srv.publish(payload_of(0, version=1))
        ctx: zmq.Context[Any] = zmq.Context.instance()
        with open_endpoint(ctx, zmq.DEALER, connect=srv.address, max_bytes=1 << 24) as ep:
            ep.socket.send(b"\x00 not msgpack")
            ep.send(messages.Hello("gen-0", 0))
            ep.send(messages.ChunkRequest(1, 10**6))
            reasons = []
            for _ in range(3):
                got = ep.recv(5000)
                assert got is not None and got[1].type == messages.ERROR
                reasons.append(got[1].body.reason)
            assert reasons == ["malformed", "unexpected_type", "bad_chunk_index"]
            assert (
                request(ep, messages.WeightsQuery(0), timeout_ms=5000, retries=0).type
                == messages.WEIGHTS_MANIFEST
            )
    assert dict(srv.rejected) == {"malformed": 1, "unexpected_type": 1, "bad_chunk_index": 1}
    for reason in reasons:
        value = registry.get_sample_value("stream_dapo_learner_messages_rejected_total", {"reason": reason})
        assert value == 1.0


def test_a_generator_that_never_reads_its_chunks_does_not_stall_the_others() -> None:
    """Regression: a reply waited up to 5 s for room in its peer's full queue, so one client asking
    for chunks without reading them held up every other generator's download."""
    import time

    with WeightServer("tcp://127.0.0.1:*", chunk_bytes=1 << 20, hwm=4) as srv:
        srv.publish(serialize_weights({"w": torch.zeros(1 << 20)}, version=1))  # 4 chunks of 1 MiB
        ctx: zmq.Context[Any] = zmq.Context.instance()
        hog = ctx.socket(zmq.DEALER)
        hog.linger, hog.rcvhwm, hog.rcvbuf = 0, 1, 4096
        hog.connect(srv.address)
        try:
            ask = encode(messages.ChunkRequest(1, 0))
            for _ in range(100):
                hog.send(ask)
            time.sleep(1.0)
            with open_endpoint(ctx, zmq.DEALER, connect=srv.address, max_bytes=1 << 24) as ep:
                t0 = time.monotonic()
                reply = request(ep, messages.WeightsQuery(0), timeout_ms=5000, retries=0)
                assert reply.type == messages.WEIGHTS_MANIFEST
                assert time.monotonic() - t0 < 3.0
        finally:
            hog.close(linger=0)


def test_shared_dir_publishes_atomically_and_prunes(tmp_path: Path) -> None:
    pub = SharedDirPublisher(tmp_path / "weights", keep=2)
    assert read_shared_dir(pub.directory, have_version=-1) is None
    payloads = [payload_of(seed, version=v) for v, seed in enumerate((0, 1, 2, 3))]
    for p in payloads:
        written = pub.publish(p)
        latest = json.loads((pub.directory / LATEST_FILE).read_text())
        assert latest == {
            "version": p.version,
            "checksum": p.checksum,
            "file": written.name,
            "total_bytes": p.total_bytes,
        }
    assert sorted(f.name for f in pub.directory.iterdir()) == [
        LATEST_FILE,
        "v00000002.safetensors",
        "v00000003.safetensors",
    ]
    found = read_shared_dir(pub.directory, have_version=-1)
    assert found is not None
    version, path = found
    assert version == 3 and path.read_bytes() == payloads[3].data
    assert read_shared_dir(pub.directory, have_version=3) is None


def test_shared_dir_rejects_a_corrupted_file(tmp_path: Path) -> None:
    pub = SharedDirPublisher(tmp_path, keep=2)
    path = pub.publish(payload_of(0, version=5))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match="v00000005"):
        read_shared_dir(tmp_path, have_version=4)


def test_tied_embeddings_appear_once_and_reload_to_the_same_model() -> None:
    model = tiny_model(0, tied=True)
    sd = gather_full_state_dict(model)
    assert sd is not None
    assert "model.embed_tokens.weight" in sd and "lm_head.weight" not in sd
    assert len(sd) == len(list(model.parameters()))
    restored = Qwen2ForCausalLM(model.config)
    missing, unexpected = restored.load_state_dict(load(serialize_weights(sd, 0).data), strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    restored.tie_weights()
    ids = torch.tensor([[1, 5, 9, 2]])
    torch.testing.assert_close(restored(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)

    untied = gather_full_state_dict(tiny_model(0, tied=False))
    assert untied is not None and "lm_head.weight" in untied


# --------------------------------------------------------------------------------------------- NCCL


def test_nccl_group_spec_counts_one_rank_per_vllm_worker() -> None:
    from stream_dapo.config import Config
    from stream_dapo.weights.nccl import NcclGroupSpec, NcclWeightSender, nccl_group_spec

    cfg = Config.model_validate(
        {
            "generator": {"num_generators": 3, "tensor_parallel_size": 2},
            "transport": {"weights_port": 6000, "nccl_port": 6001, "learner_host": "10.0.0.2"},
        }
    )
    assert nccl_group_spec(cfg) == NcclGroupSpec("10.0.0.2", 6001, 7)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="weights.method"):
            NcclWeightSender(nccl_group_spec(cfg))


def _nccl_rank(rank: int, port: int, out: str) -> None:
    from stream_dapo.weights.nccl import NcclGroupSpec, NcclWeightReceiver, NcclWeightSender

    spec = NcclGroupSpec("127.0.0.1", port, 2)
    torch.cuda.set_device(rank)
    if rank == 0:
        sender = NcclWeightSender(spec, device=0, timeout_s=120).connect()
        model = tiny_model(0).to(torch.bfloat16)
        sender.send(7, gather_full_state_dict(model) or {})
        sender.close()
    else:
        receiver = NcclWeightReceiver(spec, rank=1, device=1).connect()
        version, tensors = receiver.receive(timeout_s=120)
        torch.save({"version": version, "tensors": {n: t.cpu() for n, t in tensors}}, out)
        receiver.close()


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL broadcast needs two GPUs (sender and receiver)"
)
def test_nccl_broadcast_delivers_every_tensor_bit_identically(tmp_path: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    # port-pick: vLLM's stateless NCCL group binds its own TCP store on rank 0 and cannot adopt a
    # listening socket, so this two-GPU test picks a port (the suite's only pick; never on the CPU).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "received.pt"
    mp.start_processes(_nccl_rank, args=(port, str(out)), nprocs=2, start_method="spawn")
    got = torch.load(out)
    expected = gather_full_state_dict(tiny_model(0).to(torch.bfloat16))
    assert got["version"] == 7 and expected is not None
    assert list(got["tensors"]) == list(expected)
    for name, value in expected.items():
        assert got["tensors"][name].dtype == torch.bfloat16
        assert torch.equal(got["tensors"][name], value), name


# --------------------------------------------------------------------------------------------------
# One interface, one factory
# --------------------------------------------------------------------------------------------------


class _MemoryEngine:
    """Records what a source asks the engine to load (the image's bytes, from shared memory)."""

    def __init__(self) -> None:
        self.loaded: list[tuple[bytes, int]] = []

    def update_weights_from_image(self, image: Any, version: int) -> float:
        self.loaded.append((bytes(image), version))
        return 0.5


def test_the_factory_hands_the_generators_relay_metrics_to_its_relay_and_source(tmp_path: Path) -> None:
    """Nothing is contacted (the source binds and connects at its first poll): the counters reach
    the relay and the source, and every reason a relay is dropped for is exported at 0 from the start."""
    from prometheus_client import CollectorRegistry

    from stream_dapo.config import load_config
    from stream_dapo.runtime.metrics import GeneratorMetrics
    from stream_dapo.weights.base import RelayMetrics
    from stream_dapo.weights.factory import make_source
    from stream_dapo.weights.zmq_chunks import ZmqWeightSource
    from stream_dapo.weights.zmq_chunks.peers import DROPPED

    cfg = load_config(
        overrides=["weights.method=zmq", "weights.peer_fanout=2", f'run.out_dir="{tmp_path}"'], environ={}
    )
    registry = CollectorRegistry()
    mx = GeneratorMetrics(registry)
    source = make_source(
        cfg, 0, RelayMetrics(mx.weight_relay_sent_bytes, mx.connections_refused, mx.weight_relays_dropped)
    )
    try:
        assert isinstance(source, ZmqWeightSource) and source.relay is not None
        assert source.relay.sent_metric is mx.weight_relay_sent_bytes
        assert source.relay.refused_metric is mx.connections_refused
        assert source.dropped_metric is mx.weight_relays_dropped
        for reason in DROPPED:
            labels = {"reason": reason}
            assert registry.get_sample_value("stream_dapo_generator_weight_relays_dropped_total", labels) == 0
    finally:
        source.close()


def test_the_factory_builds_each_methods_two_ends_and_they_meet(tmp_path: Path) -> None:
    from stream_dapo.config import load_config
    from stream_dapo.weights.factory import make_publisher, make_source
    from stream_dapo.weights.shared_dir import SharedDirWeightSource
    from stream_dapo.weights.zmq_chunks import ZmqWeightSource

    sd = gather_full_state_dict(tiny_model(0))
    assert sd is not None
    payload = serialize_weights(sd, 3)
    for method, source_type in (("shared_dir", SharedDirWeightSource), ("zmq", ZmqWeightSource)):
        cfg = load_config(
            overrides=[
                f"weights.method={method}",
                f'run.out_dir="{tmp_path / method}"',
                "transport.weights_port=0",  # the publisher binds any free port; the source is told it
                f"weights.chunk_bytes={CHUNK}",
            ],
            environ={},
        )
        publisher = make_publisher(cfg)
        bound = {"weights_port": publisher.bound_ports().get("transport.weights_port", 0)}
        source = make_source(
            cfg.model_copy(update={"transport": cfg.transport.model_copy(update=bound)}), index=0
        )
        try:
            assert isinstance(source, source_type) and source.first_version == 0
            assert source(0) is None  # nothing published yet
            publisher.publish(payload, sd)
            update = source(0)
            assert update is not None and update.version == 3 and update.nbytes == payload.total_bytes
            engine = _MemoryEngine()
            assert source.load(engine, update) == 0.5  # type: ignore[arg-type]
            assert engine.loaded == [(payload.data, 3)]  # the published bytes, from memory: no file
            assert update.path is None
            assert source(3) is None  # nothing newer
        finally:
            source.close()
            publisher.close()


def test_delta_auto_is_off_towards_a_learner_on_this_machine_and_on_towards_another(tmp_path: Path) -> None:
    """weights.delta = auto (the default): a generator asks for deltas unless the learner address it
    connects to is loopback or unspecified; true and false are taken as they are. The learner serves
    deltas unless weights.delta is false."""
    from stream_dapo.config import load_config
    from stream_dapo.weights.factory import delta_wanted, is_local_host, make_publisher, make_source
    from stream_dapo.weights.zmq_chunks import WeightServer, ZmqWeightSource

    assert is_local_host("127.0.0.1") and is_local_host("127.0.0.77") and is_local_host("::1")
    assert is_local_host("[::1]") and is_local_host("0.0.0.0") and is_local_host("localhost")
    assert not is_local_host("10.1.2.3") and not is_local_host("2001:db8::1")
    assert not is_local_host("no-such-host.invalid")  # unresolvable: counted as remote

    def cfg(*overrides: str):
        return load_config(overrides=[*overrides, f'run.out_dir="{tmp_path}"'], environ={})

    assert cfg().weights.delta == "auto"
    cases = {
        (): False,
        ('transport.learner_host="10.1.2.3"',): True,
        ('transport.host="0.0.0.0"',): False,
        ("weights.delta=true",): True,
        ("weights.delta=false", 'transport.learner_host="10.1.2.3"'): False,
    }
    for overrides, wanted in cases.items():
        c = cfg(*overrides)
        assert delta_wanted(c) is wanted, overrides
        source = make_source(c, 0)
        try:
            assert isinstance(source, ZmqWeightSource) and source.delta is wanted, overrides
        finally:
            source.close()
    for overrides, served in (
        (("transport.weights_port=0",), True),
        (("transport.weights_port=0", "weights.delta=false"), False),
    ):
        publisher = make_publisher(cfg(*overrides))
        try:
            assert isinstance(publisher, WeightServer) and publisher.delta is served
        finally:
            publisher.close()


def test_an_image_is_a_function_of_the_state_alone() -> None:
    # The version travels beside the bytes, never in them: the same state published as two versions
    # is the same image and checksum (a version that changed nothing costs a delta receiver nothing),
    # and the header's metadata is the one key transformers checks.
    sd = gather_full_state_dict(tiny_model(0))
    assert sd is not None
    first, again = serialize_weights(sd, 1), serialize_weights(sd, 2)
    assert (first.version, again.version) == (1, 2)
    assert first.data == again.data and first.checksum == again.checksum
    header_len = int.from_bytes(first.data[:8], "little")
    assert json.loads(first.data[8 : 8 + header_len])["__metadata__"] == {"format": "pt"}
    changed = dict(sd)
    name = next(iter(changed))
    changed[name] = changed[name] + 1.0
    assert serialize_weights(changed, 1).checksum != first.checksum

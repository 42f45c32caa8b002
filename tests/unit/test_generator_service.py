"""`GeneratorService` without vLLM: what it does with its collaborators (a stand-in engine, injected
weight sources, the buffer link's message handling), its composition root, and its shutdown."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest

from stream_dapo.generator.engine import RolloutEngine
from stream_dapo.generator.rollout import GroupOutcome
from stream_dapo.generator.verify_queue import VerifyQueue
from stream_dapo.weights import WeightUpdate


def test_outcomes_leave_the_verify_queue_in_finishing_order() -> None:
    import threading

    first_may_finish = threading.Event()

    class Group:
        def __init__(self, version: int) -> None:
            self.start_version = version

    def verify(group: Any) -> GroupOutcome:
        if group.start_version == 3:
            first_may_finish.wait(10)
        return cast(GroupOutcome, group)

    queue = VerifyQueue()
    try:
        queue.submit(Group(3), verify)  # type: ignore[arg-type]
        queue.submit(Group(4), verify)  # type: ignore[arg-type]
        time.sleep(0.05)
        assert list(queue.done()) == [] and queue.start_versions() == [3, 4], "b waits behind a"
        first_may_finish.set()
        queue.wait()
        taken = queue.done()
        assert next(taken).start_version == 3 and queue.start_versions() == [4]
        assert next(taken).start_version == 4 and len(queue) == 0
    finally:
        queue.close()


def test_a_message_the_generator_does_not_expect_is_counted_as_rejected() -> None:
    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator
    from stream_dapo.transport import messages as m
    from stream_dapo.transport.codec import Message

    svc = build_generator(load_config(environ={}))
    try:
        svc.link.on_message(Message(m.EMPTY, m.Empty("ready")))  # the learner's reply, not ours
        req = svc.link.credits.request(in_flight=0, now=0.0)
        assert req is not None
        svc.link.on_message(Message(m.CREDIT, m.Credit(2, 0), req.request_id))
        svc.link.on_message(Message(m.CREDIT, m.Credit(2, 0), req.request_id))
        rejected = svc.registry.get_sample_value(
            "stream_dapo_generator_messages_rejected_total", {"reason": "unexpected_type"}
        )
        assert rejected == 1.0
        assert svc.link.credits.held == 2, "the second reply to the same request is not a second grant"
        assert svc.registry.get_sample_value("stream_dapo_generator_stale_credit_replies_total") == 1.0
    finally:
        svc.close()


def test_a_starting_generator_loads_the_shared_dir_version_through_its_weight_source(tmp_path: Path) -> None:
    """The late-joiner rule through the `WeightSource` interface: the service asks the source the
    factory built for weights.method, and the source hands the file's bytes to the engine, from memory."""
    import torch

    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator
    from stream_dapo.weights import SharedDirPublisher, serialize_weights

    class FileEngine:
        version = 0
        image = b""

        def update_weights_from_image(self, image: Any, version: int) -> float:
            self.version, self.image = version, bytes(image)
            return 0.0

    cfg = load_config(
        overrides=[
            "weights.method=shared_dir",
            f'weights.shared_dir="{tmp_path}"',
            "generator.weight_poll_s=60",
        ],
        environ={},
    )
    payload = serialize_weights({"w": torch.ones(2)}, 7)
    SharedDirPublisher(tmp_path).publish(payload)
    svc = build_generator(cfg)
    engine = FileEngine()
    svc.engine = cast(RolloutEngine, engine)
    try:
        svc.intake.load_initial(cast(RolloutEngine, engine))
        assert engine.version == 7
        assert engine.image == payload.data
        assert svc.intake.source is not None and svc.intake.source.latest_seen == 7
        sample = svc.registry.get_sample_value
        assert sample("stream_dapo_generator_weight_received_bytes_total") == payload.total_bytes
        assert sample("stream_dapo_generator_weight_delta_ratio") == 1.0  # a whole file, no delta
        assert svc.registry.get_sample_value("stream_dapo_generator_policy_version") == 7
    finally:
        svc.engine = None
        svc.close()


def test_the_generator_takes_its_settings_and_collaborators_from_its_composition_root(tmp_path: Path) -> None:
    """`build_generator(cfg)` composes; the service reads only its settings and asks its
    collaborators for what was not injected (issue 39: narrow inputs), so a caller can hand it
    another weight source or another output directory without touching the config."""
    import dataclasses

    import torch

    from stream_dapo.config import load_config
    from stream_dapo.generator.root import ConfiguredCollaborators, generator_settings
    from stream_dapo.generator.service import GeneratorService
    from stream_dapo.runtime.ports import read_bound_ports
    from stream_dapo.weights import SharedDirPublisher, WeightSource, serialize_weights
    from stream_dapo.weights.shared_dir import SharedDirWeightSource

    class FileEngine:
        version = 0

        def update_weights_from_image(self, image: Any, version: int) -> float:
            self.version = version
            return 0.0

    named, elsewhere = tmp_path / "named", tmp_path / "elsewhere"
    cfg = load_config(
        overrides=[
            "weights.method=shared_dir",
            f'weights.shared_dir="{named}"',
            "generator.weight_poll_s=60",
            "metrics.generator_port=0",
            f'run.out_dir="{tmp_path / "run"}"',
        ],
        environ={},
    )
    SharedDirPublisher(named).publish(serialize_weights({"w": torch.ones(2)}, 3))
    SharedDirPublisher(elsewhere).publish(serialize_weights({"w": torch.zeros(2)}, 9))

    class WeightsFromElsewhere(ConfiguredCollaborators):
        def weight_source(self, relay_metrics: Any) -> WeightSource:
            return SharedDirWeightSource(elsewhere)

    settings = dataclasses.replace(generator_settings(cfg, 2), out_dir=str(tmp_path / "out"))
    svc = GeneratorService(settings, WeightsFromElsewhere(cfg, settings))
    engine = FileEngine()
    svc.engine = cast(RolloutEngine, engine)
    try:
        svc.start_metrics()
        svc.intake.load_initial(cast(RolloutEngine, engine))
        assert engine.version == 9, "the injected source's version, not the config's (3)"
    finally:
        svc.engine = None
        svc.close()
    assert read_bound_ports(tmp_path / "out", "generator-2") is not None, "ports under the injected out_dir"
    assert read_bound_ports(cfg.run.out_dir, "generator-2") is None, "not under the one the config names"


# --------------------------------------------------------------------------------------------------
# Shutdown
# --------------------------------------------------------------------------------------------------


class ClosingEngine:
    """Only what `GeneratorService.close` asks of an engine."""

    closed = False

    def close(self) -> None:
        self.closed = True


class BrokenWeightSource:
    """A weight source whose close fails the way the zmq source's did (EBADF from its shared memory)."""

    def __init__(self) -> None:
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        raise OSError(9, "Bad file descriptor")


def _stoppable_generator(tmp_path: Path, weights: Any, *overrides: str) -> Any:
    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator

    cfg = load_config(
        overrides=["metrics.generator_port=0", f'run.out_dir="{tmp_path}"', *overrides], environ={}
    )
    return build_generator(cfg, engine=cast(RolloutEngine, ClosingEngine()), weights=weights)


def test_a_generator_writes_its_final_metrics_and_closes_its_engine_when_a_shutdown_step_fails(
    tmp_path: Path,
) -> None:
    """Regression: a real-model async run's generator wrote no final-metrics file (its figures in
    async_vs_sync_smollm2-words.json came out null): its weight source's close raised EBADF, which
    ended close() before the final metrics were written and before its engine was closed."""
    import json

    from stream_dapo.runtime.metrics import final_metrics_path

    weights = BrokenWeightSource()
    svc = _stoppable_generator(tmp_path, weights)
    engine = svc.engine
    svc.metrics.samples.inc(24)
    with pytest.raises(OSError, match="Bad file descriptor"):
        svc.close()
    assert weights.closes == 1
    assert engine.closed, "the engine is closed although the weight source failed to"
    final = json.loads(final_metrics_path(tmp_path, "generator-0").read_text())
    assert final["stream_dapo_generator_samples_total"] == 24.0


def test_the_weight_source_stays_open_while_the_watcher_is_inside_a_poll(tmp_path: Path) -> None:
    """A poll waits up to transport.timeout_s for a learner that has exited; close() must not close
    the socket and shared memory that poll is using (the watcher thread got ENOTSOCK, close() EBADF)."""
    import threading

    polling, let_go = threading.Event(), threading.Event()

    class Source(BrokenWeightSource):
        """Nothing published at start-up; the watcher's first poll then waits for let_go."""

        first_version = 0
        startup = "look"
        latest_seen = -1
        polls = 0

        def __call__(self, have: int) -> WeightUpdate | None:
            self.polls += 1
            if self.polls > 1:  # the watcher's, not the start-up look
                polling.set()
                let_go.wait()
            return None

        def join(self, engine: Any) -> None:
            pass

        def close(self) -> None:
            self.closes += 1

    weights = Source()
    svc = _stoppable_generator(tmp_path, weights, "generator.weight_poll_s=0.01")
    svc.intake.load_initial(svc.engine)
    watcher = svc.intake.watcher
    watcher.stop_wait_s = 0.0  # it cannot end before let_go: no need to wait for it
    assert polling.wait(10)
    try:
        svc.close()
        assert weights.closes == 0, "closed under the watcher's poll"
        assert svc.engine.closed
    finally:
        let_go.set()
    watcher.stop_wait_s = 60.0
    assert watcher.stop(), "once its poll returns the watcher ends"

"""A stop signal that reaches vLLM's processes too (``kill -TERM -<pgid>``) drains the generator; an
engine failure without a stop request is still a failure.

Regression: an operator's ``kill -TERM -<pgid>`` during a weight update made the generator exit 1
("collective_rpc ... cancelled"): the engine's processes died with the same signal, the pending engine
call failed, and the service treated it as a crash instead of draining.

``DyingEngine`` stands in for ``RolloutEngine`` only here (the buffer is real): it fails the way a
vLLM engine whose processes are gone fails, right after the stop signal's handler has run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from stream_dapo.config import load_config
from stream_dapo.generator.root import build_generator
from stream_dapo.generator.service import GeneratorService
from stream_dapo.weights import serialize_weights
from stream_dapo.weights.shared_dir import SharedDirPublisher
from tests.integration.test_buffer_service import overrides, service_in_thread
from tests.integration.test_generator_startup_weights import FakeEngine, NoVerifier

IN_FLIGHT = 2


class DyingEngine(FakeEngine):
    """Two groups in flight; its third step fails (after asking the service to stop, when
    ``with_stop``: the signal's Python handler runs before the failure surfaces)."""

    def __init__(self, with_stop: bool) -> None:
        self.with_stop = with_stop
        self.service: GeneratorService | None = None
        self.num_in_flight = IN_FLIGHT
        self.steps = 0
        self.aborts: list[bool] = []

    def step(self) -> list[Any]:
        self.steps += 1
        if self.steps == 3:
            if self.with_stop:
                assert self.service is not None
                self.service.request_stop()
            raise RuntimeError("collective_rpc('update_weights_from_shm') cancelled: the engine core died")
        return []

    def start_versions(self) -> list[int]:
        return [0] * self.num_in_flight

    def abort_all(self, engine_alive: bool = True) -> int:
        self.aborts.append(engine_alive)
        aborted, self.num_in_flight = self.num_in_flight, 0
        return aborted


def buffer_overrides(tmp_path: Path) -> list[str]:
    return [*overrides(tmp_path), "weights.method=shared_dir"]


def start_generator(tmp_path: Path, buffer: Any, engine: DyingEngine) -> GeneratorService:
    """A generator over the real buffer, started on version 1 of a shared-directory publication."""
    SharedDirPublisher(tmp_path / "weights").publish(serialize_weights({"w": torch.zeros(2)}, 1))
    cfg = load_config(
        overrides=[
            *buffer_overrides(tmp_path),
            f"transport.samples_port={buffer.bound_ports['transport.samples_port']}",
            "metrics.generator_port=0",
            f"generator.max_groups_in_flight={IN_FLIGHT}",
            "transport.timeout_s=5",
        ],
        environ={},
    )
    service = build_generator(cfg, 0, engine=engine, verifier=NoVerifier(), prompts=iter(()))  # type: ignore[arg-type]
    engine.service = service
    service.start()
    assert engine.version == 1
    return service


def test_an_engine_that_dies_with_the_stop_signal_is_drained_around_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with service_in_thread(load_config(overrides=buffer_overrides(tmp_path), environ={})) as buffer:
        engine = DyingEngine(with_stop=True)
        service = start_generator(tmp_path, buffer, engine)
        try:
            with caplog.at_level(logging.INFO, logger="stream_dapo"):
                service.serve()  # returns: a drain, not an exception
        finally:
            service.close()
    assert engine.steps == 3, "the drain did not step the dead engine again"
    assert engine.aborts == [False], "the groups were forgotten without calling into the dead engine"
    assert service.link.credits.held == 0
    assert service.metrics.groups_aborted._value.get() == IN_FLIGHT
    assert "the engine stopped with the stop signal" in caplog.text
    assert "drained (2 groups aborted)" in caplog.text


def test_an_engine_failure_without_a_stop_request_is_still_a_failure(tmp_path: Path) -> None:
    with service_in_thread(load_config(overrides=buffer_overrides(tmp_path), environ={})) as buffer:
        engine = DyingEngine(with_stop=False)
        service = start_generator(tmp_path, buffer, engine)
        try:
            with pytest.raises(RuntimeError, match="cancelled"):
                service.serve()
        finally:
            service.close()
    assert engine.aborts == [], "no drain ran"

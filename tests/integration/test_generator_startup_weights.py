"""A generator that starts while the newest shared-directory weights are corrupt waits, not ready, for
a good version instead of crashing.

Regression: a generator starting while the newest file in the shared directory did not match its
checksum exited 1 with an uncaught `ChecksumMismatch` traceback, although a running generator in the
same situation keeps its version and loads the next good one.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from stream_dapo.config import load_config
from stream_dapo.generator.root import build_generator
from stream_dapo.weights import serialize_weights
from stream_dapo.weights.shared_dir import SharedDirPublisher
from tests.integration.test_buffer_service import overrides, service_in_thread

WAIT_S = 120.0  # only reached when something is broken


class FakeEngine:
    """The engine's face at start-up: a policy version and a weight load (no vLLM)."""

    version = 0
    num_in_flight = 0
    tokens_generated = 0
    tokens_recomputed = 0

    def update_weights_from_image(self, image: object, version: int) -> float:
        self.version = version
        return 0.0

    def start_versions(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class NoVerifier:
    def close(self) -> None:
        pass


def wait_for(what: str, cond: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_corrupt_newest_file_at_start_up_is_waited_out_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    shared = tmp_path / "weights"  # run.out_dir is tmp_path (overrides): weights.shared_dir defaults here
    publisher = SharedDirPublisher(shared)
    corrupt = publisher.publish(serialize_weights(state, 1))
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))

    base = [*overrides(tmp_path), "weights.method=shared_dir", "generator.weight_poll_s=0.1"]
    with service_in_thread(load_config(overrides=base, environ={})) as buffer:
        cfg = load_config(
            overrides=[
                *base,
                f"transport.samples_port={buffer.bound_ports['transport.samples_port']}",
                "metrics.generator_port=0",
            ],
            environ={},
        )
        engine = FakeEngine()
        service = build_generator(cfg, 0, engine=engine, verifier=NoVerifier(), prompts=iter(()))  # type: ignore[arg-type]
        errors: list[BaseException] = []

        def start() -> None:
            try:
                service.start()
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=start, daemon=True)
        try:
            with caplog.at_level(logging.WARNING, logger="stream_dapo"):
                thread.start()
                wait_for(
                    "the warning about the corrupt file",
                    lambda: (
                        errors
                        or any(
                            "waiting for the learner to publish a good version" in r.getMessage()
                            for r in caplog.records
                        )
                    ),
                )
                assert not errors, errors
                assert thread.is_alive() and engine.version == 0, "nothing corrupt was loaded"
                assert service.health.status("ready")[0] == 503 and service.health.status("live")[0] == 200
                publisher.publish(serialize_weights(state, 2))  # the learner publishes a good version
                thread.join(WAIT_S)
            assert not thread.is_alive() and not errors, errors
            assert engine.version == 2 and service.health.status("ready")[0] == 200
            assert "Traceback" not in caplog.text
        finally:
            service.request_stop()
            thread.join(WAIT_S)
            service.close()

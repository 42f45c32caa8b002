"""Helpers for tests and benchmarks that run the real services: ports bound by the services or held by
the caller, and the overrides of a small, fast pipeline run; small models and groups to feed them."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PORT_KEYS = (
    "transport.samples_port",
    "transport.batches_port",
    "transport.weights_port",
    "metrics.buffer_port",
    "metrics.learner_port",
    "metrics.generator_port",
)
"""The ports one generator, the buffer and the learner bind (weights.method = "nccl" adds
transport.nccl_port)."""


def port_overrides() -> list[str]:
    """Every key of `PORT_KEYS` set to 0: each service binds a port of the kernel's choosing and
    reports it (`stream_dapo/runtime/ports.py`), so a test's services never meet another run's and no port is
    picked, released and bound later (another process can take it in between)."""
    return [f"{key}=0" for key in PORT_KEYS]


class HeldPorts:
    """Listening sockets on loopback that the test holds for the settings given and hands to each
    service it starts (`env`, `fds`: STREAM_DAPO_LISTEN_FDS), so that a service keeps its port across
    kills and restarts and nothing else can take it meanwhile. `overrides` tells the peers."""

    def __init__(self, *settings: str) -> None:
        self.sockets: dict[str, socket.socket] = {}
        for setting in settings:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(128)
            self.sockets[setting] = s

    @property
    def ports(self) -> dict[str, int]:
        return {k: int(s.getsockname()[1]) for k, s in self.sockets.items()}

    def overrides(self, *settings: str) -> list[str]:
        return [f"{k}={p}" for k, p in self.ports.items() if not settings or k in settings]

    def env(self, *settings: str) -> dict[str, str]:
        from stream_dapo.runtime.ports import LISTEN_FDS_ENV

        return {LISTEN_FDS_ENV: ",".join(f"{k}={self.sockets[k].fileno()}" for k in settings)}

    def fds(self, *settings: str) -> tuple[int, ...]:
        return tuple(self.sockets[k].fileno() for k in settings)

    def close(self) -> None:
        for s in self.sockets.values():
            s.close()

    def __enter__(self) -> HeldPorts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def unserved_ports(n: int) -> Iterator[list[int]]:
    """n ports nobody serves: bound (never listening) and held until the block ends, so a client that
    connects there is refused and no other process can start listening there meanwhile."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        yield [int(s.getsockname()[1]) for s in socks]


def wait_ports(out: Path, service: str, proc: Any, timeout_s: float = 300.0) -> dict[str, int]:
    """The ports `service` (the Popen `proc`) reported in out/ports/<service>.json."""
    from stream_dapo.runtime.ports import wait_bound_ports

    return wait_bound_ports(out, service, proc.poll, pid=proc.pid, timeout_s=timeout_s)


TINY_SIZES = [
    "algo.group_size=4",
    "algo.max_response_len=64",
    "algo.overlong_cache_len=16",
    "algo.max_staleness=4",
    "learner.rollout_batch_prompts=4",
    "learner.mini_batch_samples=8",
    "learner.checkpoint_every=2",
    "generator.max_groups_in_flight=8",
    "generator.kv_cache_gib=0.25",
]
"""The test pipeline's sizes: G=4, 4 prompts per rollout, 2 optimizer steps each."""


def tiny_overrides(model: Path, out: Path) -> list[str]:
    """A pipeline small enough for a test (TINY_SIZES) on `model`, writing to `out`, every port 0."""
    return [f"model.path={model}", f'run.out_dir="{out}"', *TINY_SIZES, *port_overrides()]


def admission_policy(**overrides: Any):  # -> stream_dapo.buffer.replay.AdmissionPolicy
    """A small AdmissionPolicy for buffer tests: capacity 6 in line, 100 stored, B_v = 2, max
    staleness 3, no reuse, G = 2; `overrides` replace any of them."""
    from stream_dapo.buffer.replay import AdmissionPolicy

    values: dict[str, Any] = {
        "admission_capacity": 6,
        "capacity_groups": 100,
        "groups_per_version": 2,
        "max_staleness": 3,
        "max_reuse": 1,
        "group_size": 2,
    }
    return AdmissionPolicy(**{**values, **overrides})


def tiny_qwen2(seed: int = 0, tied: bool = True):  # -> transformers.Qwen2ForCausalLM (imported lazily)
    """A randomly initialised 20k-parameter Qwen2 for learner and weight tests (fp32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(cfg).float()


def wire_group(gid: str):  # -> stream_dapo.transport.messages.Group (imported lazily)
    """A one-sample group of two response tokens, correct, advantage 0.5, from generator-0: for tests
    of what carries groups (acks, resends), not of what is in them."""
    import numpy as np

    from stream_dapo.transport.messages import Group, Sample

    s = Sample(
        tokens=np.array([1, 2], dtype=np.int32),
        logprobs=np.array([-0.1, -0.2], dtype=np.float32),
        versions=np.array([0, 0], dtype=np.int32),
        reward=1.0,
        correct=True,
        truncated=False,
        advantage=0.5,
    )
    return Group(gid, "p", "generator-0", "1", np.array([3], dtype=np.int32), 1.0, [s])


def random_group(
    rng, gid: str, prompt_len: int, lengths: list[int], advantages: list[float], weights: list[float]
):  # -> stream_dapo.transport.messages.Group (imported lazily)
    """A group of random tokens (ids < 64): one sample per entry of ``lengths``, reward the sign of its
    advantage, and ``weights`` as loss weights (a 0 marks an overlong-filtered, truncated sample)."""
    import numpy as np

    from stream_dapo.transport.messages import Group, Sample

    samples = [
        Sample(
            tokens=rng.integers(0, 64, n).astype(np.int32),
            logprobs=rng.uniform(-5.0, -3.5, n).astype(np.float32),
            versions=np.zeros(n, np.int32),
            reward=float(np.sign(a)),
            correct=a > 0,
            truncated=w == 0,
            advantage=a,
            loss_weight=w,
        )
        for n, a, w in zip(lengths, advantages, weights, strict=True)
    ]
    return Group(
        group_id=gid,
        prompt_id=gid,
        generator_id="g0",
        gold="1",
        prompt_tokens=rng.integers(0, 64, prompt_len).astype(np.int32),
        created_at=0.0,
        samples=samples,
    )

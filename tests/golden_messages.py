"""One message of every type, built through the builders: the golden wire fixtures in
`tests/data/formats_289e6bd/wire/` are these messages as the code at 289e6bd encoded them."""

from __future__ import annotations

from typing import Any

import numpy as np

from stream_dapo.transport import messages as m
from stream_dapo.transport.messages import Group, Sample


def _group(group_id: str, n_samples: int, length: int) -> Group:
    samples = [
        Sample(
            tokens=np.arange(1, length + 1, dtype=np.int32) * (k + 1),
            logprobs=np.linspace(-2.0, -0.125, length, dtype=np.float32),
            versions=np.full(length, k, dtype=np.int32),
            reward=1.0 if k % 2 else -1.0,
            correct=bool(k % 2),
            truncated=k == 2,
            advantage=0.5 * (k - 1),
            loss_weight=0.0 if k == 2 else 1.0,
        )
        for k in range(n_samples)
    ]
    return Group(
        group_id, "p-7", "gen-0", "\\frac{1}{2}", np.array([101, 102, 103], np.int32), 1.7e9 + 0.25, samples
    )


ROLLOUTS = {
    "mixed": 3,
    "all_correct": 1,
    "all_wrong": 2,
    "samples": 24,
    "correct": 9,
    "truncated": 1,
    "response_tokens": 4096,
}


def golden_messages() -> dict[str, tuple[str, Any, int | None]]:
    """name -> (message type, body as the builder returns it, request id)."""
    built: dict[str, tuple[tuple[str, Any], int | None]] = {
        "hello": (m.hello("gen-0", 3), 7),
        "credit_request": (m.credit_request("gen-0", 4), 8),
        "groups": (m.groups("gen-0", [_group("g-1", 3, 4), _group("g-2", 2, 1)]), None),
        "groups_full": (m.groups("gen-0", [_group("g-3", 2, 2)], filtered_total=5, rollouts=ROLLOUTS), None),
        "groups_empty": (m.groups("gen-0", [], filtered_total=2), None),
        "heartbeat": (m.heartbeat("gen-0", 0), 9),
        "heartbeat_rollouts": (m.heartbeat("gen-0", 6, ROLLOUTS), 10),
        "credit": (m.credit(4, 2), 8),
        "lease": (m.lease(3, True, 2), 9),
        "ack": (m.ack(["g-1"], ["g-0"], [("g-2", "wrong_group_size")]), None),
        "learner_hello": (m.learner_hello(5, 4), 1),
        "batch_request": (m.batch_request(5, 8, 65536), 2),
        "commit": (m.commit(5, ["g-1", "g-2"]), 3),
        "batch": (m.batch([_group("g-4", 2, 3)], 1), 2),
        "batch_rollouts": (m.batch([_group("g-5", 1, 2)], 0, ROLLOUTS), 2),
        "empty": (m.empty("no_groups"), 2),
        "weights_query": (m.weights_query(4), 11),
        "weights_manifest": (m.weights_manifest(5, "ab" * 32, 10, 4), 11),
        "chunk_request": (m.chunk_request(5, 2), 12),
        "chunk": (m.chunk(5, 2, b"\x00\x01\xff"), 12),
        "not_available": (m.not_available(4, 5, "no_newer_version"), 11),
        "error": (m.error("bad_schema", "hello.policy_version: expected int, got str"), None),
    }
    return {name: (t, body, rid) for name, ((t, body), rid) in built.items()}

"""One message of every type: the golden wire fixtures in `tests/data/formats_289e6bd/wire/` are
these messages as the code at 289e6bd encoded them (it built them with the builder functions
`m.hello(...)` etc. that the structs replaced, from the same values)."""

from __future__ import annotations

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


ROLLOUTS = m.Rollouts(
    mixed=3, all_correct=1, all_wrong=2, samples=24, correct=9, truncated=1, response_tokens=4096
)


def golden_messages() -> dict[str, tuple[m.Body, int | None]]:
    """name -> (message, request id)."""
    return {
        "hello": (m.Hello("gen-0", 3), 7),
        "credit_request": (m.CreditRequest("gen-0", 4), 8),
        "groups": (m.Groups("gen-0", [_group("g-1", 3, 4), _group("g-2", 2, 1)]), None),
        "groups_full": (m.Groups("gen-0", [_group("g-3", 2, 2)], filtered_total=5, rollouts=ROLLOUTS), None),
        "groups_empty": (m.Groups("gen-0", [], filtered_total=2), None),
        "heartbeat": (m.Heartbeat("gen-0", 0), 9),
        "heartbeat_rollouts": (m.Heartbeat("gen-0", 6, ROLLOUTS), 10),
        "credit": (m.Credit(4, 2), 8),
        "lease": (m.Lease(3, True, 2), 9),
        "ack": (m.Ack(["g-1"], ["g-0"], [m.Rejection("g-2", "wrong_group_size")]), None),
        "learner_hello": (m.LearnerHello(5, 4), 1),
        "batch_request": (m.BatchRequest(5, 8, 65536), 2),
        "commit": (m.Commit(5, ["g-1", "g-2"]), 3),
        "batch": (m.Batch([_group("g-4", 2, 3)], 1), 2),
        "batch_rollouts": (m.Batch([_group("g-5", 1, 2)], 0, ROLLOUTS), 2),
        "empty": (m.Empty("no_groups"), 2),
        "weights_query": (m.WeightsQuery(4), 11),
        "weights_manifest": (m.WeightsManifest.of(5, "ab" * 32, 10, 4), 11),
        "chunk_request": (m.ChunkRequest(5, 2), 12),
        "chunk": (m.Chunk(5, 2, memoryview(b"\x00\x01\xff")), 12),
        "not_available": (m.NotAvailable(4, 5, "no_newer_version"), 11),
        "error": (m.Error("bad_schema", "hello.policy_version: expected int, got str"), None),
    }

"""The generator: vLLM rollouts in groups, verified and filtered, streamed to the buffer.

- ``rollout``: pure post-processing of a finished group (verify, dynamic sampling, overlong shaping,
  advantages, the wire ``Group``);
- ``engine``: ``RolloutEngine``, continuous group generation on vLLM with per-token behaviour versions
  and in-place weight swaps;
- ``worker_ext``: the methods injected into vLLM's workers (weight loading, fingerprint, NCCL);
- ``service``: the ``stream-dapo generator`` service (lifecycle, loop, metrics, drain), over
  ``buffer_link`` (hello, credits, lease, acks and resends), ``weight_intake`` (the late-joiner load,
  weight polling and the swap between steps) and ``verify_queue``; ``root`` composes it from the
  configuration.

Importing this package does not import vLLM; ``RolloutEngine.start`` does.
"""

from stream_dapo.generator.engine import RolloutEngine, WeightUpdateError, versions_from_spans
from stream_dapo.generator.rollout import (
    FinishedGroup,
    FinishedSample,
    GroupOutcome,
    RolloutSettings,
    build_group,
    process_group,
)
from stream_dapo.generator.worker_ext import WORKER_EXTENSION, WeightUpdateExtension

__all__ = [
    "WORKER_EXTENSION",
    "FinishedGroup",
    "FinishedSample",
    "GroupOutcome",
    "RolloutEngine",
    "RolloutSettings",
    "WeightUpdateError",
    "WeightUpdateExtension",
    "build_group",
    "process_group",
    "versions_from_spans",
]

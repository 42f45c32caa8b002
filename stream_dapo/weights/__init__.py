"""Weight synchronisation from the learner to the generators.

`base`: the publication (`WeightsPayload`: gathered on rank 0, safetensors bytes, sha256) and the two
interfaces, `WeightPublisher` (learner) and `WeightSource` (generator). One module per method holds
both ends: `zmq_chunks` (chunked over ZeroMQ, the CPU default: a window of chunk requests, checked
per chunk, deltas against the version a generator holds), `shared_dir` (files in a shared
directory), `nccl` (broadcast into vLLM workers, GPU only; announced over ZeroMQ). `factory` builds
the pair that ``weights.method`` names. What they share: `delta` (chunk digests, the full-state
checksum, XOR deltas), `image` (a version in shared memory, which the engine's worker maps) and
`safetensors_view` (the tensors of an image in memory, as views).
"""

from stream_dapo.weights.base import (
    ChecksumMismatch,
    WeightPublisher,
    WeightsError,
    WeightSource,
    WeightsPayload,
    WeightTarget,
    WeightUpdate,
    gather_full_state_dict,
    serialize_weights,
    sha256_file,
    weights_file_name,
)
from stream_dapo.weights.shared_dir import LATEST_FILE, SharedDirPublisher, read_shared_dir
from stream_dapo.weights.zmq_chunks import WeightServer, fetch_weights_stream, fetch_weights_zmq

__all__ = [
    "LATEST_FILE",
    "ChecksumMismatch",
    "SharedDirPublisher",
    "WeightPublisher",
    "WeightServer",
    "WeightSource",
    "WeightTarget",
    "WeightUpdate",
    "WeightsError",
    "WeightsPayload",
    "fetch_weights_stream",
    "fetch_weights_zmq",
    "gather_full_state_dict",
    "read_shared_dir",
    "serialize_weights",
    "sha256_file",
    "weights_file_name",
]

"""Weight synchronisation from the learner to the generators.

Learner side (`publisher`): gather the full weights on rank 0, serialise them as safetensors, sha256
them, and publish over ZeroMQ (`WeightServer`), a shared directory (`SharedDirPublisher`) or NCCL
(`nccl.NcclWeightSender`, GPU only). Generator side (`receiver`, `nccl.NcclWeightReceiver`): fetch,
verify the checksum, hand back a local file or tensors.
"""

from stream_dapo.weights.publisher import (
    LATEST_FILE,
    SharedDirPublisher,
    WeightServer,
    WeightsPayload,
    gather_full_state_dict,
    serialize_weights,
    sha256_file,
    weights_file_name,
)
from stream_dapo.weights.receiver import ChecksumMismatch, WeightsError, fetch_weights_zmq, read_shared_dir

__all__ = [
    "LATEST_FILE",
    "ChecksumMismatch",
    "SharedDirPublisher",
    "WeightServer",
    "WeightsError",
    "WeightsPayload",
    "fetch_weights_zmq",
    "gather_full_state_dict",
    "read_shared_dir",
    "serialize_weights",
    "sha256_file",
    "weights_file_name",
]

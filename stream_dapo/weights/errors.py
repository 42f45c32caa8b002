"""The weights package's errors, a leaf module (the shared-memory image and the methods raise them;
`stream_dapo.weights.base` re-exports them)."""


class WeightsError(RuntimeError):
    """Weights could not be obtained; the message says why and what to check."""


class ChecksumMismatch(WeightsError):
    """The bytes received do not hash to the announced checksum; they were discarded."""

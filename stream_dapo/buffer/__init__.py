"""The replay buffer: a pure state machine (`replay`), its durable journal (`journal`), and the
`stream-dapo buffer` service around them (`service`, not imported here: the CLI loads it)."""

from stream_dapo.buffer.journal import Journal, JournalError
from stream_dapo.buffer.replay import (
    AddResult,
    AdmissionPolicy,
    BufferInputError,
    CommitResult,
    GroupState,
    MemoryLog,
    Persistence,
    ReplayBuffer,
    ServeResult,
)

__all__ = [
    "AddResult",
    "AdmissionPolicy",
    "BufferInputError",
    "CommitResult",
    "GroupState",
    "Journal",
    "JournalError",
    "MemoryLog",
    "Persistence",
    "ReplayBuffer",
    "ServeResult",
]

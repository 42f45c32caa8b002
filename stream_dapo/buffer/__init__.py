"""The replay buffer: a pure state machine (`replay`, the facade over its two halves: the
generators in `fleet`, the groups in `queue`; `policy` holds what both decide with), its durable
journal (`journal`), and the `stream-dapo buffer` service around them (`service`, not imported
here: the CLI loads it).

The package exports the main types; the results and records of the state machine are in `replay`.
"""

from stream_dapo.buffer.journal import Journal, JournalError
from stream_dapo.buffer.replay import AdmissionPolicy, BufferInputError, GroupState, ReplayBuffer

__all__ = ["AdmissionPolicy", "BufferInputError", "GroupState", "Journal", "JournalError", "ReplayBuffer"]

"""Transport between services: message schemas, the msgpack codec, and ZeroMQ endpoints.

    from stream_dapo.transport import messages, open_endpoint, request
    ep = open_endpoint(ctx, zmq.DEALER, connect="tcp://buffer:5555", max_bytes=64 * MIB, peer="buffer")
    reply = request(ep, messages.Hello("gen-0", policy_version=0), timeout_ms=2000, retries=3)
    reply.body.learner_version  # typed: reply.body is a messages.Credit

Nothing here imports torch or the project config: callers pass addresses, limits and keys.
"""

from stream_dapo.transport import messages
from stream_dapo.transport.codec import (
    REASONS,
    SCHEMA_VERSION,
    CodecError,
    Message,
    decode,
    encode,
    pack_value,
    unpack_value,
    wire_bytes,
)
from stream_dapo.transport.messages import Group, Sample, SchemaError
from stream_dapo.transport.sockets import (
    MIB,
    WEIGHTS_MAX_BYTES,
    BindError,
    CurveKeys,
    Endpoint,
    PeerUnavailable,
    PeerUnreachable,
    RemoteError,
    TransportError,
    TransportTimeout,
    make_socket,
    open_endpoint,
    request,
)

__all__ = [
    "MIB",
    "REASONS",
    "SCHEMA_VERSION",
    "WEIGHTS_MAX_BYTES",
    "BindError",
    "CodecError",
    "CurveKeys",
    "Endpoint",
    "Group",
    "Message",
    "PeerUnavailable",
    "PeerUnreachable",
    "RemoteError",
    "Sample",
    "SchemaError",
    "TransportError",
    "TransportTimeout",
    "decode",
    "encode",
    "make_socket",
    "messages",
    "open_endpoint",
    "pack_value",
    "request",
    "unpack_value",
    "wire_bytes",
]

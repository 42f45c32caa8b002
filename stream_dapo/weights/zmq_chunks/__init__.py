"""Weights chunked over ZeroMQ, both ends. Works everywhere; the CPU default (``weights.method = "zmq"``).

One module per part:

- `server`: the learner's `WeightServer`, serving the published versions from a background thread;
- `source`: the generator's `ZmqWeightSource` (the `WeightSource` it polls), which streams each newer
  version into memory and, with fan-out, serves what it holds to other generators;
- `stream`: the windowed fetch of one version (`fetch_weights_stream`), checked chunk by chunk;
- `peers`: where the chunks come from (the learner's server, other generators' relays);
- `download`: the older fetch into a file (`fetch_weights_zmq`), the benchmark's baseline.

Protocol (generator DEALER -> the server's ROUTER)::

    weights_query{have_version}  -> weights_manifest{version, checksum, total_bytes, chunk_bytes,
                                        num_chunks, format, chunk_digests, state_checksum,
                                        published_at[, peers], digest}       (the current version)
                                 -> not_available{reason="no_weights_yet"}  (nothing published)
    chunk_request{version, index[, base_version, base_checksum]}
                                 -> chunk{version, index, data[, encoding="xor_zlib", base_version]}
                                 -> not_available{reason="version_gone"}   (pruned: ask again)

The manifest always describes the current version, whatever ``have_version`` says; the client
compares (``have_version`` is informational, so a late joiner needs no special value). The last
``keep`` versions stay servable, so a fetch that straddles a publication still completes.

The generator's path (`fetch_weights_stream`) keeps ``window`` chunk requests in flight, checks
each chunk against its digest (BLAKE3; sha256 from servers that name no ``digest``) as it arrives,
assembles the version in memory and checks the full-state checksum; the engine then loads the
tensors from that memory (no file). Chunks whose digest equals the same chunk of the version the
generator holds are not asked for at all; the others are asked for with that version as a base, and
the server answers with a zlib'd XOR delta where that is smaller (`delta`), computed once per
(version, base, chunk) and cached for every generator. A chunk that fails its digest is asked for
again, raw; failing twice discards the whole transfer (the next poll starts over).

Fan-out (``peer_fanout`` > 0, `stream_dapo.weights.fanout`): a query may name the asker's relay, and
the manifest then names the peers to ask for the chunks first (the asker's parent in a relay tree,
then its ancestors); the learner serves what none of them delivers. Chunks from peers are checked
against the same digests.
"""

from stream_dapo.weights.zmq_chunks.download import fetch_weights_zmq
from stream_dapo.weights.zmq_chunks.peers import PeerOptions, connect_weight_server
from stream_dapo.weights.zmq_chunks.server import REQUEST_MAX_BYTES, WeightServer
from stream_dapo.weights.zmq_chunks.source import ZmqWeightSource
from stream_dapo.weights.zmq_chunks.stream import StreamedVersion, fetch_weights_stream

__all__ = [
    "REQUEST_MAX_BYTES",
    "PeerOptions",
    "StreamedVersion",
    "WeightServer",
    "ZmqWeightSource",
    "connect_weight_server",
    "fetch_weights_stream",
    "fetch_weights_zmq",
]

"""The older fetch (`fetch_weights_zmq`), kept for the benchmark's baseline and for tools: one chunk
request at a time into a temporary file, renamed when the whole file's sha256 matches the
manifest's. The services use `fetch_weights_stream`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream_dapo.runtime.disk import atomic_file
from stream_dapo.transport import messages
from stream_dapo.transport.codec import Message
from stream_dapo.transport.sockets import CurveKeys, Endpoint, request
from stream_dapo.weights.base import ChecksumMismatch, WeightsError, weights_file_name
from stream_dapo.weights.zmq_chunks.peers import connect_weight_server

__all__ = ["ask_manifest", "fetch_weights_zmq"]

log = logging.getLogger(__name__)


def fetch_weights_zmq(
    endpoint_or_addr: Endpoint | str,
    have_version: int,
    timeout: float = 30.0,
    *,
    dest_dir: str | os.PathLike[str] | None = None,
    retries: int = 2,
    curve: CurveKeys | None = None,
    keep: int = 2,
) -> tuple[int, Path | None]:
    """Ask the learner's weight server for its current version and download it if it differs.

    Args:
        endpoint_or_addr: a connected DEALER `Endpoint` (reused across calls), or an address such
            as ``tcp://learner:5557`` (a socket is opened and closed for this call).
        have_version: the version the caller holds, -1 for none.
        timeout: seconds to wait for each reply before a retry.
        dest_dir: where ``v{version:08d}.safetensors`` is written (temp + rename); default a
            per-process directory under the system temp dir. Older files there are pruned to ``keep``.

    Returns:
        (version, path): the server's current version and the verified local file, or
        (version, None) when it equals ``have_version``; (have_version, None) when the server has
        published nothing yet.

    Raises:
        ChecksumMismatch: the download did not match the announced checksum (nothing is kept).
        TransportTimeout: the server did not answer (is the learner running at that address?).
        WeightsError: the version kept disappearing mid-download (publications faster than fetches).
    """
    if isinstance(endpoint_or_addr, Endpoint):
        return _fetch(endpoint_or_addr, have_version, timeout, dest_dir, retries, keep)
    ep = connect_weight_server(endpoint_or_addr, curve)
    try:
        return _fetch(ep, have_version, timeout, dest_dir, retries, keep)
    finally:
        ep.close()


def _fetch(
    ep: Endpoint, have_version: int, timeout: float, dest_dir: Any, retries: int, keep: int
) -> tuple[int, Path | None]:
    timeout_ms = max(1, int(timeout * 1000))
    out_dir = (
        Path(dest_dir)
        if dest_dir is not None
        else Path(tempfile.gettempdir()) / f"stream-dapo-weights-{os.getpid()}"
    )
    # The wire schema has no "nothing" version; the server answers with the current manifest whatever
    # have_version says, so 0 stands in for -1 and the comparison below stays local.
    query = messages.WeightsQuery(max(have_version, 0))
    for _attempt in range(3):
        manifest = ask_manifest(ep, query, timeout_ms, retries)
        if manifest is None:
            return have_version, None
        version = manifest.version
        if version == have_version:
            return version, None
        if have_version > version:
            log.warning(
                "learner serves version %d, older than ours (%d): following it", version, have_version
            )
        path = _download(ep, manifest, out_dir, timeout_ms, retries)
        if path is not None:
            _prune(out_dir, keep, path)
            return version, path
        log.info("version %d was superseded while downloading; asking again", version)
    raise WeightsError(
        "the weight server replaced its version during three downloads in a row; raise learner.sync_every "
        "or weights.chunk_bytes, or check the link to the learner"
    )


def ask_manifest(
    ep: Endpoint, query: messages.WeightsQuery, timeout_ms: int, retries: int
) -> messages.WeightsManifest | None:
    """The weight server's current manifest, or None when it has published nothing yet."""
    reply = request(
        ep,
        query,
        timeout_ms=timeout_ms,
        retries=retries,
        accept=lambda m: m.type in (messages.WEIGHTS_MANIFEST, messages.NOT_AVAILABLE),
    )
    if reply.type == messages.NOT_AVAILABLE:
        return None
    manifest: messages.WeightsManifest = reply.body
    return manifest


def _download(
    ep: Endpoint, manifest: messages.WeightsManifest, out_dir: Path, timeout_ms: int, retries: int
) -> Path | None:
    """Fetch every chunk into a temp file, verify, rename. None if the version disappeared."""
    version, num_chunks = manifest.version, manifest.num_chunks
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / weights_file_name(version)
    digest = hashlib.sha256()
    received = 0
    try:
        with atomic_file(final) as f:  # raising inside abandons the temporary file
            for index in range(num_chunks):
                reply = request(
                    ep,
                    messages.ChunkRequest(version, index),
                    timeout_ms=timeout_ms,
                    retries=retries,
                    accept=_chunk_filter(version, index),
                )
                if reply.type == messages.NOT_AVAILABLE:
                    raise _VersionGone
                data = reply.body.data
                digest.update(data)
                f.write(data)
                received += len(data)
            if received != manifest.total_bytes or digest.hexdigest() != manifest.checksum:
                raise ChecksumMismatch(
                    f"weights version {version}: received {received} bytes with sha256 "
                    f"{digest.hexdigest()[:16]}..., announced {manifest.total_bytes} bytes with "
                    f"{manifest.checksum[:16]}...; discarded. A corrupting link or a buggy publisher: the "
                    "next poll retries"
                )
    except _VersionGone:
        return None
    return final


class _VersionGone(Exception):
    """The server no longer has the version being downloaded (a newer one replaced it)."""


def _chunk_filter(version: int, index: int) -> Callable[[Message], bool]:
    """Accept only the chunk asked for (a late reply to an earlier retry is dropped) or a refusal."""

    def accept(msg: Message) -> bool:
        if msg.type == messages.NOT_AVAILABLE:
            return True
        body = msg.body
        return isinstance(body, messages.Chunk) and (body.version, body.index) == (version, index)

    return accept


def _prune(directory: Path, keep: int, current: Path) -> None:
    """Keep ``current`` and the newest ``keep - 1`` other versions (the caller may still hold one)."""
    others = sorted(p for p in directory.glob("v*.safetensors") if p.name[1:9].isdigit() and p != current)
    for p in others[: max(0, len(others) - (keep - 1))]:
        p.unlink(missing_ok=True)

"""Generator side of weight sync: fetch a newer version, verify it, hand back a local file.

Both functions return a path only to a file whose sha256 matched the publisher's checksum, so a
generator that loads it never samples from a torn or corrupted copy. Swapping the weights into the
engine (atomically, between generation steps) is the generator's job.

Version rule: a publication is taken when its version differs from ``have_version``, newer or
older (an older one means the learner resumed from a checkpoint, and the weights the generator holds
belong to a lineage that no longer exists). ``have_version = -1`` means "I have nothing".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from stream_dapo.disk import atomic_file
from stream_dapo.transport import messages
from stream_dapo.transport.codec import Message
from stream_dapo.transport.sockets import WEIGHTS_MAX_BYTES, CurveKeys, Endpoint, open_endpoint, request
from stream_dapo.weights.publisher import LATEST_FILE, sha256_file, weights_file_name

__all__ = ["ChecksumMismatch", "WeightsError", "fetch_weights_zmq", "read_shared_dir"]

log = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """Weights could not be obtained; the message says why and what to check."""


class ChecksumMismatch(WeightsError):
    """The bytes received do not hash to the announced checksum; they were discarded."""


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
    ctx: zmq.Context[Any] = zmq.Context.instance()
    ep = open_endpoint(
        ctx,
        zmq.DEALER,
        connect=endpoint_or_addr,
        max_bytes=WEIGHTS_MAX_BYTES,
        peer="learner weight server",
        curve=curve,
    )
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
    query = messages.weights_query(max(have_version, 0))
    for _attempt in range(3):
        reply = request(
            ep,
            *query,
            timeout_ms=timeout_ms,
            retries=retries,
            accept=lambda m: m.type in (messages.WEIGHTS_MANIFEST, messages.NOT_AVAILABLE),
        )
        if reply.type == messages.NOT_AVAILABLE:
            return have_version, None
        manifest = reply.body
        version = int(manifest["version"])
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


def _download(
    ep: Endpoint, manifest: dict[str, Any], out_dir: Path, timeout_ms: int, retries: int
) -> Path | None:
    """Fetch every chunk into a temp file, verify, rename. None if the version disappeared."""
    version, num_chunks = int(manifest["version"]), int(manifest["num_chunks"])
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / weights_file_name(version)
    digest = hashlib.sha256()
    received = 0
    try:
        with atomic_file(final) as f:  # raising inside abandons the temporary file
            for index in range(num_chunks):
                reply = request(
                    ep,
                    *messages.chunk_request(version, index),
                    timeout_ms=timeout_ms,
                    retries=retries,
                    accept=_chunk_filter(version, index),
                )
                if reply.type == messages.NOT_AVAILABLE:
                    raise _VersionGone
                data = reply.body["data"]
                digest.update(data)
                f.write(data)
                received += len(data)
            if received != manifest["total_bytes"] or digest.hexdigest() != manifest["checksum"]:
                raise ChecksumMismatch(
                    f"weights version {version}: received {received} bytes with sha256 "
                    f"{digest.hexdigest()[:16]}..., announced {manifest['total_bytes']} bytes with "
                    f"{manifest['checksum'][:16]}...; discarded. A corrupting link or a buggy publisher: the "
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
        return msg.type == messages.CHUNK and msg.body["version"] == version and msg.body["index"] == index

    return accept


def _prune(directory: Path, keep: int, current: Path) -> None:
    """Keep ``current`` and the newest ``keep - 1`` other versions (the caller may still hold one)."""
    others = sorted(p for p in directory.glob("v*.safetensors") if p.name[1:9].isdigit() and p != current)
    for p in others[: max(0, len(others) - (keep - 1))]:
        p.unlink(missing_ok=True)


def read_shared_dir(directory: str | os.PathLike[str], have_version: int) -> tuple[int, Path] | None:
    """The newest verified weights file in a shared directory, if its version differs from ours.

    Returns None when nothing is published yet or the published version equals ``have_version``.

    Raises:
        ChecksumMismatch: the file named by LATEST does not hash to its checksum.
    """
    root = Path(directory)
    for _attempt in range(3):
        latest = root / LATEST_FILE
        try:
            info = json.loads(latest.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WeightsError(
                f"{latest} is not valid json ({exc}); the publisher writes it atomically, so "
                "something else wrote it: delete it and let the learner publish again"
            ) from exc
        version = int(info["version"])
        if version == have_version:
            return None
        path = root / str(info.get("file", weights_file_name(version)))
        try:
            actual = sha256_file(path)
        except FileNotFoundError:
            continue  # pruned between reading LATEST and opening the file: a newer LATEST is there
        if actual != info["checksum"]:
            raise ChecksumMismatch(
                f"{path} has sha256 {actual[:16]}..., LATEST says {str(info['checksum'])[:16]}...; not loading it"
            )
        return version, path
    raise WeightsError(
        f"{root}: the file LATEST names keeps disappearing; is a publisher pruning too eagerly?"
    )

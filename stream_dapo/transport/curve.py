"""CurveZMQ keys and the authenticator that lets only known clients in.

Curve encrypts a ZeroMQ connection and authenticates the server to the client (the client must
know the server's public key); the ZAP authenticator started here authenticates the client to the
server (its public key must be in an allow-list directory). Without the authenticator a Curve
server accepts any client that knows its public key, so servers always start one.

Key directory, as written by `generate_keys` (`stream-dapo keys generate --out DIR`), in the
certificate format of `zmq.auth.create_certificates`:

    DIR/server.key             server public key   -> every host
    DIR/server.key_secret      server secret key   -> buffer and learner hosts only
    DIR/client.key             client public key
    DIR/client.key_secret      client secret key   -> generator and learner hosts only
    DIR/clients/client.key     allow-list of client public keys the servers accept

The buffer and the learner's weights server use the server pair; generators and the learner
(a client of the buffer) use a client pair. More client pairs (one per host, say) can be made with
`generate_keys(dir, clients=[...])`; revoking one means deleting its file from `clients/` and
restarting the servers.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from stream_dapo.transport.sockets import CurveKeys, RateLimitedWarnings, TransportError

log = logging.getLogger(__name__)

HANDSHAKE_REASONS: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "not_allowed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake",
}
"""ZeroMQ monitor events of a refused Curve handshake, and the reason each is counted under:
not_allowed (a client key not in the allow-list: the ZAP handler said no); protocol or handshake (a
wrong server key, no keys, another mechanism: libzmq reports these as either)."""


class RefusedConnections:
    """The failed Curve handshakes of one server socket, from ZeroMQ's monitor events: each is
    passed to `count(reason)` and logged (rate-limited). ZeroMQ drops such a peer before any message,
    so without this nothing records a refusal. Poll it from the thread that owns the socket."""

    def __init__(
        self, sock: zmq.Socket[Any], name: str, count: Callable[[str], None], logger: logging.Logger
    ) -> None:
        self.name = name
        self._sock = sock
        self._count = count
        self._monitor = sock.get_monitor_socket(sum(HANDSHAKE_REASONS))
        self._warnings = RateLimitedWarnings(logger, interval_s=10.0)

    def poll(self) -> int:
        """Count what failed since the last call; returns how many."""
        from zmq.utils.monitor import recv_monitor_message

        n = 0
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            reason = HANDSHAKE_REASONS.get(event["event"], "handshake")
            self._count(reason)
            n += 1
            self._warnings.warn(
                f"refused-{self.name}-{reason}",
                "refused a connection to the %s socket: Curve handshake failed (%s, at %s); check the "
                "client's keys against transport.curve_dir",
                self.name,
                reason,
                bytes(event.get("endpoint") or b"?").decode(errors="replace"),
            )
        return n

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(linger=0)


SERVER = "server"
DEFAULT_CLIENT = "client"
CLIENTS_DIR = "clients"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"

_FIX = "create them with `stream-dapo keys generate --out DIR` and point transport.curve_dir at DIR"


class CurveKeyError(TransportError):
    """A key file is missing or unreadable; the message names the file and the fix."""


@dataclass(frozen=True)
class KeyFiles:
    """What `generate_keys` wrote."""

    server_public: Path
    server_secret: Path
    client_public: dict[str, Path]
    client_secret: dict[str, Path]
    allowed_clients_dir: Path


def generate_keys(
    out_dir: str | os.PathLike[str],
    *,
    clients: Sequence[str] = (DEFAULT_CLIENT,),
    overwrite: bool = False,
) -> KeyFiles:
    """Write a server key pair, one key pair per client name, and the client allow-list.

    Secret files are mode 0600. Existing keys are never replaced unless `overwrite`: new keys lock
    out every running service that still holds the old ones.
    """
    if not zmq.has("curve"):
        raise CurveKeyError("this libzmq has no CURVE support; install a pyzmq wheel built with libsodium")
    names = list(clients)
    if not names:
        raise ValueError("need at least one client name")
    for name in names:
        if not name or name == SERVER or Path(name).name != name or name.startswith("."):
            raise ValueError(f"client name {name!r} must be a plain file name other than {SERVER!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"client names must be unique, got {names}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    allowed = out / CLIENTS_DIR
    targets = [out / f"{n}{s}" for n in (SERVER, *names) for s in (PUBLIC_SUFFIX, SECRET_SUFFIX)]
    targets += [allowed / f"{n}{PUBLIC_SUFFIX}" for n in names]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"keys already exist ({', '.join(existing)}); keep them, or pass --force to replace them "
            "(then restart every service with the new keys)"
        )

    # Secrets are created inside a private (0700) staging directory, so they are never readable
    # by others, even for the moment between creation and chmod.
    staging = Path(tempfile.mkdtemp(prefix=".keys-", dir=out))
    try:
        for name in (SERVER, *names):
            _, secret = zmq.auth.create_certificates(staging, name)
            os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)
        allowed.mkdir(exist_ok=True)
        for name in names:
            shutil.copyfile(staging / f"{name}{PUBLIC_SUFFIX}", staging / f"allowed-{name}{PUBLIC_SUFFIX}")
            os.replace(staging / f"allowed-{name}{PUBLIC_SUFFIX}", allowed / f"{name}{PUBLIC_SUFFIX}")
        for name in (SERVER, *names):
            for suffix in (PUBLIC_SUFFIX, SECRET_SUFFIX):
                os.replace(staging / f"{name}{suffix}", out / f"{name}{suffix}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    return KeyFiles(
        server_public=out / f"{SERVER}{PUBLIC_SUFFIX}",
        server_secret=out / f"{SERVER}{SECRET_SUFFIX}",
        client_public={n: out / f"{n}{PUBLIC_SUFFIX}" for n in names},
        client_secret={n: out / f"{n}{SECRET_SUFFIX}" for n in names},
        allowed_clients_dir=allowed,
    )


def load_server_keys(key_dir: str | os.PathLike[str]) -> CurveKeys:
    """The server key pair of `key_dir` (for `make_socket(..., curve=keys, curve_server=True)`)."""
    public, secret = _load_pair(Path(key_dir) / f"{SERVER}{SECRET_SUFFIX}")
    return CurveKeys(public=public, secret=secret)


def load_client_keys(key_dir: str | os.PathLike[str], name: str = DEFAULT_CLIENT) -> CurveKeys:
    """Client `name`'s key pair plus the server's public key (for `make_socket(..., curve=keys)`)."""
    d = Path(key_dir)
    public, secret = _load_pair(d / f"{name}{SECRET_SUFFIX}")
    server_public, _ = _load(d / f"{SERVER}{PUBLIC_SUFFIX}")
    return CurveKeys(public=public, secret=secret, server_public=server_public)


def start_authenticator(
    ctx: zmq.Context[Any], allowed_client_keys_dir: str | os.PathLike[str]
) -> ThreadAuthenticator:
    """Start a ZAP handler on `ctx` that admits Curve clients whose public key is in the directory.

    Every Curve server socket of `ctx` is covered (domain "*"); plain (NULL) clients and clients
    with any other key fail the handshake, so nothing they send reaches the socket. Call `.stop()`
    on the result before destroying the context. The allow-list is read once: restart to change it.
    """
    allowed = Path(allowed_client_keys_dir)
    if not allowed.is_dir():
        raise CurveKeyError(f"no client allow-list directory at {allowed}; {_FIX}")
    keys = zmq.auth.load_certificates(allowed)
    if not keys:
        raise CurveKeyError(
            f"no client public keys (*{PUBLIC_SUFFIX}) in {allowed}: every client would be refused; {_FIX}"
        )
    auth = ThreadAuthenticator(ctx, log=logging.getLogger(__name__ + ".zap"))
    auth.start()
    try:
        auth.configure_curve(domain="*", location=str(allowed))
    except BaseException:
        auth.stop()
        raise
    log.info("Curve authenticator started: %d allowed client key(s) from %s", len(keys), allowed)
    return auth


def _load_pair(path: Path) -> tuple[bytes, bytes]:
    public, secret = _load(path)
    if secret is None:
        raise CurveKeyError(f"{path} holds no secret key (is it a public .key file?); {_FIX}")
    mode = path.stat().st_mode
    if mode & stat.S_IROTH:
        log.warning("%s is readable by every user; chmod 600 it", path)
    return public, secret


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise CurveKeyError(f"missing Curve key file {path}; {_FIX}")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"cannot read Curve key file {path}: {exc}; {_FIX}") from exc
    if not public:
        raise CurveKeyError(f"{path} holds no public key; {_FIX}")
    return public, secret


def curve_client(curve_dir: str | os.PathLike[str] | None, name: str = DEFAULT_CLIENT) -> CurveKeys | None:
    """A client's keys for transport.curve_dir (None when Curve is off): generators and the
    learner's buffer connection."""
    return load_client_keys(curve_dir, name) if curve_dir else None


def curve_server(curve_dir: str | os.PathLike[str] | None) -> tuple[CurveKeys, Path] | None:
    """The server keys of transport.curve_dir and its client allow-list directory (None when
    Curve is off): the buffer and the learner's weight server. Start `start_authenticator` on the
    allow-list before any server socket of the context accepts a client."""
    if not curve_dir:
        return None
    return load_server_keys(curve_dir), Path(curve_dir) / CLIENTS_DIR

"""`stream-dapo keys generate --out DIR`: CurveZMQ keys for authenticated, encrypted sockets.

    stream-dapo keys generate --out /etc/stream-dapo/curve
    # then, on every host: transport.curve_dir = "/etc/stream-dapo/curve"
    # (STREAM_DAPO__TRANSPORT__CURVE_DIR=/etc/stream-dapo/curve)

The layout and which file goes to which host are described in `stream_dapo.transport.curve`.
"""

from __future__ import annotations

import argparse
import sys

from stream_dapo.transport.curve import DEFAULT_CLIENT, generate_keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    gen = sub.add_parser(
        "generate",
        help="write a server key pair, client key pairs and the client allow-list",
        description="Write CurveZMQ certificates (zmq.auth format) into DIR: server.key(_secret), "
        "<client>.key(_secret) and clients/<client>.key, the public keys the servers accept.",
    )
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write the keys to (created)")
    gen.add_argument(
        "--client",
        dest="clients",
        action="append",
        metavar="NAME",
        help=f"client key pair to create (repeatable; default: {DEFAULT_CLIENT})",
    )
    gen.add_argument(
        "--force", action="store_true", help="replace existing keys (locks out running services)"
    )


def run(args: argparse.Namespace) -> int:
    if args.keys_command != "generate":  # argparse enforces the choice; kept for direct callers
        print(f"stream-dapo keys: unknown action {args.keys_command!r}", file=sys.stderr)
        return 2
    try:
        files = generate_keys(args.out, clients=args.clients or [DEFAULT_CLIENT], overwrite=args.force)
    except (FileExistsError, ValueError) as exc:
        print(f"stream-dapo keys generate: {exc}", file=sys.stderr)
        return 2
    print(
        f"server keys:   {files.server_public} (public, every host), {files.server_secret} (buffer, learner)"
    )
    for name in files.client_public:
        print(
            f"client {name!r}:  {files.client_public[name]} (public), "
            f"{files.client_secret[name]} (secret: generators, learner)"
        )
    print(f"allow-list:    {files.allowed_clients_dir}/ (buffer, learner)")
    print(f"set transport.curve_dir = {str(args.out)!r} on every service")
    return 0

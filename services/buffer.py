"""Entry point of the buffer service: `python services/buffer.py --config FILE [--set k=v ...]`.

Equivalent to `stream-dapo buffer ...`; systemd units and Kubernetes manifests call this file.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["buffer", *sys.argv[1:]]))

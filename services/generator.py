"""Entry point of the generator service: `python services/generator.py --config FILE [--set k=v ...]`.

Equivalent to `stream-dapo generator ...`; systemd units and Kubernetes manifests call this file.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["generator", *sys.argv[1:]]))

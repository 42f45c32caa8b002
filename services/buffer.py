"""Entry point of the buffer service: `python services/buffer.py --config FILE [--set k=v ...]`.

The same as `stream-dapo buffer ...` (the console script the systemd units and Kubernetes manifests run):
for a checkout without the console script on PATH. tests/integration/test_services_entry_points.py
checks that the two stay one.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["buffer", *sys.argv[1:]]))

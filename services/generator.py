"""Entry point of the generator service: `python services/generator.py --config FILE [--set k=v ...]`.

The same as `stream-dapo generator ...` (the console script the systemd units and Kubernetes manifests run):
for a checkout without the console script on PATH. tests/integration/test_services_entry_points.py
checks that the two stay one.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["generator", *sys.argv[1:]]))

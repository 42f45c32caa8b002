"""Entry point of the learner service: `python services/learner.py --config FILE [--set k=v ...]`.

The same as `stream-dapo learner ...` (the console script the systemd units and Kubernetes manifests run):
for a checkout without the console script on PATH. tests/integration/test_services_entry_points.py
checks that the two stay one.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["learner", *sys.argv[1:]]))
